"""A proxy route with a manifest: the image served from the site's chunk store, each chunk
fetched from the upstream once per site and verified before it is stored or served.

    plan = load_plan(manifest_bytes, "manifest")     # an ImageManifest of a raw image
    chunks = ChunkCache(store, metrics, upstream_options, routes)
    serve(handler, route, method, chunks)            # from web.py, for a route with a plan

A request (GET or HEAD, with or without one ``Range: bytes=...``) is split at the chunk
boundaries of the route's manifest. A zero chunk is zeros: never fetched, never stored. A data
chunk comes from the store, or from the upstream by a Range request of exactly that chunk;
concurrent requests for a chunk that is being fetched wait for that one fetch (single flight),
and the next READAHEAD data chunks of the image after the one being sent (past the request's
range too: the ramdisk asks for the next run of data next) are fetched ahead on a small pool
shared by all routes, into the store. A fetched
chunk's sha256 is compared with the manifest's digest: it is stored and served only when it
matches. A chunk that does not match is not stored, its bytes are not passed on, and the
client gets an error: a 502 when it is the request's first chunk (asked for before the answer
starts), otherwise its connection is cut before the announced Content-Length (a failure, never
a short success). The ramdisk verifies every chunk again against its own signed manifest, so a
wrong route manifest can fail a deploy, never corrupt a disk.

Memory: a request holds the chunk it sends; the pool runs at most FETCH_WORKERS fetches at
once for all routes; at most STORE_QUEUE verified chunks wait for the store's writers. A chunk
in the store is sent from its file with sendfile(2) (no copy through Python; the page cache
serves it), pinned while it is sent: the store never evicts a chunk a request is being served
from.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import BinaryIO

from agent.images.plan import Plan, Segment
from agent.net import http as agent_http
from agent.site.chunkstore import ChunkStore, StoreFull
from agent.site.metrics import Metrics
from agent.site.serve.routes import Route, RouteTable, UpstreamError, done_upstream, open_upstream

log = logging.getLogger(__name__)

FETCH_WORKERS = 8        # chunks fetched ahead at once, for all routes together
READAHEAD = 4            # data chunks a request has fetched ahead of the one it sends
STORE_WRITERS = 2        # threads writing verified chunks to the store
STORE_QUEUE = 16         # verified chunks waiting for them, at most (then written inline)
MAX_ATTEMPTS = 2         # a chunk the upstream fails to send is asked for this many times


class ChunkRejected(Exception):
    """The upstream's bytes of a chunk did not match the manifest."""


@dataclass
class _Fetch:
    future: Future[bytes] = field(default_factory=Future)
    by: object = None        # the request (a _Serving) that started it


