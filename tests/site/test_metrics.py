"""GET /metrics shows the fleet's figures where they are counted: the BMC executor's (in flight,
queued, failed by reason) once the daemon attaches it, and none of them before; its server answers
kept-alive scrapes without Nagle's wait."""

from __future__ import annotations

import http.client
import os
import socket
from pathlib import Path

from agent.runtime.scheduler import KeyedCounters
from agent.site.metrics import CONTENT_TYPE, Metrics, MetricsService
from agent.site.services import ServiceSettings, SiteServices


def scrape(site: SiteServices) -> list[str]:
    return site.metrics.render().splitlines()


def test_bmc_figures_appear_once_the_executor_is_attached(tmp_path: Path) -> None:
    with SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site")) as site:
        before = scrape(site)
        assert not any("bmc_operations" in line or "pxe_offers" in line for line in before), before
        site.bmc = KeyedCounters(in_flight=3, queued=250, failed={"unreachable": 2, "timeout": 1})
        lines = scrape(site)
        for line in ("bettercompute_site_bmc_operations_in_flight 3",
                     "bettercompute_site_bmc_operations_queued 250",
                     'bettercompute_site_bmc_operations_failed_total{reason="timeout"} 1',
                     'bettercompute_site_bmc_operations_failed_total{reason="unreachable"} 2',
                     "# TYPE bettercompute_site_bmc_operations_failed_total counter"):
            assert line in lines, line
        assert site.metrics.value("bmc_operations_failed_total", reason="unreachable") == 2
        site.bmc.queued = 0
        assert "bettercompute_site_bmc_operations_queued 0" in scrape(site)


def server_side_of(client: socket.socket) -> socket.socket:
    """This process's accepted end of ``client``'s connection (a duplicate of its descriptor,
    found by its peer address among the process's open sockets)."""
    want = client.getsockname()
    for name in os.listdir("/proc/self/fd"):
        try:
            s = socket.fromfd(int(name), socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.getpeername() == want:
                return s
        except OSError:
            pass
        s.close()
    raise AssertionError(f"no accepted socket for {want}")


def test_scrapes_on_a_kept_alive_connection_are_not_held_back_by_nagle(tmp_path: Path) -> None:
    """GET /metrics several times on one connection, as Prometheus scrapes: each answered, and
    the server's end sends without Nagle (the headers and the body are two writes; with Nagle
    the body waited for the scraper's delayed ACK, ~40 ms a scrape). The option is checked,
    not a time."""
    metrics = Metrics()
    metrics.inc("store_hits_total")
    service = MetricsService("127.0.0.1", 0, metrics)
    service.start()
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    ends: set[tuple[str, int]] = set()
    try:
        for _ in range(5):
            conn.request("GET", "/metrics")
            answer = conn.getresponse()
            assert answer.status == 200 and answer.getheader("Content-Type") == CONTENT_TYPE
            assert b"bettercompute_site_store_hits_total 1\n" in answer.read()
            assert conn.sock is not None and not answer.will_close
            ends.add(conn.sock.getsockname())
            with server_side_of(conn.sock) as server:
                assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert len(ends) == 1, "one connection kept alive for every scrape"
    finally:
        conn.close()
        service.stop()
