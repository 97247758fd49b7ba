"""deploy.image with a manifest: every chunk verified before it is written, hashed on every core,
zero chunks never hashed (nor downloaded), the partition table written last.

``ManifestDeployment`` is the pipeline (a deploy_base.Deployment): it loads the manifest, picks
the chunk reader the source allows (agent/images/image.py: Range requests, a file by offset, a qcow2
file's tables, a stream), checks a request's digest of the published file, and runs:

    copy = VerifiedCopy(plan, reader, writer, fd, skip_zeros=..., check=ctx.check, ...)
    copy.run()            # raises ChecksumMismatch / SourceFailed naming the chunk and offset

Three threads of work, in order of the image::

    reader (this module's producer thread): for a data chunk, fill a writer buffer from the
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
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent.commands.deploy_base import QCOW2_NEEDS_FILE, Deployment
from agent.errors import (
    AgentError,
    Cancelled,
    ChecksumMismatch,
    InvalidParameters,
    Reason,
    SourceFailed,
    Unsupported,
)
from agent.hw import block, diskio
from agent.images import filesource, image, manifest
from agent.images.manifest import Plan, Segment
from agent.net import http
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat

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
        self, plan: Plan, reader: image.ChunkReader, writer: diskio.DiskWriter, fd: int, *,
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


def digest_in_manifest(plan: Plan, fmt: int) -> bool:
    """Whether the manifest gives the digest of the published file itself (one made from a file
    of this format): then check_against_source compares the request's digest with it."""
    return plan.published is not None and plan.published_format == fmt


def check_against_source(plan: Plan, total: int | None, fmt: int, digest: image.Digest | None) -> None:
    """Refuse, before anything is written, a manifest that disagrees with the image: its raw
    size, or (when it was made from a file of this format) the published file's size, or the
    request's digest of the published file."""
    if fmt == image.Fmt.RAW and total is not None and total != plan.image_size:
        raise ChecksumMismatch(f"the image is {total} bytes, its manifest says {plan.image_size}",
                               size=total, manifest_size=plan.image_size)
    if plan.published_format != fmt:
        return  # a manifest of the raw image serves its compressed copies too (a digest: hashed)
    if plan.published_size and total is not None and total != plan.published_size:
        raise ChecksumMismatch(f"the published image is {total} bytes, its manifest says"
                               f" {plan.published_size}", size=total, manifest_size=plan.published_size)
    if digest is not None and plan.published is not None and plan.published != digest:
        raise InvalidParameters("the request's digest of the image is not the one its manifest gives")


