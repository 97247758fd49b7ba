"""The site's content store: files named by the sha256 of their content, on the site's disk,
within a byte budget, least recently used evicted first.

    store = ChunkStore(root, budget, metrics=m, protected=entries.digests_in_use)
    store.reconcile()                         # at start: stray temporary files removed, recounted
    data = store.read(digest)                 # the bytes, or None (a miss)
    with store.writer(digest) as w:           # verified before it gets its name
        w.write(b"...")                       # ChecksumMismatch on leaving when it does not match
    with store.open(digest) as f: ...         # pinned while open: never evicted under a reader
    store.fetch(url, digest, opts, "kernel")  # downloaded once, verified, unless held already

What it holds: the data chunks of images served by proxy routes with a manifest
(agent/site/serve/chunkroute.py) and the kernels and initrds of boot entries (agent/site/boot/pxe.py),
and the ramdisk ISOs of virtual-media sets (agent/site/boot/vmedia.py), all keyed by the digest of
their bytes, never by a URL. A file is written to a temporary sibling
(``.<digest>.<pid>.<random>.tmp``, agent/atomicfile.py), hashed as it is written, fsync'ed, and
renamed to its digest only when the digest matches: a crash leaves no partial file under a digest name, and
``reconcile`` removes the temporary ones. The directory is not fsync'ed after a rename: a
rename lost to a crash loses a chunk, which is fetched again, never a wrong one.

The budget counts the files with a digest name. Room is made when a file is committed: the
least recently used files go first, except those pinned (being read) and those ``protected``
says are in use (a live boot entry's kernel and initrd). When no room can be made, or the disk
is full, the write raises StoreFull and nothing is left behind: a route then serves the
verified chunk from memory without storing it. Files being written are not counted until
committed (one chunk per fetch in flight).
Recency is kept in memory at each hit, and on disk as the file's mtime, set at a hit when it
is older than TOUCH_SECONDS, so the order survives a restart to within that: a deploy's eight
ramdisks hitting a chunk each within a second dirty its inode once, not eight times.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from agent import atomicfile
from agent.config import Config
from agent.errors import AgentError, ChecksumMismatch, Reason
from agent.net import http
from agent.site.metrics import Metrics

log = logging.getLogger(__name__)

DIGEST = re.compile(r"[0-9a-f]{64}")
TOUCH_SECONDS = 60.0      # a hit sets a file's mtime (its recency on disk) when older than this


class StoreFull(AgentError):
    """A verified file could not be kept: the budget is taken by what is in use, or the disk
    is full. Nothing was stored."""

    reason = Reason.SOURCE_FAILED


def check_digest(text: str) -> str:
    if not DIGEST.fullmatch(text):
        raise ValueError(f"not a sha256 digest in lower-case hex: {text[:70]!r}")
    return text


class _Writer:
    """A file being written into the store: hashed as it goes, named only once verified."""

    def __init__(self, store: ChunkStore, digest: str, hashed: bool = False) -> None:
        self.store, self.digest, self.hashed = store, digest, hashed
        self.new = atomicfile.Replacement(store.root / digest, 0o644)
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        if not self.hashed:
            self.hash.update(data)
        try:
            self.new.file.write(data)
        except OSError as exc:
            raise self.store.full(exc) from exc
        self.size += len(data)

    def commit(self) -> None:
        actual = self.digest if self.hashed else self.hash.hexdigest()
        if actual != self.digest:
            raise ChecksumMismatch(f"content is sha256:{actual}, expected sha256:{self.digest}",
                                   expected=self.digest, actual=actual)
        try:
            self.new.finish()            # flushed and fsync'ed before the store's lock is taken
        except OSError as exc:
            raise self.store.full(exc) from exc
        self.store._commit(self)

    def discard(self) -> None:
        self.new.discard()


class ChunkStore:
    """Files by sha256 under ``root`` (mode 0700), within ``budget`` bytes. Thread-safe."""

    def __init__(self, root: Path, budget: int = Config.site_store_bytes, *, metrics: Metrics | None = None,
                 protected: Callable[[], set[str]] | None = None) -> None:
        if budget <= 0:
            raise ValueError(f"store budget {budget}: must be positive")
        self.root = root
        self.budget = budget
        self.metrics = metrics or Metrics()
        self.protected = protected or set
        self._lock = threading.Lock()
        self._files: collections.OrderedDict[str, int] = collections.OrderedDict()  # oldest first
        self._pins: collections.Counter[str] = collections.Counter()
        self._fetching: dict[str, threading.Lock] = {}   # digest -> its one download
        self.size = 0
        self.metrics.gauge("store_bytes", lambda: float(self.size))
        self.metrics.gauge("store_budget_bytes", lambda: float(self.budget))
        self.metrics.gauge("store_chunks", lambda: float(len(self._files)))

    # -- start ---------------------------------------------------------------------------

    def reconcile(self) -> tuple[int, int]:
        """Remove temporary and stray files, recount the budget, evict down to it.
        Returns (files kept, stray files removed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        found: list[tuple[float, str, int]] = []
        stray = 0
        for entry in os.scandir(self.root):
            if DIGEST.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                found.append((st.st_mtime, entry.name, st.st_size))
                continue
            stray += 1
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    log.warning("store: %s is a directory, not a chunk; left alone", entry.name)
                    stray -= 1
                else:
                    os.unlink(entry.path)
        found.sort()
        with self._lock:
            self._files.clear()
            self._pins.clear()
            for _mtime, name, size in found:
                self._files[name] = size
            self.size = sum(self._files.values())
            self._make_room(0)
            kept = len(self._files)
        log.info("store %s: %d files, %d bytes of %d; %d stray files removed", self.root, kept,
                 self.size, self.budget, stray)
        return kept, stray

    # -- reading -------------------------------------------------------------------------

    def has(self, digest: str) -> bool:
        with self._lock:
            return digest in self._files

    @contextlib.contextmanager
    def open(self, digest: str) -> Iterator[BinaryIO | None]:
        """The file of ``digest`` open for reading (None when it is not held), pinned: it is
        not evicted while the body runs."""
        with self._lock:
            held = digest in self._files
            if held:
                self._pins[digest] += 1
                self._files.move_to_end(digest)
        if not held:
            yield None
            return
        try:
            try:
                f = open(self.root / digest, "rb")  # noqa: SIM115  (closed below)
            except FileNotFoundError:  # removed behind the store's back
                f = None
            if f is None:
                yield None
            else:
                with contextlib.suppress(OSError):
                    if os.fstat(f.fileno()).st_mtime < time.time() - TOUCH_SECONDS:
                        os.utime(f.fileno())
                with f:
                    yield f
        finally:
            with self._lock:
                self._pins[digest] -= 1
                if self._pins[digest] <= 0:
                    del self._pins[digest]
            if f is None:
                self._forget(digest)

    def read(self, digest: str, length: int) -> bytes | None:
        """The ``length`` bytes of ``digest``; None when it is not held (or not that long:
        then it is dropped, as damaged)."""
        with self.open(digest) as f:
            if f is None:
                return None
            data = f.read(length + 1)
        if len(data) != length:
            log.warning("store: %s holds %d bytes, %d expected; dropped", digest, len(data), length)
            self.remove(digest)
            return None
        return data

    # -- writing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def writer(self, digest: str, *, hashed: bool = False) -> Iterator[_Writer]:
        """A new file for ``digest``: committed when the body leaves without an error and the
        content matches (ChecksumMismatch otherwise); nothing is left behind on any error.
        ``hashed``: the caller has already compared the bytes' digest (a route's chunk)."""
        check_digest(digest)
        try:
            w = _Writer(self, digest, hashed)
        except OSError as exc:
            raise self.full(exc) from exc
        try:
            yield w
            w.commit()
        finally:
            w.discard()

    def fetch(self, url: str, digest: str, opts: http.HttpOptions, what: str) -> None:
        """Download ``url`` under ``digest`` unless the store holds it: once, however many ask
        for it at once (they wait for that download), verified before it gets its name
        (ChecksumMismatch, nothing kept; SourceFailed from the download; StoreFull)."""
        with self._lock:
            gate = self._fetching.setdefault(digest, threading.Lock())
        try:
            with gate:
                if self.has(digest):
                    return
                log.info("caching %s %s (sha256:%s)", what, http.redact(url), digest)
                try:
                    with http.get(url, opts) as body, self.writer(digest) as w:
                        for chunk in body.iter_chunks(1 << 20):
                            w.write(chunk)
                except ChecksumMismatch as exc:
                    raise ChecksumMismatch(
                        f"{what} {http.redact(url)}: {exc.message}; not cached", expected=digest,
                        actual=exc.details.get("actual", "")) from None
        finally:
            with self._lock:
                self._fetching.pop(digest, None)

    def put(self, digest: str, data: bytes | memoryview, *, hashed: bool = False) -> None:
        """Store ``data`` under ``digest`` (ChecksumMismatch, StoreFull; nothing stored then)."""
        if self.has(digest):
            return
        with self.writer(digest, hashed=hashed) as w:
            w.write(data)

    def remove(self, digest: str) -> bool:
        """Remove ``digest`` unless it is pinned; True when it was removed."""
        with self._lock:
            if digest in self._pins or digest not in self._files:
                return False
            self.size -= self._files.pop(digest)
        with contextlib.suppress(FileNotFoundError):
            (self.root / digest).unlink()
        return True

    def full(self, exc: OSError) -> StoreFull:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFull(f"the store's disk is full ({self.root})")
        return StoreFull(f"the store cannot write in {self.root}: {exc.strerror or exc}")

    # -- inside --------------------------------------------------------------------------

    def _commit(self, w: _Writer) -> None:
        with self._lock:
            if w.digest in self._files:
                return  # another writer got there first; this one's file is discarded
            if not self._make_room(w.size):
                self.metrics.inc("store_write_failures_total")
                raise StoreFull(f"the store's budget ({self.budget} bytes) is taken by files in use")
            w.new.commit(sync_folder=False)     # see the module docstring
            self._files[w.digest] = w.size
            self.size += w.size

    def _make_room(self, need: int) -> bool:
        """Evict (lock held) until ``need`` more bytes fit; False when they cannot."""
        if self.size + need <= self.budget:
            return True
        keep = self.protected()
        for digest in list(self._files):
            if self.size + need <= self.budget:
                break
            if digest in self._pins or digest in keep:
                continue
            self.size -= self._files.pop(digest)
            with contextlib.suppress(FileNotFoundError):
                (self.root / digest).unlink()
            self.metrics.inc("store_evictions_total")
        return self.size + need <= self.budget

    def _forget(self, digest: str) -> None:
        with self._lock:
            size = self._files.pop(digest, None)
            if size is not None:
                self.size -= size
