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
