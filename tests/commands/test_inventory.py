"""inventory.refresh: a fake 8-GPU/30-disk server, the diff against the stored inventory, this
machine's own inventory, and GPUs through (fake) NVML."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.inventory import STATE_FILE, InventoryRefresh, diff
from agent.config import Config
from agent.hw import block
from agent.proto import agent_pb2
from tests.hw.fake_machine import SERIAL, build_machine

NO_NVML = "/nonexistent/libnvidia-ml.so.1"


def refresh(
    root: Path | None, config: Config, timeout: float | None = None, **request: bool
) -> agent_pb2.InventoryRefreshResult:
    handler = InventoryRefresh()
    if root is not None:
        handler.root = root
    params = handler.parse(agent_pb2.InventoryRefreshRequest(**request))
    result = handler.run(Context.local("inventory.refresh", config, timeout=timeout), params)
    assert isinstance(result, agent_pb2.InventoryRefreshResult)
    return result


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    return build_machine(tmp_path / "root", gpus=8, disks=30)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(state_dir=tmp_path / "state", nvml_library=NO_NVML)


def test_fake_server_inventory(fake: Path, config: Config) -> None:
    result = refresh(fake, config)
    inv = result.inventory
    assert result.first and not result.changes
    assert (config.state_dir / STATE_FILE).is_file()
    assert inv.system.serial == SERIAL and inv.system.boot_mode == "efi"
    assert (inv.cpu.sockets, inv.cpu.cores, inv.cpu.threads) == (2, 8, 16)
    assert len(inv.memory.dimms) == 16 and inv.memory.numa_nodes == 2
    assert len(inv.disks) == 30
    nvme = next(d for d in inv.disks if d.identity.name == "nvme3n1")
    assert (nvme.identity.serial, nvme.identity.transport, nvme.identity.wwn) == (
        "S6EXNA0T000003", "nvme", "eui.0000000000000003"
    )
    sata = next(d for d in inv.disks if d.identity.name == "sda")
    assert sata.identity.serial == "MTFD0000000000000015" and not sata.read_only
    assert len(inv.gpus) == 8 and {g.source for g in inv.gpus} == {"sysfs"}
    assert [g.index for g in inv.gpus] == list(range(8))
    assert len(inv.nics) == 4 and len(inv.infiniband) == 8
    assert inv.system.bmc_address == ""  # never asked of a fake tree


def test_changes_against_the_previous_inventory(fake: Path, config: Config) -> None:
    refresh(fake, config)
    (fake / "sys/block/nvme1n1/device/serial").write_text("REPLACED-01\n")
    shutil.rmtree(fake / "sys/bus/pci/devices/0000:88:00.0")  # GPU 7 fell off the bus
    (fake / "sys/class/net/ens1f0np0/carrier").write_text("1\n")
    (fake / "sys/class/dmi/id/bios_version").write_text("2.20.0\n")
    result = refresh(fake, config)
    assert not result.first
    changes = {c.path: (c.old_value, c.new_value) for c in result.changes}
    assert changes["disks[nvme1n1].identity.serial"] == ("S6EXNA0T000001", "REPLACED-01")
    assert changes["gpus[0000:88:00.0]"] == ("present", "")
    assert changes["nics[ens1f0np0].link"] == ("false", "true")
    assert changes["system.firmware_version"] == ("2.19.1", "2.20.0")
    assert not any(p.startswith("gpus[0000:88:00.0].") for p in changes)
    assert len(changes) == 4
    assert not refresh(fake, config).changes  # stored again: no change the third time


def test_added_device_and_corrupt_state(fake: Path, config: Config) -> None:
    refresh(fake, config)
    d = fake / "sys/bus/pci/devices/0000:f8:00.0"
    d.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
        (d / name).write_text(value + "\n")
    result = refresh(fake, config)
    changes = [(c.path, c.old_value, c.new_value) for c in result.changes]
    assert ("gpus[0000:f8:00.0]", "", "present") in changes
    (config.state_dir / STATE_FILE).write_bytes(b"\xff\xff\xff garbage")
    again = refresh(fake, config)
    assert again.first and not again.changes


def test_diff_ignores_the_clock() -> None:
    a = agent_pb2.Inventory(cpu=agent_pb2.CpuInfo(model="x", max_mhz=2400.1))
    b = agent_pb2.Inventory(cpu=agent_pb2.CpuInfo(model="x", max_mhz=2399.7))
    assert diff(a, b) == []


def test_this_machine(tmp_path: Path) -> None:
    result = refresh(None, Config(state_dir=tmp_path / "state"), include_lldp=True, timeout=18)
    inv = result.inventory
    assert inv.cpu.threads == os.cpu_count()
    assert inv.memory.total_bytes > 0
    assert inv.system.kernel == os.uname().release
    expected = sorted(d.name for d in block.list_disks() if d.transport != "loop")
    assert sorted(d.identity.name for d in inv.disks) == expected
    physical = sorted(n for n in os.listdir("/sys/class/net") if os.path.exists(f"/sys/class/net/{n}/device"))
    assert [n.name for n in inv.nics] == physical
    assert result.seconds < 120


def test_gpus_through_nvml(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakes.nvml.fakenvml import FakeMachine, NoCompiler, build_library

    try:
        library = build_library(tmp_path / "nvml")
    except NoCompiler as exc:
        pytest.skip(str(exc))
    machine = FakeMachine(tmp_path / "gpus.json", count=8)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(machine.path))
    config = Config(state_dir=tmp_path / "state", nvml_library=str(library))
    inv = refresh(fake, config).inventory
    assert len(inv.gpus) == 8 and {g.source for g in inv.gpus} == {"nvml"}
    assert len({g.uuid for g in inv.gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in inv.gpus)
    assert all(g.vendor_id == "10de" and g.memory_bytes > 0 for g in inv.gpus)
    assert all(len(g.pci_address) == 12 for g in inv.gpus)  # "0000:18:00.0", as sysfs writes it
    skipped = refresh(fake, config, skip_gpus=True)
    assert not skipped.inventory.gpus
