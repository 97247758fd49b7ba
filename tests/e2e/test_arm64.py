"""An arm64 (Grace-class) ramdisk node in ``qemu-system-aarch64 -M virt`` under TCG, network
booted by UEFI firmware (Debian's qemu-efi-aarch64: its PXE fetches a GRUB EFI image by TFTP,
which fetches the kernel and initramfs over HTTP): it joins, inventory.refresh reports an aarch64
machine booted in EFI mode with its NVMe and virtio disks, deploy.image writes the arm64 node
image to the disk chosen by its serial, and boot.kexec (the uncompressed Image on that disk,
loaded by kexec-tools: Debian's arm64 kernel has no kexec_file_load) boots it and the node
agent rejoins with a new boot id; powered off and on, the firmware boots that disk's EFI
system partition (systemd-boot) and the node rejoins again.

The ramdisk is built on this x86 host from Debian's arm64 packages (initramfs/out/arm64/,
``python -m initramfs.build --arch arm64``). One guest for the module; the tests run in order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator

import pytest

from agent.gateway import State
from agent.proto import agent_pb2
from qemu.harness import Disk, Machine
from qemu.lab import Lab, ensure_ramdisk
from qemu.nodeimage import NodeImage, build_node_image
from tests.e2e.conftest import COMMAND_TIMEOUT, JOIN_TIMEOUT, run_command, skip_reason

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "arm-1"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def arm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    reason = skip_reason("arm64")
    for tool, package in (("grub-mkimage", "grub-common"), ("mkfs.vfat", "dosfstools"), ("mcopy", "mtools")):
        if reason is None and shutil.which(tool) is None:
            reason = f"{tool} is not installed (apt-get install {package})"
    if reason:
        pytest.skip(reason)
    with Lab(tmp_path_factory.mktemp("lab-arm64"), ensure_ramdisk(arch="arm64")) as lab:
        yield lab


@pytest.fixture(scope="module")
def disks(arm_lab: Lab) -> list[Disk]:
    return arm_lab.standard_disks(NODE, size=224 * MiB)  # the image with its ESP: 162 MiB


@pytest.fixture(scope="module")
def node(arm_lab: Lab, disks: list[Disk]) -> Iterator[Machine]:
    machine = arm_lab.boot(NODE, disks=disks, pxe=True)
    arm_lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
    yield machine
    machine.stop()


@pytest.fixture(scope="module")
def image(arm_lab: Lab) -> NodeImage:
    img = build_node_image(arm_lab, NODE, arm_lab.workdir / "node-image", esp=True)
    os.link(img.zst, arm_lab.www / "node.img.zst")
    return img


def test_arm64_node_joins_under_uefi_and_reports_an_aarch64_machine(arm_lab: Lab, node: Machine,
                                                                      disks: list[Disk]) -> None:
    rec = arm_lab.gateway.nodes[NODE]
    assert rec.hello.role == "ramdisk"
    assert "-machine virt" in " ".join(node.argv())
    # Network boot: the firmware's PXE ran GRUB, which fetched both files over HTTP.
    assert node.pxe_served[:2] == ["GET /vmlinuz 200", "GET /initrd.img 200"], node.pxe_served
    assert "UEFI PXEv4" in node.console()
    status, out = node.shell("uname -m; ls /sys/firmware/efi >/dev/null && echo efi")
    assert status == 0 and "aarch64" in out and "efi" in out, out
    _, _, result = run_command(arm_lab, node, NODE, "inventory.refresh", {})
    inv = result.inventory
    assert inv.cpu.architecture == "aarch64", inv.cpu
    assert inv.cpu.threads == 2, inv.cpu
    assert 900 * MiB < inv.memory.total_bytes <= 1024 * MiB, inv.memory
    assert inv.system.boot_mode == "efi", inv.system
    by_serial = {d.identity.serial: d.identity for d in inv.disks}
    for disk in disks:
        assert disk.serial in by_serial, f"{disk.serial} missing from {sorted(by_serial)}"
        assert by_serial[disk.serial].size_bytes == disk.size
    assert by_serial[disks[0].serial].transport == "nvme"
    assert by_serial[disks[2].serial].transport == "virtio"


def test_arm64_deploy_image_by_serial_then_kexec_rejoins(arm_lab: Lab, node: Machine, disks: list[Disk],
                                                         image: NodeImage) -> None:
    payload = {"url": arm_lab.url("node.img.zst"), "format": "ZSTD",
               "digest": {"algorithm": "sha256", "hex": image.zst_sha256},
               "target": {"serial": disks[0].serial}, "verify_readback": True}
    _, _, deployed = run_command(arm_lab, node, NODE, "deploy.image", payload)
    assert deployed.disk.serial == disks[0].serial
    with disks[0].path.open("rb") as f:
        assert hashlib.sha256(f.read(deployed.image_bytes)).hexdigest() == image.raw_sha256

    old = arm_lab.gateway.nodes[NODE]
    old_boot, sessions = old.boot_id, old.sessions


    # Debian's arm64 cloud kernel is built without kexec_file_load (CONFIG_KEXEC_FILE is not
    # set; the amd64 one has it): the syscall is ENOSYS, and the agent falls back by itself to
    # kexec-tools' kexec_load (the ramdisk has it), without allow_kexec_tools, and says so.
    payload = image.kexec_payload(disks[0].serial, allow_kexec_tools=False)
    cid = arm_lab.gateway.send(NODE, "boot.kexec", payload)
    try:
        rec = arm_lab.gateway.wait(cid, COMMAND_TIMEOUT)
    except TimeoutError:
        raise node.fail("boot.kexec did not complete") from None
    assert rec.state is State.COMPLETED, \
        f"{rec.state}: {arm_lab.gateway.events_for(cid)}\n{node.console_tail()}"
    new = arm_lab.gateway.nodes[NODE]
    assert new.sessions > sessions
    assert new.hello.role == "node"
    assert new.boot_id and new.boot_id != old_boot
    assert rec.completion is not None and rec.completion.ok
    assert rec.interim_result is not None
    loaded = agent_pb2.KexecResult.FromString(rec.interim_result.payload)
    assert loaded.method == "kexec-tools", loaded
    assert "console=ttyAMA0" in image.kexec_cmdline()


def test_arm64_deployed_disk_boots_by_uefi_from_its_esp(arm_lab: Lab, node: Machine,
                                                        disks: list[Disk]) -> None:
    # Power off the kexec'd node; power on with the firmware booting the deployed disk:
    # systemd-boot (EFI/BOOT/BOOTAA64.EFI) starts the node's Image, and the node rejoins.
    sessions = arm_lab.gateway.nodes[NODE].sessions
    node.stop()
    again = arm_lab.boot(NODE, disks=disks, disk_boot=True, kernel=node.spec.kernel, initrd=node.spec.initrd,
                         append="")
    assert "-kernel" not in again.argv()
    arm_lab.wait_joined(again, NODE, JOIN_TIMEOUT, sessions=sessions + 1)
    assert arm_lab.gateway.nodes[NODE].hello.role == "node"
    again.wait_console(r"node root .* mounted on /sysroot", 30)
    _, _, result = run_command(arm_lab, again, NODE, "inventory.refresh", {})
    assert result.inventory.system.boot_mode == "efi", result.inventory.system
    assert result.inventory.cpu.architecture == "aarch64"
    again.stop()
