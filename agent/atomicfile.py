"""A file written whole or not at all: the agent's one way to write a file that must survive a
crash (keys, secrets, boot entries, routes, dnsmasq's files, the journal's compaction, downloads,
OCI blobs, manifests, the content store's chunks, `agent install`'s files).

    with replacing(path, 0o600) as f:      # a binary file object: write, copy into it
        f.write(b"...")                    # path holds the new bytes once the block ends
    write_atomic(path, data, 0o644)        # the same for bytes in hand

``replacing`` writes a new temporary file (``.NAME.PID.RANDOM.tmp``, in the same folder, or in
``tmp_dir`` when given: a folder on the same file system that nobody watches) with ``mode``
whatever the umask; when the block ends it fsyncs it, renames it over the target and fsyncs
the folder, so a crash or a power loss leaves the old content or the new, never a mix. When the
block raises, the temporary file is removed and the target is untouched. A temporary file left
by a killed process never has the target's name: a reader never takes it for the real one, and
``sweep`` removes those in the target's folder whose process is gone (the journal's ``open``;
the content store, the boot service and the TTL tables sweep their own folders whole).
``Replacement`` is the same in steps, for a writer that decides at the end whether its file is
kept, and under which lock it gets its name (the content store's). ``fsync_dir`` makes a rename
or an unlink in a directory durable.

agent/launcher.py keeps its own copy of write_atomic and fsync_dir: it is copied beside the
archive and must run with the standard library alone, even when the agent package cannot be
imported.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the directory that holds ``path`` (a rename or an unlink there is then durable)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Replacement:
    """The new content of ``path``, being written to a temporary file (see the module
    docstring): ``file`` to write it, ``commit`` to give it the target's name, ``discard`` (a
    no-op after ``commit``) to drop it. ``fsync``: how a file is made durable (the journal's
    does nothing on tmpfs)."""

    def __init__(self, path: str | os.PathLike[str], mode: int = 0o644, *,
                 tmp_dir: str | os.PathLike[str] | None = None,
                 fsync: Callable[[int], None] = os.fsync) -> None:
        self.target = os.fspath(path)
        folder, name = os.path.split(os.path.abspath(self.target))
        self.tmp = os.path.join(os.fspath(tmp_dir) if tmp_dir is not None else folder,
                                f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        self._fsync = fsync
        self.committed = False
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
        try:
            os.fchmod(fd, mode)
            self.file: io.BufferedWriter = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
            raise

    def finish(self) -> None:
        """Every byte written: flush, fsync and close the file (``commit`` does it when it was
        not done; a writer that must not fsync under its lock does it before)."""
        if not self.file.closed:
            self.file.flush()
            self._fsync(self.file.fileno())
            self.file.close()

    def commit(self, *, sync_folder: bool = True) -> None:
        """Finish the file, rename it over the target, fsync the folder (unless ``sync_folder``
        is False: a caller that does it itself, or whose loss is only a cache miss)."""
        self.finish()
        os.replace(self.tmp, self.target)
        self.committed = True
        if sync_folder:
            fsync_dir(self.target)

    def discard(self) -> None:
        """Close and remove the temporary file, unless it was committed."""
        with contextlib.suppress(OSError):     # a flush of what is dropped anyway
            self.file.close()
        if not self.committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)


def sweep(path: str | os.PathLike[str]) -> int:
    """Remove the temporary files of ``path`` that a killed writer left (those of a process
    still running are its own business); returns how many were removed."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    removed = 0
    for entry in os.scandir(folder):
        left = _LEFT_BEHIND.fullmatch(entry.name)
        if left is None or left["name"] != name or _running(int(left["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed += 1
    return removed


_LEFT_BEHIND = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[0-9a-f]{8}\.tmp")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                  # another user's process
    return True


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], mode: int = 0o644, *,
              tmp_dir: str | os.PathLike[str] | None = None,
              fsync: Callable[[int], None] = os.fsync,
              sync_folder: bool = True) -> Iterator[io.BufferedWriter]:
    """A binary file whose bytes replace ``path`` whole when the block ends, or are dropped
    when it raises (see the module docstring and ``Replacement``)."""
    new = Replacement(path, mode, tmp_dir=tmp_dir, fsync=fsync)
    try:
        yield new.file
        new.commit(sync_folder=sync_folder)
    finally:
        new.discard()


def write_atomic(
    path: str | os.PathLike[str], data: bytes, mode: int = 0o644, *,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Write ``path`` whole or not at all (see the module's docstring)."""
    with replacing(path, mode, tmp_dir=tmp_dir) as f:
        f.write(data)
