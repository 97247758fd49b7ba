"""agent.hw.kexec up to the syscall: arguments handed to kexec_file_load, errno mapping, the
kexec-tools fallback and the execute step, with the syscalls replaced by a recording double."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from agent import proc
from agent.errors import AgentError, InvalidParameters, NotFound, Reason, ToolMissing, Unsupported
from agent.hw import kexec


class RecordingSyscalls:
    """Records each call; ``fail`` maps a syscall name to the errno it raises."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail or {}

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise OSError(self.fail[name], os.strerror(self.fail[name]))

    def kexec_file_load(self, kernel_fd: int, initrd_fd: int, cmdline: bytes, flags: int) -> None:
        # What the kernel would read through the descriptors, while they are still open.
        kernel = os.pread(kernel_fd, 64, 0) if kernel_fd >= 0 else None
        initrd = os.pread(initrd_fd, 64, 0) if initrd_fd >= 0 else None
        self.calls.append(("kexec_file_load", (kernel, initrd, cmdline, flags)))
        self._maybe_fail("kexec_file_load")

    def reboot(self, cmd: int) -> None:
        self.calls.append(("reboot", cmd))
        self._maybe_fail("reboot")

    def sync(self) -> None:
        self.calls.append(("sync", None))


class RecordingRunner:
    def __init__(self, missing: bool = False) -> None:
        self.argvs: list[list[str]] = []
        self.missing = missing

    def __call__(self, argv: list[str], **kwargs: Any) -> proc.Completed:
        self.argvs.append(list(argv))
        if self.missing:
            raise ToolMissing(f"{argv[0]}: not installed on this machine", tool=argv[0])
        return proc.Completed(tuple(argv), 0, b"", b"")


@pytest.fixture
def image(tmp_path: Path) -> kexec.KexecImage:
    (tmp_path / "vmlinuz").write_bytes(b"MZ kernel bytes")
    (tmp_path / "initrd").write_bytes(b"070701 initrd bytes")
    return kexec.KexecImage(tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyS0 quiet")


def test_load_passes_descriptors_cmdline_and_flags(image: kexec.KexecImage) -> None:
    sc = RecordingSyscalls()
    assert kexec.Kexec(sc).load(image) == kexec.METHOD_SYSCALL
    name, (kernel, initrd, cmdline, flags) = sc.calls[0]
    assert name == "kexec_file_load"
    assert kernel == b"MZ kernel bytes" and initrd == b"070701 initrd bytes"
    assert cmdline == b"console=ttyS0 quiet" and flags == 0


def test_load_without_initrd_says_no_initramfs(image: kexec.KexecImage) -> None:
    sc = RecordingSyscalls()
    kexec.Kexec(sc).load(kexec.KexecImage(image.kernel, None, ""))
    _, (_, initrd, _, flags) = sc.calls[0]
    assert initrd is None and flags == kexec.KEXEC_FILE_NO_INITRAMFS


def test_descriptors_are_closed_after_load(image: kexec.KexecImage) -> None:
    before = set(os.listdir("/proc/self/fd"))
    kexec.Kexec(RecordingSyscalls()).load(image)
    with pytest.raises(AgentError):
        kexec.Kexec(RecordingSyscalls({"kexec_file_load": errno.ENOEXEC})).load(image)
    assert set(os.listdir("/proc/self/fd")) == before


def test_missing_kernel_fails_before_the_syscall(image: kexec.KexecImage, tmp_path: Path) -> None:
    sc = RecordingSyscalls()
    with pytest.raises(NotFound):
        kexec.Kexec(sc).load(kexec.KexecImage(tmp_path / "nope", None, ""))
    assert sc.calls == []


@pytest.mark.parametrize(
    ("err", "cls", "reason", "words"),
    [
        (errno.ENOEXEC, AgentError, Reason.BAD_IMAGE, "not a kernel image"),
        (errno.EKEYREJECTED, Unsupported, Reason.UNSUPPORTED, "signed"),
        (errno.EPERM, Unsupported, Reason.UNSUPPORTED, "EPERM"),
        (errno.ENOSYS, Unsupported, Reason.UNSUPPORTED, "ENOSYS"),
        (errno.ENOENT, NotFound, Reason.NOT_FOUND, "ENOENT"),
        (errno.EBUSY, AgentError, Reason.TOOL_FAILED, "EBUSY"),
    ],
)
def test_errno_becomes_a_clear_error(
    image: kexec.KexecImage, err: int, cls: type[AgentError], reason: Reason, words: str
) -> None:
    runner = RecordingRunner()
    with pytest.raises(cls) as info:
        kexec.Kexec(RecordingSyscalls({"kexec_file_load": err}), runner, which=no_tool).load(image)
    assert info.value.reason == reason
    assert words in info.value.message
    assert runner.argvs == []  # no fallback unless the request allows it (or ENOSYS and the tool)


def no_tool(name: str) -> str | None:
    return None


def have_tool(name: str) -> str | None:
    return f"/usr/sbin/{name}" if name == "kexec" else None


def test_a_kernel_without_kexec_file_load_falls_back_to_kexec_tools_by_itself(
    image: kexec.KexecImage,
) -> None:
    """ENOSYS (Debian's arm64 cloud kernel has no CONFIG_KEXEC_FILE) with kexec-tools installed:
    kexec -l, without the request's leave, and the method says so; without the tool, the
    error says what is missing."""
    runner = RecordingRunner()
    k = kexec.Kexec(RecordingSyscalls({"kexec_file_load": errno.ENOSYS}), runner, which=have_tool)
    assert k.load(image) == kexec.METHOD_TOOLS
    assert runner.argvs == [["kexec", "-l", str(image.kernel), "--command-line=console=ttyS0 quiet",
                             f"--initrd={image.initrd}"]]
    k = kexec.Kexec(RecordingSyscalls({"kexec_file_load": errno.ENOSYS}), RecordingRunner(), which=no_tool)
    with pytest.raises(Unsupported, match=r"ENOSYS.*kexec-tools, its fallback, is not installed"):
        k.load(image)


def test_a_refused_syscall_needs_the_requests_leave_even_with_kexec_tools(image: kexec.KexecImage) -> None:
    """EPERM is a refusal (a policy, lockdown), not a missing syscall: no fallback by itself."""
    runner = RecordingRunner()
    k = kexec.Kexec(RecordingSyscalls({"kexec_file_load": errno.EPERM}), runner, which=have_tool)
    with pytest.raises(Unsupported, match="does not allow the kexec-tools fallback"):
        k.load(image)
    assert runner.argvs == []


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EPERM])
def test_refused_syscall_falls_back_to_kexec_tools_when_allowed(image: kexec.KexecImage, err: int) -> None:
    runner = RecordingRunner()
    k = kexec.Kexec(RecordingSyscalls({"kexec_file_load": err}), runner)
    assert k.load(image, allow_tools=True) == kexec.METHOD_TOOLS
    assert runner.argvs == [["kexec", "-l", str(image.kernel), "--command-line=console=ttyS0 quiet",
                             f"--initrd={image.initrd}"]]


