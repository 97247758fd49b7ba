"""UEFI variables through efivarfs: read, write, delete; the boot entries and the Secure Boot state.

Each file of efivarfs (``/sys/firmware/efi/efivars``) is named ``Name-GUID`` and holds the
variable's 4 attribute bytes (little-endian) and then its value. The kernel marks most of them
immutable (``chattr +i``): the flag is cleared (FS_IOC_SETFLAGS) on the one file written or
deleted, and only there. ``Efivars(directory)`` takes the directory, so tests use a plain
directory of files in the same format.

A load option (``Boot####``, UEFI 2.10 section 3.1.3) is attributes (u32), the device path's
length (u16), the description (UCS-2, NUL-terminated), the device path and optional data.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError, InvalidParameters, NotFound, Reason

log = logging.getLogger(__name__)

EFIVARS = Path("/sys/firmware/efi/efivars")
GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"            # EFI_GLOBAL_VARIABLE
IMAGE_SECURITY = "d719b2cb-3d3a-4596-a3bc-dad00e67656f"    # db, dbx (EFI_IMAGE_SECURITY_DATABASE)
MOR = "e20939be-32d4-41be-a150-897f85d49829"               # MemoryOverwriteRequestControl
# NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS
ATTRS_NV_BS_RT = 0x7

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x10

LOAD_ORDERS = ("BootOrder", "DriverOrder", "SysPrepOrder")   # the load options' orders (UEFI 3.1)
AUTHENTICATED = 0x10 | 0x20          # EFI_VARIABLE_(TIME_BASED_)AUTHENTICATED_WRITE_ACCESS
_BOOT_ENTRY = re.compile(r"Boot([0-9A-F]{4})-" + GLOBAL)
ABSENT = "absent"


@dataclass(frozen=True)
class Variable:
    attributes: int
    value: bytes


@dataclass(frozen=True)
class BootEntry:
    number: int
    value: bytes                      # the whole load option

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.value).hexdigest()

    @property
    def description(self) -> str:
        """The load option's description, "" when the option is malformed. Whoever wrote the
        entry chose it: what is not printable becomes "?", and it is cut at 128 characters."""
        if len(self.value) < 6:
            return ""
        raw = self.value[6:]
        end = next((i for i in range(0, len(raw) - 1, 2) if raw[i:i + 2] == b"\0\0"), -1)
        if end < 0:
            return ""
        text = raw[:end].decode("utf-16-le", "replace")[:128]
        return "".join(c if c.isprintable() else "?" for c in text)


def load_option(description: str, device_path: bytes = b"\x7f\xff\x04\x00", attributes: int = 1) -> bytes:
    """A load option (LOAD_OPTION_ACTIVE by default; the device path: an end node)."""
    return (struct.pack("<IH", attributes, len(device_path)) + (description + "\0").encode("utf-16-le")
            + device_path)


def boot_name(number: int) -> str:
    return f"Boot{number:04X}"


class Efivars:
    """The UEFI variables under ``directory`` (efivarfs, or a test's directory of its files)."""

    def __init__(self, directory: Path = EFIVARS) -> None:
        self.directory = directory

    @property
    def present(self) -> bool:
        return self.directory.is_dir()

    def path(self, name: str, guid: str = GLOBAL) -> Path:
        return self.directory / f"{name}-{guid}"

    def read(self, name: str, guid: str = GLOBAL) -> Variable | None:
        """The variable, None when it does not exist."""
        try:
            data = self.path(name, guid).read_bytes()
        except FileNotFoundError:
            return None
        if len(data) < 4:
            return Variable(0, b"")
        return Variable(struct.unpack("<I", data[:4])[0], data[4:])

    def value(self, name: str, guid: str = GLOBAL) -> bytes | None:
        var = self.read(name, guid)
        return None if var is None else var.value

    def sha256(self, name: str, guid: str = GLOBAL) -> str:
        """The hex sha256 of the value, "absent" when the variable does not exist."""
        value = self.value(name, guid)
        return ABSENT if value is None else hashlib.sha256(value).hexdigest()

    def flag(self, name: str, guid: str = GLOBAL) -> int | None:
        """A one-byte variable (SecureBoot, SetupMode, MOR) as a number; None when absent."""
        value = self.value(name, guid)
        return value[0] if value else None

    def write(self, name: str, value: bytes, attributes: int = ATTRS_NV_BS_RT, guid: str = GLOBAL) -> None:
        """Write the variable in one write() (efivarfs takes a variable whole), immutable flag cleared."""
        path = self.path(name, guid)
        if path.exists():
            clear_immutable(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise AgentError(f"cannot open EFI variable {name}: {exc.strerror}", reason=Reason.TOOL_FAILED,
                             variable=name) from exc
        try:
            os.write(fd, struct.pack("<I", attributes) + value)
        except OSError as exc:
            raise AgentError(f"cannot write EFI variable {name}: {exc.strerror}",
                             reason=Reason.TOOL_FAILED, variable=name) from exc
        finally:
            os.close(fd)

    def delete(self, name: str, guid: str = GLOBAL) -> None:
        """Delete the variable (NotFound when it does not exist), immutable flag cleared first."""
        path = self.path(name, guid)
        if not path.exists():
            raise NotFound(f"EFI variable {name} does not exist", variable=name)
        clear_immutable(path)
        try:
            path.unlink()
        except OSError as exc:
            raise AgentError(f"cannot delete EFI variable {name}: {exc.strerror}",
                             reason=Reason.TOOL_FAILED, variable=name) from exc

    def every(self) -> list[tuple[str, Variable]]:
        """Every variable as ("Name-GUID", its attributes and value), by file name; one that went
        away while listed is left out."""
        found = []
        for entry in sorted(os.listdir(self.directory)):
            try:
                data = (self.directory / entry).read_bytes()
            except FileNotFoundError:
                continue
            attrs = struct.unpack("<I", data[:4])[0] if len(data) >= 4 else 0
            found.append((entry, Variable(attrs, data[4:])))
        return found

    # -- boot entries ---------------------------------------------------------------------

    def boot_entries(self) -> list[BootEntry]:
        """Every Boot#### variable, by number."""
        if not self.present:
            return []
        found = []
        for entry in sorted(os.listdir(self.directory)):
            match = _BOOT_ENTRY.fullmatch(entry)
            if match is None:
                continue
            value = self.value(entry[: -len(GLOBAL) - 1])
            if value is not None:
                found.append(BootEntry(int(match.group(1), 16), value))
        return found

    def boot_order(self) -> list[int] | None:
        """BootOrder's entry numbers; None when there is no BootOrder."""
        value = self.value("BootOrder")
        if value is None:
            return None
        return [struct.unpack_from("<H", value, i)[0] for i in range(0, len(value) - 1, 2)]

    def set_boot_order(self, order: list[int]) -> None:
        for number in order:
            if not 0 <= number <= 0xFFFF:
                raise InvalidParameters(f"boot entry {number} is not a 16-bit number")
        self.write("BootOrder", b"".join(struct.pack("<H", n) for n in order))
        log.info("EFI BootOrder = %s", ",".join(f"{n:04X}" for n in order))

    def delete_boot_entry(self, number: int) -> None:
        """Delete Boot#### and take it out of BootOrder."""
        self.delete(boot_name(number))
        order = self.boot_order()
        if order is not None and number in order:
            self.set_boot_order([n for n in order if n != number])
        log.info("EFI %s deleted", boot_name(number))


def parse_number(text: str) -> int:
    """A boot entry's number from "0003", "3" or "Boot0003"; InvalidParameters otherwise."""
    digits = text.strip()
    if digits.lower().startswith("boot"):
        digits = digits[4:]
    if not 1 <= len(digits) <= 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise InvalidParameters(f"boot entry must be 1-4 hex digits like '0003', not {text!r}")
    return int(digits, 16)


def clear_immutable(path: Path) -> None:
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
