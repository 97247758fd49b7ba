"""deploy.image's pipeline: an OS image onto one disk, verified, as fast as the disk allows.

    result = deploy.run(hooks, params, disk)  # the handler (agent/commands/deploy/) chose
                                              # and holds the disk, and gives ``Hooks``

``Hooks`` is all a pipeline uses of the command that runs it: the check that raises when it
must stop (and the event set with it), the progress meter, the running children (zstd,
qemu-img), the CA bundle of the settings. ``pipeline`` picks one of three, one per way the
image is checked; what they share (the source, the format and size checks, the target, the
digest check, the read-back) is ``Deployment``'s:

- ``StreamDeployment``: raw or compressed (gzip, xz, bzip2, zstd), streamed onto the
  disk, the whole published file's digest computed as it passes and compared at the end; a
  qcow2 file over HTTP (a registry's blob) the same way, through its tables as the stream
  passes them (agent/images/qcow2stream.py).
- ``Qcow2Deployment``: a local qcow2 file without a manifest; its digest is checked
  over the whole file and its tables walked by the agent's own reader (agent/images/qcow2.py:
  the features it refuses, an entry outside the file) before the disk is touched, then
  ``qemu-img convert -n`` writes it
  (qemu-img needs a seekable file: over HTTP, StreamDeployment streams it). For qcow2
  ``bytes_written`` is the virtual size (qemu-img skips zeros itself and does not say how
  many).
- ``ManifestDeployment``: with a manifest (``manifest`` or ``manifest_inline``: an
  ImageManifest from ``agent manifest``, or a bmaptool .bmap; agent/images/plan.py's Plan)
  every chunk of the raw image is verified before it is written (agent/images/verified.py's
  VerifiedCopy), on a pool of threads, zero chunks are never hashed (nor downloaded: a raw
  image over HTTP is fetched by Range, data runs only), and the partition tables are written
  last; a qcow2 file is read through its own tables (agent/images/qcow2.py), not by qemu-img.
  ``readers.pick`` says which chunk reader the source allows (agent/images/readers.py). A
  ``digest`` given beside a manifest is checked too: against the manifest's own digest of the
  published file, or, where the manifest gives none for this file (a .bmap; a raw image's
  manifest for a compressed or qcow2 copy), over the published bytes as they are read (a
  thread of its own), before the partition tables are written.

``verification`` in the result says which check ran: "manifest", "bmap" or "digest". Order
of checks: parameters; disk hints (exactly one disk) and safety (not mounted, not holding
the system, not held by RAID/LVM/dm), both the handler's; the source opens (404 and friends
fail here, nothing touched); the format from the magic bytes agrees with the declared one; a
raw image larger than the disk is refused. Only then is the disk discarded and written. A
failure afterwards (checksum mismatch, truncated or corrupt stream, dropped download after all
resumes, image larger than the disk, cancel, timeout) clears the start (4 MiB) and the end
(1 MiB, the backup GPT) of the disk, so no half image can boot. Over HTTP a deploy's requests
share one kept-alive connection (agent/net/pool.py's ConnectionPool).
"""


from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import queue
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.errors import (
    AgentError,
    ChecksumMismatch,
    InvalidParameters,
    Reason,
    SourceFailed,
    ToolFailed,
)
from agent.hw import block, diskio, partitions
from agent.images import filesource, image, manifest, oci, readers
from agent.images.plan import Plan
from agent.images.qcow2 import Qcow2File
from agent.images.verified import VerifiedCopy
from agent.net import http
from agent.proc import Completed, Exited
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat
ZERO_SAMPLES = 256


class Meter(Protocol):
    """Progress of the deploy (commands/base.py's Meter): at most a report a second."""

    def due(self) -> bool: ...

    def update(self, done: int, *, message: str = "", total: int | None = None,
               force: bool = False) -> bool: ...


@dataclass(frozen=True)
class Hooks:
    """What a pipeline uses of the command that runs it, and nothing more."""

    check: Callable[[], None]            # raises Cancelled or CommandTimeout when it must stop
    cancel: threading.Event              # set when it must stop: threads and downloads watch it
    meter: Meter                         # progress, subject the disk
    running: image.Running               # a child process killed with the command (zstd, qemu-img)
    run: Callable[..., Completed]        # a tool run to its end, bounded by the command (qemu-img info)
    ca_file: Path | None = None          # the settings' CA bundle, beside the request's own


