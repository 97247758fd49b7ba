"""The machine as sysfs and procfs describe it: DMI, CPUs, memory and DIMMs, boot mode, NICs,
InfiniBand ports, GPUs by PCI id, and the BMC address.

Every reader takes ``root`` (default ``/``) and reads ``root/sys/...`` and ``root/proc/...``,
so tests and benchmarks can point it at a fake tree. Readers never raise for a file that is
missing or unreadable: the field stays empty (a machine without DMI, a NIC without a link).
Tools are used only where the kernel does not say it: ``ipmitool lan print`` for the BMC
address.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import logging
import os
import re
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.hw import sysfs

log = logging.getLogger(__name__)

ROOT = Path("/")

# DMI strings firmware vendors leave when they have nothing to say.
_PLACEHOLDERS = {
    "", "to be filled by o.e.m.", "default string", "not specified", "system serial number",
    "system product name", "system manufacturer", "none", "n/a", "0123456789", "not applicable",
    "03000200-0400-0500-0006-000700080009",
}  # fmt: skip

# CPU flags that decide placement: vector units, virtualisation, confidential computing.
CPU_FLAGS = (
    "avx", "avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
    "amx_int8", "vmx", "svm", "sev", "sev_es", "sev_snp", "tdx_guest", "sme", "aes", "sha_ni",
    "pdpe1gb", "hypervisor", "x2apic", "rdrand", "sve", "sve2", "asimd",
)  # fmt: skip

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")           # 3D controller, VGA controller
PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
PCI_IDS = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"))


def _clean(value: str) -> str:
    return "" if value.strip().lower() in _PLACEHOLDERS else value.strip()


# ------------------------------------------------------------------------------ DMI


@dataclass(frozen=True)
class Dmi:
    vendor: str = ""
    product: str = ""
    serial: str = ""
    uuid: str = ""
    firmware_vendor: str = ""
    firmware_version: str = ""
    firmware_date: str = ""
    board_vendor: str = ""
    board_product: str = ""


def read_dmi(root: Path = ROOT) -> Dmi:
    d = root / "sys/class/dmi/id"
    return Dmi(
        vendor=_clean(sysfs.read(d / "sys_vendor")),
        product=_clean(sysfs.read(d / "product_name")),
        serial=_clean(sysfs.read(d / "product_serial")),
        uuid=_clean(sysfs.read(d / "product_uuid")).lower(),
        firmware_vendor=_clean(sysfs.read(d / "bios_vendor")),
        firmware_version=_clean(sysfs.read(d / "bios_version")),
        firmware_date=_clean(sysfs.read(d / "bios_date")),
        board_vendor=_clean(sysfs.read(d / "board_vendor")),
        board_product=_clean(sysfs.read(d / "board_name")),
    )


def boot_mode(root: Path = ROOT) -> str:
    return "efi" if (root / "sys/firmware/efi").is_dir() else "bios"


def kernel_release(root: Path = ROOT) -> str:
    return sysfs.read(root / "proc/sys/kernel/osrelease") or os.uname().release


def hostname(root: Path = ROOT) -> str:
    return sysfs.read(root / "proc/sys/kernel/hostname") or socket.gethostname()


# ------------------------------------------------------------------------------ CPU


@dataclass(frozen=True)
class Cpu:
    model: str
    sockets: int
    cores: int
    threads: int
    architecture: str
    flags: tuple[str, ...]
    max_mhz: float


def read_cpu(root: Path = ROOT) -> Cpu:
    model, flags, mhz = "", set[str](), 0.0
    processors = 0
    for block in sysfs.read(root / "proc/cpuinfo").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        processors += 1
        if processors == 1:
            model = fields.get("model name") or fields.get("Model") or fields.get("cpu model", "")
            flags = set((fields.get("flags") or fields.get("Features") or "").split())
            with contextlib.suppress(ValueError):
                mhz = float(fields.get("cpu MHz", "0"))
    packages: set[str] = set()
    cores: set[tuple[str, str]] = set()
    threads = 0
    cpu_dir = root / "sys/devices/system/cpu"
    with contextlib.suppress(OSError):
        for entry in os.scandir(cpu_dir):
            if not re.fullmatch(r"cpu\d+", entry.name):
                continue
            topo = Path(entry.path) / "topology"
            if not topo.is_dir():
                continue
            threads += 1
            package = sysfs.read(topo / "physical_package_id", "0")
            packages.add(package)
            cores.add((package, sysfs.read(topo / "core_id", entry.name)))
    max_khz = sysfs.read_int(cpu_dir / "cpu0/cpufreq/cpuinfo_max_freq")
    return Cpu(
        model=model,
        sockets=len(packages) or 1,
        cores=len(cores) or processors,
        threads=threads or processors,
        architecture=os.uname().machine,
        flags=tuple(f for f in CPU_FLAGS if f in flags),
        max_mhz=max_khz / 1000 if max_khz else mhz,
    )


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class Dimm:
    locator: str
    size_bytes: int
    type: str
    speed_mts: int
    manufacturer: str
    serial: str
    part_number: str = ""
    bank: str = ""


@dataclass(frozen=True)
class Memory:
    total_bytes: int
    numa_nodes: int
    dimms: tuple[Dimm, ...] = ()


# SMBIOS 3.x, type 17 "Memory Device", byte 0x12 "Memory Type".
MEMORY_TYPES = {
    0x03: "DRAM", 0x0F: "SDRAM", 0x12: "DDR", 0x13: "DDR2", 0x14: "DDR2 FB-DIMM", 0x18: "DDR3",
    0x19: "FBD2", 0x1A: "DDR4", 0x1B: "LPDDR", 0x1C: "LPDDR2", 0x1D: "LPDDR3", 0x1E: "LPDDR4",
    0x1F: "Logical non-volatile device", 0x20: "HBM", 0x21: "HBM2", 0x22: "DDR5", 0x23: "LPDDR5",
    0x24: "HBM3",
}  # fmt: skip


def smbios_structures(table: bytes) -> Iterator[tuple[int, bytes, list[str]]]:
    """(type, formatted area, strings) of each SMBIOS structure in a raw DMI table."""
    offset = 0
    while offset + 4 <= len(table):
        kind, length = table[offset], table[offset + 1]
        if length < 4 or offset + length > len(table):
            return
        formatted = table[offset : offset + length]
        end = table.find(b"\x00\x00", offset + length)
        if end < 0:
            return
        raw = table[offset + length : end]
        strings = [s.decode("latin-1").strip() for s in raw.split(b"\x00")] if raw else []
        yield kind, formatted, strings
        if kind == 127:
            return
        offset = end + 2


def parse_dimms(table: bytes) -> list[Dimm]:
    """Populated memory devices (SMBIOS type 17) of a raw DMI table."""
    dimms: list[Dimm] = []
    for kind, f, strings in smbios_structures(table):
        if kind != 17 or len(f) < 0x15:
            continue

        def string(at: int, f: bytes = f, strings: list[str] = strings) -> str:
            index = f[at] if at < len(f) else 0
            return _clean(strings[index - 1]) if 0 < index <= len(strings) else ""

        def word(at: int, f: bytes = f) -> int:
            return int(struct.unpack_from("<H", f, at)[0]) if at + 2 <= len(f) else 0

        def dword(at: int, f: bytes = f) -> int:
            return int(struct.unpack_from("<I", f, at)[0]) if at + 4 <= len(f) else 0

        size = word(0x0C)
        if size in (0, 0xFFFF):
            continue  # empty slot, or size unknown
        if size == 0x7FFF:
            size_bytes = (dword(0x1C) & 0x7FFFFFFF) << 20
        elif size & 0x8000:
            size_bytes = (size & 0x7FFF) << 10
        else:
            size_bytes = size << 20
        speed = word(0x15)
        if speed == 0xFFFF:
            speed = dword(0x54)
        dimms.append(
            Dimm(
                locator=string(0x10),
                bank=string(0x11),
                size_bytes=size_bytes,
                type=MEMORY_TYPES.get(f[0x12], f"type 0x{f[0x12]:02x}"),
                speed_mts=speed,
                manufacturer=string(0x17),
                serial=string(0x18),
                part_number=string(0x1A),
            )
        )
    return dimms


def read_memory(root: Path = ROOT) -> Memory:
    total = 0
    for line in sysfs.read(root / "proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
            break
    nodes = 0
    with contextlib.suppress(OSError):
        entries = os.scandir(root / "sys/devices/system/node")
        nodes = sum(1 for e in entries if re.fullmatch(r"node\d+", e.name))
    try:
        table = (root / "sys/firmware/dmi/tables/DMI").read_bytes()
    except OSError:
        table = b""
    return Memory(total_bytes=total, numa_nodes=nodes or 1, dimms=tuple(parse_dimms(table)))


# ----------------------------------------------------------------------------- NICs


@dataclass(frozen=True)
class Nic:
    name: str
    mac: str
    driver: str
    speed_mbps: int
    link: bool
    pci_address: str
    mtu: int
    addresses: tuple[str, ...] = ()
    firmware_version: str = ""
    driver_version: str = ""


def pci_address_of(device: Path) -> str:
    """The PCI address a sysfs device sits on (itself or its nearest PCI parent), or ""."""
    real = Path(os.path.realpath(device))
    for part in (real, *real.parents):
        if PCI_ADDRESS.fullmatch(part.name):
            return part.name.lower()
    return ""


def _ipv6_addresses(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in sysfs.read(root / "proc/net/if_inet6").splitlines():
        fields = line.split()
        if len(fields) != 6:
            continue
        with contextlib.suppress(ValueError):
            addr = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            found.setdefault(fields[5], []).append(f"{addr}/{int(fields[2], 16)}")
    return found


def _ipv4_address(name: str) -> str:
    """The interface's primary IPv4 address with prefix (SIOCGIFADDR/NETMASK), or ""."""
    SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B
    request = struct.pack("256s", name.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)[20:24])
            mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFNETMASK, request)[20:24])
    except OSError:
        return ""
    return f"{addr}/{ipaddress.IPv4Network(f'0.0.0.0/{mask}').prefixlen}"


