"""Reboot the machine, gracefully or forced, optionally into firmware setup or a one-time entry.

Graceful: through the init system (``systemctl reboot`` where systemd runs, else the init's
``reboot``), so services stop and filesystems unmount cleanly. Forced: ``sync`` then the reboot
syscall, for a machine whose init is wedged.

EFI: the one-time boot entry is ``BootNext`` and firmware setup is bit 0 of
``OsIndications``, both written through efivarfs by agent.hw.efivars (which clears the
immutable flag on the one file written, and only there).

The final actions go through an injectable ``Syscalls`` and runner: tests replace them with
recording doubles, and point ``efivars`` at a plain directory.
"""

from __future__ import annotations

import enum
import logging
import struct
import time
from pathlib import Path

from agent import proc
from agent.errors import NotFound, Unsupported
from agent.hw import efivars
from agent.hw.kexec import LINUX_REBOOT_CMD_RESTART, LinuxSyscalls, Runner, Syscalls

log = logging.getLogger(__name__)

EFI_GLOBAL_GUID = efivars.GLOBAL
EFIVARS = efivars.EFIVARS
EFI_ATTRS_NV_BS_RT = efivars.ATTRS_NV_BS_RT
EFI_OS_INDICATIONS_BOOT_TO_FW_UI = 0x1

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

    def _require_efi(self, what: str) -> None:
        if not self.has_efi:
            raise Unsupported(f"{what} needs EFI variables, and {self.efivars} is not there "
                              "(legacy BIOS boot, or efivarfs not mounted)")

    def read_var(self, name: str) -> bytes | None:
        """The value of an EFI global variable (without its attributes), or None."""
        return efivars.Efivars(self.efivars).value(name)

    def write_var(self, name: str, value: bytes, attrs: int = EFI_ATTRS_NV_BS_RT) -> None:
        """Write an EFI global variable in one write(), clearing its immutable flag first."""
        efivars.Efivars(self.efivars).write(name, value, attrs)

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
    return efivars.parse_number(entry)


__all__ = ["Mode", "Power", "parse_boot_entry"]
