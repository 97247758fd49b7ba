"""GET /metrics shows the fleet's figures where they are counted: the BMC executor's (in flight,
queued, failed by reason) once the daemon attaches it, and none of them before."""

from __future__ import annotations

from pathlib import Path

from agent.runtime.scheduler import KeyedCounters
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
