"""Build the ramdisk: a Debian kernel and a zstd-compressed cpio initramfs that runs the agent.

    python -m initramfs.build [--arch amd64|arm64] [--agent dist/agent.pyz] [--out DIR] [--kernel PATH]
                              [--iso [--iso-uki]] [--uki-site http://HOST:PORT]

The userland is assembled from Debian bookworm packages, downloaded with ``apt-get download``
and unpacked with ``dpkg-deb -x`` (no maintainer scripts, no dpkg database: a ramdisk never
installs anything), then pruned hard: documentation, locales, man pages, the parts of the
Python standard library an agent never imports, and the libraries only the dropped parts
needed. A check that every ELF file in it finds its shared libraries keeps the pruning honest.

Cached under initramfs/out/: the .deb files (by name), the pruned root (by a key of the .deb
files, this script, /init and the kernel modules), and the final image. Outputs:

    initramfs/out/vmlinuz          the kernel (a copy of /boot/vmlinuz-*-cloud-amd64)
    initramfs/out/initramfs.img    the ramdisk (cpio, zstd), with dist/agent.pyz inside
    initramfs/out/ramdisk.iso      with --iso: both on a bootable ISO for virtual media (iso.py);
                                   --iso-uki: its UEFI boot starts them as a UKI (ramdisk-iso.efi)
    initramfs/out/ramdisk.efi      with --uki-site: both as a UKI for that site's PXE boot entries
                                   (uki.py; .json beside it: its reference values, for attestation)
                                   arm64: with grubaa64.efi, the site's GRUB that starts it
                                   (netgrub.py; .json: its Authenticode digest, a loader)
    initramfs/out/site-boot/       with --uki-site and the fleet's db key: the site's boot files
                                   signed and pinned (boot-files.json); arm64: bootaa64.efi, the
                                   signed UKI itself, in place of the GRUB (Secure Boot)
    initramfs/out/base.img         the userland alone, without /init and the agent (tests append
                                   their own, see top_entries() and initramfs/cpio.py)

The compressed size of kernel + initramfs is printed (target: at most 30 MB).

``--arch arm64`` builds the ramdisk of arm64 (Grace) servers on any host, into
initramfs/out/arm64/: the same packages for Debian's arm64 (``dpkg --add-architecture arm64``,
``apt-get download``), Debian's arm64 cloud kernel downloaded and unpacked rather than
installed, and what must run in the root at build time (busybox's applet list, the import
probe, compileall, the library check) run by the root's own programs under qemu-user
(``qemu-aarch64-static`` copied into the root for the while and removed). Debian ships the
arm64 kernel as an uncompressed Image (27 MB): out/arm64/vmlinuz is that Image gzipped, which
QEMU, GRUB and U-Boot take; kexec_file_load on arm64 wants the Image itself (qemu/nodeimage.py
puts it uncompressed on the node's disk).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.proc import run
from initramfs import cpio, licences

if TYPE_CHECKING:
    from initramfs import signing

# The packages' side (initramfs/debs.py, shared with iso.py), by the names build.py, qemu/ and
# the tests know them.
from initramfs.debs import AMD64 as AMD64
from initramfs.debs import ARCHES as ARCHES
from initramfs.debs import MODULES as MODULES
from initramfs.debs import OUT as OUT
from initramfs.debs import Arch as Arch
from initramfs.debs import apt_cache
from initramfs.debs import download as download
from initramfs.debs import out_dir as out_dir
from initramfs.debs import qualified as _qualified
from initramfs.debs import run_text as _run
from initramfs.debs import unpacked as unpacked

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD_VERSION = "1"  # bump to invalidate the cached root after a change in the pruning rules
# Held for a whole build (build_lock): one builder of initramfs/out at a time in a tree.
LOCK = OUT / ".build.lock"

# What the ramdisk needs; their dependencies are resolved from the apt cache.
PACKAGES = (
    "python3.11-minimal", "libpython3.11-stdlib",   # the interpreter and its standard library
    # The agent's native dependencies, from Debian: the ramdisk's agent zipapp is built without
    # native wheels (a 4.7 MB wheel against a 1 MB package that shares the system's libcrypto).
    "python3-cryptography", "python3-cffi-backend",
    "busybox",                                     # sh, udhcpc, mount, the small tools
    "util-linux", "fdisk",                         # lsblk, blkdiscard, wipefs, blockdev, sfdisk
    "nvme-cli", "kexec-tools", "e2fsprogs", "zstd", "hdparm",
    # No iproute2: busybox's ip configures the network, and the agent reads links from sysfs.
)
# Never unpacked: package machinery, login/PAM, Perl, and the libraries only those pull in.
EXCLUDE = frozenset({
    "adduser", "cdebconf", "debconf", "dpkg", "install-info", "passwd", "tar", "perl",
    "perl-base", "perl-modules-5.36", "libperl5.36", "libpam-modules", "libpam-modules-bin",
    "libpam0g", "libpam-runtime", "libsemanage2", "libsemanage-common", "libsepol2",
    "libdebian-installer4", "libnewt0.52", "libslang2", "libtextwrap1", "libgdbm6",
    "libgdbm-compat4", "libdb5.3", "mailcap", "mime-support", "media-types", "libelogind0",
    "libaudit1", "libaudit-common", "libcap2-bin", "libnsl2", "libtirpc3", "libtirpc-common",
    "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libkrb5support0", "libkeyutils1",
    "readline-common", "gcc-12-base", "tzdata", "sensible-utils", "dbus",
    "util-linux-extra", "uuid-runtime", "logsave", "libncursesw6", "libstdc++6", "libsqlite3-0",
    "python3", "python3-minimal", "libpython3-stdlib", "python3.11",
})
# Loaded only when booted from virtual media (bc.media= on the ISO's command line): the CD
# drives (virtio-scsi; the cloud kernel has no AHCI) and ISO 9660, for the node's config
# medium (initramfs/iso.py, agent/site/boot/vmedia.py). A PXE boot does not pay for them.
MEDIA_MODULES = ("virtio_scsi", "sr_mod", "isofs")
# The TPM's driver (attestation, docs/attestation.md), loaded by /init before the agent starts,
# which looks for /dev/tpmrm0 once. arm64's cloud kernel has it as modules (tpm_tis and
# tpm_tis_core; the TPM core is built in); x86's has it built in, so its ramdisk gets nothing.
TPM_MODULES = ("tpm_tis",)


# Pruned from the unpacked root (globs relative to it).
PRUNE = (
    "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
    "usr/share/bug", "usr/share/bash-completion", "usr/share/zsh", "usr/share/pixmaps",
    "usr/share/applications", "usr/share/binfmts", "usr/share/menu", "usr/share/python3",
    "usr/share/gcc", "usr/share/gdb", "usr/share/common-licenses", "usr/share/debconf",
    "usr/share/util-linux", "usr/share/initramfs-tools", "usr/share/readline", "usr/lib/valgrind",
    "etc/init.d", "etc/cron.daily", "etc/logrotate.d", "etc/bash_completion.d", "etc/systemd",
    "lib/systemd", "usr/lib/systemd", "usr/lib/udev", "lib/udev", "usr/lib/tmpfiles.d",
    "var/lib/dpkg", "var/cache", "var/log",
    "usr/lib/python3.11/test", "usr/lib/python3.11/idlelib", "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/turtledemo", "usr/lib/python3.11/ensurepip", "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/pydoc_data", "usr/lib/python3.11/distutils", "usr/lib/python3.11/venv",
    "usr/lib/python3.11/unittest", "usr/lib/python3.11/config-3.11-x86_64-linux-gnu",
    "usr/lib/python3.11/turtle.py", "usr/lib/python3.11/pydoc.py", "usr/lib/python3.11/doctest.py",
    "usr/lib/python3.11/lib-dynload/_test*", "usr/lib/python3.11/lib-dynload/_ctypes_test*",
    "usr/lib/python3.11/lib-dynload/xxlimited*", "usr/lib/python3.11/lib-dynload/_xxtestfuzz*",
    "usr/lib/python3.11/lib-dynload/_tkinter*", "usr/lib/python3.11/lib-dynload/_curses*",
    "usr/lib/python3.11/lib-dynload/readline*", "usr/lib/python3.11/lib-dynload/_dbm*",
    "usr/lib/python3.11/lib-dynload/_gdbm*", "usr/lib/python3.11/lib-dynload/nis*",
    "usr/lib/python3.11/lib-dynload/_crypt*", "usr/lib/python3.11/lib-dynload/audioop*",
    "usr/lib/python3.11/curses", "usr/lib/python3.11/dbm", "usr/lib/python3.11/sqlite3/test",
    "usr/lib/python3.11/ctypes/test", "usr/lib/python3.11/email/architecture.rst",
    "usr/lib/python3.11/msilib", "usr/lib/python3.11/wsgiref", "usr/lib/python3.11/xmlrpc",
    "usr/lib/python3.11/lib-dynload/_codecs_*", "usr/lib/python3.11/lib-dynload/_multibytecodec*",
    "usr/lib/python3.11/LICENSE.txt", "usr/lib/python3.11/sitecustomize.py",
    "usr/lib/python3.11/sqlite3", "usr/lib/python3.11/lib-dynload/_sqlite3*",
    "usr/lib/python3.11/asyncio", "usr/lib/python3.11/lib-dynload/_asyncio*",
    "usr/lib/python3.11/xml", "usr/lib/python3.11/lib-dynload/pyexpat*",
    "usr/lib/python3.11/multiprocessing", "usr/lib/python3.11/lib-dynload/_multiprocessing*",
    "usr/lib/python3.11/lib-dynload/_posixshmem*",
    "usr/lib/python3.11/lib-dynload/ossaudiodev*", "usr/lib/python3.11/lib-dynload/_xxsubinterp*",
    "usr/lib/python3.11/lib-dynload/_lsprof*", "usr/lib/python3.11/lib-dynload/_decimal*",
    "usr/lib/x86_64-linux-gnu/libmvec*", "usr/bin/lslogins", "usr/bin/ss", "usr/sbin/tc",
    "usr/lib/x86_64-linux-gnu/tc", "usr/sbin/arpd", "usr/sbin/sulogin", "usr/bin/lsns",
    "usr/lib/x86_64-linux-gnu/libxenlight*", "usr/lib/x86_64-linux-gnu/libxlutil*",
    "usr/lib/x86_64-linux-gnu/libxenguest*", "usr/lib/x86_64-linux-gnu/libxenstat*",
    "usr/lib/x86_64-linux-gnu/kexec-tools", "usr/lib/x86_64-linux-gnu/xen*",
    # Tools the agent never runs from these packages.
    "usr/bin/nsenter", "usr/bin/unshare", "usr/bin/setarch", "usr/bin/script*", "usr/bin/su*",
    "usr/bin/chfn", "usr/bin/chsh", "usr/bin/newgrp", "usr/sbin/runuser", "sbin/runuser",
    "usr/bin/zstdgrep", "usr/bin/zstdless", "usr/bin/pzstd", "usr/sbin/mkfs.minix",
    "usr/sbin/fsck.minix", "sbin/mkfs.minix", "sbin/fsck.minix", "usr/sbin/cfdisk", "sbin/cfdisk",
    "usr/sbin/e2scrub*", "sbin/e2scrub*", "usr/lib/e2fsprogs", "usr/sbin/vmcore-dmesg",
    "usr/sbin/bridge", "sbin/bridge", "usr/sbin/dcb", "sbin/dcb", "usr/sbin/devlink",
    "sbin/devlink", "usr/sbin/rdma", "sbin/rdma", "usr/sbin/tipc", "sbin/tipc", "usr/sbin/vdpa",
    "sbin/vdpa", "usr/lib/x86_64-linux-gnu/gconv", "usr/share/zoneinfo",
    "usr/sbin/debugfs", "sbin/debugfs", "usr/sbin/e2image", "sbin/e2image", "usr/sbin/e4defrag",
    "usr/sbin/e4crypt", "sbin/e4crypt", "usr/sbin/badblocks", "sbin/badblocks",
    "usr/bin/pg", "usr/bin/more", "usr/bin/hexdump", "usr/bin/lslocks", "usr/bin/lsipc",
    "usr/bin/lsirq", "usr/bin/irqtop", "usr/bin/wall", "usr/bin/mesg", "usr/bin/ipcs",
    "usr/bin/ipcmk", "usr/bin/ipcrm", "usr/bin/choom", "usr/bin/uclampset", "usr/bin/fincore",
    "usr/sbin/zramctl", "sbin/zramctl", "usr/sbin/swaplabel", "sbin/swaplabel",
    "usr/sbin/ctrlaltdel", "sbin/ctrlaltdel", "usr/sbin/fsfreeze", "usr/sbin/isosize",
    "usr/sbin/chcpu", "sbin/chcpu", "usr/sbin/readprofile", "usr/sbin/ldattach",
    "usr/sbin/rtcwake", "usr/bin/setterm", "usr/bin/utmpdump", "usr/bin/last*",
    "etc/iproute2/*", "usr/lib/x86_64-linux-gnu/audit", "lib/x86_64-linux-gnu/security",
)


# The text codecs kept (the rest are legacy code pages and CJK tables nothing here reads).
KEEP_CODECS = frozenset({
    "__init__", "aliases", "ascii", "latin_1", "utf_8", "utf_8_sig", "utf_16", "utf_16_le",
    "utf_16_be", "utf_32", "utf_32_le", "utf_32_be", "idna", "punycode", "raw_unicode_escape",
    "unicode_escape", "charmap", "cp437", "cp1252", "iso8859_1", "iso8859_15", "base64_codec",
    "hex_codec", "zlib_codec", "bz2_codec", "quopri_codec", "uu_codec", "rot_13", "undefined",
})


# ---------------------------------------------------------------------------------------------
# Packages


def ensure_apt_lists(arch: Arch = AMD64) -> None:
    """``apt-get update`` once when the package lists do not know the interpreter (a fresh
    machine, or one whose lists were cleaned), after adding ``arch`` to dpkg's architectures
    when it is a foreign one (for ``apt-get download`` only: nothing is installed)."""
    probe = apt_cache("show", "--no-all-versions", f"{PACKAGES[0]}:{arch.name}")
    if run(probe, check=False, timeout=120).returncode != 0:
        native = _run(["dpkg", "--print-architecture"]).strip()
        if arch.name != native and arch.name not in _run(["dpkg", "--print-foreign-architectures"]).split():
            print(f"initramfs: dpkg --add-architecture {arch.name}", flush=True)
            run(["dpkg", "--add-architecture", arch.name], timeout=60)
        print("initramfs: apt-get update (the package lists are missing)", flush=True)
        run(["apt-get", "update", "-q"], timeout=900)


def resolve(roots: Iterable[str], exclude: frozenset[str] = EXCLUDE, arch: Arch = AMD64) -> list[str]:
    """The packages ``roots`` need (Depends and Pre-Depends, first fitting alternative)."""
    ensure_apt_lists(arch)
    wanted: set[str] = set()
    todo = [p for p in roots if p not in exclude]
    while todo:
        batch = sorted(set(todo) - wanted)
        todo = []
        if not batch:
            break
        wanted.update(batch)
        text = _run(apt_cache("depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                               "--no-breaks", "--no-replaces", "--no-enhances", *_qualified(batch, arch)))
        for group in _dependency_groups(text):
            if any(alt in wanted or alt in todo for alt in group):
                continue
            choice = next((alt for alt in group if alt not in exclude), None)
            if choice is not None:
                todo.append(choice)
    return sorted(wanted)


def _dependency_groups(text: str) -> list[list[str]]:
    """``apt-cache depends`` output -> one list of alternatives per dependency (virtual ones
    replaced by their providers)."""
    groups: list[list[str]] = []
    current: list[str] = []
    virtual = False
    for line in text.splitlines():
        m = re.match(r"^ (\|| )(PreDepends|Depends): (.*)$", line)
        if m:
            name = m.group(3).strip()
            virtual = name.startswith("<")
            if not virtual:
                current.append(name.split(":")[0])
            if m.group(1) != "|":
                groups.append(current)
                current = []
            continue
        if virtual and line.startswith("    "):
            # A provider of the virtual package just named; it joins the last group.
            target = groups[-1] if groups and not current else current
            target.append(line.strip().split(":")[0])
            continue
        virtual = False
    return [g for g in groups if g]


# ---------------------------------------------------------------------------------------------
# Kernel


@dataclass(frozen=True)
class Kernel:
    image: Path
    release: str
    root: Path = Path("/")   # where its /lib/modules is: / for the installed one

    @property
    def modules(self) -> Path:
        return self.root / "lib/modules" / self.release


def find_kernel(path: Path | None = None, arch: Arch = AMD64, out: Path = OUT) -> Kernel:
    """The Debian cloud kernel (the newest installed one unless ``path`` names one). For a
    foreign architecture: Debian's current one, downloaded and unpacked under ``out``."""
    if path is None and not arch.native():
        return unpack_kernel(arch, out)
    if path is None:
        found = sorted(Path("/boot").glob(arch.kernel_glob), key=_release_key)
        if not found:
            sys.exit(f"initramfs: no /boot/{arch.kernel_glob}; apt-get install linux-image-cloud-{arch.name}")
        path = found[-1]
    release = path.name.removeprefix("vmlinuz-")
    root = path.parent.parent if path.parent.name == "boot" and path.parent != Path("/boot") else Path("/")
    if not (root / "lib/modules" / release).is_dir():
        sys.exit(f"initramfs: {root}/lib/modules/{release} is missing for {path}")
    return Kernel(path, release, root)