@dataclass(frozen=True)
class DeployParams:
    """What to write and how it is checked; the handler's parse makes it (which disk: its own)."""

    url: str
    local_path: Path | None
    format: int
    digest: image.Digest | None                 # of the published file; None: a manifest's chunks only
    verify_readback: bool
    zero_skip: bool
    ca_pem: str
    headers: dict[str, str] = field(default_factory=dict)
    max_retries: int = 5
    manifest: filesource.FileRef | None = None   # a manifest file, checked against its signed digest
    manifest_inline: bytes = b""                 # or the manifest itself, inside the signed payload
    oci: oci.Reference | None = None             # an oci:// source, resolved by commands/deploy/oci.locate
    registry_hosts: frozenset[str] = frozenset()  # oci: other hosts a redirect may lead to
    resolve: Callable[[str, int], Iterable[str]] | None = None   # oci: the hosts it may dial
    auth: http.Authorization | None = None       # oci: the registry's token, renewed on a 401
    plain_http_redirect: bool = True             # oci: an https redirect to http://, if allowed
    deadline: float | None = None                # the command's: a Retry-After waited for up to it

    @property
    def has_manifest(self) -> bool:
        return self.manifest is not None or bool(self.manifest_inline)


class Deployment:
    """One deploy of one image onto one disk; a pipeline (a subclass) implements ``deploy``."""

    def __init__(self, hooks: Hooks, params: DeployParams, disk: block.Disk) -> None:
        self.hooks, self.params, self.disk = hooks, params, disk
        self.started = time.monotonic()
        self.result = agent_pb2.DeployImageResult(disk=disk.identity())
        self.meter = hooks.meter
        # One kept-alive connection (and over TLS one handshake) for all of the deploy's
        # requests: the manifest, the format probe, every Range request or the download.
        self.pool = http.ConnectionPool()

    # -- source --------------------------------------------------------------------------

    def _http_options(self) -> http.HttpOptions:
        p = self.params
        return http.HttpOptions(
            ca_pem=p.ca_pem,
            ca_file=self.hooks.ca_file,
            headers=p.headers,
            max_retries=p.max_retries,
            cancel=self.hooks.cancel,
            resolve=p.resolve,
            auth=p.auth,
            deadline=p.deadline,
            on_wait=self._said_wait,
            plain_http_redirect=p.plain_http_redirect,
        )

    def _said_wait(self, words: str) -> None:
        """A wait the server asked for (Retry-After), said in the deploy's progress."""
        log.warning("deploy to %s: %s", self.disk.name, words)
        self.meter.update(0, message=words, force=True)

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
            self.deploy()
        seconds = time.monotonic() - self.started
        self.result.seconds = seconds
        self.result.throughput_bytes_per_second = self.result.image_bytes / seconds if seconds else 0.0
        return self.result

    def deploy(self) -> None:
        """The pipeline's work: read, check, write; the result's fields filled in."""
        raise NotImplementedError

    # -- checks and progress -------------------------------------------------------------

    def _check_digest(self, got: str) -> None:
        """The published image's digest, as computed, against the request's."""
        want = self.params.digest
        assert want is not None
        self.result.digest.CopyFrom(image.Digest(want.algorithm, got).to_proto())
        if got != want.hex:
            raise ChecksumMismatch(f"{want.algorithm} of the image is {got}, expected {want.hex}",
                                   expected=want.hex, got=got)

    def _progress(self, source: image.Source, image_bytes: int, written: int = 0, skipped: int = 0) -> None:
        if self.meter.due():
            self.meter.update(source.count, total=source.total or 0,
                              message=f"{image_bytes} image bytes, {written} written, {skipped} skipped")

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

    def _read_back(self, fd: int, dfd: int | None, spans: Iterable[tuple[int, int]],
                   algorithm: str) -> Iterator[bytes]:
        """The digest of each span (offset, length) of the disk as it reads back now, in order:
        everything written flushed and the page cache dropped first, then read with O_DIRECT
        where the span is aligned to the disk's blocks (through ``fd`` otherwise)."""
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = mmap.mmap(-1, diskio.BUFFER)   # page-aligned, for O_DIRECT
        view = memoryview(buf)
        block_size = self.disk.logical_block_size
        try:
            for offset, length in spans:
                h = hashlib.new(algorithm)
                pos, end = offset, offset + length
                while pos < end:
                    self.hooks.check()
                    want = min(len(view), end - pos)
                    aligned = want // block_size * block_size
                    if dfd is not None and aligned and pos % block_size == 0:
                        n = os.preadv(dfd, [view[:aligned]], pos)
                    else:
                        n = os.preadv(fd, [view[:want]], pos)
                    if n <= 0:
                        raise SourceFailed(f"{self.disk.name}: read-back ended at byte {pos}")
                    h.update(view[:n])
                    pos += n
                yield h.digest()
        finally:
            view.release()
            buf.close()

