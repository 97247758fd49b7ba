"""boot.kexec up to the syscall: kernel and initrd from a local file, a loopback HTTP URL and a
read-only mounted partition of a loop disk; digests; the agent's rejoin parameter; load errors
fail the command before anything ends. The syscalls are a recording double (the real ones run
in the QEMU tests)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc, schema
from agent.commands.base import Context, SelfTermination
from agent.commands.kexec import KexecHandler
from agent.config import Config
from agent.errors import AgentError, ChecksumMismatch, InvalidParameters, NotFound, ProtectedDevice, Reason
from agent.hw import kexec
from agent.hw.bootid import boot_id
from agent.images import filesource
from agent.proto import agent_pb2
from tests.hw.test_kexec import RecordingSyscalls
from tests.loopback_http import LoopbackServer

KERNEL = b"MZ" + os.urandom(300_000)
INITRD = b"070701" + os.urandom(100_000)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def request(kernel: dict[str, object], initrd: dict[str, object] | None = None,
            cmdline: str = "console=ttyS0 root=/dev/vda1", **extra: object) -> agent_pb2.KexecRequest:
    payload: dict[str, object] = {"kernel": kernel, "cmdline": cmdline, **extra}
    if initrd is not None:
        payload["initrd"] = initrd
    msg = schema.payload_from_json("boot.kexec", payload)
    assert isinstance(msg, agent_pb2.KexecRequest)
    return msg


def run(handler: KexecHandler, req: agent_pb2.KexecRequest, tmp_path: Path,
        command_id: str = "cmd-1") -> SelfTermination:
    ctx = Context.local("boot.kexec", Config(cache_dir=tmp_path / "cache"), command_id=command_id)
    out = handler.run(ctx, handler.parse(req))
    assert isinstance(out, SelfTermination)
    return out


@pytest.fixture
def files(tmp_path: Path) -> Path:
    d = tmp_path / "files"
    d.mkdir()
    (d / "vmlinuz").write_bytes(KERNEL)
    (d / "initrd.img").write_bytes(INITRD)
    return d


def test_local_files_are_loaded_with_the_rejoin_marker(tmp_path: Path, files: Path) -> None:
    sc = RecordingSyscalls()
    req = request({"localPath": str(files / "vmlinuz"),
                   "digest": {"algorithm": "sha256", "hex": sha(KERNEL)}},
                  {"localPath": str(files / "initrd.img"), "digest": {"hex": sha(INITRD)}})
    out = run(KexecHandler(kexec.Kexec(sc)), req, tmp_path)
    (name, (kernel, initrd, cmdline, flags)), = sc.calls
    assert name == "kexec_file_load" and flags == 0
    assert kernel == KERNEL[:64] and initrd == INITRD[:64]
    expected = f"console=ttyS0 root=/dev/vda1 bc.rejoin=boot.kexec:cmd-1:{boot_id()}"
    assert cmdline == expected.encode()
    assert out.proof == {"old_boot_id": boot_id()}
    assert isinstance(out.result, agent_pb2.KexecResult)
    assert out.result.cmdline == expected and out.result.method == "kexec_file_load"
    assert out.result.kernel_sha256 == sha(KERNEL) and out.result.initrd_sha256 == sha(INITRD)
    assert not (tmp_path / "cache" / "kexec" / "cmd-1").exists()  # work files removed after loading
    # The action executes what was loaded, and only when the runtime calls it.
    out.action()
    assert sc.calls[1:] == [("sync", None), ("reboot", kexec.LINUX_REBOOT_CMD_KEXEC)]


def test_kernel_and_initrd_from_a_loopback_url(tmp_path: Path) -> None:
    sc = RecordingSyscalls()
    with LoopbackServer() as srv:
        srv.add("/boot/vmlinuz", KERNEL)
        srv.add("/boot/initrd", INITRD)
        req = request({"url": srv.url("/boot/vmlinuz"), "digest": {"hex": sha(KERNEL)}},
                      {"url": srv.url("/boot/initrd"),
                       "digest": {"algorithm": "sha512", "hex": hashlib.sha512(INITRD).hexdigest()}})
        out = run(KexecHandler(kexec.Kexec(sc)), req, tmp_path)
    _, (kernel, initrd, _, _) = sc.calls[0]
    assert kernel == KERNEL[:64] and initrd == INITRD[:64]
    assert isinstance(out.result, agent_pb2.KexecResult)
    assert out.result.initrd_sha256 == sha(INITRD)  # sha256 reported even when sha512 was checked


def test_bad_digest_fails_before_loading(tmp_path: Path, files: Path) -> None:
    sc = RecordingSyscalls()
    with LoopbackServer() as srv:
        srv.add("/vmlinuz", KERNEL)
        req = request({"url": srv.url("/vmlinuz"), "digest": {"hex": sha(b"other")}})
        with pytest.raises(ChecksumMismatch):
            run(KexecHandler(kexec.Kexec(sc)), req, tmp_path)
    req = request({"localPath": str(files / "vmlinuz"), "digest": {"hex": sha(KERNEL)}},
                  {"localPath": str(files / "initrd.img"), "digest": {"hex": sha(KERNEL)}})
    with pytest.raises(ChecksumMismatch):
        run(KexecHandler(kexec.Kexec(sc)), req, tmp_path)
    assert sc.calls == []
    assert not any((tmp_path / "cache" / "kexec").rglob("*"))


def test_missing_file_and_missing_url_fail_before_loading(tmp_path: Path) -> None:
    sc = RecordingSyscalls()
    with pytest.raises(NotFound):
        run(KexecHandler(kexec.Kexec(sc)), request({"localPath": str(tmp_path / "none"),
                                                    "digest": {"hex": sha(b"")}}), tmp_path)
    with LoopbackServer() as srv, pytest.raises(AgentError) as info:
        run(KexecHandler(kexec.Kexec(sc)), request({"url": srv.url("/none"), "digest": {"hex": sha(b"")}}),
            tmp_path)
    assert info.value.reason == Reason.SOURCE_FAILED
    assert sc.calls == []


def test_load_error_fails_the_command_before_anything_ends(tmp_path: Path, files: Path) -> None:
    sc = RecordingSyscalls({"kexec_file_load": errno.ENOEXEC})
    req = request({"localPath": str(files / "vmlinuz"), "digest": {"hex": sha(KERNEL)}})
    with pytest.raises(AgentError) as info:
        run(KexecHandler(kexec.Kexec(sc)), req, tmp_path)
    assert info.value.reason == Reason.BAD_IMAGE
    assert [c[0] for c in sc.calls] == ["kexec_file_load"]  # no reboot


@pytest.mark.parametrize(
    "payload",
    [
        {"cmdline": "x"},                                                     # no kernel
        {"kernel": {"localPath": "/k"}},                                      # no digest
        {"kernel": {"localPath": "/k", "digest": {"hex": "abc"}}},            # short digest
        {"kernel": {"localPath": "/k", "digest": {"algorithm": "md5", "hex": "0" * 32}}},
        {"kernel": {"localPath": "relative", "digest": {"hex": "0" * 64}}},
        {"kernel": {"url": "ftp://h/k", "digest": {"hex": "0" * 64}}},
        {"kernel": {"partitionFile": {"path": "/boot/k"}, "digest": {"hex": "0" * 64}}},  # no disk
        {"kernel": {"partitionFile": {"disk": {"name": "sda"}, "partitionNumber": 1, "path": "boot/k"},
                    "digest": {"hex": "0" * 64}}},
        {"kernel": {"localPath": "/k", "digest": {"hex": "0" * 64}}, "cmdline": "a\u00e9"},
    ],
)
def test_bad_requests_are_refused_at_parse(payload: dict[str, object]) -> None:
    with pytest.raises(InvalidParameters):
        KexecHandler(kexec.Kexec(RecordingSyscalls())).parse(schema.payload_from_json("boot.kexec", payload))


def test_command_id_that_cannot_travel_on_a_cmdline_is_refused(tmp_path: Path, files: Path) -> None:
    req = request({"localPath": str(files / "vmlinuz"), "digest": {"hex": sha(KERNEL)}})
    with pytest.raises(InvalidParameters):
        run(KexecHandler(kexec.Kexec(RecordingSyscalls())), req, tmp_path, command_id="a b")


def test_open_in_root_follows_links_without_leaving_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "boot").mkdir(parents=True)
    (root / "boot" / "vmlinuz-6.1").write_bytes(b"inside")
    (root / "vmlinuz").symlink_to("boot/vmlinuz-6.1")
    (root / "abs").symlink_to("/boot/vmlinuz-6.1")              # absolute: relative to the root
    (root / "escape").symlink_to("../../../../../../etc/hostname")
    for name in ("/vmlinuz", "/abs", "/boot/../../../boot/vmlinuz-6.1"):
        with filesource.open_in_root(root, name) as f:
            assert f.read() == b"inside"
    with pytest.raises(NotFound):
        filesource.open_in_root(root, "/escape").__enter__()


# -- partition of a loop disk, mounted read-only ---------------------------------------------


@pytest.fixture
def loop_disk(tmp_path: Path) -> Iterator[Path]:
    """A GPT loop disk: partition 1 ext4 labelled 'bootfs' holding /boot/vmlinuz (a symlink)."""
    needed = ("losetup", "sfdisk", "mkfs.ext4", "lsblk", "mount")
    if os.geteuid() != 0 or any(shutil.which(t) is None for t in needed):
        pytest.skip("needs root, losetup, sfdisk, mkfs.ext4, lsblk")
    tree = tmp_path / "tree"
    (tree / "boot").mkdir(parents=True)
    (tree / "boot" / "vmlinuz-6.1").write_bytes(KERNEL)
    (tree / "boot" / "vmlinuz").symlink_to("vmlinuz-6.1")
    fs = tmp_path / "fs.img"
    with fs.open("wb") as f:
        f.truncate(16 << 20)
    disk = tmp_path / "disk.img"
    with disk.open("wb") as f:
        f.truncate(20 << 20)
    try:
        proc.run(["mkfs.ext4", "-q", "-F", "-L", "bootfs", "-d", str(tree), str(fs)], timeout=60)
        proc.run(["sfdisk", "-q", str(disk)], input=b"label: gpt\nstart=2048, size=32768, name=bootfs\n",
                 timeout=60)
        with fs.open("rb") as src, disk.open("r+b") as dst:
            dst.seek(2048 * 512)
            shutil.copyfileobj(src, dst)
        dev = proc.run(["losetup", "--find", "--show", "--partscan", str(disk)], timeout=60).text.strip()
    except AgentError as exc:
        pytest.skip(f"cannot set up a loop disk here: {exc}")
    try:
        proc.run(["udevadm", "settle"], check=False, timeout=30) if shutil.which("udevadm") else None
        name = Path(dev).name
        if not Path(f"/sys/class/block/{name}/{name}p1").exists() and shutil.which("partx"):
            proc.run(["partx", "-a", dev], check=False, timeout=30)  # no partscan in some containers
        if not Path(f"/sys/class/block/{name}/{name}p1").exists():
            pytest.skip("the loop device shows no partitions here (no partscan)")
        yield Path(dev)
    finally:
        proc.run(["losetup", "-d", dev], check=False, timeout=60)


def mounts() -> str:
    return Path("/proc/self/mounts").read_text()


@pytest.mark.root
@pytest.mark.parametrize("select", [{"partitionNumber": 1}, {"partitionLabel": "bootfs"}])
def test_kernel_from_a_partition_mounted_read_only(tmp_path: Path, loop_disk: Path,
                                                  select: dict[str, object]) -> None:
    sc = RecordingSyscalls()
    before = mounts()
    req = request({"partitionFile": {"disk": {"name": loop_disk.name}, "path": "/boot/vmlinuz", **select},
                   "digest": {"hex": sha(KERNEL)}})
    run(KexecHandler(kexec.Kexec(sc)), req, tmp_path)
    _, (kernel, _, _, _) = sc.calls[0]
    assert kernel == KERNEL[:64]
    assert mounts() == before  # unmounted again


@pytest.mark.root
def test_partition_mounted_elsewhere_is_refused(tmp_path: Path, loop_disk: Path) -> None:
    """A partition the system has mounted (here read-only) is not mounted a second time:
    hw/block's SystemUse says it is in use, and why."""
    where = tmp_path / "elsewhere"
    where.mkdir()
    proc.run(["mount", "-o", "ro", f"{loop_disk}p1", str(where)], timeout=60)
    try:
        req = request({"partitionFile": {"disk": {"name": loop_disk.name}, "path": "/boot/vmlinuz",
                                         "partitionNumber": 1}, "digest": {"hex": sha(KERNEL)}})
        with pytest.raises(ProtectedDevice, match=f"mounted at {where}; refusing to mount it again"):
            run(KexecHandler(kexec.Kexec(RecordingSyscalls())), req, tmp_path)
    finally:
        proc.run(["umount", str(where)], timeout=60)


@pytest.mark.root
def test_partition_errors_leave_nothing_mounted(tmp_path: Path, loop_disk: Path) -> None:
    before = mounts()
    handler = KexecHandler(kexec.Kexec(RecordingSyscalls()))
    for select, path, digest, error in (
        ({"partitionNumber": 1}, "/boot/missing", sha(KERNEL), NotFound),
        ({"partitionNumber": 1}, "/boot/vmlinuz", sha(b"x"), ChecksumMismatch),
        ({"partitionNumber": 7}, "/boot/vmlinuz", sha(KERNEL), NotFound),
    ):
        req = request({"partitionFile": {"disk": {"name": loop_disk.name}, "path": path, **select},
                       "digest": {"hex": digest}})
        with pytest.raises(error):
            run(handler, req, tmp_path)
        assert mounts() == before
