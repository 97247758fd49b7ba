"""The session's options, apart from the session so that the settings table (agent/cli/settings.py)
shows their defaults in ``--help`` on a host without the third-party packages: the standard
library only, like the frame limit they share with agent/link/wire.py."""

from __future__ import annotations

from dataclasses import dataclass

MAX_FRAME_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SessionOptions:
    reconnect_min_seconds: float = 0.5      # base of the exponential backoff
    reconnect_max_seconds: float = 30.0     # its cap
    connect_timeout_seconds: float = 10.0   # TCP + TLS handshake + Hello/Welcome
    max_frame_bytes: int = MAX_FRAME_BYTES
    exit_flush_seconds: float = 5.0         # how long the exit hook waits for the queue
    offline_buffer: int = 1000              # progress/log frames kept during a handshake
