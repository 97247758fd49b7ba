"""Every kept console's history on disk, by time: compressed segments kept ``keep_days`` back,
under a per-node and a site-wide size cap.

    store = ConsoleStore(root, report=timelines.console, keep_seconds=30 * 86400,
                         node_bytes=256 << 20, site_bytes=32 << 30)
    store.append(node_id, t, line)         # the console's Ring hands each line here too
    store.read(node_id, since=t0, until=t1)  # [(time, line)], oldest first, each once
    store.oldest(node_id)                  # the oldest moment kept (0.0: none)

- Layout: ``<root>/<node>/<slice start, unix s>.gz``, one segment per node per time slice
  (``slice_seconds``, an hour by default). A segment is a run of gzip members (RFC 1952
  allows several in one file; ``gzip -dc`` reads them whole), one member per flush, lines
  ``<unix ms> <text>`` as in the ring. A node's lines are held in memory until
  ``flush_bytes`` or ``flush_seconds`` since the first one held (a query, ``close`` and the
  site's timer, ``tick``, flush too): a daemon killed outright loses at most that much, the
  ring still holds it. ``tick`` also applies the time limit to the consoles gone quiet.
- No file stays open: each flush opens, appends and closes, so 256 consoles hold no
  descriptor between their flushes.
- Dropped, oldest segment first: a segment whose slice ended before ``now - keep_seconds``;
  a node's oldest while its segments pass ``node_bytes``; the site's oldest (any node's)
  while all pass ``site_bytes``. ``oldest`` reads the first line of the oldest segment left,
  so the moment reported is one whose line is still there.
- A write that fails (a full disk, ENOSPC; any OSError) is cut back to the segment's size
  before it (no torn member), the node's timeline is told (``not stored``), and the node's
  lines are not written for ``retry_seconds`` (those held meanwhile are let go past
  ``HELD_MAX``, or at a query); the console goes on in memory and in its ring,
  and the first write that succeeds after says ``stored again``. A torn member left by a
  crash ends that segment's reading; nothing before it is lost.
- A restart: a new store over the same folder finds the segments and goes on appending.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import Config
from agent.site.observe.timeline import Step

log = logging.getLogger(__name__)

SUFFIX = ".gz"
HELD_MAX = 1 << 20        # a node's lines held in memory at most (past it, the oldest go)


def _compress(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)     # 31: a gzip member
    return c.compress(data) + c.flush()


def _members(data: bytes) -> bytes:
    """The text of a segment's gzip members, up to the first torn or damaged one."""
    out: list[bytes] = []
    while data:
        d = zlib.decompressobj(31)
        try:
            text = d.decompress(data)
        except zlib.error:
            break
        if not d.eof:
            break         # torn: a write cut short by a crash
        out.append(text)
        data = d.unused_data
    return b"".join(out)


def _parse(data: bytes) -> list[tuple[float, str]]:
    out = []
    for raw in data.decode("utf-8", "replace").splitlines():
        stamp, _, text = raw.partition(" ")
        if stamp.isdigit():
            out.append((int(stamp) / 1000, text))
    return out


@dataclass
class _Node:
    segments: dict[int, int] = field(default_factory=dict)   # slice start -> bytes on disk
    total: int = 0               # their bytes together
    held: list[bytes] = field(default_factory=list)
    held_bytes: int = 0
    held_since: float = 0.0      # when the first line held came (monotonic)
    failed_until: float = 0.0    # not written before this (monotonic): a write failed
    failed: bool = False


