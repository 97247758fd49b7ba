"""What deploy.image's three pipelines share (agent/commands/deploy.py: the raw stream and
qcow2 pipelines, checked by the whole image's digest; agent/commands/deploy_verified.py: the
manifest pipeline, every chunk verified before it is written).

``DeployParams`` is the request, parsed and checked. A ``Deployment`` is one deploy of one
image onto one disk: its source (``_open_source``: the published bytes, hashed as they pass,
over the deploy's one kept-alive HTTP connection), the checks made before the disk is
touched (format, size), the target (``_open_target``: O_DIRECT where the disk takes it, its
start and end cleared when anything inside fails; ``_prepare``: discarded and checked to read
zeros), the digest check, the one read-back (``_read_back``: the disk's bytes as they read
now, the page cache dropped) and the result. A pipeline implements ``deploy()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agent.commands.base import Context
from agent.errors import AgentError, ChecksumMismatch, InvalidParameters, Reason, SourceFailed
from agent.hw import block, diskio, partitions
from agent.images import filesource, http, image, oci
from agent.policy import conformance
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat
ZERO_SAMPLES = 256
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
    gate: conformance.Expected | None = None     # the acceptance gate, run before the disk is opened
    oci: oci.Reference | None = None             # an oci:// source, resolved by deploy_oci.locate
    registry_hosts: frozenset[str] = frozenset()  # oci: other hosts a redirect may lead to
    resolve: Callable[[str, int], Iterable[str]] | None = None   # oci: the hosts it may dial

    @property
    def has_manifest(self) -> bool:
        return self.manifest is not None or bool(self.manifest_inline)


class Deployment:
    """One deploy of one image onto one disk; a pipeline (a subclass) implements ``deploy``."""

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
            resolve=p.resolve,
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
                    self.ctx.check()
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
