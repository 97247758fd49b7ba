"""Decompressors for image streams: gzip, xz and bzip2 through the standard library, zstd
through libzstd (ctypes, the GIL let go for each call). agent/images/image.py's RawStream drives them
(and runs the ``zstd`` binary where there is no libzstd).

    dec = decompressor(Fmt.GZIP, max_out=4 << 20)   # feed(data) / finish(): raw pieces, bounded
    lib = libzstd()                                 # None where libzstd.so.1 is not installed
    z = ZstdStream(lib); z.feed(data); n = z.decompress(view)
"""

from __future__ import annotations

import bz2
import ctypes
import functools
import lzma
import zlib
from collections.abc import Iterator
from typing import Protocol

from agent.errors import AgentError, SourceFailed
from agent.proto import agent_pb2

Fmt = agent_pb2.ImageFormat


def _name(fmt: int) -> str:
    return Fmt.Name(fmt).lower()


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
        self.name = _name(fmt)
        self._d = self._new()
        self._full = False

    def _new(self) -> zlib._Decompress | lzma.LZMADecompressor | bz2.BZ2Decompressor:
        if self.fmt == Fmt.GZIP:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self.fmt == Fmt.XZ:
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        return bz2.BZ2Decompressor()

    def _eof(self) -> bool:
        return bool(self._d.eof)

    def _step(self, data: bytes) -> bytes:
        d = self._d
        try:
            if isinstance(d, (lzma.LZMADecompressor, bz2.BZ2Decompressor)):
                out = d.decompress(data, max_length=self.max_out)
            else:
                out = d.decompress(data, self.max_out)
            self._full = len(out) >= self.max_out
            return out
        except (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError) as exc:
            raise SourceFailed(f"corrupt {self.name} stream: {exc}") from exc

    def _pending(self) -> bytes:
        """Input the decompressor holds but has not consumed yet (gzip keeps it outside)."""
        d = self._d
        if isinstance(d, (lzma.LZMADecompressor, bz2.BZ2Decompressor)):
            return b""
        return d.unconsumed_tail

    def _more(self) -> bool:
        d = self._d
        if isinstance(d, (lzma.LZMADecompressor, bz2.BZ2Decompressor)):
            return not d.needs_input and not d.eof
        return not d.eof and bool(d.unconsumed_tail or self._full)

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._eof():
                rest = self._d.unused_data + data
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
            if self._eof() and self._d.unused_data:
                data = self._d.unused_data
                if not data.strip(b"\0"):
                    return
                self._d = self._new()

    def finish(self) -> Iterator[bytes]:
        if not self._eof():
            raise SourceFailed(f"{self.name} stream ended early (truncated image)")
        return iter(())


def decompressor(fmt: int, max_out: int = 4 << 20) -> Decompressor:
    """gzip, xz or bzip2 in this process (zstd runs as a child: see RawStream)."""
    if fmt in (Fmt.GZIP, Fmt.XZ, Fmt.BZIP2):
        return _StdlibDecompressor(fmt, max_out)
    raise AgentError(f"no in-process decompressor for {_name(fmt)}")



class _InBuffer(ctypes.Structure):
    _fields_ = (("src", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t))


class _OutBuffer(ctypes.Structure):
    _fields_ = (("dst", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t))


@functools.cache
def libzstd() -> ctypes.CDLL | None:
    """libzstd.so.1 through ctypes, or None where it is not installed (then: the zstd binary)."""
    try:
        lib = ctypes.CDLL("libzstd.so.1")
    except OSError:
        return None
    lib.ZSTD_createDStream.restype = ctypes.c_void_p
    lib.ZSTD_freeDStream.argtypes = [ctypes.c_void_p]
    lib.ZSTD_initDStream.argtypes = [ctypes.c_void_p]
    lib.ZSTD_initDStream.restype = ctypes.c_size_t
    lib.ZSTD_decompressStream.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(_OutBuffer), ctypes.POINTER(_InBuffer),
    ]
    lib.ZSTD_decompressStream.restype = ctypes.c_size_t
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
    lib.ZSTD_getErrorName.restype = ctypes.c_char_p
    return lib


class ZstdStream:
    """One ZSTD_DStream: compressed pieces in (``feed``), raw bytes out straight into the
    caller's buffer (``decompress``); ctypes lets the GIL go for each call. Frames follow each
    other (the stream starts the next one by itself); ``frame_done`` says the last one ended."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.ds = lib.ZSTD_createDStream()
        if not self.ds:
            raise AgentError("libzstd: cannot create a decompression stream")
        lib.ZSTD_initDStream(self.ds)
        self._in = _InBuffer()
        self._data = b""
        self.frame_done = False

    def feed(self, data: bytes) -> None:
        self._data = data  # kept alive while zstd reads it
        self._in.src = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p)
        self._in.size, self._in.pos = len(data), 0

    def has_input(self) -> bool:
        return bool(self._in.pos < self._in.size)

    def decompress(self, view: memoryview) -> int:
        target = (ctypes.c_char * len(view)).from_buffer(view)
        try:
            out = _OutBuffer(ctypes.addressof(target), len(view), 0)
            ret = self.lib.ZSTD_decompressStream(self.ds, ctypes.byref(out), ctypes.byref(self._in))
            if self.lib.ZSTD_isError(ret):
                name = self.lib.ZSTD_getErrorName(ret).decode("ascii", "replace")
                raise SourceFailed(f"corrupt zstd stream: {name}")
            self.frame_done = ret == 0
            return int(out.pos)
        finally:
            del target

    def free(self) -> None:
        if self.ds:
            self.lib.ZSTD_freeDStream(self.ds)
            self.ds = None
