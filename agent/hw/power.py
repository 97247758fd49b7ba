"""Reboot the machine, gracefully or forced, optionally into firmware setup or a one-time entry.

Graceful: through the init system (``systemctl reboot`` where systemd runs, else the init's
``reboot``), so services stop and filesystems unmount cleanly. Forced: ``sync`` then the reboot
syscall, for a machine whose init is wedged.

EFI: the one-time boot entry is ``BootNext`` and firmware setup is bit 0 of
``OsIndications``, both written through efivarfs (4 bytes of attributes, then the value).
Files in efivarfs are often immutable (``chattr +i``); the flag is cleared on the one file
written, and only there.

The final actions go through an injectable ``Syscalls`` and runner: tests replace them with
recording doubles, and point ``efivars`` at a plain directory.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import logging
import os
import struct
import time
from pathlib import Path

from agent import proc
from agent.errors import AgentError, InvalidParameters, NotFound, Reason, Unsupported
from agent.hw.kexec import LINUX_REBOOT_CMD_RESTART, LinuxSyscalls, Runner, Syscalls

log = logging.getLogger(__name__)

EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
EFIVARS = Path("/sys/firmware/efi/efivars")
# NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS
EFI_ATTRS_NV_BS_RT = 0x7
EFI_OS_INDICATIONS_BOOT_TO_FW_UI = 0x1

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x10

# After asking init to reboot, how long to wait before forcing it.
GRACEFUL_WAIT_SECONDS = 300.0


class Mode(enum.StrEnum):
    GRACEFUL = "graceful"
    FORCED = "forced"


class Power:
    """Reboot actions; ``syscalls``, ``run``, ``efivars`` and ``sleep`` are injectable."""

    def __init__(
        self,
        syscalls: Syscalls | None = None,
        run: Runner = proc.run,
        efivars: Path = EFIVARS,
        systemd_marker: Path = Path("/run/systemd/system"),
        graceful_wait: float = GRACEFUL_WAIT_SECONDS,
    ) -> None:
        self.syscalls: Syscalls = syscalls if syscalls is not None else LinuxSyscalls()
        self.run = run
        self.efivars = efivars
        self.systemd_marker = systemd_marker
        self.graceful_wait = graceful_wait
        self.sleep = time.sleep

    # -- EFI ------------------------------------------------------------------------------

    @property
    def has_efi(self) -> bool:
        return self.efivars.is_dir()

    def _var(self, name: str) -> Path:
        return self.efivars / f"{name}-{EFI_GLOBAL_GUID}"

    def _require_efi(self, what: str) -> None:
        if not self.has_efi:
            raise Unsupported(f"{what} needs EFI variables, and {self.efivars} is not there "
                              "(legacy BIOS boot, or efivarfs not mounted)")

    def read_var(self, name: str) -> bytes | None:
        """The value of an EFI global variable (without its attributes), or None."""
        try:
            data = self._var(name).read_bytes()
        except FileNotFoundError:
            return None
        return data[4:]

    def write_var(self, name: str, value: bytes, attrs: int = EFI_ATTRS_NV_BS_RT) -> None:
        """Write an EFI global variable in one write(), clearing its immutable flag first."""
        path = self._var(name)
        if path.exists():
            _clear_immutable(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, struct.pack("<I", attrs) + value)
        except OSError as exc:
            raise AgentError(f"cannot write EFI variable {name}: {exc.strerror}",
                             reason=Reason.TOOL_FAILED, variable=name) from exc
        finally:
            os.close(fd)

    def set_boot_next(self, entry: str) -> int:
        """BootNext = entry (hex "0003"); the entry must exist as Boot0003."""
        number = parse_boot_entry(entry)
        self._require_efi("a one-time boot entry")
        if self.read_var(f"Boot{number:04X}") is None:
            raise NotFound(f"EFI boot entry Boot{number:04X} does not exist", entry=f"{number:04X}")
        self.write_var("BootNext", struct.pack("<H", number))
        log.info("EFI BootNext = Boot%04X", number)
        return number

    def request_firmware_setup(self) -> None:
        """Set the boot-to-firmware-UI bit of OsIndications, where the firmware supports it."""
        self._require_efi("rebooting into firmware setup")
        supported = self.read_var("OsIndicationsSupported")
        if supported is None or len(supported) < 8 or not (
            struct.unpack("<Q", supported[:8])[0] & EFI_OS_INDICATIONS_BOOT_TO_FW_UI
        ):
            raise Unsupported("this firmware does not offer booting into its setup (OsIndicationsSupported)")
        current = self.read_var("OsIndications")
        value = struct.unpack("<Q", current[:8])[0] if current and len(current) >= 8 else 0
        self.write_var("OsIndications", struct.pack("<Q", value | EFI_OS_INDICATIONS_BOOT_TO_FW_UI))
        log.info("EFI OsIndications: boot to firmware UI")

    # -- reboot ---------------------------------------------------------------------------

    def reboot(self, mode: Mode) -> None:
        """Reboot now. Does not return when it works."""
        if mode is Mode.GRACEFUL:
            argv = ["systemctl", "reboot"] if self.systemd_marker.is_dir() else ["reboot"]
            log.info("graceful reboot through %s", argv[0])
            self.run(argv, timeout=60)
            # init stops us on its way down; if it has not after a while, it is wedged.
            self.sleep(self.graceful_wait)
            log.warning("still running %.0fs after asking init to reboot; forcing it", self.graceful_wait)
        self.force_reboot()

    def force_reboot(self) -> None:
        self.syscalls.sync()
        log.info("reboot(LINUX_REBOOT_CMD_RESTART)")
        self.syscalls.reboot(LINUX_REBOOT_CMD_RESTART)


def parse_boot_entry(entry: str) -> int:
    text = entry.strip()
    if text.lower().startswith("boot"):
        text = text[4:]
    if not 1 <= len(text) <= 4 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise InvalidParameters(f"boot entry must be 1-4 hex digits like '0003', not {entry!r}")
    return int(text, 16)


def _clear_immutable(path: Path) -> None:
    """chattr -i on one efivarfs file; quietly nothing where the filesystem has no flags."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        buf = bytearray(struct.pack("<l", 0))
        try:
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        except OSError as exc:
            if exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
                return
            raise
        flags = struct.unpack("<l", buf)[0]
        if flags & FS_IMMUTABLE_FL:
            with contextlib.suppress(OSError):
                fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("<l", flags & ~FS_IMMUTABLE_FL))
    finally:
        os.close(fd)


__all__ = ["Mode", "Power", "parse_boot_entry"]
