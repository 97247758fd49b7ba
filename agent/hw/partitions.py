"""Partition tables (GPT, MBR) and filesystem superblocks, read from the disk's own bytes.

``read_partitions(fd, disk_name, sector)`` returns what is on the disk, whatever the kernel
has seen: after a deploy we report the image's layout even for a file target. Filesystems
recognised from their superblock: ext2/3/4, xfs, vfat, swap. ``find_partition(disk, private,
number=..., label=...)`` is the kernel's view instead (sysfs), for a file read from a partition
(agent/images/filesource.py): the partition by number, GPT name or filesystem label, and its node.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError, NotFound, Reason
from agent.proto import common_pb2

GPT_SIGNATURE = b"EFI PART"


@dataclass(frozen=True)
class FsInfo:
    type: str
    uuid: str = ""
    label: str = ""


def _guid(raw: bytes) -> str:
    return str(uuid.UUID(bytes_le=raw))


def kernel_partition_name(disk: str, number: int) -> str:
    return f"{disk}p{number}" if disk[-1:].isdigit() else f"{disk}{number}"


def _cstr(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace").strip()


def probe_fs(fd: int, offset: int) -> FsInfo | None:
    """The filesystem whose superblock starts the partition at ``offset``, if recognised."""
    try:
        head = os.pread(fd, 8192, offset)
    except OSError:
        return None
    if len(head) < 4096:
        return None
    if head[0:4] == b"XFSB":
        return FsInfo("xfs", str(uuid.UUID(bytes=head[32:48])), _cstr(head[108:120]))
    sb = head[1024:2048]
    if len(sb) >= 0x88 and struct.unpack_from("<H", sb, 0x38)[0] == 0xEF53:
        compat, incompat = struct.unpack_from("<II", sb, 0x5C)
        ro_compat = struct.unpack_from("<I", sb, 0x64)[0]
        kind = "ext4" if (incompat & ~0x6) or ro_compat & ~0x7 else "ext3" if compat & 0x4 else "ext2"
        return FsInfo(kind, str(uuid.UUID(bytes=sb[0x68:0x78])), _cstr(sb[0x78:0x88]))
    if head[4086:4096] in (b"SWAPSPACE2", b"SWAP-SPACE"):
        return FsInfo("swap", str(uuid.UUID(bytes=head[1036:1052])), _cstr(head[1052:1068]))
    if head[510:512] == b"\x55\xaa":
        if head[0x52:0x5A] == b"FAT32   ":
            vid, label = head[0x43:0x47], head[0x47:0x52]
        elif head[0x36:0x3B] in (b"FAT12", b"FAT16", b"FAT  "):
            vid, label = head[0x27:0x2B], head[0x2B:0x36]
        else:
            return None
        serial = struct.unpack("<I", vid)[0]
        text = label.decode("ascii", "replace").strip()
        return FsInfo("vfat", f"{serial >> 16:04X}-{serial & 0xFFFF:04X}", "" if text == "NO NAME" else text)
    return None


def _gpt(fd: int, sector: int, disk: str) -> list[common_pb2.Partition] | None:
    header = os.pread(fd, sector, sector)
    if header[:8] != GPT_SIGNATURE:
        return None
    hsize = struct.unpack_from("<I", header, 12)[0]
    crc = struct.unpack_from("<I", header, 16)[0]
    if not 92 <= hsize <= sector:
        return None
    check = bytearray(header[:hsize])
    check[16:20] = b"\0\0\0\0"
    if zlib.crc32(check) != crc:
        return None
    entries_lba, count, esize = struct.unpack_from("<QII", header, 72)
    if esize < 128 or count > 4096:
        return None
    table = os.pread(fd, count * esize, entries_lba * sector)
    parts = []
    for i in range(count):
        e = table[i * esize : (i + 1) * esize]
        if len(e) < 128 or e[:16] == bytes(16):
            continue
        first, last = struct.unpack_from("<QQ", e, 32)
        parts.append(
            common_pb2.Partition(
                number=i + 1,
                name=kernel_partition_name(disk, i + 1),
                start_bytes=first * sector,
                size_bytes=(last - first + 1) * sector,
                type_guid=_guid(e[:16]),
                part_uuid=_guid(e[16:32]),
                label=e[56:128].decode("utf-16-le", "replace").split("\x00", 1)[0],
            )
        )
    return parts


def _mbr(fd: int, disk: str) -> list[common_pb2.Partition] | None:
    mbr = os.pread(fd, 512, 0)
    if len(mbr) < 512 or mbr[510:512] != b"\x55\xaa":
        return None
    parts = []
    for i in range(4):
        e = mbr[446 + 16 * i : 462 + 16 * i]
        ptype = e[4]
        start, count = struct.unpack_from("<II", e, 8)
        if ptype == 0 or count == 0:
            continue
        if e[0] not in (0, 0x80):
            return None  # not a partition table (a filesystem boot sector, e.g. FAT)
        parts.append(
            common_pb2.Partition(
                number=i + 1,
                name=kernel_partition_name(disk, i + 1),
                start_bytes=start * 512,
                size_bytes=count * 512,
                type_guid=f"0x{ptype:02x}",
            )
        )
    return parts


def read_partitions(fd: int, disk: str, sector: int = 512) -> list[common_pb2.Partition]:
    """Partitions found on the disk (GPT first, then MBR), with their filesystems."""
    parts = _gpt(fd, sector, disk)
    if parts is None and sector != 512:
        parts = _gpt(fd, 512, disk)
    if parts is None:
        parts = _mbr(fd, disk) or []
        if any(p.type_guid == "0xee" for p in parts):
            parts = []  # protective MBR of an unreadable GPT: report nothing rather than a lie
    for p in parts:
        fs = probe_fs(fd, p.start_bytes)
        if fs is not None:
            p.fs_type, p.fs_uuid, p.fs_label = fs.type, fs.uuid, fs.label
    return parts


# -- the kernel's view of a disk's partitions (sysfs), for a file read from one of them --------


@dataclass(frozen=True)
class KernelPartition:
    name: str                   # kernel name, "nvme0n1p2"
    number: int
    partname: str               # GPT partition name
    devnum: tuple[int, int]     # (major, minor)


def kernel_partitions(disk: Path, sys_block: Path = Path("/sys/class/block")) -> list[KernelPartition]:
    """The partitions the kernel knows on ``disk``; NotFound when it knows no such disk."""
    name = Path(os.path.realpath(disk)).name
    base = sys_block / name
    if not base.is_dir():
        raise NotFound(f"{disk}: not a block device this kernel knows", disk=disk)
    parts = []
    for entry in sorted(base.iterdir()):
        if not (entry / "partition").is_file():
            continue
        uevent = dict(
            line.split("=", 1) for line in (entry / "uevent").read_text().splitlines() if "=" in line
        )
        major, minor = (int(x) for x in (entry / "dev").read_text().strip().split(":"))
        parts.append(KernelPartition(entry.name, int((entry / "partition").read_text()),
                                     uevent.get("PARTNAME", ""), (major, minor)))
    return parts


def fs_on(node: Path) -> FsInfo | None:
    """The filesystem on a partition's node (type and label) from its superblock, or None."""
    try:
        fd = os.open(node, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return probe_fs(fd, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def device_node(part: KernelPartition, private: Path) -> Path:
    """The partition's device node: /dev/NAME, or one made in ``private`` where there is no udev."""
    dev = Path("/dev") / part.name
    rdev = os.makedev(*part.devnum)
    with contextlib.suppress(OSError):
        st = os.stat(dev)
        if stat.S_ISBLK(st.st_mode) and st.st_rdev == rdev:
            return dev
    node = private / part.name
    os.mknod(node, 0o600 | stat.S_IFBLK, rdev)
    return node


def _reread(disk: Path) -> None:
    """Ask the kernel to read the partition table again (a disk just written by deploy.image)."""
    from agent.hw import block

    try:
        fd = os.open(disk, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        block.reread_partitions(fd)
    finally:
        os.close(fd)


def find_partition(disk: Path, private: Path, *, number: int = 0, label: str = "",
                   sys_block: Path = Path("/sys/class/block")) -> tuple[KernelPartition, Path]:
    """The one partition of ``disk`` with this ``number``, or whose GPT name or filesystem label
    is ``label``, and its device node (made in ``private`` where /dev has none)."""
    parts = kernel_partitions(disk, sys_block)
    if not parts:
        _reread(disk)
        parts = kernel_partitions(disk, sys_block)
    if number:
        found = [(p, device_node(p, private)) for p in parts if p.number == number]
    else:
        found = []
        for p in parts:
            node = device_node(p, private)
            fs = fs_on(node)
            if label == p.partname or (fs is not None and label == fs.label):
                found.append((p, node))
    what = f"partition {number}" if number else f"a partition labelled {label!r}"
    if not found:
        raise NotFound(f"{disk} has no {what}", disk=disk)
    if len(found) > 1:
        raise AgentError(f"{disk} has {len(found)} partitions labelled {label!r}",
                         reason=Reason.AMBIGUOUS, disk=disk)
    return found[0]
