"""The services the site daemon runs on the provisioning network, started and stopped with it.

    from agent.site import services
    services.start(config)      # in `agent run --role site`, before the session starts
    ...
    services.stop()             # when the daemon stops (a `finally`)
    services.current()          # what the handlers use: the running SiteServices, or None

``start`` reconciles the state on disk (expired boot entries and routes dropped, host files
and scripts rewritten from the entries, a dnsmasq left by a killed daemon killed), starts the
HTTP service and, when an interface is set, dnsmasq under its supervisor, and a timer that
expires entries and routes. Where the settings do not name the site's address, nothing is
started and the boot and proxy kinds answer that the service is not running.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent import http
from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.site.dnsmasq import DnsmasqSettings, DnsmasqSupervisor
from agent.site.pxe import BootEntries
from agent.site.routes import RouteTable
from agent.site.web import HttpService

if TYPE_CHECKING:
    from agent.scheduler import KeyedCounters

log = logging.getLogger(__name__)

EXPIRY_TICK_SECONDS = 1.0


@dataclass(frozen=True)
class ServiceSettings:
    address: str                 # the site's address on the provisioning network
    port: int                    # its HTTP service's port
    root: Path                   # state: entries, hosts, scripts, cache, routes
    interface: str = ""          # dnsmasq's interface; "" runs the HTTP service alone
    ipxe_dir: Path = Path("/usr/lib/ipxe")
    bind: str = ""               # the HTTP service's bind address (default: ``address``)
    dnsmasq_argv_prefix: tuple[str, ...] = ()
    ca_file: Path | None = None  # extra CA for https upstreams and kernel downloads

    @classmethod
    def from_config(cls, config: Config) -> ServiceSettings:
        return cls(address=config.site_address, port=config.site_http_port,
                   root=config.state_dir / "site", interface=config.site_interface,
                   ipxe_dir=config.site_ipxe_dir, ca_file=config.ca_bundle)


class SiteServices:
    def __init__(self, settings: ServiceSettings) -> None:
        try:
            ipaddress.ip_address(settings.address)
        except ValueError:
            raise InvalidParameters(
                f"site_address {settings.address[:60]!r}: the site's IP address on the "
                "provisioning network (e.g. 10.0.0.2)") from None
        self.settings = settings
        self.dnsmasq: DnsmasqSupervisor | None = None
        # The BMC executor's figures (in flight, queued, failed by reason), for a scrape: the
        # daemon attaches its scheduler's KeyedCounters here (agent/app.py); None until then.
        self.bmc: KeyedCounters | None = None
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        options = http.HttpOptions(ca_file=settings.ca_file, timeout=30.0, max_retries=3)
        # The port is known only once the server is bound (port 0 in tests): bind first.
        self.routes = RouteTable(settings.root / "routes", "")
        self.entries = BootEntries(settings.root / "boot", "", on_change=self._reload,
                                   http_options=options)
        self.http = HttpService(settings.bind or settings.address, settings.port, self.entries,
                                self.routes, options)
        host = settings.address if ":" not in settings.address else f"[{settings.address}]"
        self.base_url = f"http://{host}:{self.http.port}"
        self.routes.base_url = self.base_url
        self.entries.base_url = self.base_url

    def start(self) -> None:
        dropped = self.entries.reconcile()
        live = self.routes.reconcile()
        log.info("site services: %d boot entries (%d expired dropped), %d proxy routes",
                 len(self.entries.all()), len(dropped), live)
        if self.settings.interface:
            self.dnsmasq = DnsmasqSupervisor(DnsmasqSettings(
                interface=self.settings.interface, address=self.settings.address,
                http_base_url=self.base_url, root=self.settings.root / "boot",
                ipxe_dir=self.settings.ipxe_dir, argv_prefix=self.settings.dnsmasq_argv_prefix))
            self.dnsmasq.start()
        self.http.start()
        self._timer = threading.Thread(target=self._tick, name="site-expiry", daemon=True)
        self._timer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(5)
        self.http.stop()
        if self.dnsmasq is not None:
            self.dnsmasq.stop()

    def _reload(self) -> None:
        if self.dnsmasq is not None:
            self.dnsmasq.reload()

    def _tick(self) -> None:
        while not self._stop.wait(EXPIRY_TICK_SECONDS):
            try:
                now = time.time()
                self.entries.expire(now)
                self.routes.expire(now)
            except Exception:
                log.exception("site services: expiry failed")


_current: SiteServices | None = None
_guard = threading.Lock()


def start(config: Config) -> SiteServices | None:
    """Start the site's services from the daemon's settings; None when no address is set."""
    if not config.site_address:
        log.warning("site role without site_address: the boot service and proxy routes are off")
        return None
    if _current is not None:
        raise RuntimeError("the site services are already running")
    return install(SiteServices(ServiceSettings.from_config(config)))


def install(services: SiteServices) -> SiteServices:
    """Start ``services`` and make them the process's (tests build their own settings)."""
    global _current
    with _guard:
        if _current is not None:
            raise RuntimeError("the site services are already running")
        try:
            services.start()
        except BaseException:
            services.stop()
            raise
        _current = services
    return services


def stop() -> None:
    global _current
    with _guard:
        services, _current = _current, None
    if services is not None:
        services.stop()


def current() -> SiteServices | None:
    return _current


def require() -> SiteServices:
    """The running services, for a handler; Unsupported when the daemon runs none."""
    services = _current
    if services is None:
        raise Unsupported(
            "the site's boot service and proxy routes are not running on this daemon "
            "(run `agent run --role site` with --site-address)"
        )
    return services
