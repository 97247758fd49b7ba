"""deploy.image: stream an OS image onto the disk the hints select, verified, as fast as the
disk allows.

Three pipelines, one per way the image is checked (``pipeline`` picks one; what they share,
the source, the target and the checks, is agent/commands/deploy_base.py's ``Deployment``):

- ``StreamDeployment`` (here): raw or compressed (gzip, xz, bzip2, zstd), streamed onto the
  disk, the whole published file's digest computed as it passes and compared at the end.
- ``Qcow2Deployment`` (here): a local qcow2 file without a manifest; its digest is checked
  over the whole file before the disk is touched, then ``qemu-img convert -n`` writes it
  (qemu-img needs a seekable file: an HTTP source is refused with UNSUPPORTED). For qcow2
  ``bytes_written`` is the virtual size (qemu-img skips zeros itself and does not say how
  many).
- ``ManifestDeployment`` (agent/commands/deploy_verified.py): with a manifest (``manifest`` or
  ``manifest_inline``: an ImageManifest from ``agent manifest``, or a bmaptool .bmap) every
  chunk of the raw image is verified before it is written, on a pool of threads, zero chunks
  are never hashed (nor downloaded: a raw image over HTTP is fetched by Range, data runs
  only), and the partition tables are written last; a qcow2 file is read through its own
  tables (agent/images/qcow2.py), not by qemu-img. A ``digest`` given beside a manifest is checked
  too: against the manifest's own digest of the published file, or, where the manifest gives
  none for this file (a .bmap; a raw image's manifest for a compressed or qcow2 copy), over
  the published bytes as they are read (a thread of its own), before the partition tables
  are written.

``verification`` in the result says which check ran: "manifest", "bmap" or "digest". Order
of checks: parameters; disk hints (exactly one disk) and safety (not mounted, not holding
the system, not held by RAID/LVM/dm); the source opens (404 and friends fail here, nothing
touched); the format from the magic bytes agrees with the declared one; a raw image larger
than the disk is refused. Only then is the disk discarded and written. A failure afterwards
(checksum mismatch, truncated or corrupt stream, dropped download after all resumes, image
larger than the disk, cancel, timeout) clears the start (4 MiB) and the end (1 MiB, the
backup GPT) of the disk, so no half image can boot. Over HTTP a deploy's requests share one
kept-alive connection (agent/images/http.py's Connections).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.commands import deploy_oci, deploy_verified, inventory
from agent.commands.base import Context, Handler
from agent.commands.deploy_base import QCOW2_NEEDS_FILE, Deployment, DeployParams
from agent.errors import (
    AgentError,
    ChecksumMismatch,
    InvalidParameters,
    Reason,
    SourceFailed,
    ToolFailed,
    Unsupported,
)
from agent.hw import block, diskio, system
from agent.images import filesource, http, image, oci, ocilayout
from agent.policy import conformance
from agent.proc import Exited
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat
MAX_INLINE_MANIFEST = 1 << 20  # 128 GiB of image in 4 MiB chunks; larger ones travel as a file


def _local_path(raw: str) -> Path:
    p = Path(raw)
    if not p.is_absolute() or ".." in p.parts:
        raise InvalidParameters(f"local_path must be an absolute path without '..': {raw!r}")
    if not p.is_file() and not ocilayout.is_layout(p):
        raise InvalidParameters(f"local_path {raw!r} is neither a regular file nor an OCI image layout")
    return p


class DeployImage(Handler[agent_pb2.DeployImageRequest, DeployParams], kind="deploy.image"):
    root: Path = system.ROOT                 # where the gate reads the machine (tests: a fake tree)

    def __init__(self, disks: Callable[[], list[block.Disk]] | None = None) -> None:
        self.disks = disks or block.list_disks

    def parse(self, payload: agent_pb2.DeployImageRequest) -> DeployParams:
        which = payload.WhichOneof("source")
        if which is None:
            raise InvalidParameters("deploy.image needs a source: url or local_path")
        url = payload.url if which == "url" else ""
        ref = oci.parse(url) if oci.is_reference(url) else None
        if url and ref is None:
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
        elif manifest is None and not payload.manifest_inline and ref is None and \
                not (local is not None and local.is_dir()):
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
            gate=conformance.Expected.from_proto(payload.gate) if payload.HasField("gate") else None,
            oci=ref,
            registry_hosts=deploy_oci.hosts(payload.registry_hosts, ref),
        )

    def run(self, ctx: Context, params: DeployParams) -> agent_pb2.DeployImageResult:
        if params.gate is not None:
            inventory.gate(ctx, params.gate, self.root)
            ctx.log.info("deploy.image: the node passed its acceptance gate")
        disk = block.select(self.disks(), params.hints)
        block.check_safe(disk)
        if params.local_path is not None and not disk.is_file and params.local_path.resolve() == disk.path:
            raise InvalidParameters("local_path is the target disk itself")
        with ctx.hold(f"disk:{disk.name}"):
            params, resolved = deploy_oci.locate(ctx, params)   # an oci:// source: to its blob
            result = pipeline(ctx, params, disk).run()
            result.resolved_manifest = resolved
            return result

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
                raise Unsupported(QCOW2_NEEDS_FILE)
            self._stream(source, fmt)
        finally:
            source.close()

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
                    self._readback(fd, dfd, offset, raw_hash.digest())
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


def pipeline(ctx: Context, params: DeployParams, disk: block.Disk) -> Deployment:
    """The pipeline for the request: with a manifest, chunk by chunk (deploy_verified); without,
    a local qcow2 file by qemu-img and anything else as a stream (the file's first bytes say)."""
    if params.has_manifest:
        return deploy_verified.ManifestDeployment(ctx, params, disk)
    if params.local_path is not None:
        with open(params.local_path, "rb") as f:
            if image.detect(f.read(image.MAGIC_LEN)) == Fmt.QCOW2:
                return Qcow2Deployment(ctx, params, disk)
    return StreamDeployment(ctx, params, disk)