def unpack_kernel(arch: Arch, out: Path) -> Kernel:
    """Debian's cloud kernel for ``arch`` (linux-image-cloud-ARCH's dependency), its .deb
    downloaded and unpacked (``dpkg-deb -x``) into ``out``/kernel once."""
    ensure_apt_lists(arch)
    meta = f"linux-image-cloud-{arch.name}"
    groups = _dependency_groups(_run(apt_cache("depends", "--no-recommends", "--no-suggests",
                                                f"{meta}:{arch.name}")))
    image = next((p for g in groups for p in g if p.startswith("linux-image-")), None)
    if image is None:
        sys.exit(f"initramfs: apt-cache finds no kernel package that {meta}:{arch.name} depends on")
    (deb,) = download([image], out / "debs", arch)

    def depmod(tree: Path) -> None:  # modules.dep: made by depmod at install
        for modules in (tree / "lib/modules").iterdir():
            run(["depmod", "-b", str(tree), modules.name], timeout=300)

    dest = unpacked(deb, out / "kernel", then=depmod)
    found = sorted((dest / "boot").glob(arch.kernel_glob), key=_release_key)
    if not found:
        sys.exit(f"initramfs: {deb.name} holds no boot/{arch.kernel_glob}")
    return find_kernel(found[-1], arch, out)


