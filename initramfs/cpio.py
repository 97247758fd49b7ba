"""A deterministic cpio "newc" writer: the format the kernel unpacks into its initial rootfs.

Written here rather than calling cpio(1) so the archive is byte-identical for identical
inputs (sorted entries, fixed mtimes, owner root) and can carry device nodes such as
/dev/console without mknod. Several archives may be concatenated: the kernel unpacks them in
order, later entries replacing earlier ones, which is how a test overlays its settings on a
prebuilt ramdisk.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MTIME = 0


@dataclass(frozen=True)
class Entry:
    path: str            # inside the archive, no leading slash
    mode: int            # full st_mode (type bits included)
    data: bytes = b""    # file contents, or the target of a symlink
    rdev: tuple[int, int] = (0, 0)


def file(path: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(path.lstrip("/"), stat.S_IFREG | mode, data)


def directory(path: str, mode: int = 0o755) -> Entry:
    return Entry(path.lstrip("/"), stat.S_IFDIR | mode)


def symlink(path: str, target: str) -> Entry:
    return Entry(path.lstrip("/"), stat.S_IFLNK | 0o777, target.encode())


def chardev(path: str, major: int, minor: int, mode: int = 0o600) -> Entry:
    return Entry(path.lstrip("/"), stat.S_IFCHR | mode, rdev=(major, minor))


def tree(root: Path) -> list[Entry]:
    """Every directory, file and symlink under ``root`` (device nodes are skipped)."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append(symlink(rel, os.readlink(path)))
            elif stat.S_ISDIR(st.st_mode):
                entries.append(directory(rel, stat.S_IMODE(st.st_mode)))
            elif stat.S_ISREG(st.st_mode):
                entries.append(file(rel, path.read_bytes(), stat.S_IMODE(st.st_mode)))
    return entries


def _header(ino: int, entry: Entry, namesize: int) -> bytes:
    fields = (ino, entry.mode, 0, 0, 2 if stat.S_ISDIR(entry.mode) else 1, MTIME, len(entry.data),
              0, 0, entry.rdev[0], entry.rdev[1], namesize, 0)
    return b"070701" + b"".join(b"%08X" % f for f in fields)


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 4)


def archive(entries: Iterable[Entry]) -> bytes:
    """The archive of ``entries`` (sorted by path, parents before children), with a trailer."""
    out = bytearray()
    by_path = {e.path: e for e in entries}
    for ino, path in enumerate(sorted(by_path), start=1):
        entry = by_path[path]
        name = path.encode() + b"\0"
        out += _header(ino, entry, len(name)) + name
        out += _pad(len(out))
        out += entry.data
        out += _pad(len(out))
    trailer = b"TRAILER!!!\0"
    out += _header(0, Entry("", 0), len(trailer)) + trailer
    out += _pad(len(out))
    return bytes(out)
