"""How the site's view reaches people: logs.collect in role site gathers a node's kept console
(a time range) and its timelines; inventory.refresh in role site reports each known node's last
attempt and cause; the reference gateway's CLI says them in a line per node."""

from __future__ import annotations

import io
import json
import tarfile
import time
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


def failed_boot(site: SiteServices, t0: float = 1000.0) -> None:
    obs = site.observe
    obs.prepared("n1", Prepared("pxe", MAC, 4e9))
    obs.timelines.power("n1", "on")
    ring = obs.consoles.ring("n1")
    lines = ["SeaBIOS (version 1.16)", "Linux version 6.1", "Kernel panic - not syncing: x"]
    for i, line in enumerate(lines):
        ring.append(t0 + i, line)
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
    failed_boot(site, time.time())
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
    assert boots["n1"].last_lines[0].startswith("[site: the console of attempt 1 at its panic")
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


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def node_lines(site: SiteServices, clock: Clock, lines: list[tuple[str, Step | None]]) -> None:
    """Lines of a node's console, one a second: each in the ring, its milestone (if any) in
    the timeline, as the kept console reports them."""
    for text, step in lines:
        clock.now += 1.0
        site.observe.consoles.ring("n1").append(clock.now, text)
        if step is not None:
            site.observe.timelines.console("n1", step, text)


def test_the_lines_under_a_cause_are_its_attempts_around_its_step(site: SiteServices) -> None:
    """A panic with panic=-1: the node reboots at once, and the ring's newest lines are the next
    boot's firmware and iPXE; under the cause (carried by the new attempt) are the panicking
    boot's lines around its panic, headed by which attempt and step."""
    clock = Clock()
    site.observe.timelines.clock = clock
    site.observe.prepared("n1", Prepared("pxe", MAC, 4e9))
    site.observe.timelines.power("n1", "on")
    node_lines(site, clock, [("SeaBIOS (version 1.16)", Step.FIRMWARE),
                             ("Linux version 6.1", Step.KERNEL_STARTED),
                             ("VFS: Cannot open root device", None),
                             ("Kernel panic - not syncing: VFS: Unable to mount root fs", Step.PANIC),
                             ("---[ end Kernel panic - not syncing ]---", None),
                             ("SeaBIOS (version 1.16)", Step.FIRMWARE),
                             ("iPXE initialising devices...ok", Step.BOOT_LOADER),
                             ("iPXE 1.21.1 -- Open Source Network Boot Firmware", None)])
    boot = site.observe.node_boot("n1")
    assert boot is not None and boot.attempt == 2 and boot.cause == "kernel_panic", boot
    assert boot.last_lines[0].startswith("[site: the console of attempt 1 at its panic"), boot.last_lines
    assert boot.last_lines[1:] == ["SeaBIOS (version 1.16)", "Linux version 6.1",
                                   "VFS: Cannot open root device",
                                   "Kernel panic - not syncing: VFS: Unable to mount root fs",
                                   "---[ end Kernel panic - not syncing ]---"], boot.last_lines


def test_no_dhcp_shows_ipxes_lines_not_the_firmwares_fall_through(site: SiteServices) -> None:
    """iPXE found no DHCP and gave up; the firmware then fell through to the disk and printed
    more than a screen of its own: under no_dhcp_request are iPXE's lines."""
    clock = Clock()
    site.observe.timelines.clock = clock
    site.observe.prepared("n1", Prepared("pxe", MAC, 4e9))
    site.observe.timelines.power("n1", "on")
    node_lines(site, clock, [("SeaBIOS (version 1.16)", Step.FIRMWARE),
                             ("iPXE 1.21.1 -- Open Source Network Boot Firmware", Step.BOOT_LOADER),
                             ("Configuring (net0 52:54:00:00:00:01)...... No configuration methods "
                              "succeeded (https://ipxe.org/040ee186)", None),
                             ("No more network devices", None),
                             ("Booting from Hard Disk...", None),
                             *((f"firmware line {i}", None) for i in range(20))])
    clock.now += 200
    site.observe.timelines.evaluate()
    boot = site.observe.node_boot("n1")
    assert boot is not None and boot.cause == "no_dhcp_request", boot
    assert any("No configuration methods succeeded" in line for line in boot.last_lines), boot.last_lines
    assert "(iPXE 1.21.1" in boot.cause_detail, boot.cause_detail


def test_the_demo_says_a_node_the_gateway_joined_is_joined(site: SiteServices) -> None:
    """The demo asks the site right after the gateway saw the last join, and the console's line
    of it comes later (3 s after, the site still said booting): the demo, the control plane,
    merges its own join, said as the gateway's; an attempt begun after that join stays booting."""
    from qemu.sitelife import timeline_lines

    site.observe.prepared("n1", Prepared("pxe", MAC, 4e9))
    site.observe.timelines.power("n1", "on")
    site.observe.timelines.console("n1", Step.AGENT_STARTED, "bc-init [3.1]: starting agent")
    result = agent_pb2.InventoryRefreshResult(node_boots=site.observe.node_boots())
    boot = result.node_boots[0]
    assert boot.outcome == "booting"
    began = boot.started_unix_ms / 1000
    lines = timeline_lines(result, {"n1": began + 42.0})
    assert lines[0].startswith("n1: attempt 1 (pxe, boot.prepareRamdisk): joined "
                               "(the gateway's join, +42.0s;"), lines
    assert "booting" not in lines[0]
    assert ": booting" in timeline_lines(result, {"n1": began - 10})[0]
    assert ": booting" in timeline_lines(result)[0]
