"""The site daemon's counters, served as ``GET /metrics`` in the Prometheus text exposition
format (version 0.0.4) on an address of its own (``site_metrics_address``, the loopback by
default: never the provisioning network unless configured).

    m = Metrics()
    m.inc("store_hits")                       # a counter of the table below
    m.gauge("routes_open", lambda: 3.0)       # sampled at each scrape
    m.render()                                # the exposition text
    MetricsService("127.0.0.1", 9108, m).start()

Every family is named in ``FAMILIES``, once, with its type and help: a name outside it is a
programming error (KeyError), so a typo cannot start a series nobody scrapes. The fleet's BMC
counters (operations in flight, queued, failed by reason) and the PXE offers have their rows
in the same table (COUNTED_ELSEWHERE: shown once their services count them, through the
``Metrics`` the services are given); a labelled counter takes ``labels`` (e.g. reason=...).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "bettercompute_site_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name (without PREFIX) -> (type, help)
FAMILIES: Mapping[str, tuple[str, str]] = {
    "store_bytes_served_total": ("counter", "Bytes of route bodies served from the chunk store."),
    "upstream_bytes_fetched_total": ("counter", "Bytes fetched from upstreams for the chunk store."),
    "zero_bytes_served_total": ("counter", "Bytes of zero chunks served without a fetch."),
    "relay_bytes_total": ("counter", "Bytes relayed by routes without a manifest."),
    "chunks_verified_total": ("counter", "Chunks fetched from an upstream that matched their digest."),
    "chunks_rejected_total": ("counter", "Chunks fetched from an upstream that did not match."),
    "store_hits_total": ("counter", "Chunk lookups answered from the store."),
    "store_misses_total": ("counter", "Chunk lookups that needed a fetch (or waited on one)."),
    "store_evictions_total": ("counter", "Chunks evicted to stay within the store's budget."),
    "store_write_failures_total": ("counter", "Verified chunks not stored (disk full, budget)."),
    "store_bytes": ("gauge", "Bytes held in the chunk store."),
    "store_budget_bytes": ("gauge", "The chunk store's byte budget."),
    "store_chunks": ("gauge", "Files held in the chunk store."),
    "routes_open": ("gauge", "Live proxy routes."),
    "boot_entries": ("gauge", "Live PXE boot entries."),
    # From the fleet issue: the BMC services count into these when they run.
    "bmc_operations_in_flight": ("gauge", "BMC operations being run."),
    "bmc_operations_queued": ("gauge", "BMC operations waiting for a worker."),
    "bmc_operations_failed_total": ("counter", "BMC operations that failed, by reason."),
    "pxe_offers_total": ("counter", "PXE offers made by the proxy DHCP."),
    # From the boot timelines (agent/site/observe/): attempts, the causes named, the consoles.
    "boot_attempts_total": ("counter", "Boot attempts begun (power on, cycle, reset, a new prepare)."),
    "boot_failures_total": ("counter", "Boot attempts a rule named a cause for, by cause."),
    "consoles_kept": ("gauge", "Nodes whose serial console the site keeps."),
}
# Histograms: full name (the command durations are every role's family, not the site's) ->
# (help, bucket bounds in seconds).
HISTOGRAMS: Mapping[str, tuple[str, tuple[float, ...]]] = {
    "bettercompute_command_duration_seconds": (
        "How long commands took from their start to their result, by kind and result.",
        (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)),
    "bettercompute_site_boot_phase_seconds": (
        "How long each phase of a node's boot took, by phase (agent/site/observe/).",
        (1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600, 1200)),
}
# Families another service counts: shown once counted (a 0 would claim a count nobody keeps).
COUNTED_ELSEWHERE = frozenset({"bmc_operations_in_flight", "bmc_operations_queued",
                               "bmc_operations_failed_total", "pxe_offers_total"})


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), " ")}"'
        for k, v in sorted(labels.items()))
    return "{" + inner + "}"


Sample = float | Mapping[str, float] | None
Labels = tuple[tuple[str, str], ...]


def _series(label: str, read: Callable[[], Sample]) -> list[tuple[Labels, float]]:
    got = read()
    if got is None:
        return []
    if isinstance(got, Mapping):
        return [(((label, key),), float(v)) for key, v in sorted(got.items())]
    return [((), float(got))]


class Metrics:
    """Counters and sampled values; thread-safe; one per SiteServices."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._samplers: dict[str, tuple[str, Callable[[], Sample]]] = {}
        # (name, labels) -> [count per bucket (the last: +Inf), sum]
        self._histograms: dict[tuple[str, Labels], tuple[list[int], list[float]]] = {}

    def observe(self, name: str, value: float, **labels: str) -> None:
        """One observation of a histogram of HISTOGRAMS (a name outside it: KeyError)."""
        _, bounds = HISTOGRAMS[name]
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            counts, total = self._histograms.setdefault(key, ([0] * (len(bounds) + 1), [0.0]))
            counts[next((i for i, b in enumerate(bounds) if value <= b), len(bounds))] += 1
            total[0] += value

    def count(self, name: str, **labels: str) -> int:
        """A histogram's number of observations (tests, logs)."""
        with self._lock:
            got = self._histograms.get((name, tuple(sorted(labels.items()))))
            return sum(got[0]) if got is not None else 0

    def inc(self, name: str, n: float = 1, **labels: str) -> None:
        kind, _ = FAMILIES[name]
        assert kind == "counter", name
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0) + n

    def gauge(self, name: str, sample: Callable[[], float]) -> None:
        kind, _ = FAMILIES[name]
        assert kind == "gauge", name
        self.sample(name, sample)

    def sample(self, name: str, read: Callable[[], Sample], *, label: str = "") -> None:
        """``name`` read at each scrape from whatever counts it (a gauge, or a counter another
        service keeps): a number, or with ``label`` a number per label value (reason -> count);
        None while that service does not run, and the family is left out."""
        FAMILIES[name]  # a name outside the table is a programming error
        with self._lock:
            self._samplers[name] = (label, read)

    def value(self, name: str, **labels: str) -> float:
        """A counter's value now, or a sampled one (what tests and logs read)."""
        with self._lock:
            sampler = self._samplers.get(name)
            if sampler is None:
                return self._values.get((name, tuple(sorted(labels.items()))), 0)
        series = dict(_series(*sampler))
        return series.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        with self._lock:
            values = dict(self._values)
            samplers = dict(self._samplers)
        lines: list[str] = []
        for name, (kind, help_text) in FAMILIES.items():
            series = sorted((labels, v) for (n, labels), v in values.items() if n == name)
            if name in samplers:
                try:
                    series = _series(*samplers[name])
                except Exception:  # a sampler that fails is left out, not the page
                    log.exception("metrics: sampling %s failed", name)
                    continue
            if not series and (kind == "gauge" or name in COUNTED_ELSEWHERE):
                continue
            lines.append(f"# HELP {PREFIX}{name} {help_text}")
            lines.append(f"# TYPE {PREFIX}{name} {kind}")
            if not series:
                series = [((), 0.0)]
            for labels, v in series:
                number = repr(int(v)) if float(v).is_integer() else repr(float(v))
                lines.append(f"{PREFIX}{name}{_labels(dict(labels))} {number}")
        with self._lock:
            histograms = {k: (list(c), t[0]) for k, (c, t) in self._histograms.items()}
        for name, (help_text, bounds) in HISTOGRAMS.items():
            kept = sorted((labels, v) for (n, labels), v in histograms.items() if n == name)
            if not kept:
                continue
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} histogram")
            for labels, (counts, total) in kept:
                running = 0
                for bound, n in zip((*bounds, float("inf")), counts, strict=True):
                    running += n
                    le = "+Inf" if bound == float("inf") else repr(float(bound))
                    lines.append(f"{name}_bucket{_labels({**dict(labels), 'le': le})} {running}")
                lines.append(f"{name}_sum{_labels(dict(labels))} {total!r}")
                lines.append(f"{name}_count{_labels(dict(labels))} {running}")
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 10.0
    # TCP_NODELAY on each accepted connection, as the site's HTTP service (serve/web.py): the
    # headers and the body are two writes, and with Nagle on the second waits for the scraper's
    # delayed ACK of the first (about 40 ms a scrape on a kept-alive connection).
    disable_nagle_algorithm = True
    server_version = "bettercompute-site"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self._answer(404, b"not found\n", "text/plain")
            return
        self._answer(200, self.server.metrics.render().encode(), CONTENT_TYPE)

    def _answer(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], metrics: Metrics) -> None:
        self.metrics = metrics
        super().__init__(address, _Handler)


class MetricsService:
    """``GET /metrics`` on its own address and thread."""

    def __init__(self, address: str, port: int, metrics: Metrics) -> None:
        self.server = _Server((address, port), metrics)
        self._thread = threading.Thread(target=self.server.serve_forever, name="site-metrics",
                                        kwargs={"poll_interval": 0.5}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("site metrics on http://%s:%d/metrics", self.server.server_address[0], self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
