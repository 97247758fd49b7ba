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

``esp=True`` (UEFI firmware boots it from the disk): an EFI system partition comes first,
FAT32 filled with mtools (no mount either), with systemd-boot as the removable-media loader
(EFI/BOOT/BOOTX64.EFI or BOOTAA64.EFI: Debian's systemd-boot-efi, installed on x86, its arm64
.deb downloaded and unpacked), one loader entry, and the kernel and initramfs beside it:
systemd-boot reads only FAT. The bcroot partition is the same.

``esp=True, uki=True``: the ESP's removable-media loader is instead a UKI of the same kernel,
initramfs and command line (initramfs/uki.py), alone on the ESP; ``sign`` signs it in place
(Secure Boot: initramfs/signing.py, the fleet's db key), so firmware with Secure Boot on starts
the installed system only when that key is in its db (tests/e2e/test_secure_boot.py).
``NodeImage.loader_authenticode``: the loader's Authenticode digest, what the firmware measures
into PCR 4 when it starts it.

arm64: /boot/vmlinuz is the uncompressed Image (the ramdisk's boot file is gzipped, but
kexec_file_load on arm64 reads only an Image), and the console is ttyAMA0.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.proc import run
from initramfs import build as ramdisk
from initramfs import cpio
from qemu.harness import GUEST_HOST, PLATFORMS, kernel_args
from qemu.lab import GATEWAY_PORT, Lab

LABEL = "bcroot"
SECTOR = 512
START_SECTOR = 2048                  # 1 MiB
FS_BYTES = 96 * 1024 * 1024
ESP_BYTES = 64 * 1024 * 1024         # FAT32's smallest comfortable size, kernel + initramfs fit
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
SYSTEMD_BOOT = Path("/usr/lib/systemd/boot/efi/systemd-bootx64.efi")
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
    arch: str = "amd64"
    esp: bool = False        # an EFI system partition: UEFI firmware boots it from the disk
    loader_authenticode: str = ""   # esp: the ESP's loader's Authenticode SHA-256 (its PCR 4 event)

    def kexec_cmdline(self) -> str:
        return node_cmdline(self.arch)

    def kexec_payload(self, serial: str, *, allow_kexec_tools: bool = True) -> dict[str, Any]:
        """boot.kexec's payload (JSON) into this image deployed on disk ``serial``: its kernel
        and initramfs read from the root partition, their digests, its command line."""
        def part_file(path: str, digest: str) -> dict[str, Any]:
            return {"partition_file": {"disk": {"serial": serial}, "partition_label": LABEL, "path": path},
                    "digest": {"algorithm": "sha256", "hex": digest}}

        return {"kernel": part_file("/boot/vmlinuz", self.kernel_sha256),
                "initrd": part_file("/boot/initrd.img", self.initrd_sha256),
                "cmdline": self.kexec_cmdline(), "allow_kexec_tools": allow_kexec_tools}


def node_cmdline(arch: str = "amd64") -> str:
    """The installed node's kernel command line (its settings are in agent.conf)."""
    return kernel_args(PLATFORMS[arch].console, root=f"LABEL={LABEL}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_node_image(lab: Lab, node_id: str, out: Path, *, esp: bool = False, uki: bool = False,
                     sign: Callable[[Path], object] | None = None, network: bytes = b"") -> NodeImage:
    """The image of an installed node ``node_id`` that dials ``lab``'s gateway; with ``esp``,
    bootable by UEFI firmware from the disk (``uki``: by a UKI on its ESP, which ``sign``
    signs); with ``network``, its static network (the format of the virtual-media config
    medium's: initramfs/init.sh) in /etc/bettercompute/network, for a network without DHCP."""
    if (uki or sign is not None) and not esp:
        raise ValueError("uki, sign: the ESP's loader (esp=True)")
    if sign is not None and not uki:
        raise ValueError("sign: signs the ESP's UKI (uki=True), not systemd-boot")
    out.mkdir(parents=True, exist_ok=True)
    tree = out / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    boot = tree / "boot"
    boot.mkdir(parents=True)
    kernel_bytes = lab.ramdisk.kernel.read_bytes()
    if kernel_bytes[:2] == b"\x1f\x8b":  # arm64's gzipped Image: kexec_file_load wants the Image
        kernel_bytes = gzip.decompress(kernel_bytes)
    (boot / "vmlinuz").write_bytes(kernel_bytes)
    # The node's initramfs: the ramdisk userland with /init (the agent comes from the disk).
    initrd = lab.ramdisk.base.read_bytes() + ramdisk.compress(
        cpio.archive(ramdisk.top_entries(lab.ramdisk.agent)), 3)
    (boot / "initrd.img").write_bytes(initrd)
    etc = tree / "etc/bettercompute"
    etc.mkdir(parents=True)
    shutil.copyfile(lab.pki.ca, etc / "ca.pem")
    shutil.copyfile(lab.pki.signing_pub, etc / "signing.pub")
    if network:
        (etc / "network").write_bytes(network)
    run([sys.executable, "-m", "agent", "install", "--root", str(tree), "--no-enable",
         "--archive", str(lab.ramdisk.agent), "--node", node_id,
         "--gateway", f"{GUEST_HOST}:{GATEWAY_PORT}", f"--token={lab.token_for(node_id)}",
         "--ca", "/etc/bettercompute/ca.pem", "--trusted-key", "/etc/bettercompute/signing.pub",
         "--reconnect-min", "0.5", "--reconnect-max", "3"], cwd=str(REPO), timeout=120)

    raw = out / "node.img"
    raw.unlink(missing_ok=True)
    root_start = START_SECTOR + (ESP_BYTES // SECTOR if esp else 0)
    total = root_start * SECTOR + FS_BYTES + 1024 * 1024
    with raw.open("wb") as f:
        f.truncate(total)
    table = "label: gpt\n"
    if esp:
        table += f"start={START_SECTOR}, size={ESP_BYTES // SECTOR}, type={ESP_TYPE}, name=ESP\n"
    table += (f"start={root_start}, size={FS_BYTES // SECTOR}, "
              f"type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name={LABEL}\n")
    run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(raw)], input=table.encode(), timeout=60)
    loader = ""
    if esp:
        loader = _write_esp(raw, START_SECTOR * SECTOR, boot, lab.ramdisk.arch, uki=uki, sign=sign)
    run(["mkfs.ext4", "-F", "-q", "-L", LABEL, "-d", str(tree), "-E",
         f"offset={root_start * SECTOR}", str(raw), f"{FS_BYTES // 1024}k"], timeout=120)
    zst = out / "node.img.zst"
    run(["zstd", "-q", "-f", "-T0", "-6", str(raw), "-o", str(zst)], timeout=300)
    kernel, initrd_path = out / "vmlinuz", out / "initrd.img"
    shutil.copyfile(boot / "vmlinuz", kernel)
    shutil.copyfile(boot / "initrd.img", initrd_path)
    shutil.rmtree(tree)
    return NodeImage(raw, zst, sha256(raw), sha256(zst), kernel, initrd_path, sha256(kernel),
                     sha256(initrd_path), lab.ramdisk.arch, esp, loader)


