"""Block devices: discovery through sysfs, identity, root-device-hint matching, safety checks,
the few ioctls we need, and opening a disk for I/O.

Disks come from ``/sys/block`` (``/sys/class/nvme`` for the NVMe controller behind a
namespace), never from a tool's table output. A plain file can stand in for a disk
(``file_disk``): tests and benchmarks use files and loop devices.

Safety (``check_safe``): a disk is refused when it, or one of its partitions, is mounted, is
active swap, holds the running system (the root filesystem resolves down through dm/md/LVM to
it), or has holders (a dm, md or LVM device built on top of it). Opening a block device for
writing uses O_EXCL, which the kernel refuses while anything else holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import stat
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import AgentError, InvalidParameters, NotFound, ProtectedDevice, Reason
from agent.hw import sysfs
from agent.proto import common_pb2

log = logging.getLogger(__name__)

# linux/fs.h
BLKRRPART = 0x125F
BLKGETSIZE64 = 0x80081272
BLKDISCARD = 0x1277
BLKZEROOUT = 0x127F
BLKFLSBUF = 0x1261

# Kernel names of the devices we consider disks (loop devices only with a backing file).
_DISK_PREFIXES = ("sd", "nvme", "vd", "xvd", "hd", "mmcblk", "loop")
_MiB = 1024 * 1024


@dataclass(frozen=True)
class Disk:
    name: str                   # kernel name ("sda", "nvme0n1", "loop3") or the file's name
    path: Path                  # /dev/<name>, or the file
    size: int
    logical_block_size: int = 512
    physical_block_size: int = 512
    model: str = ""
    serial: str = ""
    wwn: str = ""
    vendor: str = ""
    firmware: str = ""
    transport: str = ""         # nvme, sata, sas, scsi, virtio, usb, mmc, loop, file
    by_path: str = ""           # /dev/disk/by-path/... link pointing at it
    rotational: bool = False
    is_file: bool = False
    discard_max_bytes: int = 0
    controller: str = ""        # NVMe controller name ("nvme0") for an NVMe namespace
    nsid: int = 0

    @property
    def supports_discard(self) -> bool:
        return self.is_file or self.discard_max_bytes > 0

    def identity(self) -> common_pb2.DiskIdentity:
        return common_pb2.DiskIdentity(
            name=self.name,
            model=self.model,
            serial=self.serial,
            wwn=self.wwn,
            size_bytes=self.size,
            transport=self.transport,
            by_path=self.by_path,
            logical_block_size=self.logical_block_size,
            physical_block_size=self.physical_block_size,
            rotational=self.rotational,
            firmware=self.firmware,
        )


# ---------------------------------------------------------------------------- discovery


def _transport(name: str, devpath: str) -> str:
    if name.startswith("nvme"):
        return "nvme"
    if name.startswith("loop"):
        return "loop"
    if name.startswith(("vd", "xvd")):
        return "virtio"
    if name.startswith("mmcblk"):
        return "mmc"
    if "/usb" in devpath:
        return "usb"
    if "/ata" in devpath:
        return "sata"
    if "/sas_" in devpath or "/end_device-" in devpath or "/port-" in devpath:
        return "sas"
    return "scsi"


def _serial(sysdir: Path) -> str:
    for candidate in (sysdir / "device" / "serial", sysdir / "serial"):
        value = sysfs.read(candidate)
        if value:
            return value
    try:  # SCSI VPD page 0x80: 4 header bytes, then the serial.
        raw = (sysdir / "device" / "vpd_pg80").read_bytes()
        return raw[4:].decode("ascii", "replace").strip(" \x00")
    except OSError:
        return ""


def _wwn(sysdir: Path) -> str:
    for candidate in (sysdir / "wwid", sysdir / "device" / "wwid"):
        value = sysfs.read(candidate)
        if value:
            return value
    return ""


def _by_path_links(dev_root: Path) -> dict[str, str]:
    links: dict[str, str] = {}
    directory = dev_root / "disk" / "by-path"
    with contextlib.suppress(OSError):
        for link in sorted(directory.iterdir()):
            with contextlib.suppress(OSError):
                target = os.path.basename(os.path.realpath(link))
                links.setdefault(target, str(link))
    return links


def _is_disk_name(name: str) -> bool:
    if not name.startswith(_DISK_PREFIXES):
        return False
    # nvme0c0n1: a hidden multipath path of nvme0n1, not a disk of its own.
    return not (name.startswith("nvme") and "c" in name[4:].split("n", 1)[0])


def read_disk(name: str, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev"),
              by_path: dict[str, str] | None = None) -> Disk | None:
    """The disk ``name`` as sysfs describes it; None when it is not a usable disk."""
    sysdir = sys_root / "block" / name
    if not sysdir.exists() or sysfs.read(sysdir / "hidden") == "1":
        return None
    size = sysfs.read_int(sysdir / "size") * 512
    if name.startswith("loop") and not (sysdir / "loop" / "backing_file").exists():
        return None
    if size == 0:
        return None
    devpath = os.path.realpath(sysdir)
    controller, nsid = "", 0
    if name.startswith("nvme"):
        controller = os.path.basename(os.path.realpath(sysdir / "device"))
        if not controller.startswith("nvme"):
            controller = name[: name.rindex("n")]
        nsid = sysfs.read_int(sysdir / "nsid") or int(name.rsplit("n", 1)[1] or 0)
    links = by_path if by_path is not None else _by_path_links(dev_root)
    device = sysdir / "device"
    return Disk(
        name=name,
        path=dev_root / name,
        size=size,
        logical_block_size=sysfs.read_int(sysdir / "queue" / "logical_block_size", 512),
        physical_block_size=sysfs.read_int(sysdir / "queue" / "physical_block_size", 512),
        model=sysfs.read(device / "model"),
        serial=_serial(sysdir),
        wwn=_wwn(sysdir),
        vendor=sysfs.read(device / "vendor"),
        firmware=sysfs.read(device / "firmware_rev") or sysfs.read(device / "rev"),
        transport=_transport(name, devpath),
        by_path=links.get(name, ""),
        rotational=sysfs.read(sysdir / "queue" / "rotational") == "1",
        discard_max_bytes=sysfs.read_int(sysdir / "queue" / "discard_max_bytes"),
        controller=controller,
        nsid=nsid,
    )


def list_disks(sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> list[Disk]:
    """Every disk of this machine (loop devices included when they have a backing file)."""
    disks: list[Disk] = []
    links = _by_path_links(dev_root)
    with contextlib.suppress(OSError):
        for entry in sorted((sys_root / "block").iterdir()):
            if _is_disk_name(entry.name):
                disk = read_disk(entry.name, sys_root, dev_root, links)
                if disk is not None:
                    disks.append(disk)
    return disks


def file_disk(path: str | os.PathLike[str]) -> Disk:
    """A regular file standing in for a disk (tests, benchmarks)."""
    p = Path(path)
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):
        raise InvalidParameters(f"{p}: not a regular file")
    return Disk(name=p.name, path=p, size=st.st_size, transport="file", is_file=True,
                model="file", serial=f"file-{st.st_ino}")


# ---------------------------------------------------------------------------- hints


@dataclass(frozen=True)
class Hints:
    """Root-device-hint style selection; every field that is set must match."""

    serial: str = ""
    wwn: str = ""
    model: str = ""
    vendor: str = ""
    min_size: int = 0
    max_size: int = 0
    by_path: str = ""
    name: str = ""

    @classmethod
    def from_proto(cls, msg: common_pb2.DiskHints) -> Hints:
        name = msg.name.strip()
        if name.startswith("/dev/"):
            name = name[5:]
        if "/" in name or name in (".", ".."):
            raise InvalidParameters(f"disk name {msg.name!r}: a kernel name like 'sda', no path")
        by_path = msg.by_path.strip()
        if by_path and "/" in by_path and not by_path.startswith("/dev/disk/by-path/"):
            raise InvalidParameters(f"by_path {by_path!r}: must be a /dev/disk/by-path/ name")
        if ".." in by_path:
            raise InvalidParameters(f"by_path {by_path!r}: no '..' allowed")
        if msg.max_size_bytes and msg.min_size_bytes > msg.max_size_bytes:
            raise InvalidParameters("min_size_bytes is larger than max_size_bytes")
        hints = cls(
            serial=msg.serial.strip(), wwn=msg.wwn.strip(), model=msg.model.strip(),
            vendor=msg.vendor.strip(), min_size=msg.min_size_bytes, max_size=msg.max_size_bytes,
            by_path=by_path, name=name,
        )
        if hints == cls():
            raise InvalidParameters("disk hints are empty: name at least one property of the disk")
        return hints

    def describe(self) -> str:
        parts = [f"{k}={v!r}" for k, v in self.__dict__.items() if v]
        return ", ".join(parts)

    def matches(self, disk: Disk) -> bool:
        if self.name and disk.name != self.name:
            return False
        if self.serial and disk.serial != self.serial:
            return False
        if self.wwn and _norm_wwn(disk.wwn) != _norm_wwn(self.wwn):
            return False
        if self.model and self.model.lower() not in disk.model.lower():
            return False
        if self.vendor and self.vendor.lower() not in disk.vendor.lower():
            return False
        if self.min_size and disk.size < self.min_size:
            return False
        if self.max_size and disk.size > self.max_size:
            return False
        if self.by_path:
            have = disk.by_path if "/" in self.by_path else os.path.basename(disk.by_path)
            if not disk.by_path or have != self.by_path:
                return False
        return True


def _norm_wwn(value: str) -> str:
    v = value.strip().lower()
    for prefix in ("naa.", "eui.", "t10.", "nvme.", "0x"):
        if v.startswith(prefix):
            v = v[len(prefix):]
    return v


def select(disks: Iterable[Disk], hints: Hints) -> Disk:
    """The one disk matching ``hints``; NotFound or AMBIGUOUS otherwise."""
    found = [d for d in disks if hints.matches(d)]
    if not found:
        raise NotFound(f"no disk matches {hints.describe()}", hints=hints.describe())
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise AgentError(
            f"{len(found)} disks match {hints.describe()}: {names}; give a more specific hint",
            reason=Reason.AMBIGUOUS,
            disks=names,
        )
    return found[0]


# ---------------------------------------------------------------------------- safety


def _devnum(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split(":")
        return int(major), int(minor)
    except ValueError:
        return None


@dataclass
class SystemUse:
    """Which block devices (major, minor) the running system uses, and why."""

    uses: dict[tuple[int, int], str] = field(default_factory=dict)

    @classmethod
    def scan(cls, proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> SystemUse:
        use = cls()
        with contextlib.suppress(OSError):
            for line in (proc_root / "self" / "mountinfo").read_text().splitlines():
                fields = line.split()
                if len(fields) < 5:
                    continue
                dev = _devnum(fields[2])
                if dev is not None and dev[0] != 0:
                    why = "holds the root filesystem" if fields[4] == "/" else f"mounted at {fields[4]}"
                    use.add(dev, why, sys_root)
        with contextlib.suppress(OSError):
            for line in (proc_root / "swaps").read_text().splitlines()[1:]:
                path = line.split()[0] if line.split() else ""
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    if stat.S_ISBLK(st.st_mode):
                        use.add((os.major(st.st_rdev), os.minor(st.st_rdev)), f"active swap {path}", sys_root)
        return use

    def add(self, dev: tuple[int, int], why: str, sys_root: Path, depth: int = 0) -> None:
        """Record ``dev`` and, through dm/md/LVM slaves, every device below it."""
        if dev in self.uses or depth > 16:
            return
        self.uses[dev] = why
        node = Path(os.path.realpath(sys_root / "dev" / "block" / f"{dev[0]}:{dev[1]}"))
        for slave_dir in (node / "slaves",):
            with contextlib.suppress(OSError):
                for slave in slave_dir.iterdir():
                    sdev = _devnum(sysfs.read(slave / "dev"))
                    if sdev is not None:
                        self.add(sdev, why + f" (through {node.name})", sys_root, depth + 1)
        # A partition is used: its parent disk holds it.
        if (node / "partition").exists():
            pdev = _devnum(sysfs.read(node.parent / "dev"))
            if pdev is not None:
                self.uses.setdefault(pdev, f"{node.name} {why}")


def _sysdir(disk: Disk, sys_root: Path) -> Path:
    return sys_root / "block" / disk.name


def check_safe(disk: Disk, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> None:
    """Refuse (ProtectedDevice) a disk that is mounted, swap, holds the system, or is held."""
    if disk.is_file:
        return
    sysdir = _sysdir(disk, sys_root)
    devs: list[tuple[str, tuple[int, int]]] = []
    own = _devnum(sysfs.read(sysdir / "dev"))
    if own is not None:
        devs.append((disk.name, own))
    with contextlib.suppress(OSError):
        for part in sorted(sysdir.iterdir()):
            if (part / "partition").exists():
                pdev = _devnum(sysfs.read(part / "dev"))
                if pdev is not None:
                    devs.append((part.name, pdev))
    use = SystemUse.scan(proc_root, sys_root)
    for name, dev in devs:
        if dev in use.uses:
            raise ProtectedDevice(f"{disk.name}: {name} {use.uses[dev]}", disk=disk.name)
    for name, _dev in devs:
        holders_dir = sysdir / "holders" if name == disk.name else sysdir / name / "holders"
        with contextlib.suppress(OSError):
            holders = sorted(h.name for h in holders_dir.iterdir())
            if holders:
                raise ProtectedDevice(
                    f"{disk.name}: {name} is held by {', '.join(holders)} (RAID, LVM or device-mapper)",
                    disk=disk.name,
                )


# ---------------------------------------------------------------------------- I/O


def open_disk(disk: Disk, *, write: bool, direct: bool = False, exclusive: bool | None = None) -> int:
    """An fd on the disk; O_EXCL for a block device opened to write (refused while in use).

    Only one O_EXCL open of a block device succeeds, even within this process: open the
    first fd exclusive and the others (``exclusive=False``) while it is held.
    """
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
    if direct:
        flags |= os.O_DIRECT
    if (write if exclusive is None else exclusive) and not disk.is_file:
        flags |= os.O_EXCL
    try:
        return os.open(disk.path, flags)
    except OSError as exc:
        if exc.errno == 16:  # EBUSY
            raise ProtectedDevice(f"{disk.name}: in use (exclusive open refused)", disk=disk.name) from exc
        raise


def try_direct(disk: Disk, *, write: bool, exclusive: bool = False) -> int | None:
    """An O_DIRECT fd, or None when the device or filesystem refuses O_DIRECT."""
    try:
        return open_disk(disk, write=write, direct=True, exclusive=exclusive)
    except OSError as exc:
        if exc.errno in (22, 95):  # EINVAL, EOPNOTSUPP: no O_DIRECT here (tmpfs...)
            return None
        raise


def _ioctl_u64(fd: int, request: int) -> int:
    buf = bytearray(8)
    fcntl.ioctl(fd, request, buf)
    value: int = struct.unpack("Q", buf)[0]
    return value


def size_of(fd: int) -> int:
    st = os.fstat(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else _ioctl_u64(fd, BLKGETSIZE64)


def discard(fd: int, start: int = 0, length: int | None = None) -> None:
    """BLKDISCARD the range; a regular file gets the range deallocated (punched: it reads
    zeros after, and keeps its size)."""
    st = os.fstat(fd)
    if length is None:
        length = size_of(fd) - start
    if stat.S_ISREG(st.st_mode):
        try:
            _punch_hole(fd, start, length)
        except OSError:
            zero_out(fd, start, length)
        return
    fcntl.ioctl(fd, BLKDISCARD, struct.pack("QQ", start, length))


def _punch_hole(fd: int, start: int, length: int) -> None:
    """fallocate(PUNCH_HOLE | KEEP_SIZE): deallocate a file range; it reads zeros after."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc is among them
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if libc.fallocate(fd, 0x02 | 0x01, start, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def zero_out(fd: int, start: int, length: int) -> None:
    """BLKZEROOUT the range (written zeros for a regular file)."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        zeros = bytes(min(length, 4 * _MiB))
        done = 0
        while done < length:
            n = min(len(zeros), length - done)
            os.pwrite(fd, zeros[:n], start + done)
            done += n
        return
    fcntl.ioctl(fd, BLKZEROOUT, struct.pack("QQ", start, length))


def flush_buffers(fd: int) -> None:
    """BLKFLSBUF: drop the kernel's cached blocks of a device erased behind its back
    (NVMe format/sanitize, ATA erase); nothing for a regular file."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        try:
            fcntl.ioctl(fd, BLKFLSBUF)
        except OSError as exc:
            log.info("BLKFLSBUF refused: %s", exc)


def reread_partitions(fd: int) -> bool:
    """BLKRRPART; False for a regular file or a device without partition support."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return False
    try:
        fcntl.ioctl(fd, BLKRRPART)
        return True
    except OSError as exc:
        log.info("BLKRRPART refused: %s", exc)
        return False


def sample_offsets(size: int, count: int, block: int, seed: int | None = None) -> list[int]:
    """``count`` block-aligned offsets spread over the disk: first, last, and random ones."""
    blocks = size // block
    if blocks <= 0:
        return []
    rng = random.Random(seed)
    chosen = {0, blocks - 1}
    while len(chosen) < min(count, blocks):
        chosen.add(rng.randrange(blocks))
    return sorted(b * block for b in chosen)


def reads_zeros(fd: int, offsets: Sequence[int], block: int) -> bool:
    """True when every sampled block reads all zeros."""
    zeros = bytes(block)
    return all(os.pread(fd, block, off) == zeros for off in offsets)


def clear_ends(fd: int, size: int, head: int = 4 * _MiB, tail: int = _MiB) -> None:
    """Zero the start (MBR, GPT, boot code, first superblocks) and the end (backup GPT)."""
    head = min(head, size)
    zero_out(fd, 0, head)
    tail_start = max(head, size - tail)
    tail_start -= tail_start % 512
    if tail_start < size:
        zero_out(fd, tail_start, size - tail_start)
    os.fsync(fd)


@contextlib.contextmanager
def opened(disk: Disk, *, write: bool, direct: bool = False) -> Iterator[int]:
    fd = open_disk(disk, write=write, direct=direct)
    try:
        yield fd
    finally:
        os.close(fd)
