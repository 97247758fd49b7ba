"""A bootable "installed node" disk image for deploy.image, boot.kexec and node.reboot tests.

The image is a GPT disk with one ext4 partition (label ``bcroot``) holding:

    /boot/vmlinuz, /boot/initrd.img     the kernel, and the ramdisk userland as its initramfs
    what `agent install --root` writes  /usr/lib/bettercompute/{agent.pyz,launcher.py},
                                         /etc/bettercompute/agent.json (role node), the systemd
                                         unit, /var/lib/bettercompute-agent/ (journal, node key)
    /etc/bettercompute/ca.pem, signing.pub

Booted with ``bc.root=LABEL=bcroot`` on its command line, the initramfs' /init mounts the
partition, binds those directories into place and runs the launcher as the unit would (see
initramfs/init.sh): the ramdisk's userland stands in for a full OS. Built without mounting
anything: sfdisk writes the table, mkfs.ext4 -d fills the filesystem at its offset.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run
from initramfs import build as ramdisk
from initramfs import cpio
from qemu.harness import GUEST_HOST, kernel_args
from qemu.lab import GATEWAY_PORT, Lab

LABEL = "bcroot"
SECTOR = 512
START_SECTOR = 2048                  # 1 MiB
FS_BYTES = 96 * 1024 * 1024
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class NodeImage:
    raw: Path                # the disk image
    zst: Path                # the same, zstd-compressed (what deploy.image downloads)
    raw_sha256: str
    zst_sha256: str
    kernel: Path
    initrd: Path
    kernel_sha256: str
    initrd_sha256: str

    def kexec_cmdline(self) -> str:
        return node_cmdline()


def node_cmdline() -> str:
    """The installed node's kernel command line (its settings are in agent.conf)."""
    return kernel_args(root=f"LABEL={LABEL}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_node_image(lab: Lab, node_id: str, out: Path) -> NodeImage:
    """The image of an installed node ``node_id`` that dials ``lab``'s gateway."""
    out.mkdir(parents=True, exist_ok=True)
    tree = out / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    boot = tree / "boot"
    boot.mkdir(parents=True)
    shutil.copyfile(lab.ramdisk.kernel, boot / "vmlinuz")
    # The node's initramfs: the ramdisk userland with /init (the agent comes from the disk).
    initrd = lab.ramdisk.base.read_bytes() + ramdisk.compress(
        cpio.archive(ramdisk.top_entries(lab.ramdisk.agent)), 3)
    (boot / "initrd.img").write_bytes(initrd)
    etc = tree / "etc/bettercompute"
    etc.mkdir(parents=True)
    shutil.copyfile(lab.pki.ca, etc / "ca.pem")
    shutil.copyfile(lab.pki.signing_pub, etc / "signing.pub")
    run([sys.executable, "-m", "agent", "install", "--root", str(tree), "--no-enable",
         "--archive", str(lab.ramdisk.agent), "--node", node_id,
         "--gateway", f"{GUEST_HOST}:{GATEWAY_PORT}", f"--token={lab.token_for(node_id)}",
         "--ca", "/etc/bettercompute/ca.pem", "--trusted-key", "/etc/bettercompute/signing.pub",
         "--reconnect-min", "0.5", "--reconnect-max", "3"], cwd=str(REPO), timeout=120)

    raw = out / "node.img"
    raw.unlink(missing_ok=True)
    total = START_SECTOR * SECTOR + FS_BYTES + 1024 * 1024
    with raw.open("wb") as f:
        f.truncate(total)
    table = (f"label: gpt\nstart={START_SECTOR}, size={FS_BYTES // SECTOR}, "
             f"type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name={LABEL}\n")
    run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(raw)], input=table.encode(), timeout=60)
    run(["mkfs.ext4", "-F", "-q", "-L", LABEL, "-d", str(tree), "-E",
         f"offset={START_SECTOR * SECTOR}", str(raw), f"{FS_BYTES // 1024}k"], timeout=120)
    zst = out / "node.img.zst"
    run(["zstd", "-q", "-f", "-T0", "-6", str(raw), "-o", str(zst)], timeout=300)
    kernel, initrd_path = out / "vmlinuz", out / "initrd.img"
    shutil.copyfile(boot / "vmlinuz", kernel)
    shutil.copyfile(boot / "initrd.img", initrd_path)
    shutil.rmtree(tree)
    return NodeImage(raw, zst, sha256(raw), sha256(zst), kernel, initrd_path, sha256(kernel),
                     sha256(initrd_path))
