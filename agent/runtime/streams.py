"""Per-command frames for the gateway: progress and the command's own log lines, rate bounded.

Progress: at most one frame per PROGRESS_INTERVAL per command; a report that comes too soon is
held and sent when the interval has passed (only the newest one held), and ``close`` sends the
held one before the result, so the last progress is never lost. Every PROGRESS_MARKER_INTERVAL a
progress marker goes to the journal (the first one that far into the command). Log lines: a token
bucket per command (LOG_RATE a second, bursts of LOG_BURST); a dropped line is counted and the
count travels with the next line.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.proto import session_pb2
from agent.runtime import scheduler

PROGRESS_INTERVAL = 0.5          # seconds between progress frames of one command
PROGRESS_MARKER_INTERVAL = 15.0  # seconds between journaled progress markers of one command
LOG_RATE = 20.0                  # log lines per second per command, sustained
LOG_BURST = 50.0
MAX_LOG_LINE = 4096


class CommandStream:
    """Progress and log frames of one command, rate bounded."""

    def __init__(
        self,
        command_id: str,
        emit: Callable[[session_pb2.Frame], None],
        marker: Callable[[str, session_pb2.Progress], None] | None = None,
    ) -> None:
        self.command_id = command_id
        self._emit = emit
        self._marker = marker
        self._lock = threading.Lock()
        now = time.monotonic()
        self._last_sent = 0.0
        self._pending: session_pb2.Progress | None = None
        self._timer: threading.Timer | None = None
        # The first marker after an interval of running: a command that ends sooner is told by
        # its result, and at hundreds of commands a marker each is a journal write each.
        self._last_marker = now
        self._tokens = LOG_BURST
        self._refilled = now
        self._dropped = 0
        self._closed = False

    def progress(self, p: session_pb2.Progress) -> None:
        now = time.monotonic()
        send: session_pb2.Progress | None = None
        with self._lock:
            if self._closed:
                return
            if self._timer is None and now - self._last_sent >= PROGRESS_INTERVAL:
                send, self._last_sent = p, now
            else:
                self._pending = p
                if self._timer is None:
                    self._timer = threading.Timer(
                        max(0.0, self._last_sent + PROGRESS_INTERVAL - now), self._on_timer
                    )
                    self._timer.daemon = True
                    self._timer.start()
            marker = now - self._last_marker >= PROGRESS_MARKER_INTERVAL
            if marker:
                self._last_marker = now
        if send is not None:
            self._emit(session_pb2.Frame(progress=send))
        if marker and self._marker is not None:
            self._marker(self.command_id, p)

    def _on_timer(self) -> None:
        with self._lock:
            p, self._pending, self._timer = self._pending, None, None
            if p is None or self._closed:
                return
            self._last_sent = time.monotonic()
        self._emit(session_pb2.Frame(progress=p))

    def log(self, level: str, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            self._tokens = min(LOG_BURST, self._tokens + (now - self._refilled) * LOG_RATE)
            self._refilled = now
            if self._tokens < 1.0:
                self._dropped += 1
                return
            self._tokens -= 1.0
            dropped, self._dropped = self._dropped, 0
        self._emit(session_pb2.Frame(log=session_pb2.LogLine(
            command_id=self.command_id, level=level, message=message[:MAX_LOG_LINE],
            time_unix_ms=int(time.time() * 1000), dropped_before=dropped,
        )))

    def close(self) -> None:
        """Deliver the last progress (if one is held back) and stop; called before the result."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            timer, p, self._pending, self._timer = self._timer, self._pending, None, None
        if timer is not None:
            timer.cancel()
        if p is not None:
            self._emit(session_pb2.Frame(progress=p))


class CommandLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # LoggerAdapter is generic in the stubs only
    """ctx.log: goes to the agent's log as usual, and to the gateway as the command's log lines."""

    def __init__(self, logger: logging.Logger, command_id: str, stream: CommandStream) -> None:
        super().__init__(logger, {"command_id": command_id, "bc_streamed": True})
        self.stream = stream

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**self.extra, **kwargs.get("extra", {})}  # type: ignore[dict-item]  # extra is a Mapping in the stubs
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level >= logging.INFO:
            try:
                text = str(msg) % args if args else str(msg)
            except (TypeError, ValueError):
                text = f"{msg} {args}"
            self.stream.log(logging.getLevelName(level).lower(), text)
        super().log(level, msg, *args, **kwargs)


class ThreadLogForwarder(logging.Handler):
    """Log records of other modules (proc, hw) emitted while a lane worker runs a command."""

    def __init__(self, streams: Callable[[str], CommandStream | None]) -> None:
        super().__init__(logging.INFO)
        self._streams = streams

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "bc_streamed", False):
            return
        cid = scheduler.current_command_id()
        if cid is None:
            return
        stream = self._streams(cid)
        if stream is not None:
            with contextlib.suppress(Exception):  # logging must never fail the caller
                stream.log(record.levelname.lower(), record.getMessage())
