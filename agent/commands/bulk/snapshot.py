"""instance.snapshot: stream a block device or a file to a URL, compressed, with its digests.

No temporary copy: the source is read in 1 MiB chunks, hashed (sha256 of the raw source),
compressed on the fly (zstd through the ``zstd`` binary, gzip through zlib, or none), hashed
again (sha256 of the bytes sent), paced by a token bucket and PUT to the URL with chunked
transfer encoding. Both digests and sizes are in the result; the receiver compares them with
what it stored.

Quiesce: with ``quiesce_mountpoint`` the filesystem is frozen (FIFREEZE, what ``fsfreeze -f``
does) for the duration and thawed (FITHAW) in a ``finally``, whatever happened. The
filesystem holding the agent's state directory and ``/`` are refused: freezing them would
block the agent itself.

Not retry-safe: a failure or an interruption is reported, never silently restarted.

Sources a request may name: block devices under /dev, and regular files under the
directories of the snapshot_allow setting (``bc.snapshot_allow``, colon-separated; default
SNAPSHOT_DIRS).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent import proc
from agent.commands.base import Context, Handler
from agent.commands.bulk import transfer
from agent.config import Config
from agent.errors import InvalidParameters, ProtectedDevice, SourceFailed, ToolFailed
from agent.images import image
from agent.proto import agent_pb2, common_pb2

log = logging.getLogger(__name__)

CHUNK = 1 << 20
SNAPSHOT_DIRS = (Path("/var/lib/libvirt/images"), Path("/var/lib/bettercompute/instances"))
ZSTD_LEVEL = 3
FROZEN_DIR = "frozen"                        # markers of filesystems frozen by a snapshot

# linux/fs.h: _IOWR('X', 119, int) and _IOWR('X', 120, int)
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878


@dataclass(frozen=True)
class SnapshotParams:
    source: Path
    url: str
    compression: int                         # agent_pb2.Compression value
    quiesce: Path | None
    rate: int                                # bytes per second on the wire
    headers: tuple[tuple[str, str], ...]
    ca_pem: str


def allowed_dirs(config: Config) -> tuple[Path, ...]:
    return config.snapshot_allow or SNAPSHOT_DIRS


# -------------------------------------------------------------------------- quiesce


def freeze(mountpoint: Path) -> None:
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FIFREEZE, 0)
    except OSError as exc:
        reason = "already frozen" if exc.errno == errno.EBUSY else exc.strerror
        raise ToolFailed(f"cannot freeze {mountpoint}: {reason}", mountpoint=str(mountpoint)) from exc
    finally:
        os.close(fd)


def thaw(mountpoint: Path) -> None:
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FITHAW, 0)
    finally:
        os.close(fd)


def is_frozen(mountpoint: Path) -> bool:
    """True when the filesystem is frozen (FIFREEZE says EBUSY); it stays as it was."""
    try:
        freeze(mountpoint)
    except ToolFailed as exc:
        if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EBUSY:
            return True
        raise
    thaw(mountpoint)
    return False


def _marker(state_dir: Path, mountpoint: Path) -> Path:
    return state_dir / FROZEN_DIR / hashlib.sha256(str(mountpoint).encode()).hexdigest()[:16]


def thaw_leftovers(state_dir: Path) -> list[Path]:
    """Thaw what an agent that died mid-snapshot left frozen; the thawed mount points.

    ``frozen`` writes a marker (mount point, pid) in ``state_dir/frozen`` before it freezes
    and removes it after the thaw. A marker whose pid is no longer alive is a leftover. The
    runtime may call this at start-up; every snapshot calls it before it begins.
    """
    thawed: list[Path] = []
    with contextlib.suppress(OSError):
        for marker in sorted((state_dir / FROZEN_DIR).iterdir()):
            try:
                mountpoint, pid = marker.read_text().split("\n")[:2]
                if int(pid) == os.getpid() or proc.alive(int(pid)):
                    continue
            except (OSError, ValueError):
                continue
            try:
                thaw(Path(mountpoint))
                thawed.append(Path(mountpoint))
                log.warning("thawed %s, left frozen by an interrupted snapshot", mountpoint)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                    log.error("cannot thaw %s left frozen by an interrupted snapshot: %s", mountpoint, exc)
                    continue
            marker.unlink(missing_ok=True)
    return thawed


@contextlib.contextmanager
def frozen(ctx: Context, mountpoint: Path) -> Iterator[None]:
    """The filesystem frozen for the body of the ``with``; always thawed after it."""
    marker = _marker(ctx.config.state_dir, mountpoint)
    marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    marker.write_text(f"{mountpoint}\n{os.getpid()}\n")
    ctx.log.info("freezing %s", mountpoint)
    try:
        freeze(mountpoint)
    except BaseException:
        marker.unlink(missing_ok=True)
        raise
    try:
        yield
    finally:
        for attempt in range(3):
            try:
                thaw(mountpoint)
                ctx.log.info("thawed %s", mountpoint)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: not frozen (any more), nothing to undo
                    ctx.log.error("thaw of %s failed (attempt %d): %s", mountpoint, attempt + 1, exc)
                    time.sleep(0.5)
                    continue
            marker.unlink(missing_ok=True)
            break


def check_quiesce(config: Config, raw: str) -> Path:
    if not os.path.isabs(raw):
        raise InvalidParameters(f"quiesce_mountpoint {raw!r} must be absolute")
    mountpoint = Path(os.path.realpath(raw))
    if not os.path.ismount(mountpoint):
        raise InvalidParameters(f"quiesce_mountpoint {raw!r} is not a mount point")
    if mountpoint == Path("/"):
        raise ProtectedDevice("refusing to freeze the root filesystem: it would block the agent")
    state = config.state_dir if config.state_dir.exists() else config.state_dir.parent
    with contextlib.suppress(OSError):
        if os.stat(state).st_dev == os.stat(mountpoint).st_dev:
            raise ProtectedDevice(
                f"refusing to freeze {mountpoint}: it holds the agent's state directory {config.state_dir}"
            )
    return mountpoint


# --------------------------------------------------------------------------- source


def chunks(ctx: Context, source: image.FileSource) -> Iterator[bytes]:
    """The source in 1 MiB chunks (counted and hashed by the source as they pass)."""
    while True:
        ctx.check()
        if not (data := source.read(CHUNK)):
            return
        yield data


def gzip_stream(raw: Iterator[bytes]) -> Iterator[bytes]:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    for chunk in raw:
        out = z.compress(chunk)
        if out:
            yield out
    yield z.flush()


ZSTD_ARGV = ("zstd", "-q", "-c", f"-{ZSTD_LEVEL}", "-T0")


# -------------------------------------------------------------------------- handler


class InstanceSnapshot(Handler[agent_pb2.InstanceSnapshotRequest, SnapshotParams], kind="instance.snapshot"):
    def parse(self, payload: agent_pb2.InstanceSnapshotRequest) -> SnapshotParams:
        if not payload.source_path:
            raise InvalidParameters("instance.snapshot: 'source_path' is required")
        if not payload.upload_url:
            raise InvalidParameters("instance.snapshot: 'upload_url' is required")
        transfer.check_upload_request(payload.upload_url, payload.http_headers)
        if payload.compression not in agent_pb2.Compression.values():
            raise InvalidParameters(f"instance.snapshot: unknown compression {payload.compression}")
        return SnapshotParams(
            source=Path(payload.source_path),
            url=payload.upload_url,
            compression=payload.compression,
            quiesce=Path(payload.quiesce_mountpoint) if payload.quiesce_mountpoint else None,
            rate=payload.bandwidth_limit_bytes_per_second,
            headers=tuple(sorted(payload.http_headers.items())),
            ca_pem=payload.ca_bundle_pem,
        )

    def check_source(self, config: Config, raw: Path) -> Path:
        real = Path(os.path.realpath(raw))
        if transfer.within(real, Path("/dev")):
            if not real.is_block_device():
                raise InvalidParameters(f"snapshot source {raw} is under /dev but not a block device")
            return real
        return transfer.confine(str(raw), allowed_dirs(config), "snapshot source")

    def run(self, ctx: Context, params: SnapshotParams) -> agent_pb2.InstanceSnapshotResult:
        thaw_leftovers(ctx.config.state_dir)
        source_path = self.check_source(ctx.config, params.source)
        mountpoint = check_quiesce(ctx.config, str(params.quiesce)) if params.quiesce else None
        rate = params.rate or ctx.config.bulk_bandwidth_bytes_per_second
        started = time.monotonic()
        source = image.FileSource(source_path, "sha256", what="snapshot source")
        try:
            with frozen(ctx, mountpoint) if mountpoint else contextlib.nullcontext():
                result = self._stream(ctx, params, source, rate)
        finally:
            source.close()
        result.quiesced = mountpoint is not None
        result.seconds = time.monotonic() - started
        return result

    def _stream(
        self, ctx: Context, params: SnapshotParams, source: image.FileSource, rate: int
    ) -> agent_pb2.InstanceSnapshotResult:
        size = source.total or 0
        sent = hashlib.sha256()
        counter = {"sent": 0}
        meter = ctx.meter(total=size, subject=str(params.source))

        def on_chunk(chunk: bytes) -> None:
            sent.update(chunk)
            counter["sent"] += len(chunk)
            meter.update(source.count,
                         message=f"{source.count} of {size} bytes read, {counter['sent']} sent")

        with contextlib.ExitStack() as stack:
            if params.compression == agent_pb2.ZSTD_COMPRESSION:
                # The binary as a filter: a thread feeds it the source, the upload reads it.
                zstd = stack.enter_context(ctx.running(ZSTD_ARGV, stdin=subprocess.PIPE, grace=0.5))
                zstd.feed(chunks(ctx, source))
                body: Iterator[bytes] = zstd.chunks(CHUNK)
            elif params.compression == agent_pb2.GZIP_COMPRESSION:
                body = gzip_stream(chunks(ctx, source))
            else:
                body = chunks(ctx, source)
            transfer.upload(
                ctx,
                params.url,
                transfer.throttled(ctx, body, rate, on_chunk=on_chunk),
                headers=dict(params.headers),
                ca_pem=params.ca_pem,
            )
        meter.update(source.count, force=True,
                     message=f"{source.count} of {size} bytes read, {counter['sent']} sent")
        if source.count < size:
            raise SourceFailed(f"source ended after {source.count} of {size} bytes")
        return agent_pb2.InstanceSnapshotResult(
            source_bytes=source.count,
            uploaded_bytes=counter["sent"],
            source_digest=common_pb2.Digest(algorithm="sha256", hex=source.hasher.hexdigest()),
            uploaded_digest=common_pb2.Digest(algorithm="sha256", hex=sent.hexdigest()),
            compression=params.compression,  # type: ignore[arg-type]  # the enum's number, checked in parse
        )