SIOCETHTOOL, ETHTOOL_GDRVINFO = 0x8946, 0x3
_DRVINFO = struct.Struct("<I32s32s32s32s32s12s5I")   # struct ethtool_drvinfo (linux/ethtool.h)


@dataclass(frozen=True)
class DriverInfo:
    driver: str
    version: str
    firmware_version: str


def driver_info(name: str) -> DriverInfo | None:
    """The NIC's driver and firmware versions from the kernel (ETHTOOL_GDRVINFO, the ioctl
    behind ``ethtool -i``); None when the interface or the driver does not say."""
    buf = bytearray(_DRVINFO.size)
    struct.pack_into("<I", buf, 0, ETHTOOL_GDRVINFO)
    data = (ctypes.c_char * len(buf)).from_buffer(buf)
    request = struct.pack("16sP", name.encode()[:15], ctypes.addressof(data))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, request)
    except OSError:
        return None
    fields = _DRVINFO.unpack(bytes(buf))

    def text(raw: bytes) -> str:
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()

    firmware = text(fields[3])
    return DriverInfo(driver=text(fields[1]), version=text(fields[2]),
                      firmware_version="" if firmware.upper() in ("N/A", "") else firmware)


def driver_of(device: Path) -> str:
    """The name of the driver bound to a sysfs device, "" when none is (one readlink)."""
    try:
        return os.path.basename(os.readlink(device / "driver"))
    except OSError:
        return ""


