"""The services the site daemon runs on the provisioning network, started and stopped with it.

    from agent.site import services
    site = services.start(config)   # in `agent run --role site`, before the Agent is made
    agent = Agent(config, site=site)  # handlers reach them as ctx.site()
    ...
    site.stop()                     # when the daemon stops (a `finally`)

``start`` reconciles the state on disk (expired boot entries and routes dropped, host files
and scripts rewritten from the entries, the content store's temporary files removed and its
budget recounted, a dnsmasq left by a killed daemon killed), starts the HTTP service, the
metrics service (``GET /metrics``, agent/site/metrics.py) and, when an interface is set,
dnsmasq under its supervisor, and a timer that expires entries and routes and saves the
routes' counts. Where the settings do not name the site's address, nothing is
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
from typing import Protocol

from agent.config import Config
from agent.errors import InvalidParameters
from agent.net import connect, http
from agent.site.bmc.partstable import PartsTable
from agent.site.boot.dnsmasq import DnsmasqSettings, DnsmasqSupervisor, served_digest
from agent.site.boot.pxe import BootEntries, BootFile
from agent.site.boot.vmedia import MediaSets
from agent.site.chunkstore import ChunkStore
from agent.site.metrics import Metrics, MetricsService
from agent.site.observe import dhcplog
from agent.site.observe.observer import Observer, ObserverSettings
from agent.site.registries import Registries
from agent.site.serve.routes import RouteTable
from agent.site.serve.upstreams import UpstreamPolicy, local_addresses
from agent.site.serve.web import HttpService


class BmcFigures(Protocol):
    """What a scrape reads of the BMC executor (the scheduler's KeyedCounters, agent/runtime/)."""

    in_flight: int
    queued: int
    failed: dict[str, int]

log = logging.getLogger(__name__)

EXPIRY_TICK_SECONDS = 1.0


@dataclass(frozen=True)
class ServiceSettings:
    address: str                 # the site's address on the provisioning network
    port: int                    # its HTTP service's port
    root: Path                   # state: entries, hosts, scripts, cache, routes
    interface: str = ""          # dnsmasq's interface; "" runs the HTTP service alone
    ipxe_dir: Path = Config.site_ipxe_dir
    bind: str = ""               # the HTTP service's bind address (default: ``address``)
    dnsmasq_argv_prefix: tuple[str, ...] = ()
    ca_file: Path | None = None  # extra CA for https upstreams and kernel downloads
    store_dir: Path | None = None  # the content store (default: root / "store")
    store_bytes: int = Config.site_store_bytes
    metrics: str = ""            # host:port of GET /metrics; "" serves none
    upstreams: tuple[str, ...] = ()  # what routes may reach (agent/site/serve/upstreams.py)
    # The boot timelines and kept consoles (agent/site/observe/): the BMCs' credentials, the rings.
    secrets_dir: Path = Config.secrets_dir
    console_dir: Path | None = None
    console_ring_bytes: int = Config.site_console_ring_bytes
    console_budget_bytes: int = Config.site_console_budget_bytes
    console_store_dir: Path | None = None
    console_keep_days: float = Config.site_console_keep_days
    console_node_bytes: int = Config.site_console_node_bytes
    console_site_bytes: int = Config.site_console_site_bytes
    console_recheck_seconds: float = Config.site_console_recheck_seconds
    cause_waits: tuple[tuple[str, float], ...] = ()   # a rule's wait, by name (site_cause_waits)
    ipmitool: str = "ipmitool"
    # The HTTP service's TLS listener, for the BMCs that mount https:// images only: all three,
    # or none (no listener). https_port 0 binds any free port (tests).
    https_port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @classmethod
    def from_config(cls, config: Config) -> ServiceSettings:
        return cls(address=config.site_address, port=config.site_http_port,
                   root=config.state_dir / "site", interface=config.site_interface,
                   ipxe_dir=config.site_ipxe_dir, ca_file=config.ca_bundle,
                   store_dir=config.site_store_dir, store_bytes=config.site_store_bytes,
                   metrics=config.site_metrics_address,
                   upstreams=config.site_upstreams, secrets_dir=config.secrets_dir,
                   console_dir=config.site_console_dir,
                   console_ring_bytes=config.site_console_ring_bytes,
                   console_budget_bytes=config.site_console_budget_bytes,
                   console_store_dir=config.site_console_store_dir,
                   console_keep_days=config.site_console_keep_days,
                   console_node_bytes=config.site_console_node_bytes,
                   console_site_bytes=config.site_console_site_bytes,
                   console_recheck_seconds=config.site_console_recheck_seconds,
                   cause_waits=config.site_cause_waits,
                   https_port=config.site_https_port or None, tls_cert=config.site_tls_cert,
                   tls_key=config.site_tls_key)


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
        # daemon attaches its scheduler's KeyedCounters here (agent/cli/app.py); None until then.
        self.bmc: BmcFigures | None = None
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._serving = False
        # What a command makes the site fetch itself (a boot entry's kernel and initrd, a media
        # set's ISO, a route's manifest) is dialled under the routes' upstream policy too.
        options = http.HttpOptions(ca_file=settings.ca_file, timeout=30.0, max_retries=3,
                                   resolve=self.upstream_addresses)
        self.fetch_options = options     # firmware images fetched into the store (bmc.firmware apply)
        self.metrics = Metrics()
        # What the site sees of each node's boot: timelines, causes, consoles (agent/site/observe/).
        self.observe = Observer(ObserverSettings(
            settings.root / "observe", settings.secrets_dir, console_dir=settings.console_dir,
            console_ring_bytes=settings.console_ring_bytes,
            console_budget_bytes=settings.console_budget_bytes, ipmitool=settings.ipmitool,
            console_store_dir=settings.console_store_dir, console_keep_days=settings.console_keep_days,
            console_node_bytes=settings.console_node_bytes, console_site_bytes=settings.console_site_bytes,
            console_recheck_seconds=settings.console_recheck_seconds,
            waits=dict(settings.cause_waits)), self.metrics)
        # Each node's parts as its BMC gave them at its last bmc.query query (inventory.refresh).
        self.parts = PartsTable(settings.root / "parts")
        self.store = ChunkStore(settings.store_dir or settings.root / "store",
                                settings.store_bytes, metrics=self.metrics,
                                protected=self._in_use)
        # The port is known only once the server is bound (port 0 in tests): bind first.
        self.routes = RouteTable(settings.root / "routes", "")
        # Routes to OCI registries: resolved with the secret store's credentials, their
        # requests authorized by the site (the ramdisk holds none).
        self.registries = Registries(settings.secrets_dir, options)
        self.routes.authorizer = self.registries.auth_for
        self.entries = BootEntries(settings.root / "boot", "", on_change=self._reload,
                                   http_options=options, store=self.store)
        self.media = MediaSets(settings.root / "media", "", http_options=options, store=self.store)
        self.metrics.gauge("routes_open", lambda: float(len(self.routes.all())))
        self.metrics.gauge("boot_entries", lambda: float(len(self.entries.all())))
        # The fleet's figures, read where they are counted: the BMC executor's (once the daemon
        # attaches it) and dnsmasq's log (once it runs).
        self.metrics.sample("bmc_operations_in_flight",
                            lambda: None if self.bmc is None else float(self.bmc.in_flight))
        self.metrics.sample("bmc_operations_queued",
                            lambda: None if self.bmc is None else float(self.bmc.queued))
        self.metrics.sample("bmc_operations_failed_total",
                            lambda: None if self.bmc is None else dict(self.bmc.failed), label="reason")
        self.metrics.sample("pxe_offers_total", lambda: None if self.dnsmasq is None
                            else float(self.dnsmasq.counters.pxe_offers))
        self.http = HttpService(settings.bind or settings.address, settings.port, self.entries,
                                self.routes, options, self.store, self.metrics, media=self.media,
                                observe=self.observe.http_fetch)
        try:
            self.https = self._https_listener(options)
        except BaseException:
            self.http.server.server_close()
            raise
        self.metrics_service: MetricsService | None = None
        if settings.metrics:
            host, port = parse_host_port(settings.metrics, "site_metrics_address")
            try:
                self.metrics_service = MetricsService(host, port, self.metrics)
            except OSError as exc:  # monitoring is not worth the boot service: said, not fatal
                log.error("site metrics: cannot listen on %s (%s); GET /metrics is not served",
                          settings.metrics, exc.strerror or exc)
        host = settings.address if ":" not in settings.address else f"[{settings.address}]"
        self.base_url = f"http://{host}:{self.http.port}"
        self.routes.base_url = self.base_url
        self.routes.policy = UpstreamPolicy.parse(
            settings.upstreams, own={settings.address, *local_addresses()}, own_port=self.http.port)
        self.entries.base_url = self.base_url
        self.media.base_url = self.base_url
        if self.https is not None:
            self.media.https_base_url = f"https://{host}:{self.https.port}"

    def _https_listener(self, options: http.HttpOptions) -> HttpService | None:
        """The HTTP service's TLS listener (virtual media alone, under the first listener's
        connection caps), where the settings name its port, certificate and key; None where
        they name none of them."""
        st = self.settings
        given = {"site_https_port": st.https_port is not None, "site_tls_cert": st.tls_cert is not None,
                 "site_tls_key": st.tls_key is not None}
        if not any(given.values()):
            return None
        if not all(given.values()):
            missing = ", ".join(k for k, v in given.items() if not v)
            raise InvalidParameters(f"the site's https listener needs site_https_port, site_tls_cert and "
                                    f"site_tls_key together; missing: {missing}")
        assert st.https_port is not None and st.tls_cert is not None and st.tls_key is not None
        context = connect.server_context(st.tls_cert, st.tls_key)
        return HttpService(st.bind or st.address, st.https_port, None, self.routes, options,
                           metrics=self.metrics, media=self.media, observe=self.observe.http_fetch,
                           tls=context, conns=self.http.server.conns)

    def _dnsmasq_line(self, line: str) -> None:
        """A line of dnsmasq's log: the PXE boot server's answer ties a MAC to its address (whom
        the node's script is served to); every line goes to the timelines."""
        got = dhcplog.parse(line)
        if got is not None and got.mac and got.ip:
            self.entries.tie(got.mac, got.ip)
        self.observe.dnsmasq_line(line)

    def upstream_addresses(self, host: str, port: int) -> list[str]:
        """The addresses the site may dial for ``host``: ``site_upstreams``' policy
        (agent/site/serve/upstreams.py); InvalidParameters when it may not."""
        return self.routes.policy.addresses(host, port)

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
        self.store.reconcile()
        dropped = self.entries.reconcile()
        live = self.routes.reconcile()
        self.media.reconcile()
        log.info("site services: %d boot entries (%d expired dropped), %d proxy routes",
                 len(self.entries.all()), len(dropped), live)
        self.observe.start()
        if self.settings.interface:
            boot = DnsmasqSettings(
                interface=self.settings.interface, address=self.settings.address,
                http_base_url=self.base_url, root=self.settings.root / "boot",
                ipxe_dir=self.settings.ipxe_dir, argv_prefix=self.settings.dnsmasq_argv_prefix)
            self.dnsmasq = DnsmasqSupervisor(boot, on_line=self._dnsmasq_line)
            # its DHCP exchange ties each MAC to an address: a node's script goes there only
            self.entries.clients_tied = True
            # an entry for the site's arm64 UKI (Secure Boot) names the one its TFTP serves
            self.entries.served_uki = lambda: served_digest(boot, BootFile.UEFI_ARM64_UKI)
            self.dnsmasq.start()
        self.http.start()
        self._serving = True
        if self.https is not None:
            self.https.start()
        if self.metrics_service is not None:
            self.metrics_service.start()
        self._timer = threading.Thread(target=self._tick, name="site-expiry", daemon=True)
        self._timer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(5)
        if self._serving:
            if self.https is not None:
                self.https.stop()
            self.http.stop()
            if self.metrics_service is not None:
                self.metrics_service.stop()
        else:  # bound in __init__, never served: shutdown() would wait for a loop never run
            self.http.server.server_close()
            if self.https is not None:
                self.https.server.server_close()
            if self.metrics_service is not None:
                self.metrics_service.server.server_close()
        self.routes.flush()
        self.routes.upstreams.close()
        if self.dnsmasq is not None:
            self.dnsmasq.stop()
        self.observe.stop()

    def _in_use(self) -> set[str]:
        """What the store must keep: the kernels and initrds of live boot entries, the ISOs
        of live media sets."""
        return self.entries.digests_in_use() | self.media.digests_in_use()

    def _reload(self) -> None:
        if self.dnsmasq is not None:
            self.dnsmasq.reload()

    def _tick(self) -> None:
        while not self._stop.wait(EXPIRY_TICK_SECONDS):
            try:
                now = time.time()
                self.entries.expire(now)
                self.routes.expire(now)
                self.routes.flush()
                self.routes.upstreams.sweep()
                self.media.expire(now)
                self.observe.tick()
            except Exception:
                log.exception("site services: expiry failed")


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """"127.0.0.1:9108" or "[::1]:9108" -> (host, port); InvalidParameters otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        number = int(port)
        if not sep or not 0 <= number < 65536:
            raise ValueError(port)
    except ValueError:
        raise InvalidParameters(f"{what} {text[:60]!r}: an IP address and a port, e.g. "
                                "127.0.0.1:9108") from None
    return host, number


def start(config: Config) -> SiteServices | None:
    """Start the site's services from the daemon's settings; None when no address is set."""
    if not config.site_address:
        log.warning("site role without site_address: the boot service and proxy routes are off")
        return None
    services = SiteServices(ServiceSettings.from_config(config))
    services.start()
    return services
