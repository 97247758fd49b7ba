"""The chunk readers of a deploy verified by a manifest: the raw image asked for chunk by chunk
in image order, from where it is, and ``pick`` that says which one a source allows.

- ``RangeReader``: a raw image over HTTP, Range requests of the data runs only (zero chunks are
  not downloaded at all).
- ``FileReader``: a local raw file by offset (a zero chunk in a hole is not read).
- ``Qcow2Reader``: a local qcow2 file through its tables (agent/images/qcow2.py).
- ``StreamReader``: anything else, as an agent/images/image.py RawStream, in order.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Protocol

from agent.errors import ChecksumMismatch, SourceFailed, Unsupported
from agent.hw import diskio
from agent.images import image
from agent.images.plan import Plan
from agent.net import http
from agent.proto import agent_pb2

Fmt = agent_pb2.ImageFormat
QCOW2_NEEDS_FILE = ("a qcow2 image over HTTP is deployed by its digest, streamed through its tables;"
                    " chunk by chunk against a manifest it needs a local file (local_path)")


class Reader(enum.StrEnum):
    RANGE = "range"
    FILE = "file"
    QCOW2 = "qcow2"
    STREAM = "stream"


def pick(fmt: int, *, local: bool, ranged: bool, must_hash: bool) -> Reader:
    """The chunk reader for an image of format ``fmt``: a local file is read by offset (raw) or
    through its tables (qcow2); a raw image over HTTP whose server takes Range requests is
    fetched by Range, unless the published bytes must be hashed whole (``must_hash``: a digest
    the manifest does not vouch for); anything else is read as a stream. A qcow2 image over
    HTTP is refused here (its chunks in the guest's order need a seekable file; without a
    manifest it streams: agent/images/qcow2stream.py)."""
    if fmt == Fmt.QCOW2:
        if not local:
            raise Unsupported(QCOW2_NEEDS_FILE)
        return Reader.QCOW2
    if fmt == Fmt.RAW and local:
        return Reader.FILE
    if fmt == Fmt.RAW and ranged and not must_hash:
        return Reader.RANGE
    return Reader.STREAM


SCRATCH = 4 << 20         # bytes read at a time when the source's zeros are checked
CONSUME = 2 << 20         # bytes decompressed at a time for a zero chunk (stays in the cache)


class ChunkReader(Protocol):
    """The raw image's bytes for the producer, asked for in image order."""

    @property
    def fetched(self) -> int:
        """Bytes taken from the source (downloaded or read)."""
        ...

    @property
    def resumes(self) -> int:
        """Downloads resumed by Range after a dropped connection."""
        ...

    def read_data(self, offset: int, view: memoryview) -> None:
        """Exactly len(view) bytes of the raw image at ``offset``; SourceFailed when short."""
        ...

    def pass_zeros(self, offset: int, length: int) -> None:
        """The source's bytes of a zero chunk: checked for zeros, skipped or consumed."""
        ...

    def finish(self, size: int) -> None:
        """The source ends exactly at ``size``."""
        ...

    def close(self) -> None:
        ...


def _not_zeros(offset: int) -> ChecksumMismatch:
    return ChecksumMismatch(f"the image has data at byte {offset}, in a chunk the manifest says is zeros",
                            offset=offset)


def _check_zeros(view: memoryview, offset: int) -> None:
    import ctypes

    n = len(view)
    if not n:
        return
    buf = (ctypes.c_char * n).from_buffer(view)
    if not diskio.all_zero(view, ctypes.addressof(buf), 0, n):
        raise _not_zeros(offset)
    del buf


