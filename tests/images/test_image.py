"""agent.images.image: format detection, digests, and the streaming decompressors."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
from pathlib import Path

import pytest

from agent import proc
from agent.errors import AgentError, InvalidParameters, NotFound, SourceFailed
from agent.images import decompress, image
from agent.proto import agent_pb2

Fmt = agent_pb2.ImageFormat
RAW = os.urandom(300_000) + bytes(5_000_000) + os.urandom(1000)


def inflate(fmt: int, published: bytes, step: int = 65536, max_out: int = 1 << 20) -> bytes:
    dec = decompress.decompressor(fmt, max_out=max_out)
    out = []
    for i in range(0, len(published), step):
        for piece in dec.feed(published[i : i + step]):
            assert len(piece) <= max_out
            out.append(piece)
    out.extend(dec.finish())
    return b"".join(out)


def test_detect() -> None:
    assert image.detect(gzip.compress(b"x")) == Fmt.GZIP
    assert image.detect(lzma.compress(b"x")) == Fmt.XZ
    assert image.detect(bz2.compress(b"x")) == Fmt.BZIP2
    assert image.detect(b"\x28\xb5\x2f\xfd\x00") == Fmt.ZSTD
    assert image.detect(b"QFI\xfb\x00\x00\x00\x03") == Fmt.QCOW2
    assert image.detect(b"BZh is not enough") == Fmt.RAW
    assert image.detect(bytes(512)) == Fmt.RAW


def test_check_digest() -> None:
    assert image.Digest.parse(" SHA256 ", "AB" * 32) == image.Digest("sha256", "ab" * 32)
    for algo, hx in (("md5", "ab" * 16), ("sha256", "ab" * 31), ("sha512", "g" * 128)):
        with pytest.raises(InvalidParameters):
            image.Digest.parse(algo, hx)


@pytest.mark.parametrize(
    ("fmt", "compress"),
    [(Fmt.GZIP, gzip.compress), (Fmt.XZ, lzma.compress), (Fmt.BZIP2, bz2.compress)],
    ids=["gzip", "xz", "bzip2"],
)
def test_stdlib_round_trip_bounded(fmt: int, compress: object) -> None:
    published = compress(RAW)  # type: ignore[operator]
    assert inflate(fmt, published, step=7777, max_out=100_000) == RAW
    two = compress(RAW[:1000]) + compress(RAW[1000:])  # type: ignore[operator]
    assert inflate(fmt, two) == RAW
    assert inflate(fmt, published + bytes(4096)) == RAW  # zero padding after the end
    with pytest.raises(SourceFailed, match="ended early"):
        inflate(fmt, published[:-20])
    with pytest.raises(SourceFailed):
        inflate(fmt, published + b"garbage")


def read_stream(tmp_path: Path, published: bytes, fmt: int, piece: int = 100_000) -> bytes:
    p = tmp_path / "published"
    p.write_bytes(published)
    src = image.FileSource(p, "sha256")
    stream = image.RawStream(src, fmt)
    out = bytearray()
    buf = memoryview(bytearray(piece))
    try:
        while n := stream.readinto(buf):
            out += buf[:n]
    finally:
        stream.close()
        src.close()
    assert src.hasher.hexdigest() == hashlib.sha256(published).hexdigest()  # the published bytes, all
    return bytes(out)


@pytest.mark.parametrize("how", ["libzstd", "zstd child"])
def test_zstd_stream(tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("zstd not installed")
    if how == "libzstd" and decompress.libzstd() is None:
        pytest.skip("no libzstd.so.1 here")
    if how == "zstd child":
        monkeypatch.setattr(decompress, "libzstd", lambda: None)
    published = proc.run(["zstd", "-q", "-c"], input=RAW).stdout
    assert read_stream(tmp_path, published, Fmt.ZSTD) == RAW
    with pytest.raises(SourceFailed, match="zstd"):
        read_stream(tmp_path, published[: len(published) // 2], Fmt.ZSTD)
    two = published + proc.run(["zstd", "-q", "-c"], input=RAW[:1000]).stdout  # two frames
    assert read_stream(tmp_path, two, Fmt.ZSTD, piece=4096) == RAW + RAW[:1000]
    with pytest.raises(SourceFailed, match="zstd"):
        read_stream(tmp_path, published + b"garbage!", Fmt.ZSTD)


@pytest.mark.parametrize("fmt", [Fmt.RAW, Fmt.GZIP, Fmt.XZ, Fmt.BZIP2])
def test_raw_stream_stdlib(tmp_path: Path, fmt: int) -> None:
    compress = {Fmt.RAW: bytes, Fmt.GZIP: gzip.compress, Fmt.XZ: lzma.compress, Fmt.BZIP2: bz2.compress}[fmt]
    assert read_stream(tmp_path, compress(RAW), fmt, piece=77_777) == RAW
    if fmt != Fmt.RAW:
        with pytest.raises(SourceFailed):
            read_stream(tmp_path, compress(RAW)[:-20], fmt)


def test_sources(tmp_path: Path) -> None:
    p = tmp_path / "img"
    p.write_bytes(b"0123456789")
    src = image.FileSource(p, "sha256")
    assert src.peek(4) == b"0123" and src.read(100) == b"0123" and src.read(100) == b"456789"
    assert src.read(10) == b"" and src.count == 10
    assert src.hasher.hexdigest() == __import__("hashlib").sha256(b"0123456789").hexdigest()
    with pytest.raises(NotFound):
        image.FileSource(tmp_path / "missing", "sha256")
    with pytest.raises(InvalidParameters, match="snapshot source /dev/null is neither a block device"):
        image.FileSource(Path("/dev/null"), "sha256", what="snapshot source")


def test_hash_to_end_on_its_own_thread(tmp_path: Path) -> None:
    """The published file's digest, read to its end beside other work; stopped early, it
    says so rather than give the digest of a part."""
    p = tmp_path / "img"
    data = os.urandom(3 << 20)
    p.write_bytes(data)
    src = image.FileSource(p, "sha512")
    assert src.peek(4) == data[:4]
    assert image.HashToEnd(src, piece=1 << 20).hexdigest() == hashlib.sha512(data).hexdigest()
    stopped = image.HashToEnd(image.FileSource(p, "sha256"), piece=1 << 20)
    stopped.close()
    with pytest.raises(AgentError, match="not finished"):
        stopped.hexdigest()
