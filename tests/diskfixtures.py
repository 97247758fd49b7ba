"""Disks for tests: files, loop devices, and images with a real GPT and filesystems.

Imported explicitly by the block-device, deploy and wipe tests (not a conftest: those folders
have their own). Loop devices need root and a free /dev/loop*; tests skip otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.errors import AgentError, InvalidParameters, NotFound
from agent.hw import block

MiB = 1024 * 1024
BLKSSZGET, BLKPBSZGET = 0x1268, 0x127B   # the logical and physical block size ioctls


def disk_for_path(path: str | os.PathLike[str]) -> block.Disk:
    """A block device node (/dev/loop3) or a regular file, as a Disk (tests, benchmarks)."""
    p = Path(path)
    st = p.stat()
    if stat.S_ISREG(st.st_mode):
        return block.file_disk(p)
    if not stat.S_ISBLK(st.st_mode):
        raise InvalidParameters(f"{p}: neither a block device nor a regular file")
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"))
    disk = block.read_disk(name)
    if disk is None:
        raise NotFound(f"{p}: not a usable disk")
    return disk


def block_sizes(fd: int) -> tuple[int, int]:
    """(logical, physical) block size of an open disk; (512, 4096) for a regular file."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return 512, 4096
    sizes = []
    for request in (BLKSSZGET, BLKPBSZGET):
        buf = bytearray(4)
        fcntl.ioctl(fd, request, buf)
        sizes.append(int.from_bytes(buf, sys.byteorder, signed=True))
    return sizes[0], sizes[1]


def random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


@contextlib.contextmanager
def loop_device(backing: Path, *, partscan: bool = False) -> Iterator[block.Disk]:
    """A loop device on ``backing``, detached afterwards; skips where it cannot be made."""
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("needs root and losetup for a loop device")
    argv = ["losetup", "-f", "--show"] + (["-P"] if partscan else []) + [str(backing)]
    try:
        dev = proc.run(argv, timeout=30).text.strip()
    except AgentError as exc:
        pytest.skip(f"cannot create a loop device here: {exc}")
    try:
        disk = block.read_disk(os.path.basename(dev))
        assert disk is not None, dev
        yield disk
    finally:
        proc.run(["losetup", "-d", dev], check=False, timeout=30)


@contextlib.contextmanager
def mounted(dev: Path, mnt: Path) -> Iterator[None]:
    mnt.mkdir(exist_ok=True)
    try:
        proc.run(["mount", str(dev), str(mnt)], timeout=60)
    except AgentError as exc:
        pytest.skip(f"cannot mount here: {exc}")
    try:
        yield
    finally:
        proc.run(["umount", str(mnt)], check=False, timeout=60)


def gpt_image(path: Path, size: int = 64 * MiB) -> Path:
    """A GPT disk image: p1 "efi" 8 MiB at 1 MiB (ext4, label BOOTFS), p2 "root" (swap)."""
    for tool in ("sfdisk", "mkfs.ext4", "mkswap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    with path.open("wb") as f:
        f.truncate(size)
    script = (
        "label: gpt\n"
        "start=2048, size=16384, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=efi\n"
        "start=18432, size=8192, type=0657FD6D-A4AB-43C4-84E5-0933C84B4F4F, name=root\n"
    )
    proc.run(["sfdisk", "-q", str(path)], input=script.encode(), timeout=60)
    proc.run(["mkfs.ext4", "-q", "-F", "-L", "BOOTFS", "-E", f"offset={MiB}", str(path), "8M"],
             timeout=60)
    swap = path.with_suffix(".swap")
    with swap.open("wb") as f:
        f.truncate(4 * MiB)
    proc.run(["mkswap", "-L", "SWAPPY", str(swap)], timeout=60)
    with path.open("r+b") as f:
        f.seek(18432 * 512)
        f.write(swap.read_bytes())
    swap.unlink()
    return path