def _release_key(path: Path) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", path.name)]


def module_files(kernel: Kernel, names: Iterable[str] = MODULES) -> list[str]:
    """Paths (relative to /lib/modules/RELEASE) of ``names`` and what they depend on, in load
    order. Modules built into the kernel are skipped."""
    deps: dict[str, list[str]] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
    by_name = {Path(m).name.split(".ko")[0].replace("-", "_"): m for m in deps}
    order: list[str] = []

    def visit(mod: str) -> None:
        for dep in reversed(deps[mod]):
            visit(dep)
        if mod not in order:
            order.append(mod)

    for name in names:
        if name in by_name:
            visit(by_name[name])
    return order


# ---------------------------------------------------------------------------------------------
# The root


def build_root(debs: list[Path], kernel: Kernel, dest: Path, agent: Path | None, arch: Arch = AMD64) -> None:
    """Unpack, prune and complete the root in ``dest`` (built in a sibling, renamed at the end)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for deb in debs:
        run(["dpkg-deb", "-x", str(deb), str(tmp)], timeout=300)
    _merge_usr(tmp)
    # The copyright files, kept compressed in usr/share/licenses before the docs are pruned.
    licences.install_copyrights(tmp, [d.name.split("_")[0] for d in debs],
                                lambda name: download([name], debs[0].parent)[0],
                                licences.kernel_copyright(kernel.image))
    for pattern in PRUNE:
        # PRUNE names x86's multiarch directories; the same files under the target's.
        for path in tmp.glob(pattern.replace("x86_64-linux-gnu", arch.triplet)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for codec in (tmp / "usr/lib/python3.11/encodings").glob("*.py"):
        if codec.stem not in KEEP_CODECS:
            codec.unlink()
    for cache in list(tmp.rglob("__pycache__")):
        shutil.rmtree(cache)
    for d in ("proc", "sys", "dev", "run", "tmp", "root", "sysroot", "etc/bettercompute",
              "usr/lib/bettercompute", "var/lib", "mnt"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "tmp").chmod(0o1777)
    (tmp / "root").chmod(0o700)
    _busybox_links(tmp, arch)
    (tmp / "usr/bin/python3").unlink(missing_ok=True)
    (tmp / "usr/bin/python3").symlink_to("python3.11")
    _install(tmp / "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
    _install(tmp / "etc/group", b"root:x:0:\n", 0o644)
    _install(tmp / "etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644)
    _install(tmp / "etc/hosts", b"127.0.0.1 localhost\n", 0o644)
    _install(tmp / "etc/os-release", b'NAME="Better Compute ramdisk"\nID=bc-ramdisk\nID_LIKE=debian\n',
             0o644)
    _compile_imported(tmp, agent, arch)
    install_modules(kernel, tmp, arch)
    missing = check_libraries(tmp, arch)
    if missing:
        sys.exit("initramfs: pruned too much, missing shared libraries:\n  " + "\n  ".join(missing))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def install_modules(kernel: Kernel, root: Path, arch: Arch = AMD64) -> None:
    """``kernel``'s modules that /init loads, copied into ``root``, and their lists in load
    order: ``modules`` (in the background, the NIC's last), ``modules.media`` (virtual media
    only) and, where the TPM's driver is a module, ``modules.tpm`` (before the agent)."""
    mods = module_files(kernel, arch.modules)
    media = [m for m in module_files(kernel, MEDIA_MODULES) if m not in mods]
    tpm = [m for m in module_files(kernel, TPM_MODULES) if m not in mods]
    for mod in [*mods, *media, *tpm]:
        target = root / "lib/modules" / mod
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kernel.modules / mod, target)
    # /usr/share/bettercompute: the ramdisk's own files, outside the directories /init binds
    # from an installed node's disk (etc/bettercompute among them) while DHCP may still run.
    lists = {"modules": mods, "modules.media": media, "modules.tpm": tpm}
    for name, listed in lists.items():
        if listed or name != "modules.tpm":  # no TPM list where the driver is built in (x86)
            _install(root / "usr/share/bettercompute" / name, "".join(f"{m}\n" for m in listed).encode(),
                     0o644)


