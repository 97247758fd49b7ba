"""The Debian packages of the ramdisk and its ISO: the architectures they are built for, where
each builds, and a package's .deb downloaded (``apt-get download``) and unpacked (``dpkg-deb
-x``: no maintainer scripts) once. initramfs/build.py (the ramdisk) and initramfs/iso.py (its
ISO's GRUB packages) both use them; so do the QEMU harness's images (qemu/)."""

from __future__ import annotations

import platform
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run

OUT = Path(__file__).resolve().parent / "out"

# Kernel modules loaded by /init, dependencies first (the rest is built into the cloud kernel).
# The NIC's last: /init relies on every other driver being loaded once the network is up.
# efivarfs: the UEFI variables the release gate reads and puts back (docs/lifecycle.md).
MODULES = ("virtio_pci", "virtio_blk", "virtio_rng", "virtio_console", "efivarfs", "virtio_net")


@dataclass(frozen=True)
class Arch:
    """What differs between the ramdisk's architectures (Debian's name is the key)."""
    name: str                    # Debian's: amd64, arm64
    machine: str                 # the kernel's (uname -m): x86_64, aarch64
    triplet: str                 # the multiarch library directory
    loader: str                  # the dynamic loader, in the root
    modules: tuple[str, ...]     # MODULES for this architecture's cloud kernel
    emulator: str                # the qemu-user program that runs the root's programs elsewhere
    gzip_kernel: bool = False    # Debian ships an uncompressed Image: gzip it for the boot files

    @property
    def kernel_glob(self) -> str:
        return f"vmlinuz-*-cloud-{self.name}"

    def native(self) -> bool:
        return platform.machine() == self.machine


ARCHES = {
    "amd64": Arch("amd64", "x86_64", "x86_64-linux-gnu", "/usr/lib64/ld-linux-x86-64.so.2", MODULES,
                  "qemu-x86_64-static"),
    "arm64": Arch("arm64", "aarch64", "aarch64-linux-gnu", "/usr/lib/ld-linux-aarch64.so.1", MODULES,
                  "qemu-aarch64-static", gzip_kernel=True),
}
AMD64 = ARCHES["amd64"]


def out_dir(arch: Arch) -> Path:
    """Where ``arch``'s ramdisk is built by default: x86's in OUT, the others beside it."""
    return OUT if arch is AMD64 else OUT / arch.name


def apt_cache(*args: str) -> list[str]:
    """``apt-cache ARGS`` with apt's binary cache kept in OUT/apt: Debian's container images
    turn it off (``Dir::Cache::pkgcache ""``), and without it every call parses the package
    lists again (~2.4 s of CPU a call, against ~0.6 s; a build makes a dozen). apt itself
    checks the cache against the lists and remakes it when they change."""
    cache = OUT / "apt"
    cache.mkdir(parents=True, exist_ok=True)
    return ["apt-cache", "-o", f"Dir::Cache::pkgcache={cache / 'pkgcache.bin'}",
            "-o", f"Dir::Cache::srcpkgcache={cache / 'srcpkgcache.bin'}", *args]


def run_text(argv: list[str], **kw: object) -> str:
    return run(argv, **kw).stdout.decode()  # type: ignore[arg-type]  # run's keyword arguments, passed on


def download(packages: list[str], dest: Path, arch: Arch = AMD64) -> list[Path]:
    """The .deb of each package, downloaded once into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not _deb(dest, p)]
    if missing:
        print(f"initramfs: downloading {len(missing)} packages", flush=True)
        run(["apt-get", "download", "-q", *qualified(missing, arch)], cwd=str(dest), timeout=900)
    debs = []
    for p in packages:
        deb = _deb(dest, p)
        if deb is None:
            sys.exit(f"initramfs: apt-get download gave no .deb for {p}")
        debs.append(deb)
    return debs


def qualified(packages: list[str], arch: Arch) -> list[str]:
    """``packages`` as apt must be asked for them: NAME:ARCH, but NAME for an ``Architecture:
    all`` package (apt knows no lsb-base:arm64). The host's own architecture: NAME."""
    if arch.native():
        return list(packages)
    text = run_text(apt_cache("show", "--no-all-versions", *packages))
    arch_all = set(re.findall(r"(?m)^Package: (\S+)\n(?:[^\n]+\n)*?Architecture: all$", text))
    return [p if p in arch_all else f"{p}:{arch.name}" for p in packages]


def _deb(dest: Path, package: str) -> Path | None:
    found = sorted(dest.glob(f"{package}_*.deb"))
    return found[-1] if found else None


def unpacked(deb: Path, dest: Path, then: Callable[[Path], None] | None = None) -> Path:
    """``dest``, holding ``deb`` unpacked (``dpkg-deb -x``: no maintainer scripts) once. The
    tree is made beside it, finished by ``then``, stamped with the .deb's name and renamed
    into place: an interrupted unpack or another .deb is unpacked again."""
    stamp = dest / ".deb"
    if stamp.is_file() and stamp.read_text() == deb.name:
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    for stale in (dest, tmp):
        shutil.rmtree(stale, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(deb), str(tmp)], timeout=300)
    if then is not None:
        then(tmp)
    (tmp / ".deb").write_text(deb.name)
    tmp.rename(dest)
    return dest
