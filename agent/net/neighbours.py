"""The kernel's neighbour table: which link-layer address answered for an IPv4 address."""

from __future__ import annotations

import contextlib
from pathlib import Path


def read_arp(ip: str, path: Path = Path("/proc/net/arp")) -> str:
    """The MAC of ``ip`` in the kernel's neighbour table, lower case ("" when absent)."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines()[1:]:
            cells = line.split()
            if len(cells) >= 4 and cells[0] == ip and cells[3] != "00:00:00:00:00:00":
                return cells[3].lower()
    return ""