class StreamDeployment(Deployment):
    """The raw image's bytes in order, from a raw or compressed stream (gzip, xz, bzip2, zstd),
    checked by the published file's digest.

    Threads, bounded queues, nothing staged on tmpfs::

        source (HTTP with Range resume, or a local file) --hash of the published bytes-->
          [decompressor: gzip/xz/bzip2 (stdlib) or zstd (libzstd, or the `zstd -dc` child)]
            --raw bytes--> 8 MiB page-aligned buffers --> DiskWriter threads (O_DIRECT when
              allowed; all-zero 64 KiB granules skipped when the disk was discarded and reads
              zeros)
    """

    def deploy(self) -> None:
        """The whole published image's digest, as old control planes send: raw or compressed,
        streamed onto the disk and hashed as it passes."""
        self.result.verification = "digest"
        source = self._open_source()
        try:
            fmt = self._check_format(source.peek())
            self._check_fits(fmt, source.total)
            if fmt == Fmt.QCOW2:
                self._stream_qcow2(source)
            else:
                self._stream(source, fmt)
        finally:
            source.close()

    def _stream(self, source: image.Source, fmt: int) -> None:
        # ToolMissing here (no zstd): nothing touched yet
        stream = image.RawStream(source, fmt, self.hooks.running) if fmt != Fmt.RAW else None
        try:
            with self._open_target() as (fd, dfd):
                skip = self._prepare(fd)
                raw_hash = hashlib.sha256() if self.params.verify_readback else None
                with diskio.DiskWriter(
                    fd, dfd, size=self.disk.size, skip_zeros=skip, cancel=self.hooks.cancel,
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
                    self._readback(fd, dfd, offset, raw_hash.digest())
                self._finish(fd)
        except BaseException:
            if stream is not None:
                stream.close()
            raise

    def _stream_qcow2(self, source: image.Source) -> None:
        """A qcow2 file from a stream, through its tables as they pass (agent/images/qcow2stream.py);
        zeros written only where the disk does not read zeros. ``verify_readback`` is not done
        here (as for qemu-img's path): the guest's bytes are written out of order."""
        from agent.images.qcow2stream import Qcow2Stream

        q = Qcow2Stream(source, self.hooks.check)
        if q.size > self.disk.size:
            raise AgentError(f"qcow2 virtual size {q.size} is larger than disk {self.disk.name}"
                             f" ({self.disk.size})", reason=Reason.TOO_LARGE)
        with self._open_target() as (fd, dfd):
            skip = self._prepare(fd)
            direct = dfd if q.header.cluster >= self.disk.logical_block_size else None
            self.result.direct_io = direct is not None
            with diskio.DiskWriter(fd, direct, size=self.disk.size, skip_zeros=skip, cancel=self.hooks.cancel,
                                   block=self.disk.logical_block_size) as writer:
                q.progress = lambda done: self._progress(source, done, writer.written, writer.skipped)
                q.copy(writer, zeros=not skip)
            self.result.bytes_written = writer.written
            self.result.bytes_skipped = writer.skipped
            self.result.image_bytes = q.size
            self.result.source_bytes = source.count
            self.result.resumes = source.resumes
            self._check_digest(source.hasher.hexdigest())
            self._finish(fd)

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
                self.hooks.check()
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

    def _readback(self, fd: int, dfd: int | None, length: int, expected: bytes) -> None:
        """The written image read back (bypassing the page cache): its sha256 against the
        one computed as it was written."""
        (got,) = self._read_back(fd, dfd, [(0, length)], "sha256")
        if got != expected:
            raise ChecksumMismatch(
                f"{self.disk.name}: read-back sha256 {got.hex()} differs from the image's {expected.hex()}"
            )
        self.result.readback_verified = True


class Qcow2Deployment(Deployment):
    """A local qcow2 file without a manifest: qemu-img needs a seekable file, so its digest is
    checked over the whole file first, then it converts it onto the disk. ``bytes_written``
    is the virtual size (qemu-img skips zeros itself and does not say how many)."""

    def deploy(self) -> None:
        """The published file's digest checked whole before the disk is touched, then
        ``qemu-img convert -n`` straight onto the disk."""
        self.result.verification = "digest"
        source = self._open_source()
        try:
            if self._check_format(source.peek()) != Fmt.QCOW2:
                raise SourceFailed("the image is no longer a qcow2 file")  # changed since it was chosen
            self._qcow2(source)
        finally:
            source.close()

    def _qcow2(self, source: image.Source) -> None:
        assert self.params.local_path is not None
        path = self.params.local_path
        while source.read(8 << 20):  # digest of the published file before touching the disk
            self.hooks.check()
            self._progress(source, 0)
        self._check_digest(source.hasher.hexdigest())
        # The agent's own reader first: the features it refuses (zstd clusters, extended L2
        # entries, an external data file...) and tables that point outside the file (qemu-img
        # convert reads those clusters as zeros and exits 0) are refused here as they are with
        # a manifest, before the disk is opened.
        with Qcow2File(path) as q:
            q.check()
        virtual = image.qcow2_info(self.hooks.run, path)
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
        """qemu-img convert under hooks.running (killed on cancel, timeout or error; its exit
        checked on leaving), its ``-p`` percentages read for progress."""
        def failure(exited: Exited) -> AgentError:
            return ToolFailed(f"qemu-img convert failed ({exited.description}): {exited.tail(2)}",
                              tool="qemu-img")

        pending = b""
        with self.hooks.running(argv, stdout=subprocess.PIPE, failure=failure) as child:
            for chunk in child.chunks(4096):
                self.hooks.check()
                pending += chunk
                found = re.findall(rb"\((\d+(?:\.\d+)?)/100%\)", pending)
                pending = pending[-64:]
                if found:
                    self.meter.update(int(virtual * float(found[-1]) / 100), total=virtual,
                                      message="qemu-img convert")

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
            with tempfile.TemporaryDirectory(prefix="bc-manifest-") as private:
                dest = Path(private) / "manifest"
                # The request's CA; its headers (say, a token) only where the image is.
                same = bool(p.url and p.manifest.url) and http.origin(p.url) == http.origin(p.manifest.url)
                filesource.fetch(p.manifest, dest, cancel=self.hooks.cancel,
                                 ca_file=self.hooks.ca_file, ca_pem=p.ca_pem,
                                 headers=p.headers if same else None, pool=self.pool)
                data = dest.read_bytes()
        plan = manifest.parse(data)
        if plan.image_size > self.disk.size:
            raise AgentError(f"the manifest's image is {plan.image_size} bytes, disk {self.disk.name} only"
                             f" {self.disk.size}", reason=Reason.TOO_LARGE)
        return plan

    def _run_manifest(self, plan: Plan) -> None:
        self.result.verification = plan.kind
        with contextlib.ExitStack() as opened:   # each reader, hasher and source closed once
            reader, published = self._open_reader(plan, opened)
            self._write_verified(plan, reader, published)
            self.result.source_bytes = reader.fetched
            self.result.resumes = reader.resumes

    def _open_reader(self, plan: Plan, opened: contextlib.ExitStack
                     ) -> tuple[readers.ChunkReader, Callable[[], str] | None]:
        """The image read chunk by chunk as its source allows (``readers.pick``): a raw image
        over HTTP by Range (data runs only), a local raw file by offset (holes skipped), a local
        qcow2 file through its tables, anything else as a stream; what it opens is closed by
        ``opened``. Returns the reader and, for a request's digest of the published file that
        the manifest does not vouch for itself (a .bmap, or a manifest of the raw image given
        for a compressed or qcow2 copy), the function that gives the digest of the published
        bytes as they were read: the whole file is then read (over HTTP: downloaded, zeros
        too), hashed on a thread of its own or by the stream, and compared before the
        partition tables are written."""
        p = self.params
        source: image.Source | None = None
        if p.url:
            # A 16-byte Range probe: the format, the size, and whether Range works, without
            # starting a download of the whole image.
            with http.get(p.url, self._http_options(), offset=0, length=image.MAGIC_LEN,
                          pool=self.pool) as probe:
                head = probe.read(image.MAGIC_LEN)
                ranged, total = probe.ranged, probe.total
        else:
            source = opened.enter_context(contextlib.closing(self._open_source()))
            head, ranged = source.peek(), False
        fmt = self._check_format(head)
        must_hash = self._must_hash(plan, fmt)
        kind = readers.pick(fmt, local=p.local_path is not None, ranged=ranged, must_hash=must_hash)
        if kind is readers.Reader.RANGE:
            check_against_source(plan, total, fmt, p.digest)
            return opened.enter_context(contextlib.closing(
                readers.RangeReader(p.url, self._http_options(), plan, self.pool))), None
        if source is None:
            source = opened.enter_context(contextlib.closing(self._open_source()))
        self._check_fits(fmt, source.total)
        check_against_source(plan, source.total, fmt, p.digest)
        if kind is readers.Reader.STREAM:
            stream = image.RawStream(source, fmt, self.hooks.running, hash_published=must_hash)
            reader = opened.enter_context(contextlib.closing(readers.StreamReader(stream)))
            # hashed by the stream's feeding thread as it reads
            return reader, source.hasher.hexdigest if must_hash else None
        assert p.local_path is not None
        chunks: readers.ChunkReader
        if kind is readers.Reader.QCOW2:
            qcow = opened.enter_context(contextlib.closing(readers.Qcow2Reader(str(p.local_path))))
            check_against_source(plan, qcow.q.size, Fmt.RAW, None)
            chunks = qcow
        else:
            chunks = opened.enter_context(contextlib.closing(readers.FileReader(str(p.local_path))))
        if not must_hash:
            return chunks, None
        # the file is read by offset: its digest on a thread of its own
        return chunks, opened.enter_context(contextlib.closing(image.HashToEnd(source))).hexdigest

    def _must_hash(self, plan: Plan, fmt: int) -> bool:
        """A digest in the request that the manifest does not give for this very file (then
        check_against_source compared the two): it is checked on the bytes."""
        return self.params.digest is not None and not digest_in_manifest(plan, fmt)

    def _write_verified(self, plan: Plan, reader: readers.ChunkReader,
                        published: Callable[[], str] | None = None) -> None:
        with self._open_target() as (fd, dfd):
            skip = self._prepare(fd)
            if not skip:  # the old partition table goes before anything new is written
                block.clear_ends(fd, self.disk.size)
            buffers = max(4, min(32, (128 << 20) // plan.chunk_size))
            with diskio.DiskWriter(
                fd, dfd, size=self.disk.size, skip_zeros=skip, cancel=self.hooks.cancel,
                block=self.disk.logical_block_size, buffer_size=plan.chunk_size, buffers=buffers,
            ) as writer:
                copy = VerifiedCopy(
                    plan, reader, writer, fd, skip_zeros=skip, check=self.hooks.check,
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

def pipeline(hooks: Hooks, params: DeployParams, disk: block.Disk) -> Deployment:
    """The pipeline for the request: with a manifest, chunk by chunk; without, a local qcow2
    file by qemu-img and anything else as a stream (the file's first bytes say)."""
    if params.has_manifest:
        return ManifestDeployment(hooks, params, disk)
    if params.local_path is not None:
        with open(params.local_path, "rb") as f:
            if image.detect(f.read(image.MAGIC_LEN)) == Fmt.QCOW2:
                return Qcow2Deployment(hooks, params, disk)
    return StreamDeployment(hooks, params, disk)


def run(hooks: Hooks, params: DeployParams, disk: block.Disk) -> agent_pb2.DeployImageResult:
    """Deploy the image of ``params`` onto ``disk`` (chosen, checked safe and held by the
    caller); the result, or an AgentError with the disk's ends cleared."""
    return pipeline(hooks, params, disk).run()