def _merge_usr(root: Path) -> None:
    """bookworm's packages still ship some files in /bin, /sbin, /lib: fold them into /usr and
    link the top-level names, as a merged-/usr system does."""
    for top in ("bin", "sbin", "lib", "lib64"):
        src = root / top
        dst = root / "usr" / top
        if src.is_dir() and not src.is_symlink():
            dst.mkdir(parents=True, exist_ok=True)
            for item in src.rglob("*"):
                rel = item.relative_to(src)
                target = dst / rel
                if item.is_dir() and not item.is_symlink():
                    target.mkdir(parents=True, exist_ok=True)
                elif not target.exists() and not target.is_symlink():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(item, target)
            shutil.rmtree(src)
        if not src.exists():
            dst.mkdir(parents=True, exist_ok=True)
            src.symlink_to(f"usr/{top}")


IMPORT_PROBE = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/_vendor"]
import importlib, pkgutil
import agent.cli, agent.cli.app, agent.cli.settings, agent.runtime.core, agent.link.session
import agent.commands, agent.hw
import cryptography.hazmat.primitives.asymmetric.ed25519, cryptography.x509, ssl, json, http.client
import encodings.idna  # host names on the way to getaddrinfo and TLS
import encodings.utf_16_le  # GPT partition names
import pynvml  # imported where NVML is used (and it imports ctypes.util)
for pkg in (agent.commands, agent.hw):  # handlers are imported on first use: import them all here
    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        try:
            importlib.import_module(m.name)
        except Exception:
            pass
