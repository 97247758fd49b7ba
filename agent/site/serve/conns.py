"""The site HTTP service's connections: how many, from whom, and how long one may sit idle.

A client that opens connections and sends nothing must not take the daemon's descriptors
from its gateway session, its journal and other nodes' routes (issue 27, item 4):

- At most ``per_client`` connections from one address and ``total`` in all; ``total`` also
  leaves ``FD_RESERVE`` of the process's descriptors (RLIMIT_NOFILE) for everything else,
  counting two for each connection (the node's and its upstream's). A connection past a cap
  is answered 503 and closed at once; when the total is reached, the connection that has
  waited longest for a request head is dropped first, so idle ones never lock out a working
  node.
- A request's head (request line and headers) must arrive whole within ``head_seconds`` of
  the connection's opening or of the previous response's end (a kept-alive connection's idle
  time): one thread watches every deadline and shuts the late connection down. A byte now
  and then does not keep a connection.

    conns = InboundConnections(per_client=32, head_seconds=10)
    if conns.admit(sock, address): ...   # False: refused (past a cap); the caller closes it
    conns.waiting(sock)                  # a head is awaited from now
    if not conns.received(sock): ...     # the head came; False: too late, it was shut down
    conns.leave(sock)                    # closed
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import threading
import time
from dataclasses import dataclass, field

from agent.deadlines import DeadlineWatch

log = logging.getLogger(__name__)

FD_RESERVE = 128          # descriptors kept for the gateway session, the journal, dnsmasq, BMCs
MAX_CONNECTIONS = 1024    # in all, when the descriptors allow it
PER_CLIENT = 32           # from one address: a ramdisk needs a few
HEAD_SECONDS = 10.0       # a request's head, or a kept-alive connection's idle time
REFUSALS_LOG_SECONDS = 10.0


def connection_budget(reserve: int = FD_RESERVE, most: int = MAX_CONNECTIONS) -> int:
    """How many connections the process's descriptors allow: two each, ``reserve`` kept."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return most
    return max(1, min(most, (soft - reserve) // 2))


@dataclass
class _Conn:
    sock: socket.socket
    host: str
    deadline: float = 0.0        # 0: no head awaited (a request being served)
    since: float = 0.0           # when the head began to be awaited
    shut: bool = False


@dataclass
class InboundConnections:
    """The site HTTP service's client connections: admitted under the caps, each one's request
    head awaited within its time (see the module docstring)."""

    per_client: int = PER_CLIENT
    total: int = field(default_factory=connection_budget)
    head_seconds: float = HEAD_SECONDS

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self._by_host: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        self._refused_logged = time.monotonic() - REFUSALS_LOG_SECONDS
        # The heads awaited, by connection: one thread sleeps to the first (agent/deadlines.py)
        # and is woken only for an earlier one, so a request's head awaited and come costs no
        # thread switch (hundreds a second while a rack deploys); it also logs the refusals.
        self._deadlines: DeadlineWatch[int] = DeadlineWatch(
            "site-http-deadlines", self._late, tick=REFUSALS_LOG_SECONDS, on_tick=self._log_now)

    # -- what the server calls ---------------------------------------------------------

    def admit(self, sock: socket.socket, host: str) -> bool:
        """Count ``sock`` from ``host`` in; False (not counted) when past a cap."""
        evict: _Conn | None = None
        with self._lock:
            if self._by_host.get(host, 0) >= self.per_client:
                self._refuse(host, "per client")
                return False
            if len(self._conns) >= self.total:
                idle = [c for c in self._conns.values() if c.deadline and not c.shut]
                if not idle:
                    self._refuse(host, "in all")
                    return False
                evict = min(idle, key=lambda c: c.since)
                evict.shut = True
                self._forget(evict)
            self._conns[id(sock)] = _Conn(sock, host)
            self._by_host[host] = self._by_host.get(host, 0) + 1
        if evict is not None:
            _shut(evict.sock)
        return True

    def waiting(self, sock: socket.socket) -> None:
        """A request head is awaited on ``sock`` from now."""
        now = time.monotonic()
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is None or conn.shut:
                return
            conn.since, conn.deadline = now, now + self.head_seconds
            self._deadlines.set(id(sock), conn.deadline)

    def received(self, sock: socket.socket) -> bool:
        """The head came on ``sock``; False when it came too late (the connection is shut)."""
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is None:
                return False
            conn.deadline = 0.0
            self._deadlines.clear(id(sock))
            return not conn.shut

    def leave(self, sock: socket.socket) -> None:
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is not None and conn.sock is sock:
                self._forget(conn)

    def sockets(self) -> list[socket.socket]:
        """The admitted connections' sockets."""
        with self._lock:
            return [c.sock for c in self._conns.values()]

    def count(self, host: str | None = None) -> int:
        with self._lock:
            return len(self._conns) if host is None else self._by_host.get(host, 0)

    # -- the watch ---------------------------------------------------------------------

    def start(self) -> None:
        self._deadlines.start()

    def stop(self) -> None:
        self._deadlines.stop()

    def _late(self, keys: list[int]) -> None:
        """The watch's: the connections whose head is late are shut (without the lock)."""
        now = time.monotonic()
        late: list[socket.socket] = []
        with self._lock:
            for key in keys:
                conn = self._conns.get(key)
                if conn is not None and conn.deadline and conn.deadline <= now and not conn.shut:
                    conn.shut = True
                    late.append(conn.sock)
        for sock in late:
            _shut(sock)
        if late:
            log.info("site HTTP: %d connection(s) sent no request within %gs; closed",
                     len(late), self.head_seconds)

    def _log_now(self) -> None:
        with self._lock:
            self._log_refusals(time.monotonic())

    # -- with the lock held ------------------------------------------------------------

    def _forget(self, conn: _Conn) -> None:
        if self._conns.pop(id(conn.sock), None) is None:
            return
        self._deadlines.clear(id(conn.sock))
        left = self._by_host.get(conn.host, 1) - 1
        if left:
            self._by_host[conn.host] = left
        else:
            self._by_host.pop(conn.host, None)

    def _refuse(self, host: str, which: str) -> None:
        key = f"{host} ({which})"
        self._refused[key] = self._refused.get(key, 0) + 1
        self._log_refusals(time.monotonic())

    def _log_refusals(self, now: float) -> None:
        """One line each REFUSALS_LOG_SECONDS at most, however many were refused."""
        if not self._refused or now - self._refused_logged < REFUSALS_LOG_SECONDS:
            return
        log.warning("site HTTP: connections refused past the caps (%d per client, %d in all): %s",
                    self.per_client, self.total,
                    ", ".join(f"{n} from {k}" for k, n in sorted(self._refused.items())))
        self._refused.clear()
        self._refused_logged = now


def _shut(sock: socket.socket) -> None:
    """End a connection another thread may be reading: its read returns, the thread ends."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
