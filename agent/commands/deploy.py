"""deploy.image: stream an OS image onto the disk the hints select, verified, as fast as the
disk allows.

Pipeline (threads, bounded queues; nothing is staged on tmpfs)::

    source (HTTP with Range resume, or a local file) --hash of the published bytes-->
      [decompressor: gzip/xz/bzip2 (stdlib) or `zstd -dc`] --raw chunks-->
        assembler (fills 8 MiB page-aligned buffers; range check; progress) -->
          DiskWriter thread (O_DIRECT when allowed; all-zero 64 KiB granules skipped when the
          disk was discarded and reads zeros)

Order of checks: parameters; disk hints (exactly one disk) and safety (not mounted, not
holding the system, not held by RAID/LVM/dm); the source opens (404 and friends fail here,
nothing touched); the format from the magic bytes agrees with the declared one; a raw image
larger than the disk is refused. Only then is the disk discarded and written. A failure
afterwards (checksum mismatch, truncated or corrupt stream, dropped download after all
resumes, image larger than the disk, cancel, timeout) clears the start (4 MiB) and the end
(1 MiB, the backup GPT) of the disk, so no half image can boot.

qcow2 is not a stream format: it is converted by ``qemu-img convert -n`` straight onto the
disk, from ``local_path`` only (qemu-img needs a seekable file; an HTTP source is refused
with UNSUPPORTED). Its digest is checked over the whole file before the disk is touched.
For qcow2 ``bytes_written`` is the virtual size (qemu-img skips zeros itself and does not
say how many).

With a manifest (``manifest`` or ``manifest_inline``: an ImageManifest from ``agent
manifest``, or a bmaptool .bmap) the whole-image digest is not needed: every chunk of the raw
image is verified before it is written, on a pool of threads, zero chunks are never hashed
(nor downloaded: a raw image over HTTP is fetched by Range, data runs only), and the
partition tables are written last (agent/commands/deploy_verified.py). A qcow2 file is then
read through its own tables (agent/qcow2.py), not by qemu-img. ``verification`` in the
result says which check ran: "manifest", "bmap" or "digest". A ``digest`` given beside a
manifest is checked too: against the manifest's own digest of the published file, or, where
the manifest gives none for this file (a .bmap; a raw image's manifest for a compressed or
qcow2 copy), over the published bytes as they are read (a thread of its own), before the
partition tables are written.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import filesource, http, image, manifest
from agent.commands import deploy_verified
from agent.commands.base import Context, Handler
from agent.errors import (
    AgentError,
    ChecksumMismatch,
    InvalidParameters,
    Reason,
    SourceFailed,
    ToolFailed,
    Unsupported,
)
from agent.hw import block, diskio, partitions
from agent.manifest import Plan
from agent.proc import Exited
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat
ZERO_SAMPLES = 256
MAX_INLINE_MANIFEST = 1 << 20  # 128 GiB of image in 4 MiB chunks; larger ones travel as a file
QCOW2_NEEDS_FILE = "qcow2 is converted by qemu-img, which needs a seekable file: use local_path"


@dataclass(frozen=True)
class DeployParams:
    url: str
    local_path: Path | None
    format: int
    digest: image.Digest | None                 # of the published file; None: a manifest's chunks only
    hints: block.Hints
    verify_readback: bool
    zero_skip: bool
    ca_pem: str
    headers: dict[str, str] = field(default_factory=dict)
    max_retries: int = 5
    manifest: filesource.FileRef | None = None   # a manifest file, checked against its signed digest
    manifest_inline: bytes = b""                 # or the manifest itself, inside the signed payload

    @property
    def has_manifest(self) -> bool:
        return self.manifest is not None or bool(self.manifest_inline)


def _local_path(raw: str) -> Path:
    p = Path(raw)
    if not p.is_absolute() or ".." in p.parts:
        raise InvalidParameters(f"local_path must be an absolute path without '..': {raw!r}")
    if not p.is_file():
        raise InvalidParameters(f"local_path {raw!r} is not a regular file")
    return p


class DeployImage(Handler[agent_pb2.DeployImageRequest, DeployParams], kind="deploy.image"):
    def __init__(self, disks: Callable[[], list[block.Disk]] | None = None) -> None:
        self.disks = disks or block.list_disks

    def parse(self, payload: agent_pb2.DeployImageRequest) -> DeployParams:
        which = payload.WhichOneof("source")
        if which is None:
            raise InvalidParameters("deploy.image needs a source: url or local_path")
        url = payload.url if which == "url" else ""
        if url:
            http.check_url(url)
        local = _local_path(payload.local_path) if which == "local_path" else None
        if payload.format == Fmt.QCOW2 and url:
            raise Unsupported(QCOW2_NEEDS_FILE)
        manifest = None
        if payload.HasField("manifest"):
            manifest = filesource.parse_source(payload.manifest, "manifest")
        if manifest is not None and payload.manifest_inline:
            raise InvalidParameters("give the manifest as a file or inline, not both")
        if len(payload.manifest_inline) > MAX_INLINE_MANIFEST:
            raise InvalidParameters(f"an inline manifest is at most {MAX_INLINE_MANIFEST} bytes (this one"
                                    f" {len(payload.manifest_inline)}): give it as a file, `manifest`")
        digest = None
        if payload.HasField("digest"):
            digest = image.Digest.parse(payload.digest.algorithm, payload.digest.hex)
        elif manifest is None and not payload.manifest_inline:
            raise InvalidParameters("deploy.image needs the image's digest (sha256 or sha512) or a manifest")
        if not payload.HasField("target"):
            raise InvalidParameters("deploy.image needs target disk hints")
        if payload.max_retries > 100:
            raise InvalidParameters("max_retries is at most 100")
        for name in payload.http_headers:
            if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", name) or name.lower() in ("range", "if-range", "host"):
                raise InvalidParameters(f"HTTP header name {name!r} is not allowed")
        return DeployParams(
            url=url,
            local_path=local,
            format=payload.format,
            digest=digest,
            hints=block.Hints.from_proto(payload.target),
            verify_readback=payload.verify_readback,
            zero_skip=not payload.disable_zero_skip,
            ca_pem=payload.ca_bundle_pem,
            headers=dict(payload.http_headers),
            max_retries=payload.max_retries or 5,
            manifest=manifest,
            manifest_inline=payload.manifest_inline,
        )

    def run(self, ctx: Context, params: DeployParams) -> agent_pb2.DeployImageResult:
        disk = block.select(self.disks(), params.hints)
        block.check_safe(disk)
        if params.local_path is not None and not disk.is_file and params.local_path.resolve() == disk.path:
            raise InvalidParameters("local_path is the target disk itself")
        with ctx.hold(f"disk:{disk.name}"):
            return Deployment(ctx, params, disk).run()

    def on_interrupted(self, params: DeployParams) -> None:
        """After a crash (the journal replayed, the deploy reported interrupted): clear the start
        and end of its target, so that nothing the killed deploy wrote can boot. The deploy
        writes the partition tables last, so a kill before that leaves none; this covers a kill
        between its last write and its result. (For core's replay to call: see the report.)"""
        try:
            disk = block.select(self.disks(), params.hints)
            block.check_safe(disk)
        except AgentError as exc:
            log.warning("interrupted deploy: its target cannot be cleared: %s", exc.message)
            return
        fd = block.open_disk(disk, write=True)
        try:
            block.clear_ends(fd, disk.size)
            os.fsync(fd)
            block.reread_partitions(fd)
            log.warning("%s: start and end cleared after the interrupted deploy", disk.name)
        finally:
            os.close(fd)


class Deployment:
    """One deploy of one image onto one disk."""

    def __init__(self, ctx: Context, params: DeployParams, disk: block.Disk) -> None:
        self.ctx, self.params, self.disk = ctx, params, disk
        self.started = time.monotonic()
        self.result = agent_pb2.DeployImageResult(disk=disk.identity())
        self.meter = ctx.meter(subject=disk.name)
        # One kept-alive connection (and over TLS one handshake) for all of the deploy's
        # requests: the manifest, the format probe, every Range request or the download.
        self.pool = http.Connections(self._http_options())

    # -- source --------------------------------------------------------------------------

    def _http_options(self) -> http.HttpOptions:
        p = self.params
        return http.HttpOptions(
            ca_pem=p.ca_pem,
            ca_file=self.ctx.config.ca_bundle,
            headers=p.headers,
            max_retries=p.max_retries,
            cancel=self.ctx.cancel_event,
        )

    def _open_source(self) -> image.Source:
        """The published bytes, hashed with the request's digest's algorithm as they pass."""
        p = self.params
        algorithm = p.digest.algorithm if p.digest is not None else "sha256"
        if p.local_path is not None:
            return image.FileSource(p.local_path, algorithm)
        return image.HttpSource(p.url, self._http_options(), algorithm, pool=self.pool)

    def _check_format(self, head: bytes) -> int:
        if not head:
            raise SourceFailed("the image is empty")
        fmt = image.detect(head)
        declared = self.params.format
        if declared != Fmt.IMAGE_FORMAT_AUTO and declared != fmt:
            raise InvalidParameters(
                f"declared format {image.format_name(declared)} but the image is"
                f" {image.format_name(fmt)} (magic bytes {head[:8].hex()})"
            )
        self.result.format = fmt  # type: ignore[assignment]  # image.detect gives the enum's number
        return fmt

    def _check_fits(self, fmt: int, total: int | None) -> None:
        if fmt == Fmt.RAW and total is not None and total > self.disk.size:
            raise AgentError(
                f"image is {total} bytes, disk {self.disk.name} only {self.disk.size}",
                reason=Reason.TOO_LARGE,
            )

    def run(self) -> agent_pb2.DeployImageResult:
        with self.pool:
            if self.params.has_manifest:
                self._run_manifest(self._load_plan())
            else:
                self._run_digest()
        seconds = time.monotonic() - self.started
        self.result.seconds = seconds
        self.result.throughput_bytes_per_second = self.result.image_bytes / seconds if seconds else 0.0
        return self.result

    def _run_digest(self) -> None:
        """Without a manifest: the digest of the whole published image, as old control planes send."""
        self.result.verification = "digest"
        source = self._open_source()
        try:
            fmt = self._check_format(source.peek())
            self._check_fits(fmt, source.total)
            if fmt == Fmt.QCOW2:
                if self.params.local_path is None:
                    raise Unsupported(QCOW2_NEEDS_FILE)
                self._qcow2(source)
            else:
                self._stream(source, fmt)
        finally:
            source.close()

    # -- with a manifest -----------------------------------------------------------------

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
        dv = deploy_verified
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
                    dv.check_against_source(plan, total, fmt, p.digest)
                    reader = image.RangeReader(p.url, self._http_options(), plan, self.pool)
                else:
                    source = self._open_source()
                    fmt = self._check_format(source.peek())
            else:
                source = self._open_source()
                fmt = self._check_format(source.peek())
            if source is not None:
                self._check_fits(fmt, source.total)
                dv.check_against_source(plan, source.total, fmt, p.digest)
                must_hash = self._must_hash(plan, fmt)
                if fmt == Fmt.QCOW2 or (fmt == Fmt.RAW and p.local_path is not None):
                    if p.local_path is None:
                        raise Unsupported(QCOW2_NEEDS_FILE)
                    if fmt == Fmt.QCOW2:
                        qcow = image.Qcow2Reader(str(p.local_path))
                        reader = qcow
                        dv.check_against_source(plan, qcow.q.size, Fmt.RAW, None)
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
        return self.params.digest is not None and not deploy_verified.digest_in_manifest(plan, fmt)

    def _write_verified(self, plan: Plan, reader: image.ChunkReader,
                        published: Callable[[], str] | None = None) -> None:
        dv = deploy_verified
        with self._open_target() as (fd, dfd):
            skip = self._prepare(fd)
            if not skip:  # the old partition table goes before anything new is written
                block.clear_ends(fd, self.disk.size)
            buffers = max(4, min(32, (128 << 20) // plan.chunk_size))
            with diskio.DiskWriter(
                fd, dfd, size=self.disk.size, skip_zeros=skip, cancel=self.ctx.cancel_event,
                block=self.disk.logical_block_size, buffer_size=plan.chunk_size, buffers=buffers,
            ) as writer:
                copy = dv.VerifiedCopy(
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
                self._readback_chunks(fd, plan)
            self._finish(fd)

    def _progress_raw(self, done: int, total: int, writer: diskio.DiskWriter) -> None:
        if self.meter.due():
            self.meter.update(done, total=total,
                              message=f"{done} image bytes verified, {writer.written} written")

    def _readback_chunks(self, fd: int, plan: Plan) -> None:
        """Read every data chunk back from the disk (the page cache dropped first) and compare
        its digest with the manifest's."""
        os.fsync(fd)
        os.posix_fadvise(fd, 0, plan.image_size, os.POSIX_FADV_DONTNEED)
        for seg in plan.segments:
            self.ctx.check()
            if seg.digest is None:
                continue
            h = hashlib.new(plan.algorithm)
            for pos in range(seg.offset, seg.end, diskio.BUFFER):
                data = os.pread(fd, min(diskio.BUFFER, seg.end - pos), pos)
                h.update(data)
            if h.digest() != seg.digest:
                raise ChecksumMismatch(f"{self.disk.name}: read back, chunk {seg.index} at offset"
                                       f" {seg.offset} differs from the manifest",
                                       chunk=seg.index, offset=seg.offset)
        self.result.readback_verified = True

    def _check_digest(self, got: str) -> None:
        """The published image's digest, as computed, against the request's."""
        want = self.params.digest
        assert want is not None
        self.result.digest.CopyFrom(image.Digest(want.algorithm, got).to_proto())
        if got != want.hex:
            raise ChecksumMismatch(f"{want.algorithm} of the image is {got}, expected {want.hex}",
                                   expected=want.hex, got=got)

    # -- target --------------------------------------------------------------------------

    def _prepare(self, fd: int) -> bool:
        """Discard the disk and check that it reads zeros; True when zeros may be skipped."""
        if not (self.params.zero_skip and self.disk.supports_discard):
            return False
        try:
            block.discard(fd)
        except OSError as exc:
            log.info("%s: discard failed (%s); writing every block", self.disk.name, exc)
            return False
        offsets = block.sample_offsets(self.disk.size, ZERO_SAMPLES, 4096)
        zeros = block.reads_zeros(fd, offsets, 4096)
        self.result.discarded = zeros
        if not zeros:
            log.info("%s: discarded but does not read zeros; writing every block", self.disk.name)
        return zeros

    @contextlib.contextmanager
    def _open_target(self) -> Iterator[tuple[int, int | None]]:
        """The target disk open for writing, and with O_DIRECT where it takes it; when what runs
        inside fails, the disk's start and end are cleared (no half-written image boots)."""
        fd = block.open_disk(self.disk, write=True)
        dfd = block.try_direct(self.disk, write=True)
        self.result.direct_io = dfd is not None
        try:
            yield fd, dfd
        except BaseException:
            self._fail_cleanup(fd)
            raise
        finally:
            if dfd is not None:
                os.close(dfd)
            os.close(fd)

    def _fail_cleanup(self, fd: int) -> None:
        try:
            block.clear_ends(fd, self.disk.size)
            block.reread_partitions(fd)
            log.warning("%s: deploy failed; start and end of the disk cleared", self.disk.name)
        except OSError as exc:
            log.error("%s: could not clear the disk after a failed deploy: %s", self.disk.name, exc)

    def _finish(self, fd: int) -> None:
        block.reread_partitions(fd)
        parts = partitions.read_partitions(fd, self.disk.name, self.disk.logical_block_size)
        self.result.partitions.extend(parts)

    # -- streaming -----------------------------------------------------------------------

    def _stream(self, source: image.Source, fmt: int) -> None:
        # ToolMissing here (no zstd): nothing touched yet
        stream = image.RawStream(source, fmt, self.ctx.running) if fmt != Fmt.RAW else None
        try:
            with self._open_target() as (fd, dfd):
                skip = self._prepare(fd)
                raw_hash = hashlib.sha256() if self.params.verify_readback else None
                with diskio.DiskWriter(
                    fd, dfd, size=self.disk.size, skip_zeros=skip, cancel=self.ctx.cancel_event,
                    block=self.disk.logical_block_size,
                ) as writer:
                    offset = self._copy(source, stream, writer, raw_hash)
                self.result.bytes_written = writer.written
                self.result.bytes_skipped = writer.skipped
                self.result.image_bytes = offset
                self.result.source_bytes = source.count
                self.result.resumes = source.resumes
                self._check_digest(source.hasher.hexdigest())
                if raw_hash is not None:
                    self._readback(fd, dfd, offset, raw_hash.hexdigest())
                self._finish(fd)
        except BaseException:
            if stream is not None:
                stream.close()
            raise

    def _copy(self, source: image.Source, stream: image.RawStream | None, writer: diskio.DiskWriter,
              raw_hash: Any) -> int:
        """A reader thread fills the writer's aligned buffers straight from the source (raw)
        or the decompressor (``stream``: zstd's output is read into them, no queue); this
        thread hashes each full buffer of a raw image (a compressed one is hashed by the
        stream's feeding thread as it is read) and hands it to the writer threads. Reading,
        hashing and writing each have a thread, so the slowest of them sets the pace; a buffer
        is refilled only after it was hashed and written."""
        filled: queue.Queue[tuple[memoryview, int] | BaseException] = queue.Queue()
        halt = threading.Event()
        if stream is None:
            def read(view: memoryview) -> int:
                return source.readinto(view, hash=False)
        else:
            read = stream.readinto

        def read_loop() -> None:
            try:
                while not halt.is_set():
                    buf = writer.take()
                    fill = 0
                    while fill < len(buf) and not halt.is_set():
                        n = read(buf[fill:])
                        if n == 0:
                            break
                        fill += n
                    filled.put((buf, fill))
                    if fill < len(buf):
                        return
            except BaseException as exc:
                filled.put(exc)

        reader = threading.Thread(target=read_loop, name="deploy-read", daemon=True)
        reader.start()
        offset = 0
        try:
            while True:
                self.ctx.check()
                try:
                    item = filled.get(timeout=0.2)
                except queue.Empty:  # a slow source: stay responsive, keep reporting
                    self._progress(source, offset, writer.written, writer.skipped)
                    continue
                if isinstance(item, BaseException):
                    raise item
                buf, fill = item
                if fill == 0:
                    writer.give_back(buf)
                    return offset
                if stream is None:
                    source.hasher.update(buf[:fill])
                if raw_hash is not None:
                    raw_hash.update(buf[:fill])
                writer.submit(buf, offset, fill)
                offset += fill
                self._progress(source, offset, writer.written, writer.skipped)
                if fill < len(buf):
                    return offset
        finally:
            halt.set()
            if reader.is_alive():
                writer.stop.set()  # a reader waiting for a buffer wakes up and leaves
                if stream is not None:
                    stream.close()  # a reader waiting for the decompressor wakes up too
            reader.join(timeout=10)

    def _progress(self, source: image.Source, image_bytes: int, written: int = 0, skipped: int = 0) -> None:
        if self.meter.due():
            self.meter.update(source.count, total=source.total or 0,
                              message=f"{image_bytes} image bytes, {written} written, {skipped} skipped")

    def _readback(self, fd: int, dfd: int | None, length: int, expected: str) -> None:
        """Read the written image back (bypassing the page cache) and compare its sha256."""
        h = hashlib.sha256()
        import mmap

        buf = mmap.mmap(-1, diskio.BUFFER)
        view = memoryview(buf)
        try:
            if dfd is None:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, length, os.POSIX_FADV_DONTNEED)
            pos = 0
            block_size = self.disk.logical_block_size
            while pos < length:
                self.ctx.check()
                want = min(len(view), length - pos)
                aligned = want // block_size * block_size
                if dfd is not None and aligned:
                    n = os.preadv(dfd, [view[:aligned]], pos)
                else:
                    n = os.preadv(fd, [view[:want]], pos)
                if n <= 0:
                    raise SourceFailed(f"{self.disk.name}: read-back ended at byte {pos}")
                h.update(view[:n])
                pos += n
        finally:
            view.release()
            buf.close()
        if h.hexdigest() != expected:
            raise ChecksumMismatch(
                f"{self.disk.name}: read-back sha256 {h.hexdigest()} differs from the image's {expected}"
            )
        self.result.readback_verified = True

    # -- qcow2 ---------------------------------------------------------------------------

    def _qcow2(self, source: image.Source) -> None:
        assert self.params.local_path is not None
        path = self.params.local_path
        while source.read(8 << 20):  # digest of the published file before touching the disk
            self.ctx.check()
            self._progress(source, 0)
        self._check_digest(source.hasher.hexdigest())
        virtual = image.qcow2_info(self.ctx.run, path)
        if virtual > self.disk.size:
            raise AgentError(
                f"qcow2 virtual size {virtual} is larger than disk {self.disk.name} ({self.disk.size})",
                reason=Reason.TOO_LARGE,
            )
        fd = block.open_disk(self.disk, write=True, exclusive=False)
        dfd = block.try_direct(self.disk, write=False)
        self.result.direct_io = dfd is not None
        if dfd is not None:
            os.close(dfd)
        try:
            zero = self._prepare(fd)
            argv = ["qemu-img", "convert", "-p", "-f", "qcow2", "-O", "raw", "-n"]
            if self.result.direct_io:
                argv += ["-t", "none"]
            if zero:
                argv.append("--target-is-zero")
            argv += [str(path), str(self.disk.path)]
            self._run_qemu_img(argv, virtual)
            self.result.image_bytes = virtual
            self.result.bytes_written = virtual
            self.result.source_bytes = source.count
            self._finish(fd)
        except BaseException:
            self._fail_cleanup(fd)
            raise
        finally:
            os.close(fd)

    def _run_qemu_img(self, argv: list[str], virtual: int) -> None:
        """qemu-img convert under ctx.running (killed on cancel, timeout or error; its exit
        checked on leaving), its ``-p`` percentages read for progress."""
        import subprocess

        def failure(exited: Exited) -> AgentError:
            return ToolFailed(f"qemu-img convert failed ({exited.description}): {exited.tail(2)}",
                              tool="qemu-img")

        pending = b""
        with self.ctx.running(argv, stdout=subprocess.PIPE, failure=failure) as child:
            for chunk in child.chunks(4096):
                self.ctx.check()
                pending += chunk
                found = re.findall(rb"\((\d+(?:\.\d+)?)/100%\)", pending)
                pending = pending[-64:]
                if found:
                    self.meter.update(int(virtual * float(found[-1]) / 100), total=virtual,
                                      message="qemu-img convert")
