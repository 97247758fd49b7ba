"""A file named by a request (``FileRef``, from the wire's ``FileSource``): from a URL, from a
partition of a local disk, or from a local path, copied into a private work file and checked
against its digest. (The bytes of an image as they stream are agent/images/image.py's Sources.)

    src = parse_source(request.kernel, "kernel")     # InvalidParameters on bad input
    digest = fetch(src, dest, cancel=ctx.cancel_event, ca_file=config.ca_bundle)

What is checked is what is used afterwards: the digest is computed over the bytes written to
``dest`` (never over a file that could change after the check), and ``dest`` is removed when
anything fails. A partition is mounted read-only (``ro,noexec,nosuid,nodev``, and ``noload``
for ext4 so not even the journal is replayed) on a private temporary directory, and always
unmounted; the path inside it is resolved without ever leaving that filesystem (symlinks are
followed inside it, ``..`` stops at its root).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from agent import proc
from agent.errors import (
    AgentError,
    Cancelled,
    ChecksumMismatch,
    InvalidParameters,
    NotFound,
    ProtectedDevice,
    Reason,
)
from agent.hw import block, partitions
from agent.images.image import Digest
from agent.net import http
from agent.proto import common_pb2

log = logging.getLogger(__name__)

CHUNK = 1 << 20
MAX_SYMLINKS = 40


@dataclass(frozen=True)
class PartitionRef:
    disk: common_pb2.DiskHints
    number: int
    label: str
    path: str


@dataclass(frozen=True)
class FileRef:
    """A file a request names, and the digest it must have (not its bytes: ``fetch`` copies them)."""

    digest: Digest
    url: str = ""
    local_path: Path | None = None
    partition: PartitionRef | None = None

    def describe(self) -> str:
        if self.url:
            return http.redact(self.url)
        if self.partition is not None:
            p = self.partition
            where = f"partition {p.number}" if p.number else f"partition labelled {p.label!r}"
            return f"{p.path} on {where}"
        return str(self.local_path)


def _check_inner_path(path: str, what: str) -> str:
    if not path.startswith("/") or "\0" in path:
        raise InvalidParameters(f"{what}: path inside the partition must be absolute, not {path!r}")
    return path


def parse_source(msg: common_pb2.FileSource, what: str) -> FileRef:
    """Validate a FileSource from the wire; InvalidParameters names ``what`` (e.g. "kernel")."""
    which = msg.WhichOneof("source")
    if which is None:
        raise InvalidParameters(f"{what}: give a url, a partition_file or a local_path")
    if not msg.HasField("digest") or not msg.digest.hex:
        raise InvalidParameters(f"{what}: a digest is required")
    digest = Digest.from_proto(msg.digest, what)
    if which == "url":
        http.check_url(msg.url)
        return FileRef(digest, url=msg.url)
    if which == "local_path":
        path = msg.local_path
        if not path.startswith("/") or "\0" in path:
            raise InvalidParameters(f"{what}: local_path must be absolute, not {path!r}")
        return FileRef(digest, local_path=Path(path))
    pf = msg.partition_file
    block.Hints.from_proto(pf.disk)  # InvalidParameters when empty or malformed
    if not pf.partition_number and not pf.partition_label:
        raise InvalidParameters(f"{what}: partition_file needs a partition_number or a partition_label")
    return FileRef(digest, partition=PartitionRef(
        disk=pf.disk, number=pf.partition_number, label=pf.partition_label,
        path=_check_inner_path(pf.path, what),
    ))


# -- copying with a digest ------------------------------------------------------------------


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def _copy(reader: Callable[[int], bytes], dest: Path, digest: Digest,
          cancel: threading.Event | None, progress: Callable[[int], None] | None) -> str:
    h = digest.new()
    done = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        while chunk := reader(CHUNK):
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled while copying")
            h.update(chunk)
            out.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done)
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest()


def fetch(
    src: FileRef,
    dest: Path,
    *,
    cancel: threading.Event | None = None,
    ca_file: Path | None = None,
    ca_pem: str = "",
    headers: Mapping[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
    resolve_disk: Callable[[common_pb2.DiskHints], Path] | None = None,
    pool: http.ConnectionPool | None = None,
    resolve: Callable[[str, int], Iterable[str]] | None = None,
) -> str:
    """Copy ``src`` to ``dest`` (mode 0600) and return its digest, which must match. A URL is
    fetched trusting ``ca_pem`` and ``ca_file`` too, with ``headers`` (on a connection of
    ``pool`` when given), dialling only the addresses ``resolve`` allows (HttpOptions.resolve).

    Raises ChecksumMismatch, NotFound, SourceFailed...; ``dest`` is gone when it raises.
    """
    try:
        if src.url:
            opts = http.HttpOptions(ca_pem=ca_pem, ca_file=ca_file, headers=dict(headers or {}),
                                    cancel=cancel, resolve=resolve)
            with http.get(src.url, opts, pool=pool) as body:
                got = _copy(body.read, dest, src.digest, cancel, progress)
        elif src.local_path is not None:
            with _open_regular(src.local_path) as f:
                got = _copy(f.read, dest, src.digest, cancel, progress)
        else:
            assert src.partition is not None
            find = resolve_disk or find_disk
            with mounted_partition(find(src.partition.disk), src.partition) as root, \
                    open_in_root(root, src.partition.path) as f:
                got = _copy(f.read, dest, src.digest, cancel, progress)
        if got != src.digest.hex:
            # The digest of a local file is not told: it would confirm guesses of its content.
            actual = got if src.url else "(not shown for a local file)"
            raise ChecksumMismatch(
                f"{src.describe()}: {src.digest.algorithm} is {actual}, the request says {src.digest.hex}",
                expected=src.digest.hex, actual=actual,
            )
        return got
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        raise


@contextlib.contextmanager
def _open_regular(path: Path) -> Iterator[BinaryIO]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NotFound(f"{path}: no such file", path=path) from exc
    except OSError as exc:
        raise NotFound(f"{path}: cannot open ({exc.strerror})", path=path) from exc
    f = os.fdopen(fd, "rb")
    with f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidParameters(f"{path}: not a regular file")
        yield f


@contextlib.contextmanager
def open_in_root(root: Path, inner: str) -> Iterator[BinaryIO]:
    """Open ``inner`` (absolute, inside the filesystem at ``root``) without escaping ``root``.

    Symlinks are followed as the booted system would see them, with ``root`` as ``/``.
    """
    parts = [p for p in PurePosixPath(inner).parts if p != "/"]
    stack: list[str] = []  # resolved components below root
    hops = 0
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            if stack:
                stack.pop()
            continue
        candidate = root.joinpath(*stack, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError as exc:
            raise NotFound(f"{inner}: no such file in the partition", path=inner) from exc
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_SYMLINKS:
                raise NotFound(f"{inner}: too many levels of symbolic links", path=inner)
            target = os.readlink(candidate)
            if target.startswith("/"):
                stack = []
            parts = [p for p in PurePosixPath(target).parts if p != "/"] + parts
            continue
        stack.append(name)
    final = root.joinpath(*stack)
    fd = os.open(final, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    f = os.fdopen(fd, "rb")
    with f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidParameters(f"{inner}: not a regular file in the partition")
        yield f


# -- disks and partitions -------------------------------------------------------------------


def find_disk(hints: common_pb2.DiskHints) -> Path:
    """The one disk every set hint matches (agent.hw.block's root-device-hint matching)."""
    return block.select(block.list_disks(), block.Hints.from_proto(hints)).path


@contextlib.contextmanager
def mounted_partition(disk: Path, ref: PartitionRef) -> Iterator[Path]:
    """Mount the partition read-only on a private temporary directory; always unmounted."""
    private = Path(tempfile.mkdtemp(prefix="bc-partfile-"))
    os.chmod(private, 0o700)
    where = private / "mnt"
    where.mkdir()
    try:
        part, node = partitions.find_partition(disk, private, number=ref.number, label=ref.label)
        used = block.SystemUse.scan().uses.get(part.devnum)
        if used is not None:
            # Mounted (maybe read-write) elsewhere: a second mount would read a filesystem in flux.
            raise ProtectedDevice(f"{part.name} {used}; refusing to mount it again", device=part.name)
        fs = partitions.fs_on(node)
        fstype = fs.type if fs is not None else ""
        options = "ro,noexec,nosuid,nodev" + (",noload" if fstype in ("ext3", "ext4") else "")
        argv = ["mount", "-o", options, *(["-t", fstype] if fstype else []), str(node), str(where)]
        try:
            proc.run(argv, timeout=60)
        except AgentError as exc:
            raise AgentError(f"cannot mount {part.name} read-only: {exc.message}",
                             reason=Reason.TOOL_FAILED, device=part.name) from exc
        try:
            yield where
        finally:
            try:
                proc.run(["umount", str(where)], timeout=60)
            except AgentError:
                log.warning("umount %s failed; detaching lazily", where)
                proc.run(["umount", "-l", str(where)], timeout=60, check=False)
    finally:
        shutil.rmtree(private, ignore_errors=True)
