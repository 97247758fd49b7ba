"""The one home of an image's sources and readers (deploy.image, ``agent manifest``,
instance.snapshot): the format from the magic bytes, the one ``Digest`` type, the published
bytes and the raw image's bytes.

- ``Source``: the published bytes, in order, hashed as they pass (``FileSource``: a local file
  or block device; ``HttpSource``: a download with Range resume); ``HashToEnd`` hashes one to
  its end on a thread of its own.
- ``RawStream``: the raw image's bytes of a Source of any stream format, in order
  (agent/images/decompress.py's decompressors in bounded pieces, libzstd, or the ``zstd`` child).
- The chunk readers of a deploy verified by a manifest are agent/images/readers.py's.
- ``qcow2_info``: a qcow2 file's virtual size by ``qemu-img info`` (refusing backing files),
  for the deploy that converts one with qemu-img.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import queue
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError, InvalidParameters, NotFound, SourceFailed, ToolFailed
from agent.images import decompress
from agent.net import http
from agent.proc import Child, Completed
from agent.proto import agent_pb2, common_pb2

Fmt = agent_pb2.ImageFormat

MAGIC: tuple[tuple[bytes, int], ...] = (
    (b"\x1f\x8b", Fmt.GZIP),
    (b"\xfd7zXZ\x00", Fmt.XZ),
    (b"\x28\xb5\x2f\xfd", Fmt.ZSTD),
    (b"QFI\xfb", Fmt.QCOW2),
)
MAGIC_LEN = 16
DIGESTS = {"sha256": 64, "sha512": 128}


def format_name(fmt: int) -> str:
    return Fmt.Name(fmt).lower()


def detect(head: bytes) -> int:
    """The format the first bytes announce; RAW when none matches."""
    for magic, fmt in MAGIC:
        if head.startswith(magic):
            return fmt
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in (
        b"1AY&SY",
        b"\x17rE8P\x90",
    ):
        return Fmt.BZIP2
    return Fmt.RAW


@dataclass(frozen=True)
class Digest:
    """The one digest type: what a request or a manifest says a file's digest is (sha256 or
    sha512, lower-case hex), valid by construction (``parse``, ``from_proto``)."""

    algorithm: str
    hex: str

    @classmethod
    def parse(cls, algorithm: str, hexdigest: str) -> Digest:
        algo = algorithm.strip().lower()
        hx = hexdigest.strip().lower()
        if algo not in DIGESTS:
            raise InvalidParameters(f"digest algorithm must be sha256 or sha512, not {algorithm!r}")
        if len(hx) != DIGESTS[algo] or any(c not in "0123456789abcdef" for c in hx):
            raise InvalidParameters(f"digest is not {DIGESTS[algo]} hexadecimal characters of {algo}")
        return cls(algo, hx)

    @classmethod
    def from_proto(cls, msg: common_pb2.Digest, what: str = "") -> Digest:
        """A digest from the wire, sha256 when it names no algorithm; InvalidParameters names
        ``what`` (e.g. "kernel")."""
        try:
            return cls.parse(msg.algorithm or "sha256", msg.hex)
        except InvalidParameters as exc:
            raise InvalidParameters(f"{what}: {exc}" if what else str(exc)) from exc

    def to_proto(self) -> common_pb2.Digest:
        return common_pb2.Digest(algorithm=self.algorithm, hex=self.hex)

    def new(self) -> hashlib._Hash:
        """A hasher of this digest's algorithm."""
        return hashlib.new(self.algorithm)


# ---------------------------------------------------------------------------- sources


