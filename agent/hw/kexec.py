"""Load a kernel with ``kexec_file_load`` and execute into it, through ctypes.

No kexec-tools needed: the kernel, the initrd and the command line go to the kernel by file
descriptor (``kexec_file_load``, syscall 320 on x86_64, 294 on aarch64), and ``reboot`` with
``LINUX_REBOOT_CMD_KEXEC`` executes the loaded image. Loading is separate from executing so
that everything that can fail (bad image, signature enforcement, lockdown) fails the command
before the agent ends.

Where the kernel lacks the syscall (ENOSYS: an old or foreign kernel, or one built without
CONFIG_KEXEC_FILE, as Debian's arm64 cloud kernel is) and kexec-tools is installed (the
ramdisk has it), ``kexec -l`` / ``kexec -e`` (kexec_load) is used by itself: nothing is
weakened, the syscall simply is not there. Where it is refused (EPERM: kexec_file_load refused
though root, e.g. a signature policy) kexec-tools is tried only when the caller allows it. The
method that ran is returned (and reported in the result). Tests replace ``Syscalls`` and the
runner with recording doubles: the real
syscall runs in the QEMU tests, where a real kernel executes.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent import proc
from agent.errors import (
    AgentError,
    InvalidParameters,
    NotFound,
    Reason,
    ToolFailed,
    ToolMissing,
    Unsupported,
)

log = logging.getLogger(__name__)

SYS_KEXEC_FILE_LOAD = {"x86_64": 320, "aarch64": 294}
KEXEC_FILE_UNLOAD = 0x1
KEXEC_FILE_NO_INITRAMFS = 0x4

LINUX_REBOOT_CMD_RESTART = 0x01234567
LINUX_REBOOT_CMD_POWER_OFF = 0x4321FEDC
LINUX_REBOOT_CMD_KEXEC = 0x45584543

METHOD_SYSCALL = "kexec_file_load"
METHOD_TOOLS = "kexec-tools"

# Longest command line the kernel takes (COMMAND_LINE_SIZE is 2048 on x86, 4096 on arm64).
MAX_CMDLINE = 2048


class Syscalls(Protocol):
    """The few syscalls this module and agent.hw.power make; tests pass a recording double."""

    def kexec_file_load(self, kernel_fd: int, initrd_fd: int, cmdline: bytes, flags: int) -> None: ...

    def reboot(self, cmd: int) -> None: ...

    def sync(self) -> None: ...


class LinuxSyscalls:
    """The real ones, through libc. Each raises OSError with the errno on failure."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def kexec_file_load(self, kernel_fd: int, initrd_fd: int, cmdline: bytes, flags: int) -> None:
        number = SYS_KEXEC_FILE_LOAD.get(os.uname().machine)
        if number is None:
            raise OSError(errno.ENOSYS, f"kexec_file_load: no syscall number for {os.uname().machine}")
        buf = ctypes.create_string_buffer(cmdline)  # NUL-terminated; the length counts the NUL
        syscall = self._libc.syscall
        syscall.restype = ctypes.c_long
        rc = syscall(
            ctypes.c_long(number), ctypes.c_int(kernel_fd), ctypes.c_int(initrd_fd),
            ctypes.c_ulong(len(cmdline) + 1), buf, ctypes.c_ulong(flags),
        )
        self._check(int(rc), "kexec_file_load")

    def reboot(self, cmd: int) -> None:
        self._check(int(self._libc.reboot(ctypes.c_int(cmd))), "reboot")

    def sync(self) -> None:
        os.sync()


Runner = Callable[..., proc.Completed]


@dataclass(frozen=True)
class KexecImage:
    kernel: Path
    initrd: Path | None
    cmdline: str


def check_cmdline(cmdline: str) -> str:
    """A command line the kernel takes: printable ASCII, one line, not too long."""
    if len(cmdline.encode()) >= MAX_CMDLINE:
        raise InvalidParameters(
            f"kernel command line is {len(cmdline)} bytes; the limit is {MAX_CMDLINE - 1}")
    if not cmdline.isascii() or any(not c.isprintable() for c in cmdline):
        raise InvalidParameters("kernel command line must be printable ASCII on one line")
    return cmdline


def _lockdown() -> str:
    """The kernel's lockdown mode ("integrity", "confidentiality") or "" when none."""
    try:
        text = Path("/sys/kernel/security/lockdown").read_text()
    except OSError:
        return ""
    mode = text[text.find("[") + 1 : text.find("]")] if "[" in text else ""
    return "" if mode == "none" else mode


def _kexec_disabled() -> bool:
    try:
        return Path("/proc/sys/kernel/kexec_load_disabled").read_text().strip() == "1"
    except OSError:
        return False