def test_bad_image_never_falls_back(image: kexec.KexecImage) -> None:
    runner = RecordingRunner()
    with pytest.raises(AgentError) as info:
        k = kexec.Kexec(RecordingSyscalls({"kexec_file_load": errno.ENOEXEC}), runner)
        k.load(image, allow_tools=True)
    assert info.value.reason == Reason.BAD_IMAGE and runner.argvs == []


def test_fallback_without_kexec_tools_says_so(image: kexec.KexecImage) -> None:
    k = kexec.Kexec(RecordingSyscalls({"kexec_file_load": errno.ENOSYS}), RecordingRunner(missing=True))
    with pytest.raises(ToolMissing, match="kexec-tools is not installed"):
        k.load(image, allow_tools=True)


def test_execute_syncs_then_reboots_into_the_image() -> None:
    sc = RecordingSyscalls()
    kexec.Kexec(sc).execute(kexec.METHOD_SYSCALL)
    assert sc.calls == [("sync", None), ("reboot", kexec.LINUX_REBOOT_CMD_KEXEC)]


def test_execute_with_tools_runs_kexec_e() -> None:
    sc, runner = RecordingSyscalls(), RecordingRunner()
    kexec.Kexec(sc, runner).execute(kexec.METHOD_TOOLS)
    assert sc.calls == [("sync", None)] and runner.argvs == [["kexec", "-e"]]


def test_unload_uses_the_unload_flag() -> None:
    sc = RecordingSyscalls()
    kexec.Kexec(sc).unload(kexec.METHOD_SYSCALL)
    assert sc.calls == [("kexec_file_load", (None, None, b"", kexec.KEXEC_FILE_UNLOAD))]


@pytest.mark.parametrize("bad", ["a\nb", "x" * 3000, "caf\u00e9"])
def test_bad_cmdline_is_refused(bad: str) -> None:
    with pytest.raises(InvalidParameters):
        kexec.check_cmdline(bad)


def test_append_params_replaces_an_earlier_value() -> None:
    got = kexec.append_params("console=ttyS0 bc.rejoin=old root=/dev/sda1", ["bc.rejoin=boot.kexec:c1:b1"])
    assert got == "console=ttyS0 root=/dev/sda1 bc.rejoin=boot.kexec:c1:b1"


def test_real_syscall_refuses_a_bogus_image_cleanly(image: kexec.KexecImage) -> None:
    """The real ctypes syscall with bytes no kernel can load: a clean error, nothing loaded.

    As root the kernel answers ENOEXEC (bad image), or EPERM where a container or lockdown
    forbids kexec; as a user always EPERM. Either way it must be an AgentError that says so.
    """
    with pytest.raises(AgentError) as info:
        kexec.Kexec().load(image)
    # A kernel without the syscall (ENOSYS) hands it to kexec-tools where installed, which
    # refuses the bytes too, saying both.
    fell_back = info.value.details.get("method") == kexec.METHOD_TOOLS
    expected = (Reason.TOOL_FAILED,) if fell_back else (Reason.BAD_IMAGE, Reason.UNSUPPORTED)
    assert info.value.reason in expected
    assert info.value.details["errno"] in ("ENOEXEC", "EPERM", "ENOSYS", "EINVAL", "EKEYREJECTED")