class ChunkCache:
    """Chunks by digest: the store, the fetches in flight (single flight), the fetch pool."""

    def __init__(self, store: ChunkStore, metrics: Metrics,
                 upstream: agent_http.HttpOptions, routes: RouteTable) -> None:
        """``routes``: whose upstream policy every fetch is dialled under (agent/site/serve/upstreams.py)."""
        self.store, self.metrics, self.upstream, self.routes = store, metrics, upstream, routes
        self._lock = threading.Lock()
        self._inflight: dict[str, _Fetch] = {}
        self._ahead = 0
        self._pool = ThreadPoolExecutor(FETCH_WORKERS, thread_name_prefix="site-chunk")
        self._writer = ThreadPoolExecutor(STORE_WRITERS, thread_name_prefix="site-store")
        self._queued = threading.BoundedSemaphore(STORE_QUEUE)

    def close(self) -> None:
        """Stop the pool; a fetch it will not run now fails its waiters (none waits for ever)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._writer.shutdown(wait=False)
        with self._lock:
            pending = list(self._inflight.values())
        for fetch in pending:
            with contextlib.suppress(InvalidStateError):
                fetch.future.set_exception(UpstreamError("the site's HTTP service stopped", 503))

    def get(self, route: Route, seg: Segment, by: object) -> tuple[bytes, bool]:
        """The verified bytes of data chunk ``seg``, and whether ``by`` fetched them itself
        (False: from the store, or from a fetch another request started)."""
        assert seg.digest is not None
        key = seg.digest.hex()
        for _ in range(3):  # a chunk evicted between the check and the read is looked up again
            data = self.store.read(key, seg.length)
            if data is not None:
                self.metrics.inc("store_hits_total")
                return data, False
            with self._lock:
                fetch = self._inflight.get(key)
                mine = fetch is None and not self.store.has(key)
                if mine:
                    fetch = self._inflight[key] = _Fetch(by=by)
            if fetch is None:
                continue  # it was stored meanwhile: read it
            self.metrics.inc("store_misses_total")
            if mine:
                self._fill(route, seg, key, fetch)
            return fetch.future.result(), fetch.by is by
        raise UpstreamError(f"chunk {seg.index} could not be kept in the store long enough to read")

    def ahead(self, route: Route, seg: Segment, by: object) -> bool:
        """Start fetching ``seg`` on the pool unless it is held, in flight, or the pool is
        busy; True when this started a fetch."""
        assert seg.digest is not None
        key = seg.digest.hex()
        with self._lock:
            if self._ahead >= FETCH_WORKERS or key in self._inflight or self.store.has(key):
                return False
            fetch = self._inflight[key] = _Fetch(by=by)
            self._ahead += 1

        def run() -> None:
            try:
                self._fill(route, seg, key, fetch)
            finally:
                with self._lock:
                    self._ahead -= 1

        try:
            self._pool.submit(run)
        except RuntimeError:  # shut down: let a request fetch it itself
            with self._lock:
                self._ahead -= 1
                self._inflight.pop(key, None)
            return False
        return True

    def _fill(self, route: Route, seg: Segment, key: str, fetch: _Fetch) -> None:
        """Fetch and verify ``seg``, hand it to the waiters, then store it on the writer
        pool (inline when STORE_QUEUE writes are pending already): nobody waits for the
        store's fsync. A request that comes meanwhile finds the fetch in flight, already
        answered, until the chunk is in the store."""
        try:
            data = self._fetch(route, seg)
        except BaseException as exc:  # the waiters' to report (each request logs its own)
            with contextlib.suppress(InvalidStateError):  # failed by close() meanwhile
                fetch.future.set_exception(exc)
            self._landed(key)
            return
        with contextlib.suppress(InvalidStateError):
            fetch.future.set_result(data)
        if self._queued.acquire(blocking=False):
            try:
                self._writer.submit(self._store, route, seg, key, data, True)
                return
            except RuntimeError:  # shut down
                self._queued.release()
        self._store(route, seg, key, data, False)

    def _store(self, route: Route, seg: Segment, key: str, data: bytes, queued: bool) -> None:
        try:
            self.store.put(key, data, hashed=True)
        except StoreFull as exc:
            self.metrics.inc("store_write_failures_total")
            log.warning("route %s: chunk %d served without being stored: %s", route.id,
                        seg.index, exc.message)
        except OSError as exc:
            self.metrics.inc("store_write_failures_total")
            log.warning("route %s: chunk %d not stored: %s", route.id, seg.index, exc)
        finally:
            if queued:
                self._queued.release()
            self._landed(key)

    def _landed(self, key: str) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    def _fetch(self, route: Route, seg: Segment) -> bytes:
        """The chunk's bytes from the upstream, verified; UpstreamError or ChunkRejected."""
        error: Exception | None = None
        for _attempt in range(MAX_ATTEMPTS):
            try:
                data = self._download(route, seg)
            except UpstreamError as exc:
                error = exc
                continue
            if hashlib.sha256(data).digest() != seg.digest:
                self.metrics.inc("chunks_rejected_total")
                log.warning("route %s (node %s): chunk %d at byte %d from %s does not match the "
                            "manifest; not stored, not served", route.id, route.node_id,
                            seg.index, seg.offset, agent_http.redact(route.upstream_url))
                raise ChunkRejected(f"chunk {seg.index} at byte {seg.offset} from the upstream "
                                    "does not match the manifest")
            self.metrics.inc("chunks_verified_total")
            return data
        assert error is not None
        raise error

    def _download(self, route: Route, seg: Segment) -> bytes:
        last = seg.end - 1
        pool = self.routes.upstreams
        conn, resp = open_upstream(route, "GET", {"Range": f"bytes={seg.offset}-{last}"},
                                   self.upstream, self.routes.policy, pool)
        n = 0
        try:
            whole = resp.status == 200 and seg.offset == 0 and route.plan is not None and \
                route.plan.image_size == seg.length
            if resp.status != 206 and not whole:
                raise UpstreamError(f"upstream answered {resp.status} to a chunk's Range request")
            if resp.status == 206:
                got = resp.getheader("Content-Range", "")
                if not got.startswith(f"bytes {seg.offset}-{last}/"):
                    raise UpstreamError(f"upstream sent {got[:60]!r} for bytes {seg.offset}-{last}")
            # One read to the chunk's end, into the bytes it returns: no zeroed buffer to fill
            # and copy again (a fresh 4 MiB each, page faults and all, was a tenth of the
            # site's CPU in a rack's deploy). Short when the upstream ends early.
            try:
                data = resp.read(seg.length)
            except (OSError, ValueError) as exc:
                raise UpstreamError(f"upstream failed mid-chunk: {type(exc).__name__}") from exc
            except Exception as exc:  # http.client.IncompleteRead and its kin
                raise UpstreamError(f"upstream failed mid-chunk: {type(exc).__name__}") from exc
            n = len(data)
            self.metrics.inc("upstream_bytes_fetched_total", n)
            if n < seg.length:
                raise UpstreamError(f"upstream ended chunk {seg.index} at {n} of {seg.length} bytes")
            return data
        finally:
            done_upstream(pool, route, conn, resp, n == seg.length and resp.isclosed())


