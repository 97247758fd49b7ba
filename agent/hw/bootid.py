"""The kernel's boot id: a random UUID per boot, how a rejoining agent proves a new boot; and
the ``bc.rejoin=<kind>:<command id>:<old boot id>`` kernel parameter that carries that proof
across a kexec into a new ramdisk, whose journal starts empty."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.errors import InvalidParameters

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
REJOIN_PARAM = "bc.rejoin"


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


def rejoin_param(kind: str, command_id: str, old_boot_id: str) -> str:
    """The kernel parameter that lets the next agent complete a self-terminating command."""
    for part in (command_id, old_boot_id):
        if not part or any(c.isspace() or c in ':"' or not c.isprintable() for c in part):
            raise InvalidParameters(f"cannot carry {part!r} on a kernel command line")
    return f"{REJOIN_PARAM}={kind}:{command_id}:{old_boot_id}"


def rejoin_markers(cmdline: str) -> list[tuple[str, str, str]]:
    """(kind, command id, old boot id) of every well-formed bc.rejoin= parameter."""
    found = []
    for token in cmdline.split():
        name, sep, value = token.partition("=")
        if name != REJOIN_PARAM or not sep:
            continue
        parts = value.split(":")
        if len(parts) != 3 or not all(parts):
            log.warning("ignoring malformed kernel parameter %r", token)
            continue
        found.append((parts[0], parts[1], parts[2]))
    return found
