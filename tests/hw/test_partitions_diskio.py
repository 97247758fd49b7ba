"""agent.hw.partitions (GPT/MBR and superblocks from the disk's bytes) and agent.hw.diskio."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest

from agent.errors import AgentError, Cancelled, Reason
from agent.hw import diskio, partitions
from tests.diskfixtures import MiB, gpt_image


def test_gpt_with_ext4_and_swap(tmp_path: Path) -> None:
    img = gpt_image(tmp_path / "g.img", 32 * MiB)
    fd = os.open(img, os.O_RDONLY)
    try:
        parts = partitions.read_partitions(fd, "nvme0n1")
    finally:
        os.close(fd)
    assert [p.name for p in parts] == ["nvme0n1p1", "nvme0n1p2"]
    assert parts[0].label == "efi" and parts[0].fs_type == "ext4" and parts[0].fs_label == "BOOTFS"
    assert parts[1].fs_type == "swap" and parts[1].fs_label == "SWAPPY" and parts[1].size_bytes == 4 * MiB


def test_gpt_with_bad_crc_is_not_trusted(tmp_path: Path) -> None:
    img = gpt_image(tmp_path / "g.img", 32 * MiB)
    with img.open("r+b") as f:
        f.seek(512 + 40)
        f.write(b"\xff")
    fd = os.open(img, os.O_RDONLY)
    try:
        assert partitions.read_partitions(fd, "sda") == []  # protective MBR only: nothing claimed
    finally:
        os.close(fd)


def test_mbr_and_names(tmp_path: Path) -> None:
    mbr = bytearray(2 * MiB)
    struct.pack_into("<B3xB3xII", mbr, 446, 0x80, 0x83, 2048, 1024)
    mbr[510:512] = b"\x55\xaa"
    path = tmp_path / "m.img"
    path.write_bytes(bytes(mbr))
    fd = os.open(path, os.O_RDONLY)
    try:
        (p,) = partitions.read_partitions(fd, "sda")
    finally:
        os.close(fd)
    assert (p.name, p.type_guid, p.start_bytes, p.size_bytes) == ("sda1", "0x83", MiB, 512 * 1024)
    assert partitions.kernel_partition_name("mmcblk0", 2) == "mmcblk0p2"


def test_vfat_and_xfs_superblocks(tmp_path: Path) -> None:
    fat = bytearray(8192)
    fat[0x43:0x47] = struct.pack("<I", 0x1234ABCD)
    fat[0x47:0x52] = b"EFI SYSTEM "
    fat[0x52:0x5A] = b"FAT32   "
    fat[510:512] = b"\x55\xaa"
    xfs = bytearray(8192)
    xfs[0:4] = b"XFSB"
    xfs[32:48] = bytes(range(16))
    xfs[108:120] = b"root\0\0\0\0\0\0\0\0"
    path = tmp_path / "fs"
    path.write_bytes(bytes(fat) + bytes(xfs))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert partitions.probe_fs(fd, 0) == partitions.FsInfo("vfat", "1234-ABCD", "EFI SYSTEM")
        got = partitions.probe_fs(fd, 8192)
    finally:
        os.close(fd)
    assert got is not None and got.type == "xfs" and got.label == "root"
    assert got.uuid == "00010203-0405-0607-0809-0a0b0c0d0e0f"


def _writer(path: Path, size: int, **kw: object) -> tuple[int, diskio.DiskWriter]:
    fd = os.open(path, os.O_RDWR)
    return fd, diskio.DiskWriter(fd, None, size=size, buffers=2, buffer_size=MiB, **kw)  # type: ignore[arg-type]


def test_writer_skips_zero_granules_and_writes_odd_tail(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.write_bytes(b"\xee" * 4 * MiB)
    fd, w = _writer(path, 4 * MiB, skip_zeros=True)
    try:
        with w:
            buf = w.take()
            buf[:] = bytes(MiB)
            buf[100:200] = b"x" * 100
            w.submit(buf, 0, MiB)
            buf = w.take()
            buf[:1000] = b"y" * 1000
            w.submit(buf, MiB, 1000)
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data[100:200] == b"x" * 100 and data[:100] == bytes(100)
    assert data[diskio.GRANULE : MiB] == b"\xee" * (MiB - diskio.GRANULE)  # skipped, not written
    assert data[MiB : MiB + 1000] == b"y" * 1000
    assert w.written == diskio.GRANULE + 1000 and w.skipped == MiB - diskio.GRANULE


def test_writer_refuses_beyond_end_and_stops_on_cancel(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.write_bytes(bytes(MiB))
    fd, w = _writer(path, MiB)
    try:
        with pytest.raises(AgentError) as err, w:
            w.submit(w.take(), MiB - 10, 20)
        assert err.value.reason == Reason.TOO_LARGE
        cancel = threading.Event()
        cancel.set()
        fd2, w2 = _writer(path, MiB, cancel=cancel)
        with pytest.raises(Cancelled), w2:
            w2.take()
        os.close(fd2)
    finally:
        os.close(fd)


def test_all_zero_reads_the_buffer_in_place() -> None:
    import ctypes
    import mmap

    m = mmap.mmap(-1, 3 * diskio.GRANULE)
    view = memoryview(m)
    pin = ctypes.c_char.from_buffer(m)
    address = ctypes.addressof(pin)
    g = diskio.GRANULE
    assert diskio.all_zero(view, address, 0, 3 * g)
    for pos in (0, g // 2, g - 1):  # first byte, middle, last byte of a granule
        view[pos] = 1
        assert not diskio.all_zero(view, address, 0, g)
        assert diskio.all_zero(view, address, g, 2 * g)
        view[pos] = 0
    assert diskio.all_zero(view, address, 5, 5)  # empty range
    del pin
    view.release()
    m.close()


def test_writer_flushes_in_the_background_every_sync_every_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device is flushed along the way (fdatasync from the sync thread), not only by the
    fsync at the end: the final fsync then has little left to wait for."""
    monkeypatch.setattr(diskio, "SYNC_EVERY", MiB)
    synced: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(diskio.os, "fdatasync", counting)
    path = tmp_path / "d"
    path.write_bytes(bytes(8 * MiB))
    fd, w = _writer(path, 8 * MiB)
    try:
        with w:
            for i in range(8):
                buf = w.take()
                buf[:MiB] = os.urandom(MiB)
                w.submit(buf, i * MiB, MiB)
                time.sleep(0.05)  # let the sync thread see each megabyte
    finally:
        os.close(fd)
    assert len(synced) >= 3
    assert w.written == 8 * MiB
