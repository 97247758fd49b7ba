"""The services the site daemon runs on the provisioning network, started and stopped with it.

    from agent.site import services
    site = services.start(config)   # in `agent run --role site`, before the Agent is made
    agent = Agent(config, site=site)  # handlers reach them as ctx.site()
    ...
    site.stop()                     # when the daemon stops (a `finally`)

``start`` reconciles the state on disk (expired boot entries and routes dropped, host files
and scripts rewritten from the entries, a dnsmasq left by a killed daemon killed), starts the
HTTP service and, when an interface is set, dnsmasq under its supervisor, and a timer that
expires entries and routes. Where the settings do not name the site's address, nothing is
started and the boot and proxy kinds answer that the service is not running. There is no
process global: tests build their own ``SiteServices`` (a context manager) and hand it to the
context they run a handler with.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agent import http
from agent.config import Config
from agent.errors import InvalidParameters
from agent.site.dnsmasq import DnsmasqSettings, DnsmasqSupervisor
from agent.site.pxe import BootEntries
from agent.site.routes import RouteTable
from agent.site.web import HttpService

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
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._serving = False
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

    def __enter__(self) -> SiteServices:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Reconcile the state on disk and start serving; on a failure what started stops."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
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
        self._serving = True
        self._timer = threading.Thread(target=self._tick, name="site-expiry", daemon=True)
        self._timer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(5)
        if self._serving:
            self.http.stop()
        else:  # bound in __init__, never served: shutdown() would wait for a loop never run
            self.http.server.server_close()
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


def start(config: Config) -> SiteServices | None:
    """Start the site's services from the daemon's settings; None when no address is set."""
    if not config.site_address:
        log.warning("site role without site_address: the boot service and proxy routes are off")
        return None
    services = SiteServices(ServiceSettings.from_config(config))
    services.start()
    return services
