"""agent.hw.pci: PCIe links and AER counts from a fake sysfs tree and from this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.hw import pci
from tests.hw.fake_machine import ROOT_PORT, aer_lines, build_machine


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    return build_machine(tmp_path / "root", gpus=2, disks=2, nics=2, ib_ports=0, dimms=2)


def test_links_and_the_port_above(fake: Path) -> None:
    devices = {d.address: d for d in pci.read_pci_devices(fake)}
    assert sorted(devices) == [ROOT_PORT, "0000:18:00.0", "0000:28:00.0", "0000:3b:00.0", "0000:3b:00.1"]
    nic = devices["0000:3b:00.1"]
    assert (nic.link_speed, nic.link_width, nic.max_link_speed, nic.max_link_width) == (
        "16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16
    )
    assert (nic.vendor_id, nic.device_id, nic.class_code) == ("15b3", "101d", "0x020000")
    assert nic.driver == "mlx5_core"
    assert nic.upstream == ROOT_PORT and devices[ROOT_PORT].upstream == ""
    assert nic.is_class("0x02") and nic.is_class("0200") and not nic.is_class("0x0302")
    assert pci.gts(devices["0000:18:00.0"].max_link_speed) == 32.0
    assert pci.gts("Unknown") == 0.0 and pci.gts("2.5 GT/s PCIe") == 2.5


def test_aer_counts(fake: Path) -> None:
    d = fake / "sys/bus/pci/devices/0000:18:00.0"
    (d / "aer_dev_correctable").write_text(aer_lines("COR", 17) + "\n")
    (d / "aer_dev_fatal").write_text(aer_lines("FATAL", 2) + "\n")
    gpu = next(x for x in pci.read_pci_devices(fake) if x.address == "0000:18:00.0")
    assert gpu.aer == pci.Aer(correctable=17, nonfatal=0, fatal=2)
    for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        (d / name).unlink()
    gpu = next(x for x in pci.read_pci_devices(fake) if x.address == "0000:18:00.0")
    assert gpu.aer is None  # no AER capability: not "0 errors"


def test_a_conventional_pci_device_is_left_out(fake: Path) -> None:
    assert not (fake / "sys/bus/pci/devices/0000:03:00.0/max_link_width").exists()
    assert "0000:03:00.0" not in {d.address for d in pci.read_pci_devices(fake)}


def test_a_link_that_is_down(fake: Path) -> None:
    d = fake / "sys/bus/pci/devices/0000:28:00.0"
    (d / "current_link_speed").write_text("Unknown\n")
    (d / "current_link_width").write_text("0\n")
    gpu = next(x for x in pci.read_pci_devices(fake) if x.address == "0000:28:00.0")
    assert (pci.gts(gpu.link_speed), gpu.link_width) == (0.0, 0)


def test_this_machine() -> None:
    have = sorted(a for a in os.listdir("/sys/bus/pci/devices")
                  if os.path.exists(f"/sys/bus/pci/devices/{a}/max_link_width"))
    devices = pci.read_pci_devices()
    assert [d.address for d in devices] == have
    for d in devices:
        assert d.max_link_width >= 0 and d.class_code.startswith("0x")
