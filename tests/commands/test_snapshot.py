"""instance.snapshot against a loopback HTTP server: compressed stream, digests, quiesce, refusals."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from agent import proc
from agent.commands.base import Context
from agent.commands.bulk import transfer
from agent.commands.bulk.snapshot import FROZEN_DIR, InstanceSnapshot, freeze, is_frozen, thaw_leftovers
from agent.config import Config
from agent.errors import InvalidParameters, NotFound, ProtectedDevice, SourceFailed
from agent.proto import agent_pb2, session_pb2
from tests.loopback_http import Fault, LoopbackServer


@pytest.fixture
def images(tmp_path: Path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    return d


def config_for(images: Path, tmp_path: Path) -> Config:
    return Config(state_dir=tmp_path / "state", snapshot_allow=(images,))


def disk_image(path: Path, size: int = 5 << 20) -> bytes:
    """Compressible but not trivial content: zeros, text and random blocks."""
    data = bytearray(size)
    data[: 1 << 20] = os.urandom(1 << 20)
    data[2 << 20 : 3 << 20] = (b"instance data " * 80000)[: 1 << 20]
    path.write_bytes(bytes(data))
    return bytes(data)


def snapshot(
    config: Config,
    source: Path,
    url: str,
    compression: int = agent_pb2.GZIP_COMPRESSION,
    progress: list[session_pb2.Progress] | None = None,
    **extra: object,
) -> agent_pb2.InstanceSnapshotResult:
    handler = InstanceSnapshot()
    msg = agent_pb2.InstanceSnapshotRequest(
        source_path=str(source), upload_url=url, compression=compression, **extra  # type: ignore[arg-type]
    )
    params = handler.parse(msg)
    ctx = Context.local(
        "instance.snapshot", config, progress_sink=None if progress is None else progress.append
    )
    result = handler.run(ctx, params)
    assert isinstance(result, agent_pb2.InstanceSnapshotResult)
    return result


def decompress(data: bytes, compression: int) -> bytes:
    if compression == agent_pb2.GZIP_COMPRESSION:
        return gzip.decompress(data)
    if compression == agent_pb2.ZSTD_COMPRESSION:
        return proc.run(["zstd", "-d", "-c", "-q"], input=data, timeout=60).stdout
    return data


@pytest.mark.parametrize(
    "compression",
    [agent_pb2.GZIP_COMPRESSION, agent_pb2.ZSTD_COMPRESSION, agent_pb2.NO_COMPRESSION],
)
def test_snapshot_of_a_file_arrives_whole_with_matching_digests(
    images: Path, tmp_path: Path, compression: int
) -> None:
    if compression == agent_pb2.ZSTD_COMPRESSION and shutil.which("zstd") is None:
        pytest.skip("zstd not installed")
    source = images / "vm.raw"
    data = disk_image(source)
    progress: list[session_pb2.Progress] = []
    with LoopbackServer() as srv:
        result = snapshot(config_for(images, tmp_path), source, srv.url("/snap"), compression, progress)
        uploaded = srv.uploads["/snap"]
        method, _, headers = srv.requests[-1]
    assert method == "PUT" and headers.get("Transfer-Encoding") == "chunked"
    assert decompress(uploaded, compression) == data
    assert result.source_bytes == len(data)
    assert result.source_digest.hex == hashlib.sha256(data).hexdigest()
    assert result.uploaded_bytes == len(uploaded)
    assert result.uploaded_digest.hex == hashlib.sha256(uploaded).hexdigest()
    assert result.compression == compression
    assert not result.quiesced
    if compression != agent_pb2.NO_COMPRESSION:
        assert len(uploaded) < len(data)
    assert progress and progress[-1].done == len(data) and progress[-1].total == len(data)


@pytest.mark.root
def test_snapshot_of_a_block_device(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a loop device")
    backing = tmp_path / "disk.img"
    data = disk_image(backing, 3 << 20)
    try:
        loop = proc.run(["losetup", "--find", "--show", "--read-only", str(backing)], timeout=30).text.strip()
    except Exception as exc:
        pytest.skip(f"no loop device: {exc}")
    try:
        with LoopbackServer() as srv:
            result = snapshot(Config(state_dir=tmp_path / "state"), Path(loop), srv.url("/blk"))
            assert gzip.decompress(srv.uploads["/blk"]) == data
        assert result.source_digest.hex == hashlib.sha256(data).hexdigest()
    finally:
        proc.run(["losetup", "-d", loop], check=False, timeout=30)


def test_sources_outside_the_allowed_directories_are_refused(images: Path, tmp_path: Path) -> None:
    config = config_for(images, tmp_path)
    (images / "escape").symlink_to("/etc/shadow")
    with LoopbackServer() as srv:
        for bad in ("/etc/shadow", str(images / "escape"), str(images / ".." / "x"), "relative.img"):
            with pytest.raises(InvalidParameters):
                snapshot(config, Path(bad), srv.url("/x"))
        with pytest.raises(InvalidParameters, match="not a block device"):
            snapshot(config, Path("/dev/null"), srv.url("/x"))
        with pytest.raises(NotFound):
            snapshot(config, images / "missing.raw", srv.url("/x"))
        assert srv.uploads == {}


def test_bad_requests_are_refused_before_any_work() -> None:
    handler = InstanceSnapshot()
    for msg in (
        agent_pb2.InstanceSnapshotRequest(upload_url="http://127.0.0.1/x"),
        agent_pb2.InstanceSnapshotRequest(source_path="/dev/sda"),
        agent_pb2.InstanceSnapshotRequest(source_path="/dev/sda", upload_url="ftp://127.0.0.1/x"),
        agent_pb2.InstanceSnapshotRequest(
            source_path="/dev/sda", upload_url="http://127.0.0.1/x", http_headers={"X-A": "b\r\nEvil: 1"}
        ),
    ):
        with pytest.raises(InvalidParameters):
            handler.parse(msg)


def test_server_error_fails_the_snapshot(images: Path, tmp_path: Path) -> None:
    source = images / "vm.raw"
    disk_image(source, 1 << 20)
    with LoopbackServer() as srv:
        srv.add("/snap", b"", fault=Fault(status=507))
        with pytest.raises(SourceFailed, match="507"):
            snapshot(config_for(images, tmp_path), source, srv.url("/snap"))


def test_token_bucket_paces_to_its_rate() -> None:
    bucket = transfer.TokenBucket(1_000_000)
    assert bucket.delay(bucket.capacity) == 0.0  # the burst is free
    wait = bucket.delay(2_000_000)
    assert 1.9 < wait <= 2.0 + 1e-3  # then the rate holds: 2 MB at 1 MB/s


@pytest.mark.root
def test_quiesce_freezes_for_the_duration_and_thaws_on_success(
    ext4_mount: Path, images: Path, tmp_path: Path
) -> None:
    source = images / "vm.raw"
    data = disk_image(source, 3 << 20)
    seen: list[bool] = []
    progress: list[session_pb2.Progress] = []
    with LoopbackServer() as srv:
        handler = InstanceSnapshot()
        params = handler.parse(
            agent_pb2.InstanceSnapshotRequest(
                source_path=str(source),
                upload_url=srv.url("/q"),
                compression=agent_pb2.NO_COMPRESSION,
                quiesce_mountpoint=str(ext4_mount),
                bandwidth_limit_bytes_per_second=4 << 20,
            )
        )

        def sink(p: session_pb2.Progress) -> None:
            seen.append(is_frozen(ext4_mount))
            progress.append(p)

        ctx = Context.local("instance.snapshot", config_for(images, tmp_path), progress_sink=sink)
        result = handler.run(ctx, params)
        assert srv.uploads["/q"] == data
    assert isinstance(result, agent_pb2.InstanceSnapshotResult)
    assert result.quiesced
    assert seen and all(seen), "the filesystem was not frozen while the snapshot streamed"
    assert not is_frozen(ext4_mount)
    assert not any((tmp_path / "state" / FROZEN_DIR).iterdir())  # marker removed after the thaw


@pytest.mark.root
def test_quiesce_thaws_even_when_the_upload_fails(ext4_mount: Path, images: Path, tmp_path: Path) -> None:
    source = images / "vm.raw"
    disk_image(source, 1 << 20)
    with LoopbackServer() as srv:
        srv.add("/q", b"", fault=Fault(status=500))
        with pytest.raises(SourceFailed):
            snapshot(
                config_for(images, tmp_path), source, srv.url("/q"), quiesce_mountpoint=str(ext4_mount)
            )
    assert not is_frozen(ext4_mount)
    (ext4_mount / "writable").write_text("yes")  # would block on a frozen filesystem


def test_quiesce_refuses_root_and_non_mountpoints(images: Path, tmp_path: Path) -> None:
    source = images / "vm.raw"
    disk_image(source, 1 << 16)
    config = config_for(images, tmp_path)
    with pytest.raises(ProtectedDevice, match="root filesystem"):
        snapshot(config, source, "http://127.0.0.1:9/x", quiesce_mountpoint="/")
    with pytest.raises(InvalidParameters, match="not a mount point"):
        snapshot(config, source, "http://127.0.0.1:9/x", quiesce_mountpoint=str(images))


def test_bandwidth_limit_paces_the_upload(images: Path, tmp_path: Path) -> None:
    source = images / "vm.raw"
    data = os.urandom(5 << 20)
    source.write_bytes(data)
    rate = 2 << 20
    with LoopbackServer() as srv:
        started = time.monotonic()
        snapshot(
            config_for(images, tmp_path), source, srv.url("/slow"), agent_pb2.NO_COMPRESSION,
            bandwidth_limit_bytes_per_second=rate,
        )
        elapsed = time.monotonic() - started
        assert srv.uploads["/slow"] == data
    # A lower bound only (a slow machine can only take longer): 5 MiB at 2 MiB/s after a burst
    # of a quarter second's worth cannot take less than 2 s.
    assert elapsed >= (len(data) - rate * transfer.BURST_SECONDS) / rate - 0.3


@pytest.mark.root
def test_a_freeze_left_by_a_dead_agent_is_thawed(ext4_mount: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    markers = state / FROZEN_DIR
    markers.mkdir(parents=True)
    dead = proc.spawn(["true"])
    dead.wait()
    freeze(ext4_mount)
    (markers / "a").write_text(f"{ext4_mount}\n{dead.pid}\n")
    (markers / "b").write_text(f"/nonexistent/mnt\n{os.getpid()}\n")  # a live snapshot's: kept
    assert thaw_leftovers(state) == [ext4_mount]
    assert not is_frozen(ext4_mount)
    assert sorted(p.name for p in markers.iterdir()) == ["b"]
