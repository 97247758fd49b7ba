"""A copy verified by a manifest: every chunk verified before it is written, hashed on every core,
zero chunks never hashed (nor downloaded), the partition table written last. The manifest
pipeline of deploy.image (agent/images/deploy.py) loads the Plan, picks the chunk reader the
source allows (agent/images/readers.py) and runs:

    copy = VerifiedCopy(plan, reader, writer, fd, skip_zeros=..., check=ctx.check, ...)
    copy.run()            # raises ChecksumMismatch / SourceFailed naming the chunk and offset

Three threads of work, in order of the image::

    reader (the producer thread): for a data chunk, fill a writer buffer from the
        source (a local file by offset, HTTP Range requests of the data runs only, or the
        decompressed stream); for a zero chunk, check the source's bytes are zeros (memcmp) or
        skip them (a hole of the local file, not downloaded at all over HTTP)
    hash pool (a thread per core; hashlib lets the GIL go): the chunk's digest
    the caller's thread: takes the chunks in image order, compares each digest, and only then
        hands the buffer to the DiskWriter. The first mismatch stops everything: no chunk
        from the bad one on is ever written.

A zero chunk is written by nobody when the disk was discarded and reads zeros, with BLKZEROOUT
(or zeros, for a file) otherwise. The chunks that hold the partition tables (those overlapping
the first and the last MiB of the image: the MBR and primary GPT, the backup GPT) are kept in
memory and written at the very end, after everything else was verified, written and flushed:
the end first, then the start, its first page (MBR, GPT header) last, each flushed. Until then
the disk has no partition table (the caller discarded or cleared its ends first), so a crash,
a cancel or a failure leaves nothing bootable. A .bmap's mapped range longer than one buffer
(8 MiB) is hashed in order across its pieces and checked at its last piece (as bmaptool does),
so its earlier pieces may be written before the mismatch is known; the partition table is
still written last.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from agent.errors import Cancelled, ChecksumMismatch, SourceFailed
from agent.hw import block, diskio
from agent.images import readers
from agent.images.plan import Plan, Segment

HOLD = 1 << 20            # bytes at each end of the image whose chunks are written last
FIRST_PAGE = 4096         # the MBR and the primary GPT header, written after everything else
_END = object()


@dataclass
class _Item:
    seg: Segment
    offset: int                     # of this piece
    length: int
    buf: memoryview | None = None   # a whole writer buffer (the piece is its first ``length``); None: zeros
    future: Future[bytes | None] | None = None
    last: bool = True               # the segment's last piece (its digest is checked here)


class VerifiedCopy:
    def __init__(
        self, plan: Plan, reader: readers.ChunkReader, writer: diskio.DiskWriter, fd: int, *,
        skip_zeros: bool, check: Callable[[], None], progress: Callable[[int], None],
        workers: int | None = None,
    ) -> None:
        self.plan, self.reader, self.writer, self.fd = plan, reader, writer, fd
        self.skip_zeros = skip_zeros
        self.check, self.progress = check, progress
        self.workers = workers or os.cpu_count() or 1
        self.chunks_verified = 0
        self.zero_chunks = 0
        self.zeros_skipped = 0
        self.held: list[tuple[int, bytes]] = []
        self._items: queue.Queue[_Item | BaseException | object] = queue.Queue(maxsize=4096)
        self._halt = threading.Event()

    # -- producer ------------------------------------------------------------------------

    def _put(self, item: _Item | BaseException | object) -> None:
        while not self._halt.is_set():
            try:
                self._items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise Cancelled("stopped")

    def _produce(self, pool: ThreadPoolExecutor, chain: ThreadPoolExecutor) -> None:
        algorithm = self.plan.algorithm
        piece_size = self.writer.buffer_size

        def digest(view: memoryview) -> bytes | None:
            return hashlib.new(algorithm, view).digest()

        try:
            for seg in self.plan.segments:
                if self._halt.is_set():
                    return
                if seg.digest is None:
                    self._read(seg, seg.offset, None)
                    self._put(_Item(seg, seg.offset, seg.length))
                    continue
                if seg.length <= piece_size:
                    buf = self.writer.take()
                    self._read(seg, seg.offset, buf[: seg.length])
                    self._put(_Item(seg, seg.offset, seg.length, buf, pool.submit(digest, buf[: seg.length])))
                    continue
                h = hashlib.new(algorithm)   # a long .bmap range: hashed in order, piece by piece
                for pos in range(seg.offset, seg.end, piece_size):
                    n = min(piece_size, seg.end - pos)
                    buf = self.writer.take()
                    self._read(seg, pos, buf[:n])
                    last = pos + n == seg.end

                    def update(view: memoryview = buf[:n], last: bool = last,
                               h: hashlib._Hash = h) -> bytes | None:
                        h.update(view)
                        return h.digest() if last else None

                    self._put(_Item(seg, pos, n, buf, chain.submit(update), last))
            self.reader.finish(self.plan.image_size)
            self._put(_END)
        except Cancelled:
            if not self._halt.is_set():
                self._put(Cancelled("write stopped"))
        except BaseException as exc:
            with contextlib.suppress(Cancelled):
                self._put(exc)

    def _read(self, seg: Segment, offset: int, view: memoryview | None) -> None:
        """The piece's bytes into ``view`` (None: the zero segment's bytes, checked); a source
        that fails names the chunk and its offset."""
        try:
            if view is None:
                self.reader.pass_zeros(seg.offset, seg.length)
            else:
                self.reader.read_data(offset, view)
        except (SourceFailed, ChecksumMismatch) as exc:
            what = "chunk" if self.plan.kind == "manifest" else "range"
            err = type(exc)(f"{what} {seg.index} at offset {seg.offset}: {exc.message}")
            err.details = {**exc.details, "chunk": str(seg.index), "offset": str(seg.offset)}
            raise err from exc

    # -- consumer ------------------------------------------------------------------------

    def run(self) -> None:
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="deploy-hash")
        chain = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deploy-hash-range")
        producer = threading.Thread(target=self._produce, args=(pool, chain), name="deploy-read", daemon=True)
        producer.start()
        done = 0
        try:
            while True:
                self.check()
                try:
                    item = self._items.get(timeout=0.2)
                except queue.Empty:
                    continue
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, _Item)
                self._consume(item)
                done = item.offset + item.length
                self.progress(done)
        finally:
            self._halt.set()
            if producer.is_alive():
                self.writer.stop.set()  # a producer waiting for a buffer wakes up and leaves
            with contextlib.suppress(queue.Empty):
                while True:
                    self._items.get_nowait()
            producer.join(timeout=10)
            pool.shutdown(wait=True, cancel_futures=True)
            chain.shutdown(wait=True, cancel_futures=True)

    def _held(self, offset: int, length: int) -> bool:
        return offset < HOLD or offset + length > self.plan.image_size - HOLD

    def _consume(self, item: _Item) -> None:
        seg = item.seg
        if item.buf is None:
            self.zero_chunks += 1
            if self.skip_zeros:
                self.zeros_skipped += seg.length
            else:
                block.zero_out(self.fd, seg.offset, seg.length)
            return
        assert item.future is not None
        got = item.future.result()
        if item.last and got != seg.digest:
            self.writer.give_back(item.buf)
            what = "chunk" if self.plan.kind == "manifest" else "range"
            raise ChecksumMismatch(
                f"{what} {seg.index} at offset {seg.offset} ({seg.length} bytes): {self.plan.algorithm}"
                f" {got.hex() if got else '?'}, the manifest says {seg.digest.hex() if seg.digest else '?'}",
                chunk=seg.index, offset=seg.offset,
            )
        if item.last:
            self.chunks_verified += 1
        if self._held(item.offset, item.length):
            self.held.append((item.offset, bytes(item.buf[: item.length])))
            self.writer.give_back(item.buf)
        else:
            self.writer.submit(item.buf, item.offset, item.length)

    def write_held(self, direct_fd: int | None) -> int:
        """After the writer was closed (all else written and flushed): the end of the image,
        flushed, then its start but for the first 4 KiB, flushed, then those 4 KiB (the MBR and
        the primary GPT header: one page, so a kill cannot leave half of it), flushed. Returns
        the bytes written."""
        written = 0
        half = self.plan.image_size // 2
        held: list[tuple[int, bytes]] = []
        for offset, data in self.held:
            if offset == 0 and len(data) > FIRST_PAGE:
                held += [(FIRST_PAGE, data[FIRST_PAGE:]), (0, data[:FIRST_PAGE])]
            else:
                held.append((offset, data))
        tail = [h for h in held if h[0] >= half]
        start = [h for h in held if 0 < h[0] < half]
        first = [h for h in held if h[0] == 0]
        for part in (tail, start, first):
            for offset, data in part:
                pos = 0
                while pos < len(data):
                    pos += os.pwrite(self.fd, data[pos:], offset + pos)
                written += len(data)
            if part:
                os.fsync(self.fd)
                if direct_fd is not None:
                    os.fsync(direct_fd)
        return written
