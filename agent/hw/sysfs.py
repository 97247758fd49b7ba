"""Reading sysfs and procfs attributes: one small place for "the file's text, or a default".

Straight system calls (open, read until EOF, close) rather than a text file object: an
inventory reads a few hundred attributes, and in the ramdisk under emulation each layer of
Python's io stack counts.
"""

from __future__ import annotations

import os
from pathlib import Path


def read(path: Path, default: str = "") -> str:
    """The attribute's text, stripped; ``default`` when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return default
    try:
        chunks = []
        while chunk := os.read(fd, 65536):   # procfs files (cpuinfo) can be larger than a page
            chunks.append(chunk)
    except OSError:
        return default
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace").strip()


def read_int(path: Path, default: int = 0) -> int:
    """The attribute as an integer, decimal or "0x10de"; ``default`` when absent or not a number."""
    try:
        return int(read(path), 0)
    except ValueError:
        return default


def filesystem_type(path: Path, proc_root: Path = Path("/proc")) -> str:
    """The type of the file system that holds ``path`` ("tmpfs", "ext4"...): of the mount in
    /proc/self/mountinfo on the same device with the longest mount point above it; "" when
    it cannot be told."""
    try:
        real = os.path.realpath(path)
        dev = os.stat(real).st_dev
    except OSError:
        return ""
    found, depth = "", -1
    for line in read(proc_root / "self" / "mountinfo").splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        major, _, minor = fields[2].partition(":")
        point = fields[4].replace("\\040", " ")
        if not (major.isdigit() and minor.isdigit()) or os.makedev(int(major), int(minor)) != dev:
            continue
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > depth:
            found, depth = line.split(" - ", 1)[1].split()[0], len(point)
    return found