class Source:
    """Published bytes, in order, hashed as they pass."""

    total: int | None = None

    def __init__(self, algorithm: str) -> None:
        self.hasher = hashlib.new(algorithm)
        self.count = 0
        self._pushback = b""

    @property
    def resumes(self) -> int:
        return 0

    def _read(self, size: int) -> bytes:
        raise NotImplementedError

    def _fetch(self, size: int) -> bytes:
        """Bytes from the source, counted, not hashed (they are hashed when delivered)."""
        data = self._read(size)
        if data:
            self.count += len(data)
        elif self.total is not None and self.count != self.total:
            raise SourceFailed(f"source ended at byte {self.count} of {self.total}")
        return data

    def read(self, size: int, *, hash: bool = True) -> bytes:
        if self._pushback:
            data, self._pushback = self._pushback, b""
        else:
            data = self._fetch(size)
        if hash:
            self.hasher.update(data)
        return data

    def _readinto(self, view: memoryview) -> int:
        data = self._read(len(view))
        view[: len(data)] = data
        return len(data)

    def readinto(self, buf: memoryview, *, hash: bool = True) -> int:
        """Like read(), into ``buf``; 0 only at the end. With ``hash=False`` the caller
        feeds ``hasher`` with what it got, in order."""
        if self._pushback:
            n = min(len(buf), len(self._pushback))
            buf[:n] = self._pushback[:n]
            self._pushback = self._pushback[n:]
        else:
            n = self._readinto(buf)
            if n:
                self.count += n
            elif self.total is not None and self.count != self.total:
                raise SourceFailed(f"source ended at byte {self.count} of {self.total}")
        if hash and n:
            self.hasher.update(buf[:n])
        return n

    def peek(self, n: int = MAGIC_LEN) -> bytes:
        """The first ``n`` bytes (fewer for a shorter source), left in place for read()."""
        while len(self._pushback) < n:
            data = self._fetch(n - len(self._pushback))
            if not data:
                break
            self._pushback += data
        return self._pushback

    def close(self) -> None:
        pass


class FileSource(Source):
    """A local file or block device (its size by seeking to its end), read in order; ``what``
    names it in errors ("image", "snapshot source")."""

    def __init__(self, path: Path, algorithm: str, *, what: str = "image") -> None:
        super().__init__(algorithm)
        self.path, self.what = path, what
        try:
            self._f = open(path, "rb", buffering=0)  # noqa: SIM115  (closed by close())
        except FileNotFoundError as exc:
            raise NotFound(f"{what} {path} does not exist", path=str(path)) from exc
        except OSError as exc:
            raise SourceFailed(f"{what} {path}: {exc.strerror}") from exc
        fd = self._f.fileno()
        mode = os.fstat(fd).st_mode
        if stat.S_ISBLK(mode):
            self.total = os.lseek(fd, 0, os.SEEK_END)
            os.lseek(fd, 0, os.SEEK_SET)
        elif stat.S_ISREG(mode):
            self.total = os.fstat(fd).st_size
        else:
            self._f.close()
            raise InvalidParameters(f"{what} {path} is neither a block device nor a regular file")
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def _failed(self, exc: OSError) -> SourceFailed:
        return SourceFailed(f"{self.what} {self.path}: read error at byte {self.count}: {exc.strerror}")

    def _read(self, size: int) -> bytes:
        try:
            return self._f.read(size) or b""
        except OSError as exc:
            raise self._failed(exc) from exc

    def _readinto(self, view: memoryview) -> int:
        try:
            return self._f.readinto(view) or 0
        except OSError as exc:
            raise self._failed(exc) from exc

    def close(self) -> None:
        self._f.close()


class HttpSource(Source):
    def __init__(self, url: str, opts: http.HttpOptions, algorithm: str, *,
                 pool: http.ConnectionPool | None = None) -> None:
        super().__init__(algorithm)
        self._body = http.get(url, opts, pool=pool)
        self.total = self._body.total

    @property
    def resumes(self) -> int:
        return self._body.resumes

    def _read(self, size: int) -> bytes:
        return self._body.read(size)

    def close(self) -> None:
        self._body.close()