def load_error(exc: OSError, image: KexecImage) -> AgentError:
    """The AgentError an operator needs for a refused kexec_file_load."""
    code = exc.errno
    name = errno.errorcode.get(code or 0, str(code))
    details: dict[str, Any] = {"errno": name, "kernel": image.kernel}
    if code == errno.ENOEXEC:
        return AgentError(
            f"{image.kernel}: not a kernel image this kernel can kexec (ENOEXEC: wrong architecture, "
            "not a bzImage/Image, or a compressed image the kernel cannot read)",
            reason=Reason.BAD_IMAGE, **details,
        )
    if code == errno.EKEYREJECTED or code == errno.EBADMSG:
        return Unsupported(
            f"{image.kernel}: signature check failed ({name}): this kernel only kexecs kernels signed "
            "by a key it trusts (KEXEC_SIG / secure boot)", **details,
        )
    if code == errno.EPERM:
        why = []
        if os.geteuid() != 0:
            why.append("the agent is not root (CAP_SYS_BOOT)")
        if _kexec_disabled():
            why.append("kernel.kexec_load_disabled is 1")
        if lockdown := _lockdown():
            why.append(f"kernel lockdown is {lockdown!r} (unsigned kernels refused)")
        return Unsupported(
            f"kexec_file_load refused (EPERM): {'; '.join(why) or 'not permitted on this machine'}",
            **details,
        )
    if code == errno.ENOSYS:
        return Unsupported("kexec_file_load is not available in this kernel (ENOSYS)", **details)
    if code == errno.ENOENT:
        return NotFound(f"{image.kernel}: no such file (ENOENT)", **details)
    if code == errno.ENOMEM or code == errno.E2BIG:
        return AgentError(f"kexec_file_load: image too large or memory exhausted ({name})",
                          reason=Reason.TOO_LARGE, **details)
    if code == errno.EBUSY:
        return AgentError("kexec_file_load: another kexec image is being loaded (EBUSY)",
                          reason=Reason.TOOL_FAILED, **details)
    return AgentError(f"kexec_file_load failed: {exc.strerror or name}", reason=Reason.TOOL_FAILED, **details)


# errnos where the kexec-tools fallback may do better than the syscall; ENOSYS needs no leave.
_FALLBACK_ERRNOS = frozenset({errno.ENOSYS, errno.EPERM})
KEXEC_TOOL = "kexec"


class Kexec:
    """Load, then execute. ``syscalls`` and ``run`` are injectable for tests."""

    def __init__(self, syscalls: Syscalls | None = None, run: Runner = proc.run,
                 which: Callable[[str], str | None] = shutil.which) -> None:
        self.syscalls: Syscalls = syscalls if syscalls is not None else LinuxSyscalls()
        self.run = run
        self.which = which

    def load(self, image: KexecImage, *, allow_tools: bool = False) -> str:
        """Load ``image`` for the next kexec; the method that worked, or an AgentError.
        ENOSYS falls back to kexec-tools whenever it is installed; EPERM only with
        ``allow_tools``."""
        cmdline = check_cmdline(image.cmdline)
        for path in (image.kernel, image.initrd):
            if path is not None and not path.is_file():
                raise NotFound(f"{path}: no such file", path=path)
        flags = 0 if image.initrd is not None else KEXEC_FILE_NO_INITRAMFS
        kernel_fd = os.open(image.kernel, os.O_RDONLY | os.O_CLOEXEC)
        initrd_fd = -1
        try:
            if image.initrd is not None:
                initrd_fd = os.open(image.initrd, os.O_RDONLY | os.O_CLOEXEC)
            log.info("kexec_file_load %s initrd=%s cmdline=%r", image.kernel, image.initrd, cmdline)
            self.syscalls.kexec_file_load(kernel_fd, initrd_fd, cmdline.encode(), flags)
            return METHOD_SYSCALL
        except OSError as exc:
            error = load_error(exc, image)
            missing = exc.errno == errno.ENOSYS and self.which(KEXEC_TOOL) is not None
            if exc.errno not in _FALLBACK_ERRNOS or not (allow_tools or missing):
                if exc.errno == errno.ENOSYS:
                    error.message += " and kexec-tools, its fallback, is not installed"
                elif exc.errno in _FALLBACK_ERRNOS:
                    error.message += " (the request does not allow the kexec-tools fallback)"
                raise error from exc
            log.warning("%s; falling back to kexec-tools (kexec_load)", error.message)
            refused = error.details.get("errno", "")
        finally:
            os.close(kernel_fd)
            if initrd_fd >= 0:
                os.close(initrd_fd)
        self._load_with_tools(image, cmdline, refused)
        return METHOD_TOOLS

    def _load_with_tools(self, image: KexecImage, cmdline: str, refused: str) -> None:
        argv: list[str] = [KEXEC_TOOL, "-l", str(image.kernel), f"--command-line={cmdline}"]
        if image.initrd is not None:
            argv.append(f"--initrd={image.initrd}")
        try:
            self.run(argv, timeout=120)
        except ToolMissing as exc:
            raise ToolMissing(
                "kexec_file_load was refused and kexec-tools is not installed for the fallback",
                tool="kexec",
            ) from exc
        except ToolFailed as exc:
            raise ToolFailed(f"kexec_file_load: {refused}; the kexec-tools fallback failed too: "
                             f"{exc.message}", tool="kexec", errno=refused, method=METHOD_TOOLS) from exc

    def unload(self, method: str) -> None:
        """Drop a loaded image (the command failed after loading). Best effort."""
        try:
            if method == METHOD_TOOLS:
                self.run(["kexec", "-u"], timeout=60)
            else:
                self.syscalls.kexec_file_load(-1, -1, b"", KEXEC_FILE_UNLOAD)
        except (OSError, AgentError) as exc:
            log.warning("could not unload the kexec image: %s", exc)

    def execute(self, method: str) -> None:
        """Sync and execute the loaded image. Does not return when it works."""
        self.syscalls.sync()
        if method == METHOD_TOOLS:
            # -e: execute the image loaded with -l, without shutting services down (we are init's
            # child in the ramdisk; the journal is already flushed).
            self.run(["kexec", "-e"], timeout=60)
            return
        log.info("reboot(LINUX_REBOOT_CMD_KEXEC)")
        self.syscalls.reboot(LINUX_REBOOT_CMD_KEXEC)


def append_params(cmdline: str, params: Sequence[str]) -> str:
    """``cmdline`` with ``params`` appended, replacing earlier values of the same keys."""
    keys = {p.split("=", 1)[0] for p in params}
    kept = [word for word in cmdline.split() if word.split("=", 1)[0] not in keys]
    return " ".join([*kept, *params])