class StreamReader:
    """A raw stream read in order (a decompressed image, or a raw one without Range)."""

    def __init__(self, stream: image.RawStream) -> None:
        self.stream = stream
        self.pos = 0
        self._scratch = bytearray(SCRATCH)

    @property
    def fetched(self) -> int:
        return self.stream.source.count

    @property
    def resumes(self) -> int:
        return self.stream.source.resumes

    def close(self) -> None:
        self.stream.close()

    def _fill(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self.stream.readinto(view[got:])
            if n == 0:
                at = self.pos + got
                raise SourceFailed(f"the image ended at byte {at}, shorter than the manifest says", offset=at)
            got += n
        self.pos += got

    def read_data(self, offset: int, view: memoryview) -> None:
        assert offset == self.pos, (offset, self.pos)
        self._fill(view)

    def pass_zeros(self, offset: int, length: int) -> None:
        """A raw stream's zeros are checked (memcmp); a decompressed stream's are consumed only:
        what the disk gets there is the manifest's zeros either way, and decompressing into a
        small buffer that stays in the cache is most of the cost already."""
        assert offset == self.pos, (offset, self.pos)
        check = self.stream.fmt == Fmt.RAW
        view = memoryview(self._scratch)[: SCRATCH if check else CONSUME]
        while length:
            n = min(length, len(view))
            start = self.pos
            self._fill(view[:n])
            if check:
                _check_zeros(view[:n], start)
            length -= n

    def finish(self, size: int) -> None:
        if self.stream.readinto(memoryview(bytearray(1))):
            raise SourceFailed(f"the image goes on past byte {size}, longer than the manifest says",
                               offset=size)


class FileReader:
    """A raw local file, read by offset: a zero chunk in a hole of the file is not read at all."""

    resumes = 0

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.fetched = 0
        self._scratch = bytearray(SCRATCH)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read_data(self, offset: int, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = os.preadv(self.fd, [view[got:]], offset + got)
            if n == 0:
                raise SourceFailed(f"the image ended at byte {offset + got}, shorter than the manifest says",
                                   offset=offset + got)
            got += n
        self.fetched += got

    def _data_extents(self, offset: int, end: int) -> list[tuple[int, int]]:
        """The parts of [offset, end) that are not holes (SEEK_DATA / SEEK_HOLE)."""
        out = []
        pos = offset
        while pos < end:
            try:
                start = os.lseek(self.fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole from here to the end of the file
                break
            if start >= end:
                break
            stop = min(os.lseek(self.fd, start, os.SEEK_HOLE), end)
            out.append((start, stop))
            pos = stop
        return out

    def pass_zeros(self, offset: int, length: int) -> None:
        view = memoryview(self._scratch)
        for start, stop in self._data_extents(offset, offset + length):
            pos = start
            while pos < stop:
                n = min(stop - pos, len(view))
                self.read_data(pos, view[:n])
                _check_zeros(view[:n], pos)
                pos += n

    def finish(self, size: int) -> None:
        actual = os.fstat(self.fd).st_size
        if actual != size:
            raise SourceFailed(f"the image is {actual} bytes, the manifest says {size}", size=actual)


class Qcow2Reader:
    """A local qcow2 file, read by guest offset through its tables: a zero chunk whose clusters
    are unallocated (or zero clusters) is not read at all, an allocated one is checked."""

    resumes = 0

    def __init__(self, path: str) -> None:
        from agent.images.qcow2 import Qcow2File

        self.q = Qcow2File(Path(path))
        self._scratch = bytearray(SCRATCH)

    @property
    def fetched(self) -> int:
        return self.q.fetched

    def read_data(self, offset: int, view: memoryview) -> None:
        self.q.read(offset, view)

    def pass_zeros(self, offset: int, length: int) -> None:
        view = memoryview(self._scratch)
        for pos in range(offset, offset + length, len(view)):
            n = min(len(view), offset + length - pos)
            if self.q.allocated(pos, n):
                self.q.read(pos, view[:n])
                _check_zeros(view[:n], pos)

    def finish(self, size: int) -> None:
        if self.q.size != size:
            raise SourceFailed(f"the qcow2 image's virtual size is {self.q.size}, the manifest says {size}")

    def close(self) -> None:
        self.q.close()


class RangeReader:
    """A raw image over HTTP: only the data chunks are downloaded, a Range request per run of
    consecutive data chunks, all on the one kept-alive connection of ``pool``; zero chunks are
    not downloaded at all."""

    def __init__(self, url: str, opts: http.HttpOptions, plan: Plan, pool: http.ConnectionPool | None = None
                 ) -> None:
        self.url, self.opts, self.pool = url, opts, pool
        self.fetched = 0
        self._runs: dict[int, int] = {}     # start of a run of data -> its end
        run_start = -1
        for seg in plan.segments:
            if seg.digest is not None and run_start < 0:
                run_start = seg.offset
            elif seg.digest is None and run_start >= 0:
                self._runs[run_start] = seg.offset
                run_start = -1
        if run_start >= 0:
            self._runs[run_start] = plan.image_size
        self._body: http.Download | None = None
        self._pos = -1
        self._resumed = 0                   # by the bodies already closed

    def read_data(self, offset: int, view: memoryview) -> None:
        if self._body is None or offset != self._pos:
            self.close()
            end = self._runs.get(offset, offset + len(view))
            self._body = http.get(self.url, self.opts, offset=offset, length=end - offset, pool=self.pool)
            self._pos = offset
        got = 0
        while got < len(view):
            n = self._body.readinto(view[got:])
            if n == 0:
                raise SourceFailed(f"the download ended at byte {offset + got}", offset=offset + got)
            got += n
        self._pos += got
        self.fetched += got

    def pass_zeros(self, offset: int, length: int) -> None:
        pass

    @property
    def resumes(self) -> int:
        return self._resumed + (self._body.resumes if self._body is not None else 0)

    def finish(self, size: int) -> None:
        self.close()

    def close(self) -> None:
        if self._body is not None:
            self._resumed += self._body.resumes
            self._body.close()
            self._body = None