def read_nics(root: Path = ROOT) -> list[Nic]:
    """Physical network interfaces (those backed by a device), sorted by name."""
    base = root / "sys/class/net"
    ipv6 = _ipv6_addresses(root)
    nics: list[Nic] = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return nics
    for name in names:
        d = base / name
        if not (d / "device").exists():
            continue  # virtual: loopback, bridge, bond, veth, ifb...
        speed = sysfs.read_int(d / "speed", -1)  # EINVAL while the link is down
        addresses = [a for a in [_ipv4_address(name) if root == ROOT else ""] if a] + ipv6.get(name, [])
        info = driver_info(name) if root == ROOT else None
        nics.append(
            Nic(
                name=name,
                mac=sysfs.read(d / "address").lower(),
                driver=driver_of(d / "device"),
                speed_mbps=speed if speed > 0 else 0,
                link=sysfs.read(d / "carrier") == "1",
                pci_address=pci_address_of(d / "device"),
                mtu=sysfs.read_int(d / "mtu"),
                addresses=tuple(addresses),
                firmware_version=info.firmware_version if info else "",
                driver_version=info.version if info else "",
            )
        )
    return nics


# ----------------------------------------------------------------------- InfiniBand


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str
    rate: str
    guid: str
    link_layer: str


def _gid_guid(gid: str) -> str:
    """The port GUID: the interface id (low 64 bits) of GID 0, as 4 groups."""
    groups = gid.split(":")
    return ":".join(groups[4:]) if len(groups) == 8 else ""