class ManifestDeployment(Deployment):
    """The image with a manifest (an ImageManifest or a .bmap): read chunk by chunk as its
    source allows (image.py's chunk readers), each chunk verified before it is written by
    VerifiedCopy, the partition tables last."""

    def deploy(self) -> None:
        self._run_manifest(self._load_plan())

    def _load_plan(self) -> Plan:
        """The manifest, checked against its signed digest and parsed; nothing is touched yet."""
        p = self.params
        data = p.manifest_inline
        if p.manifest is not None:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="bc-manifest-") as private:
                dest = Path(private) / "manifest"
                # The request's CA; its headers (say, a token) only where the image is.
                same = bool(p.url and p.manifest.url) and http.origin(p.url) == http.origin(p.manifest.url)
                filesource.fetch(p.manifest, dest, cancel=self.ctx.cancel_event,
                                 ca_file=self.ctx.config.ca_bundle, ca_pem=p.ca_pem,
                                 headers=p.headers if same else None, pool=self.pool)
                data = dest.read_bytes()
        plan = manifest.parse(data)
        if plan.image_size > self.disk.size:
            raise AgentError(f"the manifest's image is {plan.image_size} bytes, disk {self.disk.name} only"
                             f" {self.disk.size}", reason=Reason.TOO_LARGE)
        return plan

    def _run_manifest(self, plan: Plan) -> None:
        """The image read chunk by chunk as its source allows: a raw image over HTTP by Range
        (data runs only), a local raw file by offset (holes skipped), a local qcow2 file through
        its tables, anything else as a stream. A request's digest of the published file that
        the manifest does not vouch for itself (a .bmap, or a manifest of the raw image given
        for a compressed or qcow2 copy) is checked on the published bytes as they are read:
        the whole file is then read (over HTTP: downloaded, zeros too), hashed on a thread of
        its own, and compared before the partition tables are written."""
        p = self.params
        self.result.verification = plan.kind
        source: image.Source | None = None
        reader: image.ChunkReader | None = None
        hasher: image.HashToEnd | None = None
        published: Callable[[], str] | None = None
        try:
            if p.url:
                # A 16-byte Range probe: the format, the size, and whether Range works, without
                # starting a download of the whole image.
                with http.get(p.url, self._http_options(), offset=0, length=image.MAGIC_LEN,
                              pool=self.pool) as probe:
                    head = probe.read(image.MAGIC_LEN)
                    ranged, total = probe.ranged, probe.total
                fmt = self._check_format(head)
                if fmt == Fmt.RAW and ranged and not self._must_hash(plan, fmt):
                    check_against_source(plan, total, fmt, p.digest)
                    reader = image.RangeReader(p.url, self._http_options(), plan, self.pool)
                else:
                    source = self._open_source()
                    fmt = self._check_format(source.peek())
            else:
                source = self._open_source()
                fmt = self._check_format(source.peek())
            if source is not None:
                self._check_fits(fmt, source.total)
                check_against_source(plan, source.total, fmt, p.digest)
                must_hash = self._must_hash(plan, fmt)
                if fmt == Fmt.QCOW2 or (fmt == Fmt.RAW and p.local_path is not None):
                    if p.local_path is None:
                        raise Unsupported(QCOW2_NEEDS_FILE)
                    if fmt == Fmt.QCOW2:
                        qcow = image.Qcow2Reader(str(p.local_path))
                        reader = qcow
                        check_against_source(plan, qcow.q.size, Fmt.RAW, None)
                    else:
                        reader = image.FileReader(str(p.local_path))
                    if must_hash:  # the file is read by offset: its digest on a thread of its own
                        hasher = image.HashToEnd(source)
                        published = hasher.hexdigest
                else:
                    stream = image.RawStream(source, fmt, self.ctx.running, hash_published=must_hash)
                    reader = image.StreamReader(stream)
                    if must_hash:  # hashed by the stream's feeding thread as it reads
                        published = source.hasher.hexdigest
            assert reader is not None
            self._write_verified(plan, reader, published)
            self.result.source_bytes = reader.fetched
            reader.close()
            self.result.resumes = reader.resumes
        finally:
            if reader is not None:
                reader.close()
            if hasher is not None:
                hasher.close()
            if source is not None:
                source.close()

    def _must_hash(self, plan: Plan, fmt: int) -> bool:
        """A digest in the request that the manifest does not give for this very file (then
        check_against_source compared the two): it is checked on the bytes."""
        return self.params.digest is not None and not digest_in_manifest(plan, fmt)

    def _write_verified(self, plan: Plan, reader: image.ChunkReader,
                        published: Callable[[], str] | None = None) -> None:
        with self._open_target() as (fd, dfd):
            skip = self._prepare(fd)
            if not skip:  # the old partition table goes before anything new is written
                block.clear_ends(fd, self.disk.size)
            buffers = max(4, min(32, (128 << 20) // plan.chunk_size))
            with diskio.DiskWriter(
                fd, dfd, size=self.disk.size, skip_zeros=skip, cancel=self.ctx.cancel_event,
                block=self.disk.logical_block_size, buffer_size=plan.chunk_size, buffers=buffers,
            ) as writer:
                copy = VerifiedCopy(
                    plan, reader, writer, fd, skip_zeros=skip, check=self.ctx.check,
                    progress=lambda done: self._progress_raw(done, plan.image_size, writer),
                )
                copy.run()
            if published is not None:  # before the partition tables: a mismatch leaves none
                self._check_digest(published())
            held = copy.write_held(dfd)
            self.result.bytes_written = writer.written + held
            self.result.bytes_skipped = writer.skipped + copy.zeros_skipped
            self.result.image_bytes = plan.image_size
            self.result.chunks_verified = copy.chunks_verified
            self.result.zero_chunks = copy.zero_chunks
            if self.params.verify_readback:
                self._readback_chunks(fd, dfd, plan)
            self._finish(fd)

    def _progress_raw(self, done: int, total: int, writer: diskio.DiskWriter) -> None:
        if self.meter.due():
            self.meter.update(done, total=total,
                              message=f"{done} image bytes verified, {writer.written} written")

    def _readback_chunks(self, fd: int, dfd: int | None, plan: Plan) -> None:
        """Every data chunk read back from the disk (the page cache dropped first), its digest
        against the manifest's."""
        data = [seg for seg in plan.segments if seg.digest is not None]
        got = self._read_back(fd, dfd, [(seg.offset, seg.length) for seg in data], plan.algorithm)
        for seg, digest in zip(data, got, strict=True):
            if digest != seg.digest:
                raise ChecksumMismatch(f"{self.disk.name}: read back, chunk {seg.index} at offset"
                                       f" {seg.offset} differs from the manifest",
                                       chunk=seg.index, offset=seg.offset)
        self.result.readback_verified = True
