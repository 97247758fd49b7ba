"""The kernel's boot id: a random UUID per boot, how a rejoining agent proves a new boot."""

from __future__ import annotations

from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id(path: Path = BOOT_ID) -> str:
    """This boot's id (lower-case UUID text); "" where the kernel does not offer one."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def kernel_cmdline(path: Path = Path("/proc/cmdline")) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
