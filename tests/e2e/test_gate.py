"""The acceptance gate on a real kernel: a QEMU node whose NVMe disks and second NIC sit behind
pcie-root-ports: one NVMe disk's set narrow and slow (x-speed=2_5, x-width=1: a riser wired x1
at Gen1, to the guest), the other's at QEMU's default (16 GT/s, x32), the NIC's at 8 GT/s x4;
the NIC reports 25 Gb/s.

inventory.refresh reads each port's link as the guest kernel has it (sysfs), the node passes
the build it is, and deploy.image gated on a build whose NVMe slots must offer Gen3 x4 and
whose NIC slots Gen4 x8 is refused (not_conforming) with the NVMe disk behind the narrow port
and the NIC behind the x4 one named, before anything is written; the same deploy gated on a
build it matches writes the image. (QEMU 7.2's emulated endpoints train x1 at 2.5 GT/s
whatever the port: the port's own capability is what the narrowing changes, so that is what
the gate's ``slots`` rule sees.)

One guest for the module, the tests in file order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from agent.proto import session_pb2
from qemu.harness import Disk, ExtraNic, Machine, PciePort
from qemu.lab import Lab
from tests.e2e.conftest import COMMAND_TIMEOUT, JOIN_TIMEOUT, run_command

pytestmark = [pytest.mark.qemu, pytest.mark.slow, pytest.mark.root]

NODE = "gate-1"
MiB = 1024 * 1024
NARROW = PciePort(speed="2_5", width=1)
IMAGE = hashlib.sha256(b"gate").digest() * (MiB // 32)      # 1 MiB, raw

# The build this node is: two QEMU NVMe disks and two NICs, each device at its own maximum link.
BUILD = {"nvme": {"count": 2, "model": "QEMU NVMe"}, "nics": {"count": 2},
         "full_link_classes": ["0x0108", "0x0200"]}
# A build whose NVMe drives need a Gen3 x4 slot and whose NICs a Gen4 x8 one.
GEN3_X4 = {**BUILD, "slots": [{"class_code": "0x0108", "min_speed_gts": 8, "min_width": 4},
                              {"class_code": "0x0200", "min_speed_gts": 16, "min_width": 8}]}


@pytest.fixture(scope="module")
def disks(lab: Lab) -> list[Disk]:
    d = lab.workdir / f"{NODE}-disks"
    d.mkdir(parents=True, exist_ok=True)
    return [Disk(d / "narrow.img", "NVMEGATENARROW", "nvme", 64 * MiB, port=NARROW),
            Disk(d / "wide.img", "NVMEGATEWIDE", "nvme", 64 * MiB, port=PciePort())]


@pytest.fixture(scope="module")
def node(lab: Lab, disks: list[Disk]) -> Iterator[Machine]:
    (lab.www / "gate.img").write_bytes(IMAGE)
    nic = ExtraNic(speed_mbps=25000, port=PciePort(speed="8", width=4))
    machine = lab.boot(NODE, disks=disks, nics=[nic])
    lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
    yield machine
    machine.stop()


def deploy(lab: Lab, disk: Disk, gate: dict[str, object]) -> session_pb2.ResultBody:
    payload = {"url": lab.url("gate.img"), "format": "RAW", "target": {"serial": disk.serial},
               "digest": {"algorithm": "sha256", "hex": hashlib.sha256(IMAGE).hexdigest()}, "gate": gate}
    cid = lab.gateway.send(NODE, "deploy.image", payload)
    body, _ = lab.gateway.wait_result(cid, COMMAND_TIMEOUT)
    return body


def test_the_ports_links_as_the_guest_sees_them(lab: Lab, node: Machine) -> None:
    _, _, result = run_command(lab, node, NODE, "inventory.refresh", {})
    inv = result.inventory
    pci = {d.address: d for d in inv.pci_devices}
    nvme = [d for d in inv.pci_devices if d.class_code.startswith("0x0108")]
    assert len(nvme) == 2
    slots = sorted((pci[d.upstream].max_link_speed, pci[d.upstream].max_link_width) for d in nvme)
    assert slots == [("16.0 GT/s PCIe", 32), ("2.5 GT/s PCIe", 1)], inv.pci_devices
    for d in nvme:  # the emulated endpoint: x1 at 2.5 GT/s, its own maximum, behind either port
        assert (d.link_speed, d.link_width) == (d.max_link_speed, d.max_link_width) == ("2.5 GT/s PCIe", 1)
    nic = next(n for n in inv.nics if n.mac == "52:54:00:12:35:01")
    assert nic.speed_mbps == 25000 and nic.driver == "virtio_net" and nic.pci_address
    assert pci[pci[nic.pci_address].upstream].max_link_speed == "8.0 GT/s PCIe"
    assert pci[pci[nic.pci_address].upstream].max_link_width == 4
    assert result.inventory.xid_events == []  # the kernel log was read: no NVIDIA driver, no Xid


def test_the_node_passes_the_build_it_is(lab: Lab, node: Machine) -> None:
    _, _, result = run_command(lab, node, NODE, "inventory.refresh", {"expect": BUILD})
    assert result.conformance.passed, result.conformance


def test_a_narrow_slot_fails_the_gate_and_deploy_writes_nothing(lab: Lab, node: Machine,
                                                              disks: list[Disk]) -> None:
    _, _, result = run_command(lab, node, NODE, "inventory.refresh", {"expect": GEN3_X4})
    inv = result.inventory
    nic = next(n for n in inv.nics if n.mac == "52:54:00:12:35:01")
    narrow = next(d.address for d in inv.pci_devices if d.class_code.startswith("0x0108")
                  and next(p for p in inv.pci_devices if p.address == d.upstream).max_link_width == 1)
    found = sorted((m.check, m.expected, m.found, m.where) for m in result.conformance.mismatches)
    assert found == sorted([
        ("pcie.slot_speed", "8 GT/s", "2.5 GT/s PCIe", narrow), ("pcie.slot_width", "x4", "x1", narrow),
        ("pcie.slot_speed", "16 GT/s", "8.0 GT/s PCIe", nic.pci_address),
        ("pcie.slot_width", "x8", "x4", nic.pci_address),
    ])  # the NVMe disk behind the default port and the first NIC (on the root complex) pass
    body = deploy(lab, disks[0], GEN3_X4)
    assert body.status == session_pb2.FAILED and body.reason == "not_conforming", body
    assert narrow in body.message and nic.pci_address in body.message
    assert not disks[0].path.read_bytes().strip(b"\0")  # nothing was written


def test_a_node_that_passes_its_gate_is_deployed(lab: Lab, node: Machine, disks: list[Disk]) -> None:
    body = deploy(lab, disks[0], BUILD)
    assert body.status == session_pb2.SUCCEEDED, f"{body.reason}: {body.message}\n{node.console_tail()}"
    assert disks[0].path.read_bytes()[: len(IMAGE)] == IMAGE
