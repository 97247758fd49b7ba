"""Partition tables (GPT, MBR) and filesystem superblocks, read from the disk's own bytes.

``read_partitions(fd, disk_name, sector)`` returns what is on the disk, whatever the kernel
has seen: after a deploy we report the image's layout even for a file target. Filesystems
recognised from their superblock: ext2/3/4, xfs, vfat, swap.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass

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
