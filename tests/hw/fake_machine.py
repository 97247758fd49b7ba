"""A fake sysfs/procfs tree of a GPU server, for agent.hw.system and inventory.refresh tests
and for bench/inventory_bench.py: DMI with an SMBIOS table (DIMMs), CPUs and topology,
memory and NUMA nodes, NVMe and SATA disks, PCI NICs, InfiniBand ports and NVIDIA GPUs.

    root = build_machine(tmp_path / "root", gpus=8, disks=30)
    system.read_machine(root); inventory.collect(root)
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

SERIAL = "SRV-4711"
UUID = "4c4c4544-0042-3510-8052-b4c04f4d3433"


def write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text + "\n")


def smbios(kind: int, handle: int, formatted: bytes, strings: list[str]) -> bytes:
    """One SMBIOS structure: header, formatted area, string set."""
    head = struct.pack("<BBH", kind, 4 + len(formatted), handle)
    tail = b"".join(s.encode() + b"\x00" for s in strings) + b"\x00" if strings else b"\x00\x00"
    return head + formatted + tail


def memory_device(
    handle: int,
    size_mib: int,
    locator: str,
    *,
    mem_type: int = 0x22,
    speed: int = 4800,
    manufacturer: str = "Samsung",
    serial: str = "",
    part: str = "M321R8GA0BB0-CQKZJ",
    extended_speed: int = 0,
) -> bytes:
    """SMBIOS type 17 (SMBIOS 3.3 layout, 0x5C bytes formatted incl. header)."""
    if size_mib >= 0x7FFF:
        size_word, extended = 0x7FFF, size_mib
    else:
        size_word, extended = size_mib, 0
    f = bytearray(0x5C - 4)

    def put(offset: int, fmt: str, value: int) -> None:
        struct.pack_into(fmt, f, offset - 4, value)

    put(0x04, "<H", 0x1000)                    # physical memory array handle
    put(0x08, "<H", 72)                        # total width
    put(0x0A, "<H", 64)                        # data width
    put(0x0C, "<H", size_word)
    put(0x0E, "<B", 0x09)                      # form factor DIMM
    put(0x10, "<B", 1)                         # device locator: string 1
    put(0x11, "<B", 2)                         # bank locator: string 2
    put(0x12, "<B", mem_type)
    put(0x15, "<H", speed)
    put(0x17, "<B", 3)                         # manufacturer
    put(0x18, "<B", 4)                         # serial
    put(0x19, "<B", 0)                         # asset tag: none
    put(0x1A, "<B", 5)                         # part number
    put(0x1C, "<I", extended)
    put(0x20, "<H", speed)
    put(0x54, "<I", extended_speed)
    return smbios(17, handle, bytes(f), [locator, f"BANK {handle & 0xF}", manufacturer,
                                          serial or f"S{handle:07X}", part])


def dmi_table(dimms: int, size_mib: int = 65536, empty_slots: int = 2) -> bytes:
    parts = [smbios(0, 0, bytes(0x14), ["Dell Inc.", "2.19.1", "03/14/2024"])]
    for i in range(dimms):
        parts.append(memory_device(0x1100 + i, size_mib, f"DIMM_{chr(65 + i // 8)}{i % 8 + 1}"))
    for i in range(empty_slots):
        empty = bytearray(memory_device(0x1200 + i, 0, f"EMPTY{i}"))
        struct.pack_into("<H", empty, 0x0C, 0)  # size 0: no module installed
        parts.append(bytes(empty))
    parts.append(smbios(127, 0xFFFF, b"", []))
    return b"".join(parts)


ROOT_PORT = "0000:00:01.0"


def aer_lines(kind: str, total: int) -> str:
    """An aer_dev_* file as Linux writes it: one line per error, then the total."""
    names = {"COR": ("RxErr", "BadTLP", "BadDLLP"), "FATAL": ("DLP", "SDES", "Undefined"),
             "NONFATAL": ("DLP", "SDES", "TLP")}[kind]
    return "\n".join([f"{names[0]} {total}", *(f"{n} 0" for n in names[1:]), f"TOTAL_ERR_{kind} {total}"])


def pcie(d: Path, klass: str, vendor: str, device: str, speed: str, width: int,
         *, correctable: int = 0) -> None:
    """A PCIe device's sysfs attributes: ids, class, link at its maximum, AER counts."""
    for name, value in (("vendor", vendor), ("device", device), ("class", klass),
                        ("current_link_speed", speed), ("max_link_speed", speed),
                        ("current_link_width", str(width)), ("max_link_width", str(width)),
                        ("aer_dev_correctable", aer_lines("COR", correctable)),
                        ("aer_dev_nonfatal", aer_lines("NONFATAL", 0)),
                        ("aer_dev_fatal", aer_lines("FATAL", 0))):
        write(d / name, value)