def systemd_boot(arch: str) -> tuple[Path, str]:
    """systemd-boot for ``arch`` and its removable-media path on the ESP."""
    if arch == "amd64":
        if not SYSTEMD_BOOT.is_file():
            raise FileNotFoundError(f"{SYSTEMD_BOOT} is missing (apt-get install systemd-boot-efi)")
        return SYSTEMD_BOOT, "BOOTX64.EFI"
    target = ramdisk.ARCHES[arch]
    out = ramdisk.out_dir(target)
    (deb,) = ramdisk.download(["systemd-boot-efi"], out / "debs", target)
    tree = ramdisk.unpacked(deb, out / "systemd-boot")
    return tree / "usr/lib/systemd/boot/efi/systemd-bootaa64.efi", "BOOTAA64.EFI"


def _write_esp(raw: Path, offset: int, boot: Path, arch: str, *, uki: bool = False,
               sign: Callable[[Path], object] | None = None) -> str:
    """An EFI system partition at ``offset`` in ``raw``: systemd-boot, its entry, and the
    kernel and initramfs in ``boot``; with ``uki``, a UKI of them alone (signed by ``sign``).
    Returns the loader's Authenticode SHA-256 (hex)."""
    from initramfs import uki as ukis

    cmdline = node_cmdline(arch)
    esp = raw.with_name("esp.img")
    esp.unlink(missing_ok=True)
    with esp.open("wb") as f:
        f.truncate(ESP_BYTES)
    run(["mkfs.vfat", "-F", "32", "-n", "ESP", str(esp)], timeout=60)
    files = raw.with_name("esp-files")
    shutil.rmtree(files, ignore_errors=True)
    files.mkdir(parents=True)
    img = ["-i", str(esp)]
    loader_name = "BOOTX64.EFI" if arch == "amd64" else "BOOTAA64.EFI"
    if uki:
        loader = files / loader_name
        ukis.build(ukis.find_stub(arch), boot / "vmlinuz", boot / "initrd.img", cmdline, loader)
        if sign is not None:
            sign(loader)
        copies = [(loader, f"::/EFI/BOOT/{loader_name}")]
        run(["mmd", *img, "::/EFI", "::/EFI/BOOT"], timeout=60)
    else:
        loader, loader_name = systemd_boot(arch)
        (files / "entries").mkdir()
        (files / "loader.conf").write_text("default bc.conf\ntimeout 0\n")
        (files / "entries/bc.conf").write_text(
            f"title Better Compute node\nlinux /vmlinuz\ninitrd /initrd.img\noptions {cmdline}\n")
        copies = [(loader, f"::/EFI/BOOT/{loader_name}"),
                  (files / "loader.conf", "::/loader/loader.conf"),
                  (files / "entries/bc.conf", "::/loader/entries/bc.conf"),
                  (boot / "vmlinuz", "::/vmlinuz"), (boot / "initrd.img", "::/initrd.img")]
        run(["mmd", *img, "::/EFI", "::/EFI/BOOT", "::/loader", "::/loader/entries"], timeout=60)
    for src, dest in copies:
        run(["mcopy", *img, str(src), dest], timeout=60)
    digest = ukis.authenticode_sha256(loader.read_bytes()).hex()
    with raw.open("r+b") as out, esp.open("rb") as f:
        out.seek(offset)
        shutil.copyfileobj(f, out, 1 << 20)
    esp.unlink()
    shutil.rmtree(files)
    return digest
