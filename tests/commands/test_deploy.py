"""deploy.image end to end: real files and loop devices as disks, a real loopback HTTP server,
real compressors and qemu-img. Every bad input of the issue fails cleanly and loses nothing."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import proc
from agent.commands.base import Context
from agent.commands.deploy import DeployImage
from agent.errors import (
    AgentError,
    Cancelled,
    ChecksumMismatch,
    CommandTimeout,
    InvalidParameters,
    NotFound,
    ProtectedDevice,
    Reason,
    SourceFailed,
    ToolMissing,
    Unsupported,
)
from agent.hw import block
from agent.images import decompress, manifest
from agent.proto import agent_pb2, common_pb2, session_pb2
from tests.diskfixtures import MiB, gpt_image, loop_device, mounted, random_file
from tests.loopback_http import Fault, LoopbackServer

Fmt = agent_pb2.ImageFormat


def sparse_image(size: int = 12 * MiB) -> bytes:
    """Data in the first, third and last MiB, zeros elsewhere (and a 100-byte odd tail)."""
    img = bytearray(size + 100)
    for start in (0, 3 * MiB, size - MiB):
        img[start : start + MiB] = os.urandom(MiB)
    img[-100:] = os.urandom(100)
    return bytes(img)


def request(source: str | Path, published: bytes, *, name: str = "disk", algo: str = "sha256",
            **kw: object) -> agent_pb2.DeployImageRequest:
    req = agent_pb2.DeployImageRequest(
        digest=common_pb2.Digest(algorithm=algo, hex=hashlib.new(algo, published).hexdigest()),
        target=common_pb2.DiskHints(name=name),
        **kw,  # type: ignore[arg-type]
    )
    if isinstance(source, Path):
        req.local_path = str(source)
    else:
        req.url = source
    return req


class Target:
    """A 32 MiB file disk filled with random "old" data."""

    def __init__(self, tmp: Path, size: int = 32 * MiB) -> None:
        self.path = tmp / "disk"
        self.old = random_file(self.path, size)

    def disks(self) -> list[block.Disk]:
        return [block.file_disk(self.path)]

    def data(self) -> bytes:
        return self.path.read_bytes()

    def untouched(self) -> bool:
        return self.data() == self.old

    def ends_cleared(self) -> bool:
        data = self.data()
        return not data[: 4 * MiB].strip(b"\0") and not data[-MiB:].strip(b"\0")


def deploy(req: agent_pb2.DeployImageRequest, disks: Callable[[], list[block.Disk]],
           sink: Callable[[session_pb2.Progress], None] | None = None,
           ctx: Context | None = None) -> agent_pb2.DeployImageResult:
    handler = DeployImage(disks=disks)
    params = handler.parse(req)
    ctx = ctx or Context.local("deploy.image", progress_sink=sink)
    return handler.run(ctx, params)


def test_raw_local_with_zero_skip_and_readback(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    (tmp_path / "img").write_bytes(img)
    progress: list[session_pb2.Progress] = []
    r = deploy(request(tmp_path / "img", img, verify_readback=True), t.disks, progress.append)
    data = t.data()
    assert data[: len(img)] == img
    assert not data[len(img) :].strip(b"\0")  # the whole disk was discarded first
    assert r.format == Fmt.RAW and r.image_bytes == len(img) == r.source_bytes
    assert r.discarded and r.bytes_skipped >= 8 * MiB
    assert r.bytes_written + r.bytes_skipped == len(img)
    assert r.readback_verified and r.direct_io
    assert r.digest.hex == hashlib.sha256(img).hexdigest()
    assert progress and progress[-1].total == len(img) and progress[-1].subject == "disk"


@pytest.mark.parametrize(
    ("fmt", "compress"),
    [
        (Fmt.GZIP, lambda b: gzip.compress(b, 1)),
        (Fmt.XZ, lambda b: lzma.compress(b, preset=0)),
        (Fmt.BZIP2, lambda b: bz2.compress(b, 1)),
        (Fmt.ZSTD, None),
    ],
    ids=["gzip", "xz", "bzip2", "zstd"],
)
def test_compressed_over_http(tmp_path: Path, fmt: int, compress: Callable[[bytes], bytes] | None) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    if compress is None:
        if shutil.which("zstd") is None:
            pytest.skip("zstd not installed")
        (tmp_path / "img").write_bytes(img)
        proc.run(["zstd", "-q", "-1", str(tmp_path / "img"), "-o", str(tmp_path / "img.zst")])
        published = (tmp_path / "img.zst").read_bytes()
    else:
        published = compress(img)
    with LoopbackServer() as srv:
        req = request(srv.add("/img", published), published, algo="sha512", format=fmt,
                      verify_readback=True)
        r = deploy(req, t.disks)
    assert t.data()[: len(img)] == img
    assert r.format == fmt and r.image_bytes == len(img) and r.source_bytes == len(published)
    assert r.digest.algorithm == "sha512" and r.readback_verified


def test_multi_member_gzip(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    published = gzip.compress(img[: 5 * MiB]) + gzip.compress(img[5 * MiB :])
    (tmp_path / "img.gz").write_bytes(published)
    deploy(request(tmp_path / "img.gz", published), t.disks)
    assert t.data()[: len(img)] == img


def test_disable_zero_skip_writes_zeros(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    (tmp_path / "img").write_bytes(img)
    r = deploy(request(tmp_path / "img", img, disable_zero_skip=True), t.disks)
    assert r.bytes_skipped == 0 and r.bytes_written == len(img) and not r.discarded
    assert t.data()[: len(img)] == img
    assert t.data()[len(img) :] == t.old[len(img) :]


def test_partitions_reported(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = gpt_image(tmp_path / "gpt.img", 16 * MiB).read_bytes()
    (tmp_path / "img.xz").write_bytes(lzma.compress(img, preset=0))
    r = deploy(request(tmp_path / "img.xz", (tmp_path / "img.xz").read_bytes()), t.disks)
    parts = {p.number: p for p in r.partitions}
    assert parts[1].label == "efi" and parts[1].fs_type == "ext4" and parts[1].fs_label == "BOOTFS"
    assert parts[1].start_bytes == MiB and parts[1].size_bytes == 8 * MiB
    assert parts[2].fs_type == "swap" and parts[2].fs_label == "SWAPPY"
    assert parts[1].type_guid == "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"


def test_qcow2_local(tmp_path: Path) -> None:
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img not installed")
    t = Target(tmp_path)
    img = sparse_image(8 * MiB)[: 8 * MiB]
    (tmp_path / "img").write_bytes(img)
    proc.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(tmp_path / "img"),
              str(tmp_path / "img.qcow2")])
    published = (tmp_path / "img.qcow2").read_bytes()
    r = deploy(request(tmp_path / "img.qcow2", published, format=Fmt.QCOW2), t.disks)
    assert r.format == Fmt.QCOW2 and r.image_bytes == len(img)
    assert t.data()[: len(img)] == img


def test_qcow2_with_backing_file_refused(tmp_path: Path) -> None:
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img not installed")
    t = Target(tmp_path)
    (tmp_path / "base").write_bytes(bytes(MiB))
    proc.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(tmp_path / "base"), "-F", "raw",
              str(tmp_path / "top.qcow2")])
    published = (tmp_path / "top.qcow2").read_bytes()
    with pytest.raises(InvalidParameters, match="backing file"):
        deploy(request(tmp_path / "top.qcow2", published), t.disks)
    assert t.untouched()


def test_qcow2_over_http_with_a_manifest_unsupported(tmp_path: Path) -> None:
    """Without a manifest a qcow2 file streams over HTTP (tests/images/test_qcow2stream.py);
    chunk by chunk against a manifest it needs a local file."""
    with pytest.raises(Unsupported, match="local_path"):
        DeployImage().parse(request("http://127.0.0.1:1/x.qcow2", b"", format=Fmt.QCOW2,
                                    manifest_inline=b"m"))
    if shutil.which("qemu-img") is None:
        return
    t = Target(tmp_path)
    proc.run(["qemu-img", "create", "-q", "-f", "qcow2", str(tmp_path / "x.qcow2"), "1M"])
    published = (tmp_path / "x.qcow2").read_bytes()
    (tmp_path / "raw").write_bytes(bytes(MiB))
    man = manifest.write(tmp_path / "raw")[0].read_bytes()
    with LoopbackServer() as srv, pytest.raises(Unsupported, match="local_path"):
        deploy(request(srv.add("/x", published), published, manifest_inline=man), t.disks)  # detected
    assert t.untouched()


# ------------------------------------------------------------------------- bad input


def test_wrong_checksum_clears_disk(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = os.urandom(6 * MiB)
    (tmp_path / "img").write_bytes(img)
    req = request(tmp_path / "img", b"something else")
    with pytest.raises(ChecksumMismatch):
        deploy(req, t.disks)
    assert t.ends_cleared()


def test_truncated_gzip_fails(tmp_path: Path) -> None:
    t = Target(tmp_path)
    published = gzip.compress(os.urandom(4 * MiB))[:-5000]
    (tmp_path / "img.gz").write_bytes(published)
    with pytest.raises(SourceFailed, match="ended early"):
        deploy(request(tmp_path / "img.gz", published), t.disks)
    assert t.ends_cleared()


@pytest.mark.parametrize("fmt", ["gzip", "xz", "bzip2", "zstd"])
def test_corrupt_stream_fails(tmp_path: Path, fmt: str) -> None:
    t = Target(tmp_path)
    raw = os.urandom(2 * MiB) + bytes(2 * MiB)
    if fmt == "zstd":
        if shutil.which("zstd") is None:
            pytest.skip("zstd not installed")
        published = proc.run(["zstd", "-q", "-c"], input=raw).stdout
    else:
        published = {"gzip": gzip.compress, "xz": lzma.compress, "bzip2": bz2.compress}[fmt](raw)
    bad = bytearray(published)
    for i in range(len(bad) // 2, len(bad) // 2 + 64):
        bad[i] ^= 0xFF
    (tmp_path / "img").write_bytes(bad)
    with pytest.raises(SourceFailed, match="corrupt"):
        deploy(request(tmp_path / "img", bytes(bad)), t.disks)  # the digest matches the bad bytes
    assert t.ends_cleared()


def test_zstd_missing_is_tool_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Target(tmp_path)
    published = b"\x28\xb5\x2f\xfd" + os.urandom(1000)
    (tmp_path / "img.zst").write_bytes(published)
    monkeypatch.setenv("PATH", str(tmp_path))  # no zstd there
    monkeypatch.setattr(decompress, "libzstd", lambda: None)  # nor libzstd (as in a ramdisk without it)
    with pytest.raises(ToolMissing, match="zstd"):
        deploy(request(tmp_path / "img.zst", published), t.disks)
    assert t.untouched()


@pytest.mark.parametrize("status", [404, 500])
def test_http_errors_lose_nothing(tmp_path: Path, status: int) -> None:
    t = Target(tmp_path)
    with LoopbackServer() as srv:
        url = srv.add("/img", b"x" * MiB, Fault(status=status))
        req = request(url, b"x" * MiB, max_retries=1)
        with pytest.raises(SourceFailed, match=f"HTTP {status}"):
            deploy(req, t.disks)
    assert t.untouched()


def test_connection_reset_resumes(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with LoopbackServer() as srv:
        url = srv.add("/img", img, Fault(reset_after=2 * MiB + 7, times=2))
        r = deploy(request(url, img), t.disks)
    assert r.resumes == 2 and t.data()[: len(img)] == img


def test_slow_server_completes(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = os.urandom(MiB)
    with LoopbackServer() as srv:
        r = deploy(request(srv.add("/img", img, Fault(delay=0.05)), img), t.disks)
    assert r.image_bytes == MiB and t.data()[:MiB] == img


def test_download_always_cut_short_fails(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = os.urandom(4 * MiB)
    with LoopbackServer() as srv:
        url = srv.add("/img", img, Fault(truncate_after=MiB + 3))
        with pytest.raises(SourceFailed, match="download failed"):
            deploy(request(url, img, max_retries=2), t.disks)
    assert t.ends_cleared()


def test_raw_image_larger_than_disk_refused_before_writing(tmp_path: Path) -> None:
    t = Target(tmp_path, 4 * MiB)
    img = os.urandom(5 * MiB)
    (tmp_path / "img").write_bytes(img)
    with pytest.raises(AgentError) as err:
        deploy(request(tmp_path / "img", img), t.disks)
    assert err.value.reason == Reason.TOO_LARGE and t.untouched()


def test_compressed_image_larger_than_disk_fails(tmp_path: Path) -> None:
    t = Target(tmp_path, 4 * MiB)
    published = gzip.compress(os.urandom(5 * MiB), 1)
    (tmp_path / "img.gz").write_bytes(published)
    with pytest.raises(AgentError) as err:
        deploy(request(tmp_path / "img.gz", published), t.disks)
    assert err.value.reason == Reason.TOO_LARGE and t.ends_cleared()


def test_declared_format_mismatch(tmp_path: Path) -> None:
    t = Target(tmp_path)
    published = gzip.compress(b"x" * 1000)
    (tmp_path / "img.gz").write_bytes(published)
    with pytest.raises(InvalidParameters, match="declared format xz but the image is gzip"):
        deploy(request(tmp_path / "img.gz", published, format=Fmt.XZ), t.disks)
    assert t.untouched()


def test_empty_image(tmp_path: Path) -> None:
    t = Target(tmp_path)
    (tmp_path / "img").write_bytes(b"")
    with pytest.raises(SourceFailed, match="empty"):
        deploy(request(tmp_path / "img", b""), t.disks)
    assert t.untouched()


def test_hints_matching_nothing_or_several(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    random_file(a, MiB)
    random_file(b, MiB)
    disks = lambda: [block.file_disk(a), block.file_disk(b)]  # noqa: E731
    req = request(tmp_path / "a", b"")
    req.target.CopyFrom(common_pb2.DiskHints(name="nope"))
    with pytest.raises(NotFound):
        deploy(req, disks)
    req.target.CopyFrom(common_pb2.DiskHints(model="file"))
    with pytest.raises(AgentError) as err:
        deploy(req, disks)
    assert err.value.reason == Reason.AMBIGUOUS and "a, b" in err.value.message


def test_cancel_clears_disk(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = os.urandom(8 * MiB)
    ctx = Context.local("deploy.image")

    def sink(p: session_pb2.Progress) -> None:
        if p.done > MiB:
            ctx.cancel_event.set()

    ctx.progress_sink = sink
    with LoopbackServer() as srv:
        url = srv.add("/img", img, Fault(delay=0.02))
        with pytest.raises(Cancelled):
            deploy(request(url, img), t.disks, ctx=ctx)
    assert t.ends_cleared()


def test_deadline_stops_and_clears_disk(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = os.urandom(8 * MiB)
    ctx = Context.local("deploy.image", timeout=1.5)
    with LoopbackServer() as srv:
        url = srv.add("/img", img, Fault(delay=0.05))
        with pytest.raises(CommandTimeout):
            deploy(request(url, img), t.disks, ctx=ctx)
    assert t.ends_cleared()


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda r: r.ClearField("digest"), "digest"),
        (lambda r: setattr(r.digest, "algorithm", "md5"), "sha256 or sha512"),
        (lambda r: setattr(r.digest, "hex", "zz" * 32), "hexadecimal"),
        (lambda r: r.ClearField("target"), "target"),
        (lambda r: r.target.CopyFrom(common_pb2.DiskHints()), "empty"),
        (lambda r: r.target.CopyFrom(common_pb2.DiskHints(name="../sda")), "kernel name"),
        (lambda r: setattr(r, "local_path", "relative/img"), "absolute"),
        (lambda r: setattr(r, "local_path", "/nonexistent/img"), "regular file"),
        (lambda r: setattr(r, "url", "ftp://127.0.0.1/img"), "scheme"),
        (lambda r: r.http_headers.__setitem__("Range", "bytes=5-"), "not allowed"),
        (lambda r: r.ClearField("local_path"), "source"),
    ],
)
def test_bad_parameters(tmp_path: Path, mutate: Callable[[agent_pb2.DeployImageRequest], None],
                        match: str) -> None:
    (tmp_path / "img").write_bytes(b"x")
    req = request(tmp_path / "img", b"x")
    mutate(req)
    with pytest.raises((InvalidParameters, Unsupported), match=match):
        DeployImage().parse(req)


# ------------------------------------------------------------------------- loop devices


@pytest.mark.root
def test_loop_device_deploy_rereads_partitions(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    random_file(backing, 32 * MiB)
    img = gpt_image(tmp_path / "gpt.img", 16 * MiB).read_bytes()
    published = gzip.compress(img, 1)
    with loop_device(backing, partscan=True) as disk, LoopbackServer() as srv:
        req = request(srv.add("/img", published), published, name=disk.name, verify_readback=True)
        r = deploy(req, lambda: [disk])
        assert r.direct_io and r.readback_verified and r.discarded
        assert [p.name for p in r.partitions] == [f"{disk.name}p1", f"{disk.name}p2"]
        if _kernel_reads_gpt():  # BLKRRPART made the kernel see them too
            assert Path(f"/sys/block/{disk.name}/{disk.name}p1").exists()
        with open(disk.path, "rb") as f:
            assert f.read(len(img)) == img


def _kernel_reads_gpt() -> bool:
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            return "CONFIG_EFI_PARTITION=y" in f.read()
    except OSError:
        return True


@pytest.mark.root
def test_mounted_loop_device_refused(tmp_path: Path) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 not installed")
    backing = tmp_path / "backing"
    with backing.open("wb") as f:
        f.truncate(32 * MiB)
    proc.run(["mkfs.ext4", "-q", "-F", str(backing)])
    (tmp_path / "img").write_bytes(b"y" * MiB)
    with loop_device(backing) as disk, mounted(disk.path, tmp_path / "mnt"):
        req = request(tmp_path / "img", b"y" * MiB, name=disk.name)
        with pytest.raises(ProtectedDevice, match="mounted"):
            deploy(req, lambda: [disk])
    head = backing.read_bytes()[:MiB]
    assert b"y" * 512 not in head and head[1024 + 0x38 : 1024 + 0x3A] == b"\x53\xef"  # ext4 intact


def test_root_disk_is_protected() -> None:
    st = os.stat("/")
    if os.major(st.st_dev) == 0:
        pytest.skip("root is not on a block device here")
    root = next((d for d in block.list_disks() if _holds_root(d)), None)
    if root is None:
        pytest.skip("no disk under the root filesystem found")
    with pytest.raises(ProtectedDevice, match="root filesystem"):
        block.check_safe(root)


def _holds_root(disk: block.Disk) -> bool:
    st = os.stat("/")
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysdir = Path("/sys/block") / disk.name
    devs = [(sysdir / "dev").read_text().strip()]
    devs += [(p / "dev").read_text().strip() for p in sysdir.iterdir() if (p / "partition").exists()]
    return dev in devs


def test_concurrent_commands_on_one_disk_serialize(tmp_path: Path) -> None:
    """Two deploys to the same disk take the disk lock one after the other."""
    t = Target(tmp_path)
    img = os.urandom(2 * MiB)
    (tmp_path / "img").write_bytes(img)
    first = Context.local("deploy.image")
    second = Context.local("deploy.image")
    second.locks = first.locks
    errors: list[BaseException] = []

    def go(ctx: Context) -> None:
        try:
            deploy(request(tmp_path / "img", img), t.disks, ctx=ctx)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(c,)) for c in (first, second)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors and t.data()[: len(img)] == img