def build_machine(
    root: Path,
    *,
    gpus: int = 8,
    disks: int = 30,
    nics: int = 4,
    ib_ports: int = 8,
    sockets: int = 2,
    cores_per_socket: int = 4,
    dimms: int = 16,
    efi: bool = True,
) -> Path:
    sys, proc, dev = root / "sys", root / "proc", root / "dev"
    # DMI
    dmi = sys / "class/dmi/id"
    for name, value in {
        "sys_vendor": "Dell Inc.", "product_name": "PowerEdge XE9680", "product_serial": SERIAL,
        "product_uuid": UUID.upper(), "bios_vendor": "Dell Inc.", "bios_version": "2.19.1",
        "bios_date": "03/14/2024", "board_vendor": "Dell Inc.", "board_name": "0X9680A",
    }.items():  # fmt: skip
        write(dmi / name, value)
    write(sys / "firmware/dmi/tables/DMI", dmi_table(dimms))
    if efi:
        (sys / "firmware/efi/efivars").mkdir(parents=True, exist_ok=True)
    # CPU
    threads = sockets * cores_per_socket * 2
    blocks = []
    for cpu in range(threads):
        package, core = cpu // (cores_per_socket * 2), (cpu // 2) % cores_per_socket
        topo = sys / f"devices/system/cpu/cpu{cpu}/topology"
        write(topo / "physical_package_id", str(package))
        write(topo / "core_id", str(core))
        blocks.append(
            f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            f"cpu MHz\t\t: 2000.000\nphysical id\t: {package}\ncore id\t\t: {core}\n"
            "flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw amx_tile amx_bf16 vmx aes x2apic\n"
        )
    write(proc / "cpuinfo", "\n".join(blocks))
    write(sys / "devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "3800000")
    # Memory
    write(proc / "meminfo", f"MemTotal:       {dimms * 64 * 1024 * 1024 - 12345678} kB\nMemFree: 1 kB")
    for node in range(sockets):
        (sys / f"devices/system/node/node{node}").mkdir(parents=True, exist_ok=True)
    write(proc / "sys/kernel/osrelease", "6.1.0-21-amd64")
    write(proc / "sys/kernel/hostname", "gpu-node-17")
    # Disks: NVMe first, then SATA
    for i in range(disks):
        nvme = i < disks // 2
        sata = i - disks // 2
        name = f"nvme{i}n1" if nvme else "sd" + ("a" if sata >= 26 else "") + chr(97 + sata % 26)
        block = sys / "block" / name
        device = block / "device"
        write(block / "size", str((3840 if nvme else 960) * 1000**3 // 512))
        write(block / "queue/logical_block_size", "512")
        write(block / "queue/physical_block_size", "4096")
        write(block / "queue/rotational", "0")
        write(block / "removable", "0")
        write(block / "ro", "0")
        (block / "holders").mkdir(parents=True, exist_ok=True)
        write(block / "wwid", f"eui.{i:016x}" if nvme else f"naa.5000c500{i:08x}")
        write(device / "model", "SAMSUNG MZWLR3T8HBLS" if nvme else "MTFDDAK960TDS")
        write(device / "firmware_rev", "MPK7525Q")
        if nvme:
            write(device / "serial", f"S6EXNA0T{i:06d}")
        else:
            write(device / "vpd_pg80", b"\x00\x80\x00\x14" + f"MTFD{i:016d}".encode())
            write(device / "vendor", "ATA")
        (dev / name).parent.mkdir(parents=True, exist_ok=True)
        (dev / name).touch()
    # NICs on PCI, behind a root port; both in /sys/bus/pci/devices with their links and AER
    port = sys / "devices/pci0000:00" / ROOT_PORT
    pcie(port, "0x060400", "0x8086", "0x352a", "16.0 GT/s PCIe", 16)
    (sys / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (sys / "bus/pci/devices" / ROOT_PORT).symlink_to(os.path.relpath(port, sys / "bus/pci/devices"))
    for i in range(nics):
        address = f"0000:{0x3b + i // 2:02x}:00.{i % 2}"
        pci = port / address
        driver = sys / "bus/pci/drivers/mlx5_core"
        driver.mkdir(parents=True, exist_ok=True)
        pcie(pci, "0x020000", "0x15b3", "0x101d", "16.0 GT/s PCIe", 16)
        (sys / "bus/pci/devices" / address).symlink_to(os.path.relpath(pci, sys / "bus/pci/devices"))
        if not (pci / "driver").exists():
            (pci / "driver").symlink_to(os.path.relpath(driver, pci))
        net = sys / "class/net" / f"ens{i // 2 + 1}f{i % 2}np{i % 2}"
        write(net / "address", f"B8:3F:D2:A1:B2:{i:02X}")
        write(net / "mtu", "9000")
        write(net / "speed", "100000" if i else "-1")
        write(net / "carrier", "1" if i else "0")
        (net / "device").symlink_to(os.path.relpath(pci, net))
    (sys / "class/net/lo").mkdir(parents=True, exist_ok=True)
    write(sys / "class/net/lo/address", "00:00:00:00:00:00")
    write(
        proc / "net/if_inet6",
        "fe80000000000000ba3fd2fffea1b201 03 40 20 80 ens1f1np1\n"
        "00000000000000000000000000000001 01 80 10 80       lo",
    )
    # InfiniBand
    for i in range(ib_ports):
        ib = sys / f"class/infiniband/mlx5_{i}"
        write(ib / "node_guid", f"b83f:d203:00a1:{i:04x}")
        port = ib / "ports/1"
        write(port / "state", "4: ACTIVE")
        write(port / "rate", "400 Gb/sec (4X NDR)")
        write(port / "link_layer", "InfiniBand")
        write(port / "gids/0", f"fe80:0000:0000:0000:b83f:d203:00a1:{i:04x}")
    # GPUs on PCI, plus a non-NVIDIA VGA and an NVIDIA bridge that are not GPUs
    pci_devices = sys / "bus/pci/devices"
    for i in range(gpus):
        d = pci_devices / f"0000:{0x18 + 0x10 * i:02x}:00.0"
        pcie(d, "0x030200", "0x10de", "0x2330", "32.0 GT/s PCIe", 16)
    others = (("0000:03:00.0", "0x102b", "0x030000"), ("0000:05:00.0", "0x10de", "0x068000"))
    for address, vendor, klass in others:
        write(pci_devices / address / "vendor", vendor)
        write(pci_devices / address / "device", "0x0001")
        write(pci_devices / address / "class", klass)
    return root