def read_infiniband(root: Path = ROOT) -> list[IbPort]:
    base = root / "sys/class/infiniband"
    ports: list[IbPort] = []
    with contextlib.suppress(OSError):
        for device in sorted(os.listdir(base)):
            port_dir = base / device / "ports"
            with contextlib.suppress(OSError):
                for port in sorted(os.listdir(port_dir), key=lambda p: int(p) if p.isdigit() else 0):
                    p = port_dir / port
                    state = sysfs.read(p / "state")  # "4: ACTIVE"
                    ports.append(
                        IbPort(
                            device=device,
                            port=int(port) if port.isdigit() else 0,
                            state=state.split(":", 1)[-1].strip(),
                            rate=sysfs.read(p / "rate"),
                            guid=_gid_guid(sysfs.read(p / "gids/0"))
                            or sysfs.read(base / device / "node_guid"),
                            link_layer=sysfs.read(p / "link_layer"),
                        )
                    )
    return ports


# ---------------------------------------------------------------------- GPUs by PCI


@dataclass(frozen=True)
class PciGpu:
    pci_address: str
    vendor_id: str                           # "10de"
    device_id: str                           # "2330"
    name: str


def pci_device_names(vendor: str, devices: set[str], paths: tuple[Path, ...] = PCI_IDS) -> dict[str, str]:
    """Names of ``devices`` of ``vendor`` (4 hex digits) from the pci.ids database, if present."""
    names: dict[str, str] = {}
    for path in paths:
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                inside = False
                for line in f:
                    if not line.startswith("\t"):
                        if inside:
                            return names
                        inside = line.startswith(vendor + "  ")
                    elif inside and not line.startswith("\t\t"):
                        dev, _, name = line.strip().partition("  ")
                        if dev in devices:
                            names[dev] = name.strip()
        except OSError:
            continue
        return names
    return names


def read_pci_gpus(root: Path = ROOT, vendor: str = NVIDIA_VENDOR) -> list[PciGpu]:
    """GPUs of ``vendor`` on the PCI bus (3D or VGA controllers), sorted by address."""
    base = root / "sys/bus/pci/devices"
    found: list[tuple[str, str]] = []
    with contextlib.suppress(OSError):
        for address in sorted(os.listdir(base)):
            d = base / address
            if sysfs.read(d / "vendor").lower() != vendor:
                continue
            if not sysfs.read(d / "class").lower().startswith(GPU_CLASSES):
                continue
            found.append((address.lower(), sysfs.read(d / "device").lower().removeprefix("0x")))
    names = pci_device_names(vendor.removeprefix("0x"), {dev for _, dev in found}) if found else {}
    return [
        PciGpu(address, vendor.removeprefix("0x"), dev, names.get(dev, "")) for address, dev in found
    ]


# ------------------------------------------------------------------------------ BMC

IPMI_DEVICES = (Path("/dev/ipmi0"), Path("/dev/ipmi/0"), Path("/dev/ipmidev/0"))
Runner = Callable[[list[str]], str]


def parse_lan_print(text: str) -> str:
    """The BMC's IP address from ``ipmitool lan print`` output, "" when unset."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "IP Address":
            value = value.strip()
            return "" if value in ("", "0.0.0.0") else value  # noqa: S104  (unset, not a bind)
    return ""


def bmc_address(
    run: Runner, channels: tuple[int, ...] = (1, 8, 2), devices: tuple[Path, ...] = IPMI_DEVICES
) -> str:
    """The BMC address through ``ipmitool lan print`` where an IPMI device exists, else "".

    ``run(argv)`` returns stdout (raises AgentError on failure); channel 1 is the usual LAN
    channel, 8 and 2 are common on Dell and Supermicro boards.
    """
    if not any(p.exists() for p in devices):
        return ""
    for channel in channels:
        try:
            address = parse_lan_print(run(["ipmitool", "lan", "print", str(channel)]))
        except Exception as exc:  # a BMC that does not answer is no inventory failure
            log.debug("ipmitool lan print %d: %s", channel, exc)
            continue
        if address:
            return address
    return ""


@dataclass(frozen=True)
class Machine:
    """Everything this module reads, in one value (what inventory.refresh reports)."""

    dmi: Dmi
    cpu: Cpu
    memory: Memory
    nics: tuple[Nic, ...]
    infiniband: tuple[IbPort, ...]
    boot_mode: str
    kernel: str
    hostname: str


def read_machine(root: Path = ROOT) -> Machine:
    return Machine(
        dmi=read_dmi(root),
        cpu=read_cpu(root),
        memory=read_memory(root),
        nics=tuple(read_nics(root)),
        infiniband=tuple(read_infiniband(root)),
        boot_mode=boot_mode(root),
        kernel=kernel_release(root),
        hostname=hostname(root),
    )
