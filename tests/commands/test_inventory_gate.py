"""inventory.refresh's acceptance gate: a fake server against its expected build, the GPUs
through the fake NVML (VBIOS, PCIe link, NVLink), Xid events and AER counts in the inventory."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format

from agent.commands.base import Context
from agent.commands.inventory import InventoryRefresh
from agent.config import Config
from agent.errors import InvalidParameters
from agent.policy import conformance, xid
from agent.proto import agent_pb2
from tests.hw.fake_machine import aer_lines, build_machine
from tests.policy.test_xid import KERNEL_LOG

NO_NVML = "/nonexistent/libnvidia-ml.so.1"

# What the fake server of tests/hw/fake_machine.py is (GPUs as the fake NVML serves them).
BUILD = {
    "cpu_model": "Xeon(R) Platinum 8480", "cpu_sockets": 2, "cpu_threads": 16,
    "memory_bytes": 16 * 64 * 2**30,
    "gpus": {"count": 8, "model": "H100 80GB", "min_memory_bytes": 80 * 10**9, "min_vbios": "96.00.74.00.01",
             "nvlinks_up": 18},
    "nics": {"count": 4, "model": "15b3:101d"},
    "nvme": {"count": 15, "model": "MZWLR3T8", "min_capacity_bytes": 3840 * 10**9,
             "min_firmware": "MPK7525Q"},
    "full_link_classes": ["0x0302", "0x02", "0x0108"],
}  # fmt: skip


def run(root: Path, config: Config, expect: dict[str, object] | None, *, log: str = "",
        **request: object) -> agent_pb2.InventoryRefreshResult:
    handler = InventoryRefresh()
    handler.root = root
    handler.kernel_log = lambda: xid.parse(log)
    payload = json_format.ParseDict({**request, **({"expect": expect} if expect is not None else {})},
                                    agent_pb2.InventoryRefreshRequest())
    result = handler.run(Context.local("inventory.refresh", config), handler.parse(payload))
    assert isinstance(result, agent_pb2.InventoryRefreshResult)
    return result


def mismatches(result: agent_pb2.InventoryRefreshResult) -> list[tuple[str, str, str, str]]:
    return [(m.check, m.expected, m.found, m.where) for m in result.conformance.mismatches]


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    return build_machine(tmp_path / "root", gpus=8, disks=30)


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Config, object]:
    from tests.fakes.nvml.fakenvml import FakeMachine, NoCompiler, build_library

    try:
        library = build_library(tmp_path / "nvml")
    except NoCompiler as exc:
        pytest.skip(str(exc))
    machine = FakeMachine(tmp_path / "gpus.json", count=8)
    # The fake GPUs sit where the fake tree's GPUs are (buses 0x18, 0x28, ...).
    for i in range(8):
        machine.set(i, pci_bus=0x18 + 0x10 * i)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(machine.path))
    return Config(state_dir=tmp_path / "state", nvml_library=str(library)), machine


def test_a_node_matching_its_build_passes(fake: Path, nvml: tuple[Config, object]) -> None:
    config, _ = nvml
    result = run(fake, config, BUILD)
    assert result.HasField("conformance")
    assert mismatches(result) == [] and result.conformance.passed
    g = result.inventory.gpus[0]
    assert (g.vbios_version, g.pcie_width, g.pcie_width_max) == ("96.00.74.00.01", 16, 16)
    assert g.pcie_generation_max == 5
    assert (g.nvlinks_up, g.nvlinks) == (18, 18)


def test_without_an_expected_build_there_is_no_verdict(fake: Path, tmp_path: Path) -> None:
    result = run(fake, Config(state_dir=tmp_path / "state", nvml_library=NO_NVML), None)
    assert not result.HasField("conformance")
    assert len(result.inventory.pci_devices) == 8 + 4 + 1  # GPUs, NICs, the root port
    nic = next(n for n in result.inventory.nics if n.name == "ens1f1np1")
    assert nic.model == "15b3:101d"  # no pci.ids in the fake tree: the ids


def test_a_gpu_at_x8_an_old_vbios_and_a_link_down_fail(fake: Path, nvml: tuple[Config, object]) -> None:
    config, machine = nvml
    machine.set(2, pcie_width=8)                                  # type: ignore[attr-defined]
    machine.set(5, vbios="96.00.61.00.01", nvlink_down=[3, 7])    # type: ignore[attr-defined]
    result = run(fake, config, BUILD)
    assert not result.conformance.passed
    assert mismatches(result) == [
        ("gpu.vbios", "96.00.74.00.01", "96.00.61.00.01", "0000:68:00.0"),
        ("gpu.nvlinks_up", "18", "16", "0000:68:00.0"),
        ("pcie.link_width", "x16", "x8", "0000:38:00.0"),
    ]
    message = result.conformance.mismatches[2].message
    assert message == "GPU 0000:38:00.0 trains at x8, it can do x16 (NVML)"


def test_a_missing_gpu_and_a_different_model(fake: Path, nvml: tuple[Config, object]) -> None:
    config, machine = nvml
    machine.set(7, missing=True)                                  # type: ignore[attr-defined]
    machine.set(0, model="H200", pci_bus=0x18)                    # type: ignore[attr-defined]
    found = mismatches(run(fake, config, BUILD))
    assert ("gpu.count", "8", "7", "") in found
    assert ("gpu.model", "H100 80GB", "NVIDIA H200", "0000:18:00.0") in found


def test_nic_and_nvme_links_and_drives(fake: Path, tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path / "state", nvml_library=NO_NVML)
    nic = fake / "sys/bus/pci/devices/0000:3c:00.0"
    (nic / "current_link_width").write_text("8\n")                 # a NIC trained at x8 ...
    (nic / "current_link_speed").write_text("8.0 GT/s PCIe\n")     # ... and at Gen3
    port = fake / "sys/bus/pci/devices/0000:00:01.0"
    (port / "max_link_speed").write_text("8.0 GT/s PCIe\n")        # held back by its port
    (fake / "sys/block/nvme4n1/device/firmware_rev").write_text("MPK7520Q\n")
    (fake / "sys/block/nvme9n1/size").write_text(str(1920 * 10**9 // 512) + "\n")
    build = {k: v for k, v in BUILD.items() if k != "gpus"}
    found = mismatches(run(fake, config, build))
    assert found == [
        ("nvme.firmware", "MPK7525Q", "MPK7520Q", "nvme4n1"),
        ("nvme.capacity", str(3840 * 10**9), str(1920 * 10**9), "nvme9n1"),
        ("pcie.link_speed", "16.0 GT/s PCIe", "8.0 GT/s PCIe", "0000:3c:00.0"),
        ("pcie.link_width", "x16", "x8", "0000:3c:00.0"),
    ]
    result = run(fake, config, build)
    speed = result.conformance.mismatches[2].message
    assert speed.endswith("the port above it (0000:00:01.0) can do only 8.0 GT/s PCIe")


def test_cpu_memory_and_nic_speed(fake: Path, tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path / "state", nvml_library=NO_NVML)
    build = {"cpu_model": "EPYC", "cpu_threads": 32, "memory_bytes": 2 * 2**40,
             "nics": {"speed_mbps": 200000}}
    found = [(m[0], m[3]) for m in mismatches(run(fake, config, build))]
    assert found == [("cpu.model", ""), ("cpu.threads", ""), ("memory.total", ""),
                     *(("nic.speed", n) for n in ("ens1f0np0", "ens1f1np1", "ens2f0np0", "ens2f1np1"))]
    # within the tolerance: 1 TiB less 12 MB is 1 TiB
    assert not mismatches(run(fake, config, {"memory_bytes": 2**40}))


def test_xid_and_aer_in_the_inventory(fake: Path, tmp_path: Path) -> None:
    (fake / "sys/bus/pci/devices/0000:18:00.0/aer_dev_correctable").write_text(aer_lines("COR", 5))
    config = Config(state_dir=tmp_path / "state", nvml_library=NO_NVML)
    inv = run(fake, config, None, log=KERNEL_LOG).inventory
    assert [(e.xid, e.action) for e in inv.xid_events][:3] == [
        (13, agent_pb2.XID_NONE), (13, agent_pb2.XID_NONE), (79, agent_pb2.XID_REBOOT)]
    aer = {d.address: d.aer.correctable for d in inv.pci_devices}
    assert aer["0000:18:00.0"] == 5 and aer["0000:28:00.0"] == 0
    again = run(fake, config, None, log=KERNEL_LOG + KERNEL_LOG)
    assert not [c for c in again.changes if c.path.startswith("xid_events")]  # events: not hardware


@pytest.mark.parametrize(("expect", "words"), [
    ({"memory_tolerance_percent": 80}, "at most 50"),
    ({"gpus": {"count": 1000}}, "more than 64"),
    ({"full_link_classes": ["display"]}, "not a PCI class code"),
    ({"cpu_model": "x" * 200}, "at most 128"),
])
def test_bad_expectations_are_refused(expect: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidParameters, match=words):
        payload = json_format.ParseDict({"expect": expect}, agent_pb2.InventoryRefreshRequest())
        InventoryRefresh().parse(payload)


def test_gpus_cannot_be_expected_when_skipped() -> None:
    payload = json_format.ParseDict({"skip_gpus": True, "expect": {"gpus": {"count": 8}}},
                                    agent_pb2.InventoryRefreshRequest())
    with pytest.raises(InvalidParameters, match="skip_gpus"):
        InventoryRefresh().parse(payload)


@pytest.mark.parametrize(("found", "minimum", "ok"), [
    ("96.00.A5.00.01", "96.00.74.00.01", True), ("96.00.61.00.01", "96.00.74.00.01", False),
    ("2.10", "2.9", True), ("MPK7525Q", "MPK7526Q", False), ("22.39.1002", "22.39.1002", True),
    ("16.35.2000", "16.35.4030", False),
])
def test_version_order(found: str, minimum: str, ok: bool) -> None:
    assert conformance.at_least(found, minimum) is ok


def test_deploy_image_behind_the_gate(fake: Path, tmp_path: Path) -> None:
    """deploy.image with `gate`: a node that is not the build is refused before its disk is
    opened; one that is gets the image."""
    import hashlib

    from agent.commands.deploy import DeployImage
    from agent.errors import NotConforming
    from agent.hw import block
    from agent.proto import common_pb2

    disk = tmp_path / "disk"
    old = bytes(range(256)) * (4 << 12)
    disk.write_bytes(old)
    image = b"\x5a" * (1 << 20)
    (tmp_path / "image").write_bytes(image)
    handler = DeployImage(disks=lambda: [block.file_disk(disk)])
    handler.root = fake

    def deploy(gate: dict[str, object]) -> agent_pb2.DeployImageResult:
        request = agent_pb2.DeployImageRequest(
            local_path=str(tmp_path / "image"), target=common_pb2.DiskHints(name="disk"),
            digest=common_pb2.Digest(algorithm="sha256", hex=hashlib.sha256(image).hexdigest()),
            gate=json_format.ParseDict(gate, agent_pb2.ExpectedBuild()))  # fmt: skip
        result = handler.run(Context.local("deploy.image", Config(state_dir=tmp_path / "state")),
                             handler.parse(request))
        assert isinstance(result, agent_pb2.DeployImageResult)
        return result

    (fake / "sys/bus/pci/devices/0000:3b:00.1/current_link_width").write_text("4\n")
    with pytest.raises(NotConforming) as refused:
        deploy({"nvme": {"count": 16}, "full_link_classes": ["0x02"]})
    assert refused.value.details["mismatches"] == "nvme.count@node,pcie.link_width@0000:3b:00.1"
    assert "15 NVMe drive(s), expected 16" in refused.value.message
    assert disk.read_bytes() == old  # refused before anything was written
    result = deploy({"nvme": {"count": 15}, "cpu_threads": 16})
    assert result.bytes_written + result.bytes_skipped == len(image)
    assert disk.read_bytes()[: len(image)] == image


def test_a_slot_narrower_than_the_build_needs(fake: Path, tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path / "state", nvml_library=NO_NVML)
    build = {"slots": [{"class_code": "0x0200", "min_speed_gts": 16, "min_width": 16}]}
    assert not mismatches(run(fake, config, build))
    port = fake / "sys/bus/pci/devices/0000:00:01.0"
    (port / "max_link_width").write_text("8\n")          # the riser is wired x8 ...
    (port / "max_link_speed").write_text("8.0 GT/s PCIe\n")  # ... at Gen3
    found = mismatches(run(fake, config, build))
    nics = ("0000:3b:00.0", "0000:3b:00.1", "0000:3c:00.0", "0000:3c:00.1")
    assert found == [m for n in nics for m in (("pcie.slot_speed", "16 GT/s", "8.0 GT/s PCIe", n),
                                               ("pcie.slot_width", "x16", "x8", n))]