# -- answering a request ---------------------------------------------------------------


@dataclass
class Served:
    status: int
    sent: int = 0
    from_store: int = 0
    from_upstream: int = 0
    zeros: int = 0
    note: str = ""

    def describe(self) -> str:
        return (f"{self.from_store} bytes from the store, {self.from_upstream} from the "
                f"upstream, {self.zeros} zeros")


class Cut(Exception):
    """The answer started and cannot be completed: the connection must be dropped."""

    def __init__(self, note: str, served: Served) -> None:
        super().__init__(note)
        self.served = served


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """A single ``bytes=`` range as [start, end) within ``size``; None for the whole image
    (no header, or one this service ignores: several ranges, another unit); "unsatisfiable"."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or last.isdigit()) or \
            (first and not first.isdigit()) or (last and not last.isdigit()):
        return None
    if not first:  # the last N bytes
        n = int(last)
        if n == 0:
            return "unsatisfiable"
        return max(0, size - n), size
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    if start >= size:
        return "unsatisfiable"
    if end <= start:
        return None
    return start, end


@functools.lru_cache(maxsize=4)
def zeros(size: int) -> memoryview:
    """A chunk of zeros, made once per chunk size for every request (a request made its own
    before: 4 MiB zeroed for each of a deploy's hundreds of Range requests, zero chunks or not)."""
    return memoryview(bytes(size))


def etag(route: Route) -> str:
    return f'"m-{route.manifest[:32]}"'


@dataclass(frozen=True)
class _StoredPiece:
    """``count`` bytes at ``offset`` of a stored chunk's open file."""

    file: BinaryIO
    offset: int
    count: int

    def __len__(self) -> int:
        return self.count


class _Serving:
    """One request's walk over the chunks of its range."""

    def __init__(self, route: Route, chunks: ChunkCache, start: int, end: int) -> None:
        self.route, self.chunks, self.start, self.end = route, chunks, start, end
        assert route.plan is not None
        self.plan: Plan = route.plan
        cs = self.plan.chunk_size
        self.segments = self.plan.segments[start // cs: -(-end // cs)]
        self.result = Served(200)
        self.fetched_ahead: set[int] = set()   # chunks this request's read-ahead fetched

    def data_after(self, seg: Segment) -> list[Segment]:
        """The READAHEAD data chunks after ``seg`` in the image, past this request's range
        too: a ramdisk asks for each run of data chunks in turn, so the next run's first
        chunk is what it asks for next."""
        found: list[Segment] = []
        for nxt in self.plan.segments[seg.index + 1:]:
            if nxt.digest is not None:
                found.append(nxt)
                if len(found) == READAHEAD:
                    break
        return found

    def pieces(self, first: bytes | None) -> Iterator[memoryview | _StoredPiece]:
        """The request's bytes in order, a chunk at a time: bytes in memory, or a stored
        chunk's file (pinned while the consumer sends it: sendfile, no copy); ``first`` is
        the first data chunk, already fetched."""
        for seg in self.segments:
            lo = max(seg.offset, self.start) - seg.offset
            hi = min(seg.end, self.end) - seg.offset
            if seg.digest is None:
                self.result.zeros += hi - lo
                self.chunks.metrics.inc("zero_bytes_served_total", hi - lo)
                yield zeros(self.plan.chunk_size)[lo:hi]
                continue
            self._ahead_of(seg)
            if first is not None:
                data, own = first, self._first_own
                first = None
            else:
                with self.chunks.store.open(seg.digest.hex()) as f:
                    if f is not None and os.fstat(f.fileno()).st_size == seg.length:
                        if seg.index not in self.fetched_ahead:
                            self.chunks.metrics.inc("store_hits_total")
                        self._count(seg, hi - lo, False)
                        yield _StoredPiece(f, lo, hi - lo)
                        continue
                data, own = self.chunks.get(self.route, seg, self)
            self._count(seg, hi - lo, own)
            yield memoryview(data)[lo:hi]

    def _count(self, seg: Segment, n: int, own: bool) -> None:
        """``n`` bytes of ``seg`` served: from the upstream when this request fetched it
        (itself or ahead), otherwise from the store (or another request's fetch)."""
        if own or seg.index in self.fetched_ahead:
            self.result.from_upstream += n
        else:
            self.result.from_store += n
            self.chunks.metrics.inc("store_bytes_served_total", n)

    _first_own = False

    def first(self) -> bytes | None:
        """The first data chunk of the range, fetched before the answer starts (so that a
        failure is an HTTP error, not a cut)."""
        for seg in self.segments:
            if seg.digest is not None:
                self._ahead_of(seg)
                if self.chunks.store.has(seg.digest.hex()):
                    return None  # sent from its file by pieces(), not read here
                data, self._first_own = self.chunks.get(self.route, seg, self)
                return data
        return None

    def _ahead_of(self, seg: Segment) -> None:
        for following in self.data_after(seg):
            if self.chunks.ahead(self.route, following, self):
                self.fetched_ahead.add(following.index)


def serve(h: BaseHTTPRequestHandler, route: Route, method: str, routes: RouteTable,
          chunks: ChunkCache) -> Served:
    """Answer ``h``'s request on ``route`` (which has a plan) from the chunk store. Returns
    what was served; raises Cut when the connection must be dropped (after the answer began)."""
    plan = route.plan
    assert plan is not None
    size = plan.image_size
    tag = etag(route)
    wanted = parse_range(h.headers.get("Range"), size)
    if_range = h.headers.get("If-Range")
    if if_range is not None and if_range.strip() != tag:
        wanted = None  # the client's copy is of another version: the whole image
    if wanted == "unsatisfiable":
        _answer(h, 416, b"range not satisfiable\n", {"Content-Range": f"bytes */{size}"})
        return Served(416, note="unsatisfiable range")
    start, end = (0, size) if wanted is None or isinstance(wanted, str) else wanted
    status = 200 if wanted is None else 206
    length = end - start
    headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
               "ETag": tag, "Content-Length": str(length)}
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    if method == "HEAD":
        _start(h, status, headers)
        return Served(status)
    if not routes.reserve(route, length):
        _answer(h, 403, f"route {route.id}: past its max_bytes ({route.max_bytes})\n".encode(), {})
        return Served(403, note="past max_bytes")
    walk = _Serving(route, chunks, start, end)
    walk.result.status = status
    try:
        first = walk.first()
    except (UpstreamError, ChunkRejected) as exc:
        route.release(length)
        code = exc.status if isinstance(exc, UpstreamError) else 502
        _answer(h, code, f"{exc}\n".encode(), {})
        walk.result.status, walk.result.note = code, str(exc)
        return walk.result
    _start(h, status, headers)
    sent = 0
    try:
        for piece in walk.pieces(first):
            if isinstance(piece, _StoredPiece):
                h.wfile.flush()
                h.connection.sendfile(piece.file, piece.offset, piece.count)
            else:
                h.wfile.write(piece)
            sent += len(piece)
    except (UpstreamError, ChunkRejected) as exc:
        route.release(length - sent)
        walk.result.sent, walk.result.note = sent, f"cut: {exc}"
        raise Cut(walk.result.note, walk.result) from exc
    except (ConnectionError, TimeoutError, BlockingIOError) as exc:  # the last: a kernel timeout
        route.release(length - sent)
        walk.result.sent, walk.result.note = sent, f"client went away: {type(exc).__name__}"
        raise Cut(walk.result.note, walk.result) from exc
    walk.result.sent = sent
    return walk.result


def _start(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
    h.send_response(status)
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()


def _answer(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
    _start(h, status, {**headers, "Content-Type": "text/plain", "Content-Length": str(len(body))})
    with contextlib.suppress(OSError):
        h.wfile.write(body)
