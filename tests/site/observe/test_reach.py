"""How the site's view reaches people: logs.collect in role site gathers a node's kept console
(a time range) and its timelines; inventory.refresh in role site reports each known node's last
attempt and cause; the reference gateway's CLI says them in a line per node."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.bulk.logs import LogsCollect
from agent.commands.inventory import InventoryRefresh
from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.gateway.cli import boots_summary
from agent.proto import agent_pb2
from agent.site.observe.timeline import Prepared, Step
from agent.site.services import ServiceSettings, SiteServices
from tests.hw.fake_machine import build_machine

MAC = "52:54:00:00:00:01"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteServices]:
    with SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                      secrets_dir=tmp_path / "secrets")) as running:
        yield running


def collect(site: SiteServices | None, config: Config, **fields: object) -> dict[str, bytes]:
    handler = LogsCollect()
    params = handler.parse(agent_pb2.LogsCollectRequest(**fields))  # type: ignore[arg-type]
    result = handler.run(Context.local("logs.collect", config, site=site), params)
    assert isinstance(result, agent_pb2.LogsCollectResult)
    with tarfile.open(fileobj=io.BytesIO(result.inline_archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def failed_boot(site: SiteServices) -> None:
    obs = site.observe
    obs.prepared("n1", Prepared("pxe", MAC, 4e9))
    obs.timelines.power("n1", "on")
    ring = obs.consoles.ring("n1")
    lines = ["SeaBIOS (version 1.16)", "Linux version 6.1", "Kernel panic - not syncing: x"]
    for i, line in enumerate(lines):
        ring.append(1000.0 + i, line)
    obs.timelines.console("n1", Step.KERNEL_STARTED, "Linux version 6.1")
    obs.timelines.console("n1", Step.PANIC, "Kernel panic - not syncing: x")


def test_logs_collect_gathers_a_nodes_console_range_and_timelines(site: SiteServices, tmp_path: Path) -> None:
    failed_boot(site)
    config = Config(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    config.state_dir.mkdir()
    files = collect(site, config, node_ids=["n1"], from_unix_ms=1_001_000, until_unix_ms=1_002_000)
    console = files["nodes/n1/console.txt"].decode()
    assert console.splitlines() == ["1970-01-01T00:16:41.000Z Linux version 6.1",
                                    "1970-01-01T00:16:42.000Z Kernel panic - not syncing: x"]
    attempts = json.loads(files["nodes/n1/timeline.json"])
    assert attempts[-1]["cause"] == "kernel_panic"
    assert "kernel_panic" in files["nodes/n1/timeline.txt"].decode()
    manifest = json.loads(files["manifest.json"])
    assert any(e["name"] == "nodes/n1/console.txt" for e in manifest["entries"])


def test_logs_collect_gives_a_consoles_last_lines_with_their_times(
        site: SiteServices, tmp_path: Path) -> None:
    failed_boot(site)
    config = Config(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    config.state_dir.mkdir()
    files = collect(site, config, node_ids=["n1"], console_last_lines=2)
    assert files["nodes/n1/console.txt"].decode().splitlines() == [
        "1970-01-01T00:16:41.000Z Linux version 6.1",
        "1970-01-01T00:16:42.000Z Kernel panic - not syncing: x"]
    # the last N within a window: the window first, then its last lines
    files = collect(site, config, node_ids=["n1"], until_unix_ms=1_001_000, console_last_lines=1)
    assert files["nodes/n1/console.txt"].decode().splitlines() == [
        "1970-01-01T00:16:41.000Z Linux version 6.1"]


def test_the_node_summary_says_the_oldest_moment_kept(site: SiteServices) -> None:
    failed_boot(site)
    assert site.observe.node_boot("n1").console_oldest_unix_ms == 1_000_000  # type: ignore[union-attr]
    ring = site.observe.consoles.ring("n1")
    for i in range(3000):                    # the ring turns over: its oldest moment moves on
        ring.append(2000.0 + i, "x" * 2000)
    oldest = site.observe.node_boot("n1").console_oldest_unix_ms  # type: ignore[union-attr]
    assert oldest / 1000 == ring.read()[0][0] > 2000.0
    site.observe.timelines.power("n3", "on")
    assert site.observe.node_boot("n3").console_oldest_unix_ms == 0  # type: ignore[union-attr]


def test_logs_collect_of_nodes_needs_the_site(tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path / "state")
    config.state_dir.mkdir()
    with pytest.raises(Unsupported):
        collect(None, config, node_ids=["n1"])
    with pytest.raises(InvalidParameters):
        LogsCollect().parse(agent_pb2.LogsCollectRequest(node_ids=["../etc"]))
    with pytest.raises(InvalidParameters):
        LogsCollect().parse(agent_pb2.LogsCollectRequest(node_ids=["n1"], from_unix_ms=5, until_unix_ms=4))


def test_inventory_refresh_in_role_site_reports_each_nodes_last_attempt(
        site: SiteServices, tmp_path: Path) -> None:
    failed_boot(site)
    site.observe.timelines.power("n2", "on")
    site.observe.timelines.console("n2", Step.JOINED, "connected to gateway")
    handler = InventoryRefresh()
    handler.root = build_machine(tmp_path / "root", gpus=0, disks=1)
    config = Config(state_dir=tmp_path / "state", nvml_library="/nonexistent/libnvidia-ml.so.1")
    result = handler.run(Context.local("inventory.refresh", config, site=site),
                         handler.parse(agent_pb2.InventoryRefreshRequest()))
    assert isinstance(result, agent_pb2.InventoryRefreshResult)
    boots = {b.node_id: b for b in result.node_boots}
    assert boots["n1"].outcome == "failed" and boots["n1"].cause == "kernel_panic"
    assert boots["n1"].last_lines[-1] == "Kernel panic - not syncing: x"
    assert boots["n1"].console == "not kept"
    assert boots["n2"].outcome == "joined" and not boots["n2"].cause
    summary = boots_summary(result)
    assert summary[0].startswith("n1: attempt 1 (pxe, boot.prepareRamdisk): failed: kernel_panic")
    assert summary[-1].startswith("n2: attempt 1 (disk, bmc.power on): joined")


def test_the_demo_prints_each_nodes_timeline(site: SiteServices) -> None:
    from qemu.sitelife import timeline_lines

    failed_boot(site)
    result = agent_pb2.InventoryRefreshResult(node_boots=site.observe.node_boots())
    lines = timeline_lines(result)
    assert lines[0].startswith("n1: attempt 1 (pxe, boot.prepareRamdisk): failed: kernel_panic")
    assert [line.split()[1] for line in lines[1:]] == ["prepared", "power_on", "kernel_started", "panic"]
