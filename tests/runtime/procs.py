"""Process-group inspection for the kill tests (reads /proc; zombies count as gone)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def live_in_group(pgid: int) -> list[int]:
    """Pids of processes in process group ``pgid`` that are not zombies."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_group_gone(pgid: int, timeout: float = 20.0) -> list[int]:
    """Wait (bounded) until nothing of the group is alive; return what is left."""
    end = time.monotonic() + timeout
    left = live_in_group(pgid)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = live_in_group(pgid)
    return left


def kill_leftovers(pgid: int) -> None:
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
