"""A qcow2 file deployed from a stream (agent/images/qcow2stream.py): files made by the real
qemu-img, served over a real loopback HTTP server, deployed into a file disk and compared with
the raw image they were made from."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from agent import proc
from agent.errors import ChecksumMismatch, InvalidParameters, SourceFailed, Unsupported
from agent.images import qcow2stream
from agent.proto import agent_pb2
from tests.commands.test_deploy import Target, deploy, request
from tests.diskfixtures import MiB
from tests.loopback_http import Fault, LoopbackServer

Fmt = agent_pb2.ImageFormat

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")


def mixed_image(size: int = 12 * MiB) -> bytes:
    """Random data (stored as it is, even by -c), text (compressible: -c compresses it), zeros."""
    img = bytearray(size)
    img[0:MiB] = os.urandom(MiB)
    img[3 * MiB: 5 * MiB] = (b"the quick brown fox " * (2 * MiB // 20 + 1))[: 2 * MiB]
    img[8 * MiB + 4096: 9 * MiB] = os.urandom(MiB - 4096)
    img[size - 65536:] = os.urandom(65536)
    return bytes(img)


def qcow2_of(tmp: Path, img: bytes, *opts: str, name: str = "img") -> bytes:
    raw, out = tmp / f"{name}.raw", tmp / f"{name}.qcow2"
    raw.write_bytes(img)
    proc.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", *opts, str(raw), str(out)])
    return out.read_bytes()


def l2_moved_to_the_end(published: bytes) -> bytes:
    """The file with its first L2 table copied to its end and the L1 entry pointing there: the
    table now comes after the data it maps."""
    cluster = 1 << struct.unpack(">I", published[20:24])[0]
    l1_offset = struct.unpack(">Q", published[40:48])[0]
    entry = struct.unpack(">Q", published[l1_offset: l1_offset + 8])[0]
    l2 = entry & 0x00FFFFFFFFFFFE00
    data = bytearray(published)
    data += bytes(-len(data) % cluster)
    moved = len(data)
    data += published[l2: l2 + cluster]
    data[l2: l2 + cluster] = bytes(cluster)
    data[l1_offset: l1_offset + 8] = struct.pack(">Q", (entry & ~0x00FFFFFFFFFFFE00) | moved)
    return bytes(data)


@pytest.mark.parametrize("opts", [
    (),
    ("-c",),
    ("-o", "cluster_size=4096"),             # many L2 tables, each before its data
    ("-c", "-o", "cluster_size=4096,compat=0.10"),   # version 2
], ids=["plain", "compressed", "small-clusters", "v2-compressed"])
@pytest.mark.parametrize("zero_skip", [True, False], ids=["discarded", "zeros-written"])
def test_qcow2_over_http_equals_the_raw_image(tmp_path: Path, opts: tuple[str, ...], zero_skip: bool) -> None:
    """Without zero skipping the disk's old bytes are overwritten with zeros where the image has
    no cluster (the Target holds random old data: a gap left would show)."""
    t = Target(tmp_path)
    img = mixed_image()
    published = qcow2_of(tmp_path, img, *opts)
    with LoopbackServer() as srv:
        r = deploy(request(srv.add("/img.qcow2", published), published,
                           disable_zero_skip=not zero_skip), t.disks)
    assert t.data()[: len(img)] == img
    assert r.format == Fmt.QCOW2 and r.verification == "digest" and r.image_bytes == len(img)
    assert r.source_bytes == len(published)
    if zero_skip:
        assert r.discarded and r.bytes_written < len(img) // 2   # unallocated clusters never written
    else:
        assert r.bytes_written == len(img)


def test_compressed_clusters_are_inflated(tmp_path: Path) -> None:
    img = mixed_image()
    plain, packed = qcow2_of(tmp_path, img, name="a"), qcow2_of(tmp_path, img, "-c", name="b")
    assert len(packed) < len(plain) - MiB                 # -c did compress the text
    with LoopbackServer() as srv:
        t = Target(tmp_path)
        deploy(request(srv.add("/b", packed), packed), t.disks)
    assert t.data()[: len(img)] == img


def test_a_dropped_download_resumes(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = mixed_image()
    published = qcow2_of(tmp_path, img)
    with LoopbackServer() as srv:
        url = srv.add("/img.qcow2", published, Fault(reset_after=len(published) // 2, times=1))
        r = deploy(request(url, published), t.disks)
    assert t.data()[: len(img)] == img and r.resumes == 1


def test_a_tampered_blob_fails_its_digest_with_the_ends_cleared(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = mixed_image()
    published = qcow2_of(tmp_path, img)
    bad = bytearray(published)
    bad[len(bad) // 2] ^= 1                              # inside a data cluster: parses fine
    with LoopbackServer() as srv, pytest.raises(ChecksumMismatch):
        deploy(request(srv.add("/img.qcow2", bytes(bad)), published), t.disks)
    assert t.ends_cleared()


def test_metadata_after_its_data_buffered_within_the_window(tmp_path: Path) -> None:
    """A small file whose L2 table comes last: its data is still in the read window."""
    t = Target(tmp_path)
    img = mixed_image()
    published = l2_moved_to_the_end(qcow2_of(tmp_path, img))
    assert len(published) < qcow2stream.WINDOW
    with LoopbackServer() as srv:
        deploy(request(srv.add("/img.qcow2", published), published), t.disks)
    assert t.data()[: len(img)] == img


def test_metadata_after_its_data_beyond_the_window_refused(tmp_path: Path) -> None:
    t = Target(tmp_path, size=40 * MiB)
    img = os.urandom(24 * MiB)
    published = l2_moved_to_the_end(qcow2_of(tmp_path, img))
    with LoopbackServer() as srv, pytest.raises(InvalidParameters, match="metadata after its data"):
        deploy(request(srv.add("/img.qcow2", published), published), t.disks)
    assert t.ends_cleared()


def test_truncated_file(tmp_path: Path) -> None:
    t = Target(tmp_path)
    published = qcow2_of(tmp_path, mixed_image())
    cut = published[: len(published) - 70000]
    with LoopbackServer() as srv, pytest.raises(SourceFailed, match="truncated"):
        deploy(request(srv.add("/img.qcow2", cut), cut), t.disks)
    assert t.ends_cleared()


def test_larger_than_the_disk_refused_untouched(tmp_path: Path) -> None:
    t = Target(tmp_path, size=8 * MiB)
    published = qcow2_of(tmp_path, mixed_image())
    with LoopbackServer() as srv, pytest.raises(Exception, match="larger than disk"):
        deploy(request(srv.add("/img.qcow2", published), published), t.disks)
    assert t.untouched()


def test_backing_file_refused_untouched(tmp_path: Path) -> None:
    t = Target(tmp_path)
    (tmp_path / "base").write_bytes(bytes(MiB))
    proc.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(tmp_path / "base"), "-F", "raw",
              str(tmp_path / "top.qcow2")])
    published = (tmp_path / "top.qcow2").read_bytes()
    with LoopbackServer() as srv, pytest.raises(InvalidParameters, match="backing file"):
        deploy(request(srv.add("/top.qcow2", published), published), t.disks)
    assert t.untouched()


def test_zstd_clusters_refused(tmp_path: Path) -> None:
    t = Target(tmp_path)
    try:
        published = qcow2_of(tmp_path, mixed_image(), "-c", "-o", "compression_type=zstd")
    except Exception:
        pytest.skip("this qemu-img has no zstd compression")
    with LoopbackServer() as srv, pytest.raises(Unsupported, match="zstd"):
        deploy(request(srv.add("/img.qcow2", published), published), t.disks)
    assert t.untouched()                                  # refused by the header


def test_a_manifest_with_qcow2_over_http_is_refused() -> None:
    from agent.commands.deploy import DeployImage

    req = request("http://127.0.0.1:1/x.qcow2", b"", format=Fmt.QCOW2, manifest_inline=b"x")
    with pytest.raises(Unsupported, match="local file"):
        DeployImage().parse(req)