class ConsoleStore:
    def __init__(self, root: Path, *, report: Callable[[str, str, str], None] | None = None,
                 keep_seconds: float = Config.site_console_keep_days * 86400.0,
                 node_bytes: int = Config.site_console_node_bytes,
                 site_bytes: int = Config.site_console_site_bytes,
                 slice_seconds: int = 3600, flush_bytes: int = 64 << 10, flush_seconds: float = 30.0,
                 retry_seconds: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.report = report
        self.keep_seconds = keep_seconds
        self.node_bytes = node_bytes
        self.site_bytes = site_bytes
        self.slice_seconds = slice_seconds
        self.flush_bytes = flush_bytes
        self.flush_seconds = flush_seconds
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._nodes: dict[str, _Node] = {}
        self._total = 0              # every node's segments' bytes together
        self._lock = threading.Lock()
        self._load()

    # -- on disk ------------------------------------------------------------------------------

    def _load(self) -> None:
        if not self.root.is_dir():
            return
        for folder in self.root.iterdir():
            if not folder.is_dir():
                continue
            node = self._nodes.setdefault(folder.name, _Node())
            for path in folder.iterdir():
                stem = path.name.removesuffix(SUFFIX)
                if path.name.endswith(SUFFIX) and stem.isdigit():
                    node.segments[int(stem)] = path.stat().st_size
            node.total = sum(node.segments.values())
            self._total += node.total
        with self._lock:
            self._drop()

    def _path(self, node_id: str, start: int) -> Path:
        return self.root / node_id / f"{start}{SUFFIX}"

    def size(self, node_id: str = "") -> int:
        """The segments' size on disk: the node's, or the site's ("")."""
        with self._lock:
            if not node_id:
                return self._total
            node = self._nodes.get(node_id)
            return node.total if node is not None else 0

    def segments(self, node_id: str) -> list[int]:
        """The node's segments, by their slice's start (unix s), oldest first."""
        with self._lock:
            node = self._nodes.get(node_id)
            return sorted(node.segments) if node is not None else []

    # -- writing ------------------------------------------------------------------------------

    def append(self, node_id: str, t: float, line: str) -> None:
        record = f"{int(t * 1000)} {line}\n".encode()
        with self._lock:
            node = self._nodes.setdefault(node_id, _Node())
            if not node.held:
                node.held_since = time.monotonic()
            node.held.append(record)
            node.held_bytes += len(record)
            while node.held_bytes > HELD_MAX and len(node.held) > 1:
                node.held_bytes -= len(node.held.pop(0))
            due = time.monotonic() - node.held_since >= self.flush_seconds
            if due or node.held_bytes >= self.flush_bytes:
                self._flush(node_id, node)

    def flush(self, node_id: str = "") -> None:
        """Write what is held: the node's, or every node's ("")."""
        with self._lock:
            for name, node in list(self._nodes.items()):
                if node.held and (not node_id or name == node_id):
                    self._flush(name, node, force=True)

    close = flush

    def tick(self) -> None:
        """Write the lines held past ``flush_seconds`` of the nodes gone quiet, and drop what
        the time limit no longer keeps (the site's timer, about once a second)."""
        with self._lock:
            now = time.monotonic()
            for name, node in list(self._nodes.items()):
                if node.held and now - node.held_since >= self.flush_seconds:
                    self._flush(name, node)
            self._drop()

    def _flush(self, node_id: str, node: _Node, *, force: bool = False) -> None:
        now = time.monotonic()
        if node.failed_until > now and not force:
            return
        if node.failed_until > now:
            node.held, node.held_bytes = [], 0     # a query's flush while failing: not retried
            return
        by_slice: dict[int, list[bytes]] = {}
        for record in node.held:
            t = int(record.partition(b" ")[0]) // 1000
            by_slice.setdefault(t - t % self.slice_seconds, []).append(record)
        node.held, node.held_bytes = [], 0
        for start, records in sorted(by_slice.items()):
            try:
                self._write(node_id, node, start, _compress(b"".join(records)))
            except OSError as exc:
                node.failed_until = now + self.retry_seconds
                why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else \
                    f"{exc.strerror or exc}"
                if not node.failed:
                    node.failed = True
                    log.warning("console of %s: not stored on disk: %s", node_id, why)
                    self._say(node_id, f"not stored: {why}; kept in memory, tried again every "
                              f"{self.retry_seconds:.0f}s")
                return
        if node.failed:
            node.failed = False
            self._say(node_id, "stored again")
        self._drop(node_id)

    def _write(self, node_id: str, node: _Node, start: int, member: bytes) -> None:
        path = self._path(node_id, start)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            before = os.fstat(fd).st_size
            try:
                view = memoryview(member)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, before)    # no torn member left behind
                raise
        finally:
            os.close(fd)
        grown = before + len(member) - node.segments.get(start, 0)
        node.segments[start] = before + len(member)
        node.total += grown
        self._total += grown

    def _say(self, node_id: str, text: str) -> None:
        if self.report is not None:
            self.report(node_id, Step.CONSOLE, text)

    def _drop(self, only: str = "") -> None:
        """Segments past the time limit, then past each node's cap (``only``: that node's), then
        past the site's, oldest first (under the lock)."""
        cutoff = self.clock() - self.keep_seconds
        for node_id, node in list(self._nodes.items()):
            if only and node_id != only:
                continue
            while node.segments and min(node.segments) + self.slice_seconds <= cutoff:
                self._remove(node_id, node, min(node.segments))
            while len(node.segments) > 1 and node.total > self.node_bytes:
                self._remove(node_id, node, min(node.segments))
        while self._total > self.site_bytes:
            candidates = [(min(n.segments), name) for name, n in self._nodes.items() if n.segments]
            if not candidates:
                break
            start, name = min(candidates)
            self._remove(name, self._nodes[name], start)

    def _remove(self, node_id: str, node: _Node, start: int) -> None:
        size = node.segments.pop(start, 0)
        node.total -= size
        self._total -= size
        with contextlib.suppress(FileNotFoundError):
            self._path(node_id, start).unlink()
        if not node.segments:
            with contextlib.suppress(OSError):
                (self.root / node_id).rmdir()

    # -- reading ------------------------------------------------------------------------------

    def read(self, node_id: str, since: float = 0.0, until: float = 0.0) -> list[tuple[float, str]]:
        """The node's lines kept within [since, until] (0: no bound), oldest first, each once."""
        self.flush(node_id)
        with self._lock:
            node = self._nodes.get(node_id)
            starts = sorted(node.segments) if node is not None else []
        out: list[tuple[float, str]] = []
        for start in starts:
            if (until and start > until) or (since and start + self.slice_seconds <= since):
                continue
            try:
                data = self._path(node_id, start).read_bytes()
            except FileNotFoundError:
                continue          # dropped meanwhile
            out += [(t, text) for t, text in _parse(_members(data))
                    if not (since and t < since) and not (until and t > until)]
        return out

    def oldest(self, node_id: str) -> float:
        """The time of the oldest line kept on disk (0.0: none): the first line of the oldest
        segment (its first bytes alone decompressed)."""
        for start in self.segments(node_id):
            try:
                with self._path(node_id, start).open("rb") as f:
                    head = f.read(1 << 16)
                stamp = zlib.decompressobj(31).decompress(head, 32).partition(b" ")[0]
            except (FileNotFoundError, zlib.error):
                continue
            if stamp.isdigit():
                return int(stamp) / 1000
        return 0.0
