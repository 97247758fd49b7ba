"""A progress display for a person: a redrawn bar on a terminal, plain lines otherwise.

``agent exec`` and the gateway CLI feed it session_pb2.Progress messages. On a terminal the
bar is redrawn in place at most 10 times a second; when the output is a file or a pipe it
prints a plain line when the message changes, at every 10 %, or every 5 seconds.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

from agent.proto import session_pb2


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def describe(p: session_pb2.Progress) -> str:
    parts = []
    if p.subject:
        parts.append(p.subject)
    if p.total:
        parts.append(f"{_human(p.done)}/{_human(p.total)}")
    elif p.done:
        parts.append(_human(p.done))
    if p.rate > 0:
        parts.append(f"{_human(p.rate)}/s")
    if p.eta_seconds >= 0 and p.fraction < 1:
        parts.append(f"eta {p.eta_seconds:.0f}s")
    if p.message:
        parts.append(p.message)
    return " ".join(parts)


class ProgressBar:
    def __init__(self, stream: TextIO | None = None, *, label: str = "", tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.tty = self.stream.isatty() if tty is None else tty
        self._last_draw = 0.0
        self._last_line = 0.0
        self._last_decile = -1
        self._last_message = ""
        self._drawn = False

    def update(self, p: session_pb2.Progress) -> None:
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw < 0.1 and p.fraction < 1:
                return
            self._last_draw = now
            self._draw(p)
            return
        decile = int(p.fraction * 10) if p.fraction >= 0 else -1
        if p.message != self._last_message or decile != self._last_decile or now - self._last_line >= 5:
            self._last_message, self._last_decile, self._last_line = p.message, decile, now
            # No percentage where the command knows none (a kexec's fetch): describe() has its bytes.
            pct = f"{p.fraction * 100:5.1f}% " if p.fraction >= 0 else ""
            self.stream.write(f"{self.label + ' ' if self.label else ''}{pct}{describe(p)}".rstrip() + "\n")
            self.stream.flush()

    def _draw(self, p: session_pb2.Progress) -> None:
        width = shutil.get_terminal_size((80, 20)).columns
        text = describe(p)
        label = f"{self.label} " if self.label else ""
        bar_width = max(10, min(40, width - len(label) - 10 - min(len(text), width // 2)))
        if p.fraction >= 0:
            filled = int(bar_width * min(1.0, p.fraction))
            bar = "#" * filled + "-" * (bar_width - filled)
            pct = f"{p.fraction * 100:5.1f}%"
        else:
            pos = int(time.monotonic() * 8) % bar_width
            bar = "-" * pos + "#" + "-" * (bar_width - pos - 1)
            pct = "      "  # the moving mark says it is working; no percentage is known
        line = f"{label}[{bar}] {pct} {text}"[: width - 1]
        self.stream.write("\r" + line.ljust(width - 1))
        self.stream.flush()
        self._drawn = True

    def finish(self, message: str = "") -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
        if message:
            self.stream.write(message + "\n")
        self.stream.flush()
        self._drawn = False