for name in list(sys.modules):
    f = getattr(sys.modules[name], "__file__", None) or ""
    if f.startswith(("/usr/lib/python3.11/", "/usr/lib/python3/")) and f.endswith(".py"):
        print(f)
"""


def _compile_imported(root: Path, agent: Path | None, arch: Arch = AMD64) -> None:
    """Bytecode for the standard library modules (and Debian's cryptography) the agent imports,
    compiled by the ramdisk's own interpreter: without it every boot compiles them again, which
    is slow under emulation. Only those: all of the standard library would cost ~2.5 MB."""
    if agent is None:
        return
    shutil.copyfile(agent, root / "tmp/probe.pyz")
    try:
        # -B: the probe's imports must not leave bytecode behind. Timestamp-checked .pyc files
        # that compileall then took as up to date went stale in the archive (its entries
        # have fixed mtimes), and every boot compiled them again: argparse, typing, inspect,
        # logging and ~20 more, 2.4-2.9 s of the join under emulation.
        files = _guest_python(root, ["-B", "-c", IMPORT_PROBE, "/tmp/probe.pyz"], arch)
    finally:
        (root / "tmp/probe.pyz").unlink()
    with in_root(root, arch) as argv:
        run([*argv, "/usr/bin/python3.11", "-I", "-B", "-m", "compileall", "-q", "-f",
             "--invalidation-mode", "unchecked-hash", "-i", "-"], input=files.encode(), timeout=1800)
    stale = checked_bytecode(root)
    if stale:
        sys.exit("initramfs: bytecode that the ramdisk would compile again at every boot:\n  "
                 + "\n  ".join(stale))


def checked_bytecode(root: Path) -> list[str]:
    """The .pyc files under ``root`` that Python checks against their source: in the archive
    every source has the same fixed mtime, so a timestamp-based .pyc never matches and the
    module is compiled again at every boot. Only unchecked hash-based ones pass."""
    stale = []
    for pyc in sorted(root.glob("usr/lib/python3*/**/__pycache__/*.pyc")):
        with pyc.open("rb") as f:
            header = f.read(8)
        if len(header) < 8 or int.from_bytes(header[4:8], "little") != 0b01:  # hash-based, unchecked
            stale.append(str(pyc.relative_to(root)))
    return stale


def _guest_python(root: Path, args: list[str], arch: Arch = AMD64) -> str:
    """Run the root's python3.11 (in a chroot: we are root wherever images are built)."""
    if os.geteuid() != 0:
        sys.exit("initramfs: building the ramdisk needs root (chroot to compile its bytecode)")
    with in_root(root, arch) as argv:
        return _run([*argv, "/usr/bin/python3.11", "-I", *args], timeout=1800)


@contextlib.contextmanager
def in_root(root: Path, arch: Arch) -> Iterator[list[str]]:
    """The argv prefix that runs one of the root's programs in a chroot: on a host of another
    architecture through qemu-user, whose static binary is copied into the root for the while
    (no binfmt_misc needed, which containers often lack)."""
    if arch.native():
        yield ["chroot", str(root)]
        return
    emulator = shutil.which(arch.emulator)
    if emulator is None:
        sys.exit(f"initramfs: {arch.emulator} is missing (apt-get install qemu-user-static): "
                 f"it runs the {arch.name} root's programs at build time")
    inside = root / "usr/bin" / arch.emulator
    shutil.copyfile(emulator, inside)
    inside.chmod(0o755)
    try:
        yield ["chroot", str(root), f"/usr/bin/{arch.emulator}"]
    finally:
        inside.unlink(missing_ok=True)


def precompile_agent(root: Path, agent: Path, out: Path, arch: Arch = AMD64) -> Path:
    """``agent`` with bytecode added (initramfs/pyc.py run by the root's python), cached by
    the agent's digest."""
    digest = hashlib.sha256(agent.read_bytes()).hexdigest()[:16]
    target = out / f"agent-{digest}.pyz"
    if target.is_file():
        return target
    work = root / "tmp"
    shutil.copyfile(HERE / "pyc.py", work / "pyc.py")
    shutil.copyfile(agent, work / "in.pyz")
    try:
        _guest_python(root, ["/tmp/pyc.py", "/tmp/in.pyz", "/tmp/out.pyz"], arch)
        for old in out.glob("agent-*.pyz"):
            old.unlink()
        shutil.move(work / "out.pyz", target)
    finally:
        for name in ("pyc.py", "in.pyz", "out.pyz"):
            (work / name).unlink(missing_ok=True)
    return target


# Applets left out. modprobe: the ramdisk has no modules.dep (/init loads its few modules by
# path), so it could only fail, yet the kernel runs it for every module request, and at boot
# those requests (the CTR-KDF self-test's "crypto-hmac(sha256)", IPv6's) wait for the root's
# unpacking and then for busybox to start and fail: ~0.4 s before /init under emulation.
# Without the program the kernel's requests fail at once.
NO_APPLETS = frozenset({"modprobe"})


def _busybox_links(root: Path, arch: Arch = AMD64) -> None:
    """A link for every busybox applet that no unpacked package provides (but NO_APPLETS)."""
    if arch.native():
        applets = _run([str(root / "usr/bin/busybox"), "--list-full"]).split()
    else:
        with in_root(root, arch) as argv:
            applets = _run([*argv, "/usr/bin/busybox", "--list-full"]).split()
    for applet in applets:
        name = Path(applet).name
        if name in NO_APPLETS or any((root / d / name).exists() or (root / d / name).is_symlink()
               for d in ("usr/bin", "usr/sbin")):
            continue
        link = root / "usr" / ("sbin" if "sbin" in applet else "bin") / name
        link.symlink_to("/usr/bin/busybox")


def _install(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def check_libraries(root: Path, arch: Arch = AMD64) -> list[str]:
    """Each ELF file's shared libraries that the root lacks ("FILE: libfoo.so.1")."""
    if os.geteuid() != 0:
        print("initramfs: not root, skipping the shared library check", file=sys.stderr)
        return []
    with in_root(root, arch) as argv:
        return _check_libraries(root, [*argv, arch.loader, "--list"], arch)


def _check_libraries(root: Path, list_argv: list[str], arch: Arch) -> list[str]:
    missing = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        if path.suffix == ".ko" or path.name == arch.emulator:
            continue
        rel = "/" + path.relative_to(root).as_posix()
        done = subprocess.run([*list_argv, rel],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 and "not a dynamic executable" not in done.stderr + done.stdout:
            missing.append(f"{rel}: {done.stderr.strip() or done.stdout.strip()}")
    return missing


# ---------------------------------------------------------------------------------------------
# The image


def compress(data: bytes, level: int = 19) -> bytes:
    return run(["zstd", f"-{level}", "-T0", "-q", "-c", "--no-progress"], input=data, timeout=900).stdout


def top_entries(agent: Path) -> list[cpio.Entry]:
    """What changes most often (the agent, /init), archived apart from the cached base."""
    return [
        cpio.file("init", (HERE / "init.sh").read_bytes(), 0o755),
        cpio.file("usr/share/bettercompute/udhcpc.script", (HERE / "udhcpc.script").read_bytes(), 0o755),
        cpio.file("usr/lib/bettercompute/agent.pyz", agent.read_bytes(), 0o644),
    ]


def build_agent(out: Path, version: str | None = None) -> Path:
    """The agent zipapp for the ramdisk: this tree, pure-Python dependencies only (the native
    ones come from Debian's python3-cryptography and python3-cffi-backend), without the
    reference gateway (a test and demo tool, run from the host)."""
    argv = [sys.executable, str(ROOT / "build/zipapp.py"), "--arch", "none", "--without-gateway",
            "--out", str(out)]
    if version:
        argv += ["--version", version]
    run(argv, timeout=300)
    return out


def root_key(debs: list[Path], kernel: Kernel, arch: Arch = AMD64) -> str:
    h = hashlib.sha256(BUILD_VERSION.encode())
    if arch is not AMD64:  # x86's key as it was, so that its cached roots stay valid
        h.update(arch.name.encode())
    for deb in debs:
        h.update(deb.name.encode() + b"\0")
    h.update((HERE / "build.py").read_bytes())
    h.update((HERE / "pyc.py").read_bytes())
    h.update((HERE / "licences.py").read_bytes())
    h.update(kernel.release.encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def build_lock(path: Path | None = None) -> Iterator[None]:
    """One builder at a time in this tree: an exclusive flock on ``path`` (default LOCK, under
    initramfs/out) for the whole build, the agent zipapp, the root, the images and the apt cache
    they share (every arch's out is under OUT). A second builder, a developer's ``./dev demo``
    beside a test run, says so and waits for the first to finish rather than writing the same
    files at once. Not reentrant: taken by the entry points (main, qemu/lab.py's
    ensure_ramdisk), never by build() itself. Freed when the process dies, however it dies."""
    path = LOCK if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"initramfs: another build holds {path}: waiting for it", flush=True)
            fcntl.flock(held, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class Built:
    kernel: Path
    initramfs: Path      # with the agent
    agent: Path | None   # the agent zipapp in it, with bytecode
    base: Path           # without it
    root: Path           # the unpacked root, for tests that build images from it


def build(agent: Path | None, out: Path | None = None, kernel_path: Path | None = None,
          extra: dict[str, bytes] | None = None, arch: Arch = AMD64) -> Built:
    """The ramdisk of ``arch`` in ``out`` (cached pieces reused). The caller holds build_lock()."""
    out = out_dir(arch) if out is None else out
    kernel = find_kernel(kernel_path, arch, out)
    packages = resolve(PACKAGES, EXCLUDE, arch)
    debs = download(packages, out / "debs", arch)
    key = root_key(debs, kernel, arch)
    rootfs = out / f"root-{key}"
    if not rootfs.is_dir():
        print(f"initramfs: assembling the {arch.name} root from {len(debs)} packages", flush=True)
        build_root(debs, kernel, rootfs, agent, arch)
        for old in out.glob("root-*"):
            if old != rootfs:
                shutil.rmtree(old, ignore_errors=True)
    entries = [*cpio.tree(rootfs), cpio.chardev("dev/console", 5, 1), cpio.chardev("dev/null", 1, 3, 0o666)]
    base = out / "base.img"
    stamp = out / "base.key"
    if not base.is_file() or not stamp.is_file() or stamp.read_text() != key:
        print("initramfs: compressing", flush=True)
        base.write_bytes(compress(cpio.archive(entries)))
        stamp.write_text(key)
    vmlinuz = out / "vmlinuz"
    release = out / "kernel.release"
    if arch.gzip_kernel:
        if not vmlinuz.is_file() or not release.is_file() or release.read_text().strip() != kernel.release:
            vmlinuz.write_bytes(gzip.compress(kernel.image.read_bytes(), 9, mtime=0))
    elif not vmlinuz.is_file() or vmlinuz.read_bytes() != kernel.image.read_bytes():
        shutil.copyfile(kernel.image, vmlinuz)
    release.write_text(kernel.release + "\n")
    image = out / "initramfs.img"
    if agent is not None:
        agent = precompile_agent(rootfs, agent, out, arch)
        # /init and the agent go in their own archive appended to the base (the kernel unpacks
        # concatenated archives in order), so a new agent does not recompress the base.
        site = [cpio.file(dest, data, 0o644) for dest, data in sorted((extra or {}).items())]
        bom = licences.image_sbom(debs, kernel.image, agent, rootfs, key)
        top = [*top_entries(agent), cpio.file(licences.SBOM, bom, 0o644)]
        image.write_bytes(base.read_bytes() + compress(cpio.archive(top + site), 3))
        image.with_name(image.name + ".cdx.json").write_bytes(bom)  # and beside it
    return Built(vmlinuz, image, agent, base, rootfs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m initramfs.build", description=__doc__.split("\n")[0])
    parser.add_argument("--agent", type=Path,
                        help="the agent zipapp to put in the ramdisk (default: built from this tree "
                        "without native wheels, into OUT/agent.pyz: the ramdisk has Debian's)")
    parser.add_argument("--arch", choices=sorted(ARCHES), default=AMD64.name,
                        help="the target's Debian architecture (default: amd64)")
    parser.add_argument("--out", type=Path, help="the output directory (default: initramfs/out, "
                        "initramfs/out/ARCH for another architecture than amd64)")
    parser.add_argument("--kernel", type=Path, help="the kernel image (default: the newest cloud kernel)")
    parser.add_argument("--iso", action="store_true",
                        help="also make OUT/ramdisk.iso: the kernel and initramfs on a bootable ISO "
                        "for a BMC's virtual media (BIOS and UEFI on amd64, UEFI on arm64; "
                        "initramfs/iso.py)")
    parser.add_argument("--iso-uki", action="store_true",
                        help="with --iso: the ISO's UEFI GRUB chainloads the ramdisk as a UKI "
                        "(OUT/ramdisk-iso.efi and .json), measured for attestation (docs/attestation.md)")
    parser.add_argument("--uki-site", metavar="http://HOST:PORT",
                        help="also make OUT/ramdisk.efi: the ramdisk as a UKI whose nodes fetch "
                        "their settings from this site (docs/site.md), and its reference values")
    parser.add_argument("--add", action="append", default=[], metavar="SRC:DEST",
                        help="put file SRC at DEST in the ramdisk, e.g. the site's gateway CA: "
                        "--add ca.pem:/etc/bettercompute/ca.pem (then boot with bc.ca=that path)")
    parser.add_argument("--db-key", type=Path, metavar="PEM",
                        help="the fleet's Secure Boot db signing key: the UKIs and the site's boot "
                        "files (OUT/site-boot/) are signed with it (initramfs/signing.py, sbsign); "
                        "the ISO's UEFI boot (with --iso-uki) starts the signed UKI itself")
    parser.add_argument("--db-cert", type=Path, metavar="PEM", help="with --db-key: its certificate")
    parser.add_argument("--db-key-passphrase-file", type=Path, metavar="PATH",
                        help="with --db-key: the file that holds an encrypted key's passphrase")
    args = parser.parse_args(argv)
    if args.iso_uki and not args.iso:
        parser.error("--iso-uki needs --iso")
    db_key = None
    if args.db_key or args.db_cert or args.db_key_passphrase_file:
        from initramfs import signing

        if not (args.db_key and args.db_cert):
            parser.error("--db-key and --db-cert go together")
        try:
            db_key = signing.DbKey.load(args.db_key, args.db_cert, args.db_key_passphrase_file)
        except signing.SigningError as exc:
            parser.error(str(exc))
        if args.iso and not args.iso_uki:   # initramfs/iso.py, "Secure Boot"
            parser.error("--db-key with --iso needs --iso-uki: under Secure Boot the ISO's UEFI boot is "
                         "the signed UKI; a kernel and initramfs would be verified by nothing")
    site_cmdline = ""
    if args.uki_site:
        from initramfs import uki

        try:
            site_cmdline = uki.site_cmdline(args.arch, args.uki_site)
        except ValueError as exc:
            parser.error(f"--uki-site: {exc}")
    extra: dict[str, bytes] = {}
    for spec in args.add:
        src, sep, dest = spec.partition(":")
        if not sep or not dest.startswith("/") or ".." in Path(dest).parts:
            parser.error(f"--add {spec}: expected SRC:/absolute/destination")
        extra[dest] = Path(src).read_bytes()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with build_lock():      # the whole build: the agent, the ramdisk, the ISO, the UKI, GRUB
        return _make(args, extra, db_key, site_cmdline)


def _make(args: argparse.Namespace, extra: dict[str, bytes], db_key: signing.DbKey | None,
          site_cmdline: str) -> int:
    """main's build, under build_lock()."""
    arch = ARCHES[args.arch]
    out = args.out or out_dir(arch)
    agent = args.agent or build_agent(out / "agent.pyz")
    built = build(agent, out, args.kernel, extra, arch)
    k, i = built.kernel.stat().st_size, built.initramfs.stat().st_size
    print(f"{built.kernel}: {k / 1e6:.1f} MB")
    print(f"{built.initramfs}: {i / 1e6:.1f} MB (base {built.base.stat().st_size / 1e6:.1f} MB + agent)")
    print(f"kernel + initramfs, compressed: {(k + i) / 1e6:.1f} MB ({k + i} bytes; target <= 30 MB)")
    if args.iso:
        from initramfs import iso

        bom = built.initramfs.with_name(built.initramfs.name + ".cdx.json").read_bytes()
        iso_uki = None
        if args.iso_uki:
            from initramfs import uki

            iso_uki = out / "ramdisk-iso.efi"
            uki.write(uki.find_stub(arch.name), built.kernel, built.initramfs, iso.default_cmdline(arch.name),
                      iso_uki, sign=_signer(db_key))
        target = iso.build_iso(built.kernel, built.initramfs, out / "ramdisk.iso", arch=arch.name,
                               sbom=bom, out=out, uki=iso_uki, db_key=db_key)
        n = target.stat().st_size
        print(f"{target}: {n / 1e6:.1f} MB ({n} bytes; target <= {iso.MAX_ISO_BYTES / 1e6:.0f} MB)")
    if args.uki_site:
        from initramfs import uki

        values = uki.write(uki.find_stub(arch.name), built.kernel, built.initramfs, site_cmdline,
                           out / "ramdisk.efi", sign=_signer(db_key))
        signed = ", signed" if db_key else ""
        print(f"{out / 'ramdisk.efi'}: build {values['build_id']}{signed}, PCR 4 {values['pcr4'][0]} "
              "(its reference values in ramdisk.efi.json)")
        grub = None
        if arch.name == "arm64":
            from initramfs import netgrub

            grub = out / netgrub.NAME
            loader = netgrub.build(args.uki_site, grub, out)
            print(f"{grub}: the site's GRUB for arm64 PXE, Authenticode {loader} "
                  f"(the policy's loaders; {netgrub.NAME}.json)")
        if db_key is not None:
            from initramfs import signing

            # Under Secure Boot arm64 nodes get the signed UKI itself (bootaa64.efi): Debian's
            # GRUB without shim cannot start an image then; the GRUB stays in OUT for sites
            # without Secure Boot.
            arm64_uki = out / "ramdisk.efi" if arch.name == "arm64" else None
            pinned = signing.site_boot_files(out / "site-boot", db_key, grub=None if arm64_uki else grub,
                                             uki=arm64_uki)
            for name, entry in pinned.items():
                auth = entry.get("authenticode")
                print(f"{out / 'site-boot' / name}: sha256 {entry['sha256']}"
                      + (f", signed, Authenticode {auth}" if auth else ""))
            print(f"{out / 'site-boot'}: the site's boot files (its site_ipxe_dir), "
                  "pinned in boot-files.json")
    return 0


def _signer(db_key: signing.DbKey | None) -> Callable[[Path], object] | None:
    """A UKI's signing step with the fleet's db key, or None (unsigned)."""
    if db_key is None:
        return None
    from initramfs import signing

    return lambda image: signing.sign(image, db_key)


if __name__ == "__main__":
    sys.exit(main())
