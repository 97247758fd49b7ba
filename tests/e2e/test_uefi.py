"""UEFI network boot on x86, and a deployed image that UEFI firmware boots from its disk.

A q35 machine with OVMF (Debian's ovmf) boots the ramdisk over the network: the firmware
loads the EFI build of QEMU's iPXE ROM for the NIC, iPXE gets boot.ipxe from the user
network's TFTP and the kernel and initramfs over HTTP. The agent joins and reports EFI boot
mode; deploy.image writes a GPT image with an EFI system partition (systemd-boot, the kernel
and initramfs) and the bcroot partition to the disk chosen by its serial. Then the machine
is powered off and on again with the firmware booting that disk: systemd-boot starts the
node's kernel, and the node agent rejoins from its disk, in EFI mode. Then node.reboot from
the node role: the guest reboots through /init (busybox reboot -> SIGTERM to PID 1), the
firmware and systemd-boot again, and the agent rejoins with a new boot id, the same node key
(on the disk) and the completion, read from its journal on the disk.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from agent.gateway import State
from qemu.harness import Disk, Machine
from qemu.lab import Lab
from qemu.nodeimage import SYSTEMD_BOOT, NodeImage, build_node_image
from tests.e2e.conftest import COMMAND_TIMEOUT, JOIN_TIMEOUT, run_command, skip_reason

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "uefi-1"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def uefi_lab(lab: Lab) -> Lab:
    reason = skip_reason(uefi=True)
    if reason is None:
        for tool in ("mkfs.vfat", "mcopy"):
            if shutil.which(tool) is None:
                reason = f"{tool} is not installed (apt-get install dosfstools mtools)"
    if reason is None and not SYSTEMD_BOOT.is_file():
        reason = f"no {SYSTEMD_BOOT} (apt-get install systemd-boot-efi)"
    if reason:
        pytest.skip(reason)
    return lab


@pytest.fixture(scope="module")
def disks(uefi_lab: Lab) -> list[Disk]:
    return uefi_lab.standard_disks(NODE, size=224 * MiB)


@pytest.fixture(scope="module")
def node(uefi_lab: Lab, disks: list[Disk]) -> Iterator[Machine]:
    machine = uefi_lab.boot(NODE, disks=disks, pxe=True, uefi=True)
    uefi_lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
    yield machine
    machine.stop()


@pytest.fixture(scope="module")
def image(uefi_lab: Lab) -> NodeImage:
    img = build_node_image(uefi_lab, NODE, uefi_lab.workdir / "uefi-node-image", esp=True)
    os.link(img.zst, uefi_lab.www / "uefi-node.img.zst")
    return img


def test_ovmf_ipxe_network_boot_joins_in_efi_mode(uefi_lab: Lab, node: Machine) -> None:
    assert node.pxe_served[:2] == ["GET /vmlinuz 200", "GET /initrd.img 200"], node.pxe_served
    assert "-bios" in node.argv()
    _, _, result = run_command(uefi_lab, node, NODE, "inventory.refresh", {})
    assert result.inventory.system.boot_mode == "efi", result.inventory.system


def test_deployed_gpt_esp_image_boots_from_its_disk_under_uefi(uefi_lab: Lab, node: Machine,
                                                              disks: list[Disk], image: NodeImage) -> None:
    payload = {"url": uefi_lab.url("uefi-node.img.zst"), "format": "ZSTD",
               "digest": {"algorithm": "sha256", "hex": image.zst_sha256},
               "target": {"serial": disks[0].serial}, "verify_readback": True}
    _, _, deployed = run_command(uefi_lab, node, NODE, "deploy.image", payload)
    assert deployed.disk.serial == disks[0].serial
    sessions = uefi_lab.gateway.nodes[NODE].sessions
    node.stop()  # power off; power on with the firmware booting the deployed disk

    again = uefi_lab.boot(NODE, disks=disks, uefi=True, disk_boot=True, kernel=image.kernel,
                          initrd=image.initrd, append="")
    assert "-kernel" not in again.argv()
    uefi_lab.wait_joined(again, NODE, JOIN_TIMEOUT, sessions=sessions + 1)
    rec = uefi_lab.gateway.nodes[NODE]
    assert rec.hello.role == "node"
    again.wait_console(r"node root .* mounted on /sysroot", 30)
    _, _, result = run_command(uefi_lab, again, NODE, "inventory.refresh", {})
    assert result.inventory.system.boot_mode == "efi", result.inventory.system

    # node.reboot from the node role (this boot, rather than a node of its own booted for it).
    old_boot, old_key = rec.boot_id, rec.public_key
    cid = uefi_lab.gateway.send(NODE, "node.reboot", {"mode": "GRACEFUL"})
    try:
        done = uefi_lab.gateway.wait(cid, COMMAND_TIMEOUT)
    except TimeoutError:
        raise again.fail("node.reboot did not complete") from None
    assert done.state is State.COMPLETED, \
        f"{done.state}: {uefi_lab.gateway.events_for(cid)}\n{again.console_tail()}"
    assert done.completion is not None and done.completion.ok
    rebooted = uefi_lab.gateway.nodes[NODE]
    assert rebooted.sessions >= sessions + 2 and rebooted.hello.role == "node"
    assert rebooted.boot_id and rebooted.boot_id != old_boot
    assert (done.completion.old_boot_id, done.completion.new_boot_id) == (old_boot, rebooted.boot_id)
    # It went through /init's shutdown path, and the same node key (on the disk) came back.
    assert "reboot requested: stopping the agent" in again.console()
    assert rebooted.public_key == old_key
    again.stop()
