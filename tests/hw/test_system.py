"""agent.hw.system against a fake server tree and against this machine's own sysfs/procfs."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from agent.hw import system
from tests.hw.fake_machine import SERIAL, UUID, build_machine, dmi_table, memory_device, smbios


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    return build_machine(tmp_path / "root", gpus=8, disks=6, nics=4, ib_ports=2, dimms=4)


def test_dmi_and_boot_mode_of_the_fake_server(fake: Path) -> None:
    dmi = system.read_dmi(fake)
    assert (dmi.vendor, dmi.product, dmi.serial) == ("Dell Inc.", "PowerEdge XE9680", SERIAL)
    assert dmi.uuid == UUID  # lower-cased
    assert (dmi.firmware_version, dmi.firmware_date, dmi.board_product) == ("2.19.1", "03/14/2024", "0X9680A")
    assert system.boot_mode(fake) == "efi"
    assert system.kernel_release(fake) == "6.1.0-21-amd64"
    assert system.hostname(fake) == "gpu-node-17"


def test_placeholder_dmi_strings_are_empty(fake: Path) -> None:
    (fake / "sys/class/dmi/id/product_serial").write_text("To Be Filled By O.E.M.\n")
    assert system.read_dmi(fake).serial == ""


def test_cpu_topology(fake: Path) -> None:
    cpu = system.read_cpu(fake)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert (cpu.sockets, cpu.cores, cpu.threads) == (2, 8, 16)
    assert cpu.max_mhz == 3800.0
    assert set(cpu.flags) == {
        "avx", "avx2", "avx512f", "avx512bw", "amx_tile", "amx_bf16", "vmx", "aes", "x2apic"
    }


def test_memory_and_dimms(fake: Path) -> None:
    mem = system.read_memory(fake)
    assert mem.total_bytes == (4 * 64 * 1024 * 1024 - 12345678) * 1024
    assert mem.numa_nodes == 2
    assert len(mem.dimms) == 4  # the two empty slots are left out
    first = mem.dimms[0]
    assert (first.locator, first.size_bytes, first.type) == ("DIMM_A1", 64 << 30, "DDR5")
    assert first.speed_mts == 4800
    assert (first.manufacturer, first.part_number, first.bank) == ("Samsung", "M321R8GA0BB0-CQKZJ", "BANK 0")
    assert first.serial == "S0001100"


def test_smbios_size_encodings() -> None:
    big = memory_device(1, 256 * 1024, "BIG")           # 256 GiB: extended size field
    small = bytearray(memory_device(2, 0, "KIB"))
    struct.pack_into("<H", small, 0x0C, 0x8000 | 512)   # 512 KiB granularity
    unknown = bytearray(memory_device(3, 0, "UNKNOWN"))
    struct.pack_into("<H", unknown, 0x0C, 0xFFFF)
    fast = memory_device(4, 32768, "FAST", mem_type=0x1A, speed=0xFFFF, extended_speed=8800)
    table = big + bytes(small) + bytes(unknown) + bytes(fast) + smbios(127, 0xFFFF, b"", [])
    dimms = {d.locator: d for d in system.parse_dimms(table)}
    assert dimms["BIG"].size_bytes == 256 << 30
    assert dimms["KIB"].size_bytes == 512 << 10
    assert "UNKNOWN" not in dimms
    assert dimms["FAST"].type == "DDR4" and dimms["FAST"].speed_mts == 8800


def test_truncated_or_garbage_tables_do_not_raise() -> None:
    table = dmi_table(2)
    for cut in (0, 3, 10, 40, len(table) // 2, len(table) - 3):
        system.parse_dimms(table[:cut])
    assert system.parse_dimms(os.urandom(4096)) is not None


def test_nics(fake: Path) -> None:
    nics = {n.name: n for n in system.read_nics(fake)}
    assert set(nics) == {"ens1f0np0", "ens1f1np1", "ens2f0np0", "ens2f1np1"}  # lo is virtual
    down, up = nics["ens1f0np0"], nics["ens1f1np1"]
    assert (up.mac, up.driver, up.mtu) == ("b8:3f:d2:a1:b2:01", "mlx5_core", 9000)
    assert (up.speed_mbps, up.link) == (100000, True)
    assert up.pci_address == "0000:3b:00.1"
    assert up.addresses == ("fe80::ba3f:d2ff:fea1:b201/64",)
    assert (down.speed_mbps, down.link) == (0, False)


def test_infiniband(fake: Path) -> None:
    ports = system.read_infiniband(fake)
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    assert ports[1].state == "ACTIVE" and ports[1].rate == "400 Gb/sec (4X NDR)"
    assert ports[1].guid == "b83f:d203:00a1:0001" and ports[1].link_layer == "InfiniBand"


def test_gpus_by_pci_id(fake: Path, tmp_path: Path) -> None:
    found = system.read_pci_gpus(fake)
    assert [g.pci_address for g in found] == [f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(8)]
    assert all((g.vendor_id, g.device_id) == ("10de", "2330") for g in found)
    ids = tmp_path / "pci.ids"
    ids.write_text(
        "10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n\t\t10de 16c1  sub\n10df  Emulex\n"
    )
    assert system.pci_device_names("10de", {"2330", "9999"}, (ids,)) == {"2330": "GH100 [H100 SXM5 80GB]"}


LAN_PRINT = """Set in Progress         : Set Complete
Auth Type Support       : NONE MD5 PASSWORD
IP Address Source       : DHCP Address
IP Address              : 10.20.30.40
Subnet Mask             : 255.255.255.0
MAC Address             : 4c:d9:8f:11:22:33
"""


def test_bmc_address(tmp_path: Path) -> None:
    assert system.parse_lan_print(LAN_PRINT) == "10.20.30.40"
    assert system.parse_lan_print(LAN_PRINT.replace("10.20.30.40", "0.0.0.0")) == ""
    device = tmp_path / "ipmi0"
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str:
        calls.append(argv)
        if argv[-1] == "1":
            raise RuntimeError("channel 1 is not a LAN channel")
        return LAN_PRINT

    assert system.bmc_address(run, devices=(device,)) == ""  # no IPMI device: ipmitool not run
    assert calls == []
    device.touch()
    assert system.bmc_address(run, devices=(device,)) == "10.20.30.40"
    assert calls == [["ipmitool", "lan", "print", "1"], ["ipmitool", "lan", "print", "8"]]


def test_empty_tree_gives_empty_fields(tmp_path: Path) -> None:
    m = system.read_machine(tmp_path)
    assert m.dmi == system.Dmi() and m.nics == () and m.infiniband == ()
    assert m.boot_mode == "bios"
    assert system.read_pci_gpus(tmp_path) == []


def test_this_machine() -> None:
    m = system.read_machine()
    assert m.cpu.threads == os.cpu_count()
    assert m.cpu.model
    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    assert m.memory.total_bytes == int(meminfo[1]) * 1024
    assert m.boot_mode == ("efi" if Path("/sys/firmware/efi").is_dir() else "bios")
    assert m.kernel == os.uname().release
    physical = sorted(n for n in os.listdir("/sys/class/net") if os.path.exists(f"/sys/class/net/{n}/device"))
    assert [n.name for n in m.nics] == physical
    for nic in m.nics:
        assert nic.mac == Path(f"/sys/class/net/{nic.name}/address").read_text().strip()


def test_nic_driver_info_agrees_with_ethtool() -> None:
    import shutil
    import subprocess

    if shutil.which("ethtool") is None:
        pytest.skip("ethtool is not installed")
    names = [n for n in sorted(os.listdir("/sys/class/net")) if os.path.exists(f"/sys/class/net/{n}/device")]
    if not names:
        pytest.skip("no NIC backed by a device on this machine")
    for name in names:
        info = system.driver_info(name)
        assert info is not None
        shown = dict(line.split(": ", 1) for line in subprocess.run(
            ["ethtool", "-i", name], check=True, capture_output=True, text=True).stdout.splitlines()
            if ": " in line)
        assert info.driver == shown["driver"] and info.version == shown.get("version", "")
        assert info.firmware_version == ("" if shown.get("firmware-version", "N/A") == "N/A"
                                         else shown["firmware-version"])
    assert system.driver_info("nonexistent0") is None


def test_filesystem_type_of_a_path_is_its_mount_s(tmp_path: Path) -> None:
    from agent.hw.sysfs import filesystem_type

    assert filesystem_type(Path("/proc/self")) == "proc"
    assert filesystem_type(tmp_path / "not-there") == ""
    fake = tmp_path / "proc" / "self"
    fake.mkdir(parents=True)
    dev = os.stat(tmp_path).st_dev
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    (fake / "mountinfo").write_text(
        f"22 1 {majmin} / / rw - ext4 /dev/sda1 rw\n"
        f"23 22 {majmin} / {tmp_path} rw shared:1 - tmpfs tmpfs rw\n"
        f"24 22 0:99 / {tmp_path}/other rw - nfs srv:/x rw\n")
    assert filesystem_type(tmp_path / "proc", tmp_path / "proc") == "tmpfs"   # the longest on its device
