"""A file written whole or not at all: the agent's one way to write a file that must survive a
crash (keys, secrets, boot entries, routes, dnsmasq's files, `agent install`'s files).

``write_atomic`` writes a new temporary file (in ``tmp_dir`` when given: a folder on the same
file system that nobody watches) with ``mode`` whatever the umask, fsyncs it, renames it over
the target and fsyncs the directory, so a crash or a power loss leaves the old content or the
new, never a mix, and a failure leaves no temporary file behind. ``fsync_dir`` makes a rename
or an unlink in a directory durable.

agent/launcher.py keeps its own copy of the two: it is copied beside the archive and must run
with the standard library alone, even when the agent package cannot be imported.
"""

from __future__ import annotations

import contextlib
import os


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the directory that holds ``path`` (a rename or an unlink there is then durable)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: str | os.PathLike[str], data: bytes, mode: int = 0o644, *,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Write ``path`` whole or not at all (see the module's docstring)."""
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    tmp = os.path.join(os.fspath(tmp_dir) if tmp_dir is not None else folder,
                       f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(target)
