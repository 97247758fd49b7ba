"""disk.wipe: real files and loop devices for the methods that run here; NVMe and ATA through
a fake nvme/hdparm runner that answers with recorded output and acts on a file disk."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from agent import proc
from agent.commands.base import Context
from agent.commands.wipe import Wipe
from agent.errors import (
    Cancelled,
    InvalidParameters,
    NotFound,
    ProtectedDevice,
    Reason,
    Unsupported,
)
from agent.hw import block, partitions
from agent.proc import Completed
from agent.proto import agent_pb2, common_pb2, session_pb2
from tests.diskfixtures import MiB, gpt_image, loop_device, mounted, random_file

M = agent_pb2.WipeMethod
L = agent_pb2.NistLevel
V = agent_pb2.WipeVerify
DATA = Path(__file__).resolve().parent.parent / "hw" / "data"


def wipe(disks: Callable[[], list[block.Disk]], names: Sequence[str], method: int = M.BEST_AVAILABLE,
         *, runner: Callable[..., Completed] | None = None, ctx: Context | None = None,
         **kw: object) -> agent_pb2.WipeResult:
    handler = Wipe(disks=disks, runner=runner)
    req = agent_pb2.WipeRequest(disks=[common_pb2.DiskHints(name=n) for n in names], method=method,
                                **kw)  # type: ignore[arg-type]
    params = handler.parse(req)
    ctx = ctx or Context.local("disk.wipe")
    ctx.config = replace(ctx.config, node_id="node-7")
    return handler.run(ctx, params)


def file_disks(*paths: Path) -> Callable[[], list[block.Disk]]:
    return lambda: [block.file_disk(p) for p in paths]


def test_best_available_on_files_overwrites_in_parallel(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    random_file(a, 24 * MiB)
    random_file(b, 9 * MiB + 4096)
    seen: list[session_pb2.Progress] = []
    ctx = Context.local("disk.wipe", progress_sink=seen.append)
    r = wipe(file_disks(a, b), ["a", "b"], ctx=ctx)
    assert [c.disk.name for c in r.certificates] == ["a", "b"]
    for c, path in zip(r.certificates, (a, b), strict=True):
        assert c.method == M.OVERWRITE_ZEROS and c.level == L.CLEAR and c.verified and not c.error
        assert c.node_id == "node-7" and c.disk.size_bytes == path.stat().st_size
        assert c.started_at_unix_ms <= c.finished_at_unix_ms
        assert "all zeros" in c.verification_detail and c.bytes_verified > 0
        assert not path.read_bytes().strip(b"\0")
    assert {p.subject for p in seen} == {"a", "b"}


def test_random_two_passes_full_verify(tmp_path: Path) -> None:
    a = tmp_path / "a"
    old = random_file(a, 16 * MiB)
    r = wipe(file_disks(a), ["a"], M.OVERWRITE_RANDOM, passes=2, verify=V.FULL)
    c = r.certificates[0]
    assert c.verified and c.passes == 2 and c.bytes_verified == 16 * MiB
    assert "random pattern" in c.verification_detail
    new = a.read_bytes()
    assert new != old and new.strip(b"\0")
    assert all(new[i : i + 4096] != old[i : i + 4096] for i in range(0, len(new), 1 << 20))


def test_metadata_wipe_removes_partition_table_and_signatures(tmp_path: Path) -> None:
    img = gpt_image(tmp_path / "disk", 32 * MiB)
    r = wipe(file_disks(img), ["disk"], M.METADATA)
    c = r.certificates[0]
    assert c.verified and c.level == L.NIST_LEVEL_UNSPECIFIED
    fd = os.open(img, os.O_RDONLY)
    try:
        assert partitions.read_partitions(fd, "disk") == []
        assert partitions.probe_fs(fd, MiB) is None
        assert partitions.probe_fs(fd, 18432 * 512) is None
    finally:
        os.close(fd)


def test_discard_on_file(tmp_path: Path) -> None:
    a = tmp_path / "a"
    random_file(a, 8 * MiB)
    c = wipe(file_disks(a), ["a"], M.DISCARD).certificates[0]
    assert c.verified and c.tool == "fallocate punch hole" and not a.read_bytes().strip(b"\0")


def test_minimum_purge_unsupported_on_plain_disk(tmp_path: Path) -> None:
    a = tmp_path / "a"
    old = random_file(a, MiB)
    with pytest.raises(Unsupported, match="no supported method reaches PURGE") as err:
        wipe(file_disks(a), ["a"], minimum_level=L.PURGE)
    assert err.value.reason == Reason.UNSUPPORTED and a.read_bytes() == old


@pytest.mark.parametrize(
    "method", [M.NVME_FORMAT_CRYPTO, M.NVME_SANITIZE_BLOCK, M.ATA_SECURE_ERASE_ENHANCED]
)
def test_unsupported_method_refused_before_any_disk_is_touched(tmp_path: Path, method: int) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    old_a, old_b = random_file(a, MiB), random_file(b, MiB)
    with pytest.raises(Unsupported, match="not supported"):
        wipe(file_disks(a, b), ["a", "b"], method)
    assert a.read_bytes() == old_a and b.read_bytes() == old_b


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (agent_pb2.WipeRequest(), "at least one disk"),
        (agent_pb2.WipeRequest(disks=[common_pb2.DiskHints(name="a")], passes=9), "at most"),
        (agent_pb2.WipeRequest(disks=[common_pb2.DiskHints(name="a")], method=M.DISCARD, passes=2),
         "overwrite"),
        (agent_pb2.WipeRequest(disks=[common_pb2.DiskHints(name="a")], method=M.OVERWRITE_ZEROS,
                               minimum_level=L.PURGE), "below the minimum"),
        (agent_pb2.WipeRequest(disks=[common_pb2.DiskHints()]), "empty"),
        (agent_pb2.WipeRequest(disks=[common_pb2.DiskHints(name="a")], samples=2_000_000), "samples"),
    ],
)
def test_bad_parameters(req: agent_pb2.WipeRequest, match: str) -> None:
    with pytest.raises(InvalidParameters, match=match):
        Wipe().parse(req)


def test_disk_named_twice_or_missing(tmp_path: Path) -> None:
    a = tmp_path / "a"
    random_file(a, MiB)
    with pytest.raises(InvalidParameters, match="twice"):
        wipe(file_disks(a), ["a", "a"])
    with pytest.raises(NotFound):
        wipe(file_disks(a), ["b"])


def test_cancel(tmp_path: Path) -> None:
    a = tmp_path / "a"
    random_file(a, 64 * MiB)
    ctx = Context.local("disk.wipe")
    ctx.progress_sink = lambda p: ctx.cancel_event.set()
    with pytest.raises(Cancelled):
        wipe(file_disks(a), ["a"], ctx=ctx)


# ------------------------------------------------------------------ NVMe / ATA (fake runner)


class FakeTools:
    """Answers nvme/hdparm from recorded output; format/sanitize/erase zero the file disk."""

    def __init__(self, disk: Path, id_ctrl: str, *, erase_works: bool = True,
                 hdparm: str = "") -> None:
        self.disk, self.erase_works, self.hdparm = disk, erase_works, hdparm
        self.id_ctrl = (DATA / id_ctrl).read_text()
        self.calls: list[list[str]] = []
        self.sanitize_polls = 0

    def _zero(self) -> None:
        if self.erase_works:
            size = self.disk.stat().st_size
            with self.disk.open("r+b") as f:
                f.truncate(0)
                f.truncate(size)

    def __call__(self, argv: Sequence[str], **kw: object) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        out = ""
        if argv[:2] == ["nvme", "id-ctrl"]:
            out = self.id_ctrl
        elif argv[:2] == ["nvme", "id-ns"]:
            out = (DATA / "nvme-id-ns.json").read_text()
        elif argv[:2] == ["nvme", "version"]:
            out = "nvme version 2.3 (git 2.3)\nlibnvme version 1.3 (git 1.3)\n"
        elif argv[:2] in (["nvme", "format"], ["nvme", "sanitize"]):
            self._zero()
        elif argv[:2] == ["nvme", "sanitize-log"]:
            self.sanitize_polls += 1
            log = json.loads((DATA / "nvme-sanitize-log-2x.json").read_text())
            if self.sanitize_polls == 1:
                log["nvme0"]["sprog"] = 32768
                log["nvme0"]["sstat"]["status"] = 2
            out = json.dumps(log)
        elif argv[0] == "hdparm" and argv[1] == "-I":
            out = self.hdparm
        elif argv[0] == "hdparm" and any(a.startswith("--security-erase") for a in argv):
            self._zero()
        return Completed(tuple(argv), 0, out.encode(), b"")


def nvme_disk(path: Path, transport: str = "nvme") -> Callable[[], list[block.Disk]]:
    def disks() -> list[block.Disk]:
        d = block.file_disk(path)
        return [replace(d, name="nvme0n1", transport=transport, controller="nvme0", nsid=1)]
    return disks


def test_nvme_best_available_sanitize_block(tmp_path: Path) -> None:
    a = tmp_path / "a"
    random_file(a, 4 * MiB)
    tools = FakeTools(a, "nvme-id-ctrl-sanitize.json")
    ctx = Context.local("disk.wipe")
    ctx.sleep = lambda s: None  # type: ignore[method-assign]
    c = wipe(nvme_disk(a), ["nvme0n1"], runner=tools, ctx=ctx).certificates[0]
    assert c.method == M.NVME_SANITIZE_BLOCK and c.level == L.PURGE and c.verified, c
    assert c.tool == "nvme-cli 2.3 (git 2.3)"
    assert ["nvme", "sanitize", "/dev/nvme0", "--sanact=2"] in tools.calls
    assert tools.sanitize_polls == 2


def test_nvme_qemu_like_controller_formats_user_data(tmp_path: Path) -> None:
    a = tmp_path / "a"
    random_file(a, 4 * MiB)
    tools = FakeTools(a, "nvme-id-ctrl-qemu.json")
    c = wipe(nvme_disk(a), ["nvme0n1"], runner=tools).certificates[0]
    assert c.method == M.NVME_FORMAT_USER_DATA and c.level == L.PURGE and c.verified
    fmt = next(x for x in tools.calls if x[:2] == ["nvme", "format"])
    assert "--ses=1" in fmt and "--lbaf=0" in fmt and "--namespace-id=1" in fmt and "--force" in fmt
    with pytest.raises(Unsupported, match="FNA bit 2"):
        wipe(nvme_disk(a), ["nvme0n1"], M.NVME_FORMAT_CRYPTO, runner=tools)
    with pytest.raises(Unsupported, match="SANICAP"):
        wipe(nvme_disk(a), ["nvme0n1"], M.NVME_SANITIZE_CRYPTO, runner=tools)


def test_erase_that_leaves_old_data_fails_verification(tmp_path: Path) -> None:
    a = tmp_path / "a"
    old = random_file(a, 4 * MiB)
    tools = FakeTools(a, "nvme-id-ctrl-sanitize.json", erase_works=False)
    ctx = Context.local("disk.wipe")
    ctx.sleep = lambda s: None  # type: ignore[method-assign]
    c = wipe(nvme_disk(a), ["nvme0n1"], M.NVME_FORMAT_CRYPTO, runner=tools, ctx=ctx).certificates[0]
    assert not c.verified and "verification failed" in c.error and a.read_bytes() == old


def test_ata_frozen_is_unsupported_and_unfrozen_erases(tmp_path: Path) -> None:
    a = tmp_path / "a"
    random_file(a, 2 * MiB)
    frozen = (DATA / "hdparm-I-frozen.txt").read_text()
    tools = FakeTools(a, "nvme-id-ctrl-qemu.json", hdparm=frozen)
    with pytest.raises(Unsupported, match="frozen"):
        wipe(nvme_disk(a, "sata"), ["nvme0n1"], M.ATA_SECURE_ERASE, runner=tools)
    c = wipe(nvme_disk(a, "sata"), ["nvme0n1"], runner=tools).certificates[0]
    assert c.method == M.OVERWRITE_ZEROS  # frozen: best available falls back to Clear
    tools.hdparm = frozen.replace("\t\tfrozen", "\tnot\tfrozen")
    c = wipe(nvme_disk(a, "sata"), ["nvme0n1"], runner=tools).certificates[0]
    assert c.method == M.ATA_SECURE_ERASE_ENHANCED and c.level == L.PURGE and c.verified
    assert any("--security-erase-enhanced" in x for x in tools.calls)
    set_pass = tools.calls.index(next(x for x in tools.calls if "--security-set-pass" in x))
    erase = tools.calls.index(next(x for x in tools.calls if "--security-erase-enhanced" in x))
    assert set_pass < erase


# ------------------------------------------------------------------ loop devices


@pytest.mark.root
def test_loop_devices_discard_and_overwrite(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    random_file(a, 16 * MiB)
    random_file(b, 16 * MiB)
    with loop_device(a) as da, loop_device(b) as db:
        disks = lambda: [da, db]  # noqa: E731
        r = wipe(disks, [da.name, db.name], M.DISCARD)
        assert all(c.verified and c.tool == "ioctl BLKDISCARD" for c in r.certificates)
        r = wipe(disks, [da.name, db.name], M.OVERWRITE_ZEROS, verify=V.FULL)
        assert all(c.verified and c.bytes_verified == 16 * MiB for c in r.certificates)
        assert all(c.disk.transport == "loop" for c in r.certificates)
    assert not a.read_bytes().strip(b"\0") and not b.read_bytes().strip(b"\0")


@pytest.mark.root
def test_mounted_loop_device_refused(tmp_path: Path) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 not installed")
    a, other = tmp_path / "a", tmp_path / "other"
    with a.open("wb") as f:
        f.truncate(16 * MiB)
    proc.run(["mkfs.ext4", "-q", "-F", str(a)])
    old_other = random_file(other, MiB)
    with loop_device(a) as da, mounted(da.path, tmp_path / "mnt"):
        disks = lambda: [da, block.file_disk(other)]  # noqa: E731
        with pytest.raises(ProtectedDevice, match="mounted"):
            wipe(disks, ["other", da.name])
    assert other.read_bytes() == old_other  # refused as a whole: the free disk is untouched too
