"""A bootable "installed node" disk image for deploy.image, boot.kexec and node.reboot tests.

The image is a GPT disk with one ext4 partition (label ``bcroot``) holding:

    /boot/vmlinuz, /boot/initrd.img     the kernel, and the ramdisk userland as its initramfs
    /opt/bettercompute/agent.pyz         the agent, run in the node role
    /etc/bettercompute/agent.conf        its settings (JSON), state on the disk
    /etc/bettercompute/ca.pem, signing.pub
    /var/lib/bettercompute-agent/        the node agent's journal and key (survive a reboot)

Booted with ``bc.root=LABEL=bcroot`` on its command line, the initramfs' /init mounts the
partition on /sysroot and runs the agent from there (see initramfs/init.sh). Built without
mounting anything: sfdisk writes the table, mkfs.ext4 -d fills the filesystem at its offset.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run
from initramfs import build as ramdisk
from initramfs import cpio
from qemu.harness import kernel_args
from qemu.lab import GATEWAY_PORT, GUEST_HOST, Lab

LABEL = "bcroot"
SECTOR = 512
START_SECTOR = 2048                  # 1 MiB
FS_BYTES = 96 * 1024 * 1024
ROOT = "/sysroot"                    # where /init mounts the partition


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
    (tree / "opt/bettercompute").mkdir(parents=True)
    shutil.copyfile(lab.ramdisk.agent, tree / "opt/bettercompute/agent.pyz")
    etc = tree / "etc/bettercompute"
    etc.mkdir(parents=True)
    shutil.copyfile(lab.pki.ca, etc / "ca.pem")
    shutil.copyfile(lab.pki.signing_pub, etc / "signing.pub")
    state = tree / "var/lib/bettercompute-agent"
    state.mkdir(parents=True)
    state.chmod(0o700)
    conf = {
        "role": "node",
        "node_id": node_id,
        "gateway": f"{GUEST_HOST}:{GATEWAY_PORT}",
        "enrollment_token": lab.token_for(node_id),
        "ca_bundle": f"{ROOT}/etc/bettercompute/ca.pem",
        "trusted_keys": [f"{ROOT}/etc/bettercompute/signing.pub"],
        "state_dir": f"{ROOT}/var/lib/bettercompute-agent",
        "reconnect_min_seconds": 0.5,
        "reconnect_max_seconds": 3,
    }
    (etc / "agent.conf").write_text(json.dumps(conf, indent=1) + "\n")

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
