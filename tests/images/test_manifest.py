"""agent.images.manifest: building, the format's refusals, bmaptool's .bmap, and `agent manifest`."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import proc
from agent.errors import InvalidParameters
from agent.images import manifest
from agent.proto import agent_pb2

MiB = 1 << 20
CHUNK = 64 << 10


def sparse(path: Path, size: int = 2 * MiB + 100) -> bytes:
    """Data in chunks 0, 3 and the odd-sized last one; zeros elsewhere."""
    img = bytearray(size)
    for start in (0, 3 * CHUNK, size - 100):
        img[start : start + CHUNK] = os.urandom(len(img[start : start + CHUNK]))
    path.write_bytes(img)
    return bytes(img)


def digests(img: bytes, chunk: int = CHUNK) -> list[bytes]:
    return [hashlib.sha256(img[i : i + chunk]).digest() for i in range(0, len(img), chunk)]


def test_build_raw_and_compressed_agree(tmp_path: Path) -> None:
    img = sparse(tmp_path / "img")
    raw = manifest.build(tmp_path / "img", chunk_size=CHUNK)
    assert raw.image_size == len(img) and raw.chunk_count == len(digests(img))
    assert raw.digests == b"".join(digests(img))  # the last one over its real length (100 bytes)
    assert raw.published.hex == hashlib.sha256(img).hexdigest() and raw.published_format == agent_pb2.RAW
    (tmp_path / "img.gz").write_bytes(gzip.compress(img, 1))
    gz = manifest.build(tmp_path / "img.gz", chunk_size=CHUNK)
    assert gz.digests == raw.digests and gz.published_format == agent_pb2.GZIP
    assert gz.published_size == (tmp_path / "img.gz").stat().st_size
    plan = manifest.from_proto(raw)
    data = [s.index for s in plan.segments if s.digest is not None]
    assert data == [0, 3, len(plan.segments) - 1]  # zero chunks known by their digest alone
    assert plan.segments[-1].length == len(img) % CHUNK


def test_build_zstd(tmp_path: Path) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("zstd not installed")
    img = sparse(tmp_path / "img")
    proc.run(["zstd", "-q", "-1", str(tmp_path / "img"), "-o", str(tmp_path / "img.zst")])
    m = manifest.build(tmp_path / "img.zst", chunk_size=CHUNK)
    assert m.digests == b"".join(digests(img)) and m.published_format == agent_pb2.ZSTD


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: setattr(m, "version", 2), "version 2"),
        (lambda m: setattr(m, "algorithm", "md5"), "unknown hash algorithm"),
        (lambda m: setattr(m, "chunk_size", 3 * CHUNK), "power of two"),
        (lambda m: setattr(m, "chunk_size", 4096), "power of two"),
        (lambda m: setattr(m, "chunk_count", m.chunk_count + 1), "chunks, but"),
        (lambda m: setattr(m, "image_size", m.image_size + CHUNK), "chunks, but"),
        (lambda m: setattr(m, "digests", m.digests[:-1]), "bytes of digests"),
    ],
    ids=["version", "algorithm", "not-power-of-two", "too-small", "count", "size", "digests"],
)
def test_refusals(tmp_path: Path, change: object, message: str) -> None:
    sparse(tmp_path / "img")
    m = manifest.build(tmp_path / "img", chunk_size=CHUNK)
    change(m)  # type: ignore[operator]
    with pytest.raises(InvalidParameters, match=message):
        manifest.parse(m.SerializeToString())


def test_garbage_refused() -> None:
    with pytest.raises(InvalidParameters):
        manifest.parse(b"\xff\xff\xff not a manifest")
    with pytest.raises(InvalidParameters, match=r"not a \.bmap"):
        manifest.parse(b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><bmap version="2.0"/>')


def bmap_of(path: Path) -> bytes:
    if shutil.which("bmaptool") is None:
        pytest.skip("bmaptool (Debian bmap-tools) not installed")
    return subprocess.run(["bmaptool", "create", str(path)], check=True, capture_output=True).stdout


def test_bmap_from_bmaptool(tmp_path: Path) -> None:
    path = tmp_path / "img"
    with open(path, "wb") as f:  # a sparse file: bmaptool maps only the allocated blocks
        f.truncate(3 * MiB + 4096 * 3)
        f.seek(MiB)
        f.write(os.urandom(100_000))
        f.seek(3 * MiB)
        f.write(os.urandom(4096 * 2 + 10))
    img = path.read_bytes()
    plan = manifest.parse(bmap_of(path))
    assert plan.kind == "bmap" and plan.image_size == len(img)
    assert sum(s.length for s in plan.segments) == len(img)
    for seg in plan.segments:
        chunk = img[seg.offset : seg.end]
        if seg.digest is None:
            assert not chunk.strip(b"\0")
        else:
            assert hashlib.sha256(chunk).digest() == seg.digest
    damaged = bmap_of(path).replace(b"<ImageSize> ", b"<ImageSize> 1")
    with pytest.raises(InvalidParameters):
        manifest.parse(damaged)


def test_agent_manifest_command(tmp_path: Path) -> None:
    img = sparse(tmp_path / "img")
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "agent", "manifest", str(tmp_path / "img"), "--chunk-size", "64K"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=root)
    data = (tmp_path / "img.manifest").read_bytes()
    assert out.stdout.split()[0] == f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert manifest.parse(data).image_size == len(img)
    bad = subprocess.run([sys.executable, "-m", "agent", "manifest", str(tmp_path / "nope")],
                         capture_output=True, text=True, cwd=root)
    assert bad.returncode == 1 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_gateway_deploy_payload(tmp_path: Path) -> None:
    """The reference gateway's payload: the image's digest and its manifest, named and signed."""
    from google.protobuf import json_format

    from agent.gateway.images import deploy_payload

    img = sparse(tmp_path / "img")
    payload = deploy_payload(tmp_path / "img", "http://h/img", target={"serial": "S1"})
    data = (tmp_path / "img.manifest").read_bytes()
    assert payload["manifest"] == {"url": "http://h/img.manifest",
                                   "digest": {"algorithm": "sha256", "hex": hashlib.sha256(data).hexdigest()}}
    assert payload["digest"]["hex"] == hashlib.sha256(img).hexdigest()
    req = json_format.ParseDict(payload, agent_pb2.DeployImageRequest())
    assert req.manifest.url == "http://h/img.manifest" and req.target.serial == "S1"


def test_build_qcow2(tmp_path: Path) -> None:
    """A qcow2 file's manifest is its guest (raw) bytes' one; the published digest is the file's."""
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img not installed")
    img = sparse(tmp_path / "img", size=2 * MiB)
    proc.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-c", str(tmp_path / "img"),
              str(tmp_path / "q")])
    m = manifest.build(tmp_path / "q", chunk_size=CHUNK)
    assert m.digests == b"".join(digests(img)) and m.published_format == agent_pb2.QCOW2
    assert m.published.hex == hashlib.sha256((tmp_path / "q").read_bytes()).hexdigest()