class HashToEnd:
    """A Source read to its end and hashed on a thread of its own (a spare core, as hashlib lets
    the GIL go), beside a deploy that reads the image another way (a local file by offset, a
    qcow2 file through its tables): the digest of the published bytes, for the request's.

        published = HashToEnd(source)       # starts reading
        published.hexdigest()               # waits for the end; the source's error, if any
        published.close()                   # stops it early (a failed deploy)
    """

    def __init__(self, source: Source, piece: int = 8 << 20) -> None:
        self.source, self.piece = source, piece
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="published-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self.source.read(self.piece):
                pass
        except BaseException as exc:  # handed to hexdigest()
            self._error = exc

    def hexdigest(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._stop.is_set():
            raise AgentError("the published image's digest was not finished (stopped)")
        return self.source.hasher.hexdigest()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


STREAM_PIECE = 4 << 20
F_SETPIPE_SZ = 1031
ZSTD_DECOMPRESS = ("zstd", "-dc", "-q", "--no-progress")
Running = Callable[..., contextlib.AbstractContextManager[Child]]   # proc.running, ctx.running


class RawStream:
    """The raw image bytes of a Source, in order, through ``readinto``.

    RAW: the source itself. gzip, xz, bzip2: a thread decompresses into a short queue of
    pieces. zstd: libzstd (through ctypes, the GIL let go) decompresses straight into the
    caller's buffer, from compressed pieces a thread reads ahead; where there is no libzstd,
    the ``zstd -dc`` child, fed by a thread, its output read straight into the caller's buffer
    through a 1 MiB pipe (no queue, no copy in Python: the decompressor's own speed). In all
    threaded cases the feeding thread reads the source, so the published bytes are hashed
    there (``source.hasher``), beside the caller's work. ``readinto`` returns 0 only at the
    true end, after the source was read to its end; a corrupt or truncated stream raises
    SourceFailed. ``close`` stops the threads and the child.
    """

    def __init__(self, source: Source, fmt: int, running: Running | None = None, *,
                 hash_published: bool = True) -> None:
        self.source, self.fmt = source, fmt
        self.hash_published = hash_published  # False: a manifest verifies the raw chunks instead
        self.count = 0                     # raw bytes delivered
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: Child | None = None
        self._children = contextlib.ExitStack()   # the zstd child's `running`, left in close()
        self._pieces: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=8)
        self._piece = memoryview(b"")
        self._done = False
        self._zstd: decompress.ZstdStream | None = None
        if fmt == Fmt.RAW:
            return
        target: Callable[[], None]
        if fmt == Fmt.ZSTD and (lib := decompress.libzstd()) is not None:
            self._zstd = decompress.ZstdStream(lib)
            target = self._read_ahead
        elif fmt == Fmt.ZSTD:
            from agent import proc

            self._child = child = self._children.enter_context((running or proc.running)(
                ZSTD_DECOMPRESS, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                failure=lambda exited: SourceFailed(
                    f"corrupt or truncated zstd stream (zstd {exited.description}: {exited.tail()[-200:]})"),
            ))
            for pipe in (child.popen.stdin, child.popen.stdout):
                assert pipe is not None
                with contextlib.suppress(OSError):  # 64 KiB by default: a syscall per 64 KiB
                    fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, 1 << 20)
            child.feed(self._published_pieces())
            return
        elif fmt in (Fmt.GZIP, Fmt.XZ, Fmt.BZIP2):
            self._dec = decompress.decompressor(fmt)
            target = self._inflate
        else:
            raise AgentError(f"no stream decompressor for {format_name(fmt)}")
        self._thread = threading.Thread(target=target, name=f"{format_name(fmt)}-feed", daemon=True)
        self._thread.start()

    # -- threads -------------------------------------------------------------------------

    def _published_pieces(self) -> Iterator[bytes]:
        """The published bytes for the zstd child's stdin (its feeding thread reads, and hashes,
        them); the source's own failure is the one raised where the child's exit is checked."""
        try:
            while not self._stop.is_set() and (data := self.source.read(STREAM_PIECE,
                                                                         hash=self.hash_published)):
                yield data
        except AgentError:
            raise
        except Exception as exc:
            raise SourceFailed(f"reading the zstd image failed: {exc}") from exc

    def _put(self, item: bytes | BaseException | None,
             q: queue.Queue[bytes | BaseException | None] | None = None) -> bool:
        q = self._pieces if q is None else q
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)  # wakes as soon as there is room
                return True
            except queue.Full:
                continue
        return False

    def _read_ahead(self, q: queue.Queue[bytes | BaseException | None] | None = None) -> None:
        """The published bytes, read (and hashed) in pieces into ``q`` (default: the pieces the
        reader takes), so that reading and hashing overlap the decompression."""
        try:
            while data := self.source.read(STREAM_PIECE, hash=self.hash_published):
                if not self._put(data, q):
                    return
            self._put(None, q)
        except BaseException as exc:  # handed on
            self._put(exc, q)

    def _inflate(self) -> None:
        compressed: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=4)
        reader = threading.Thread(target=self._read_ahead, args=(compressed,), name="stream-read",
                                  daemon=True)
        reader.start()
        try:
            while True:
                data = compressed.get()
                if isinstance(data, BaseException):
                    raise data
                if data is None:
                    break
                for out in self._dec.feed(data):
                    if not self._put(out):
                        return
            for out in self._dec.finish():
                if not self._put(out):
                    return
            self._put(None)
        except BaseException as exc:  # handed to the reader
            self._put(exc)
        finally:
            if reader.is_alive():  # stopped early: let the read-ahead see the stop and leave
                with contextlib.suppress(queue.Empty):
                    while True:
                        compressed.get_nowait()

    # -- reading -------------------------------------------------------------------------

    def readinto(self, view: memoryview) -> int:
        if self._done or not len(view):
            return 0
        if self.fmt == Fmt.RAW:
            n = self.source.readinto(view, hash=self.hash_published)
        elif self._zstd is not None:
            n = self._from_libzstd(view)
        elif self._child is not None:
            n = self._child.readinto(view)  # at the end: the exit checked, the feeder's error first
            if n == 0 and self.source.read(1, hash=self.hash_published):  # fed to the end: never
                raise SourceFailed("zstd ended before the end of the published file")
        else:
            n = self._from_pieces(view)
        if n == 0:
            self._done = True
        self.count += n
        return n

    def _from_libzstd(self, view: memoryview) -> int:
        z = self._zstd
        assert z is not None
        while True:
            if z.has_input():
                n = z.decompress(view)
                if n:
                    return n
                continue  # the input was consumed without output: take the next piece
            item = self._pieces.get()
            if item is None:
                self._pieces.put(None)  # the end stays the end for the next call
                if z.frame_done:
                    return 0
                n = z.decompress(view)  # output it still holds, if any
                if n:
                    return n
                raise SourceFailed("zstd stream ended early (truncated image)")
            if isinstance(item, BaseException):
                raise item
            z.feed(item)

    def _from_pieces(self, view: memoryview) -> int:
        while not self._piece:
            item = self._pieces.get()
            if item is None:
                return 0
            if isinstance(item, BaseException):
                raise item
            self._piece = memoryview(item)
        n = min(len(view), len(self._piece))
        view[:n] = self._piece[:n]
        self._piece = self._piece[n:]
        return n

    def close(self) -> None:
        self._stop.set()
        if self._zstd is not None:
            self._zstd.free()
        if self._child is not None and not self._done:
            self._child.stop()  # stopped early (a failure, a cancel): its exit is not checked
        self._children.close()
        with contextlib.suppress(queue.Empty):
            while True:
                self._pieces.get_nowait()  # a feeder blocked on a full queue sees the stop
        if self._thread is not None:
            self._thread.join(timeout=5)


def qcow2_info(run: Callable[..., Completed], path: Path) -> int:
    """Virtual size of a qcow2 file; refuses backing files and external data files."""
    from agent import limits

    done = run(["qemu-img", "info", "--output=json", "-f", "qcow2", str(path)])
    # qemu-img's words about a file the tenant made: read bounded like the file's own bytes.
    info = limits.loads_json(done.stdout, what="qemu-img info's output", error=ToolFailed)
    if not isinstance(info, dict):
        raise ToolFailed("qemu-img info: its output is not a JSON object")
    if info.get("backing-filename") or info.get("full-backing-filename"):
        raise InvalidParameters("qcow2 image has a backing file: refused (it would read another file)")
    specific = (info.get("format-specific") or {}).get("data") or {}
    if specific.get("data-file"):
        raise InvalidParameters("qcow2 image has an external data file: refused")
    return int(info["virtual-size"])
