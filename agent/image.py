"""Image sources and formats for deploy.image: open a source, detect its format from the magic
bytes, and decompress a stream of published bytes into raw image bytes.

A ``Source`` yields the published bytes (HTTP download with Range resume, or a local file)
and hashes them on the fly. ``Decompressor``\\ s turn those chunks into bounded pieces of raw
image (never more than ``max_out`` bytes per step, so a 1000:1 compressed run of zeros cannot
blow up memory). zstd runs the ``zstd`` binary (no stdlib module); qcow2 is not a stream
format and is converted by ``qemu-img`` from a local file (see agent/commands/deploy.py).
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import lzma
import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from agent import http
from agent.errors import AgentError, InvalidParameters, NotFound, SourceFailed, ToolFailed
from agent.proc import describe_exit
from agent.proto import agent_pb2

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


def check_digest(algorithm: str, hexdigest: str) -> tuple[str, str]:
    algo = algorithm.strip().lower()
    hx = hexdigest.strip().lower()
    if algo not in DIGESTS:
        raise InvalidParameters(f"digest algorithm must be sha256 or sha512, not {algorithm!r}")
    if len(hx) != DIGESTS[algo] or any(c not in "0123456789abcdef" for c in hx):
        raise InvalidParameters(f"digest is not {DIGESTS[algo]} hexadecimal characters of {algo}")
    return algo, hx


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

    def read(self, size: int) -> bytes:
        if self._pushback:
            data, self._pushback = self._pushback, b""
        else:
            data = self._fetch(size)
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
    def __init__(self, path: Path, algorithm: str) -> None:
        super().__init__(algorithm)
        try:
            self._f = open(path, "rb", buffering=0)  # noqa: SIM115  (closed by close())
        except FileNotFoundError as exc:
            raise NotFound(f"image {path} does not exist") from exc
        except OSError as exc:
            raise SourceFailed(f"image {path}: {exc.strerror}") from exc
        self.total = os.fstat(self._f.fileno()).st_size

    def _read(self, size: int) -> bytes:
        return self._f.read(size) or b""

    def _readinto(self, view: memoryview) -> int:
        return self._f.readinto(view) or 0

    def close(self) -> None:
        self._f.close()


class HttpSource(Source):
    def __init__(self, url: str, opts: http.HttpOptions, algorithm: str) -> None:
        super().__init__(algorithm)
        self._body = http.get(url, opts)
        self.total = self._body.total

    @property
    def resumes(self) -> int:
        return self._body.resumes

    def _read(self, size: int) -> bytes:
        return self._body.read(size)

    def close(self) -> None:
        self._body.close()


# ---------------------------------------------------------------------------- decompression


class Decompressor(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]:
        """Raw output for this input, in pieces of at most max_out bytes."""
        ...

    def finish(self) -> Iterator[bytes]:
        """The rest; SourceFailed when the stream is incomplete or corrupt."""
        ...


class _StdlibDecompressor:
    """gzip / xz / bzip2 through zlib, lzma, bz2; multi-member streams supported."""

    def __init__(self, fmt: int, max_out: int) -> None:
        self.fmt, self.max_out = fmt, max_out
        self.name = format_name(fmt)
        self._d = self._new()
        self._full = False

    def _new(self) -> object:
        if self.fmt == Fmt.GZIP:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self.fmt == Fmt.XZ:
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        return bz2.BZ2Decompressor()

    def _eof(self) -> bool:
        return bool(self._d.eof)  # type: ignore[attr-defined]

    def _step(self, data: bytes) -> bytes:
        d = self._d
        try:
            if self.fmt == Fmt.GZIP:
                out: bytes = d.decompress(data, self.max_out)  # type: ignore[attr-defined]
            else:
                out = d.decompress(data, max_length=self.max_out)  # type: ignore[attr-defined]
            self._full = len(out) >= self.max_out
            return out
        except (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError) as exc:
            raise SourceFailed(f"corrupt {self.name} stream: {exc}") from exc

    def _pending(self) -> bytes:
        """Input the decompressor holds but has not consumed yet (gzip keeps it outside)."""
        if self.fmt == Fmt.GZIP:
            return self._d.unconsumed_tail  # type: ignore[attr-defined,no-any-return]
        return b""

    def _more(self) -> bool:
        if self.fmt == Fmt.GZIP:
            return not self._d.eof and bool(self._d.unconsumed_tail or self._full)  # type: ignore[attr-defined]
        return not self._d.needs_input and not self._d.eof  # type: ignore[attr-defined]

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._eof():
                rest = self._d.unused_data + data  # type: ignore[attr-defined]
                if not rest.strip(b"\0"):
                    return  # zero padding after the last member
                self._d = self._new()
                data = rest
            out = self._step(data)
            data = b""
            if out:
                yield out
            while self._more():
                out = self._step(self._pending())
                if out:
                    yield out
            if self._eof() and self._d.unused_data:  # type: ignore[attr-defined]
                data = self._d.unused_data  # type: ignore[attr-defined]
                if not data.strip(b"\0"):
                    return
                self._d = self._new()

    def finish(self) -> Iterator[bytes]:
        if not self._eof():
            raise SourceFailed(f"{self.name} stream ended early (truncated image)")
        return iter(())


class _ZstdDecompressor:
    """``zstd -dc`` as a child process: a feeder thread writes, ``feed`` reads what is ready."""

    def __init__(self, spawn: Callable[..., object], max_out: int) -> None:
        import subprocess

        self.max_out = max_out
        self._proc = spawn(["zstd", "-dc", "-q", "--no-progress"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._in: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._feeder_error: BaseException | None = None
        self._out: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        threading.Thread(target=self._feed_loop, name="zstd-feed", daemon=True).start()
        threading.Thread(target=self._read_loop, name="zstd-read", daemon=True).start()

    def _feed_loop(self) -> None:
        stdin = self._proc.stdin  # type: ignore[attr-defined]
        try:
            while (chunk := self._in.get()) is not None:
                stdin.write(chunk)
        except BaseException as exc:  # broken pipe when zstd died: reported by finish()
            self._feeder_error = exc
            while self._in.get() is not None:
                pass
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def _read_loop(self) -> None:
        fd = self._proc.stdout.fileno()  # type: ignore[attr-defined]
        while data := os.read(fd, self.max_out):
            self._out.put(data)
        self._out.put(None)

    def _drain(self, block: bool) -> Iterator[bytes]:
        while True:
            try:
                data = self._out.get(block=block, timeout=None)
            except queue.Empty:
                return
            if data is None:
                self._out.put(None)
                return
            yield data

    def _put(self, item: bytes | None) -> Iterator[bytes]:
        while True:
            if self._feeder_error is not None:
                yield from self.finish(fed=True)  # zstd stopped reading: it failed
                raise SourceFailed("zstd stopped reading its input")
            try:
                self._in.put(item, timeout=0.01)
                return
            except queue.Full:
                yield from self._drain(block=False)

    def feed(self, data: bytes) -> Iterator[bytes]:
        yield from self._put(data)
        yield from self._drain(block=False)

    def finish(self, fed: bool = False) -> Iterator[bytes]:
        if not fed:
            yield from self._put(None)
        else:
            self._in.put(None)  # the feeder is draining _in: this cannot block for long
        yield from self._drain(block=True)
        proc = self._proc
        rc = proc.wait()  # type: ignore[attr-defined]
        err = proc.stderr.read().decode("utf-8", "replace").strip()  # type: ignore[attr-defined]
        if rc != 0:
            raise SourceFailed(f"corrupt or truncated zstd stream (zstd {describe_exit(rc)}: {err[-200:]})")

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:  # type: ignore[attr-defined]
            from agent.proc import kill_group

            kill_group(proc)  # type: ignore[arg-type]


def decompressor(fmt: int, spawn: Callable[..., object], max_out: int = 4 << 20) -> Decompressor:
    if fmt in (Fmt.GZIP, Fmt.XZ, Fmt.BZIP2):
        return _StdlibDecompressor(fmt, max_out)
    if fmt == Fmt.ZSTD:
        return _ZstdDecompressor(spawn, max_out)
    raise AgentError(f"no stream decompressor for {format_name(fmt)}")


def qcow2_info(run: Callable[..., object], path: Path) -> int:
    """Virtual size of a qcow2 file; refuses backing files and external data files."""
    import json

    done = run(["qemu-img", "info", "--output=json", "-f", "qcow2", str(path)])
    try:
        info = json.loads(done.stdout)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise ToolFailed(f"qemu-img info: unreadable output ({exc})") from exc
    if info.get("backing-filename") or info.get("full-backing-filename"):
        raise InvalidParameters("qcow2 image has a backing file: refused (it would read another file)")
    specific = (info.get("format-specific") or {}).get("data") or {}
    if specific.get("data-file"):
        raise InvalidParameters("qcow2 image has an external data file: refused")
    return int(info["virtual-size"])
