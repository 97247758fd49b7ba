"""agent.hw.block: discovery from a sysfs tree, hints, safety checks, ioctls on loop devices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import AgentError, InvalidParameters, NotFound, ProtectedDevice, Reason
from agent.hw import block
from agent.proto import common_pb2
from tests.diskfixtures import MiB, block_sizes, disk_for_path, loop_device, random_file


def write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text + "\n")


def fake_sysfs(root: Path) -> tuple[Path, Path]:
    """/sys and /dev with: sda (SATA SSD), nvme0n1 (+ its hidden path nvme0c0n1), vda (virtio),
    loop0 (backed), loop1 (unbacked), zram0 (not a disk), sdb (empty card reader)."""
    sys_root, dev_root = root / "sys", root / "dev"
    devices = sys_root / "devices"

    def disk(name: str, devpath: str, size_sectors: int, **attrs: str | bytes) -> Path:
        real = devices / devpath / "block" / name
        write(real / "size", str(size_sectors))
        write(real / "queue" / "logical_block_size", "512")
        write(real / "queue" / "physical_block_size", "4096")
        write(real / "queue" / "rotational", attrs.pop("rotational", "0"))  # type: ignore[arg-type]
        write(real / "queue" / "discard_max_bytes", attrs.pop("discard", "0"))  # type: ignore[arg-type]
        for rel, value in attrs.items():
            write(real / rel.replace("__", "/"), value)
        (sys_root / "block").mkdir(parents=True, exist_ok=True)
        (sys_root / "block" / name).symlink_to(real)
        return real

    sda = disk("sda", "pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0", 1953525168,
               device__model="Samsung SSD 870", device__vendor="ATA     ", device__rev="SVT02B6Q",
               device__wwid="naa.5002538e40a1b2c3", device__vpd_pg80=b"\x00\x80\x00\x0fS5STNF0R123456A",
               discard="2147450880")
    (sda / "device" / "vpd_pg80").write_bytes(b"\x00\x80\x00\x10  S5STNF0R123456A")
    disk("nvme0n1", "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0", 7501476528,
                device__model="SAMSUNG MZQL23T8HCLS-00A07", device__serial="S64ANE0R812345",
                device__firmware_rev="GDC5602Q", wwid="eui.36344630528123450025384500000001",
                nsid="1", discard="2199023255040")
    disk("nvme0c0n1", "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/x", 100, hidden="1")
    disk("vda", "pci0000:00/0000:00:04.0/virtio1", 41943040, serial="vol-0123")
    disk("loop0", "virtual", 2048, loop__backing_file="/var/tmp/x.img")
    disk("loop1", "virtual", 0)
    disk("zram0", "virtual", 4096)
    disk("sdb", "pci0000:00/0000:00:14.0/usb1/1-2/1-2:1.0/host6/target6:0:0/6:0:0:0", 0,
         device__model="Card Reader")
    byp = dev_root / "disk" / "by-path"
    byp.mkdir(parents=True)
    (byp / "pci-0000:00:17.0-ata-1").symlink_to("../../sda")
    (byp / "pci-0000:3d:00.0-nvme-1").symlink_to("../../nvme0n1")
    for n in ("sda", "nvme0n1", "vda", "loop0"):
        (dev_root / n).touch()
    return sys_root, dev_root


def test_discovery_from_sysfs(tmp_path: Path) -> None:
    sys_root, dev_root = fake_sysfs(tmp_path)
    disks = {d.name: d for d in block.list_disks(sys_root, dev_root)}
    assert sorted(disks) == ["loop0", "nvme0n1", "sda", "vda"]
    sda = disks["sda"]
    assert sda.model == "Samsung SSD 870" and sda.vendor == "ATA" and sda.firmware == "SVT02B6Q"
    assert sda.serial == "S5STNF0R123456A" and sda.wwn == "naa.5002538e40a1b2c3"
    assert sda.size == 1953525168 * 512 and sda.transport == "sata" and not sda.rotational
    assert sda.by_path == str(dev_root / "disk/by-path/pci-0000:00:17.0-ata-1")
    assert sda.physical_block_size == 4096 and sda.supports_discard
    nvme = disks["nvme0n1"]
    assert nvme.transport == "nvme" and nvme.controller == "nvme0" and nvme.nsid == 1
    assert nvme.serial == "S64ANE0R812345" and nvme.firmware == "GDC5602Q"
    assert disks["vda"].transport == "virtio" and disks["vda"].serial == "vol-0123"
    assert disks["loop0"].transport == "loop"
    ident = nvme.identity()
    assert ident.wwn == nvme.wwn and ident.size_bytes == nvme.size and ident.name == "nvme0n1"


@pytest.mark.parametrize(
    ("hints", "expect"),
    [
        (common_pb2.DiskHints(serial="S5STNF0R123456A"), "sda"),
        (common_pb2.DiskHints(wwn="5002538e40a1b2c3"), "sda"),
        (common_pb2.DiskHints(wwn="0x5002538E40A1B2C3"), "sda"),
        (common_pb2.DiskHints(model="mzql23"), "nvme0n1"),
        (common_pb2.DiskHints(by_path="pci-0000:3d:00.0-nvme-1"), "nvme0n1"),
        (common_pb2.DiskHints(name="/dev/vda"), "vda"),
        (common_pb2.DiskHints(min_size_bytes=3 << 40), "nvme0n1"),
        (common_pb2.DiskHints(min_size_bytes=100 << 30, max_size_bytes=2 << 40), "sda"),
        (common_pb2.DiskHints(vendor="ata", min_size_bytes=1), "sda"),
    ],
)
def test_hints_select_one(tmp_path: Path, hints: common_pb2.DiskHints, expect: str) -> None:
    sys_root, dev_root = fake_sysfs(tmp_path)
    disks = block.list_disks(sys_root, dev_root)
    assert block.select(disks, block.Hints.from_proto(hints)).name == expect


def test_hints_errors(tmp_path: Path) -> None:
    sys_root, dev_root = fake_sysfs(tmp_path)
    disks = block.list_disks(sys_root, dev_root)
    with pytest.raises(NotFound, match="serial='nope'"):
        block.select(disks, block.Hints(serial="nope"))
    with pytest.raises(AgentError) as err:
        block.select(disks, block.Hints(min_size=1))
    assert err.value.reason == Reason.AMBIGUOUS
    for bad in (common_pb2.DiskHints(), common_pb2.DiskHints(name="../../etc"),
                common_pb2.DiskHints(by_path="/etc/passwd"),
                common_pb2.DiskHints(min_size_bytes=10, max_size_bytes=5)):
        with pytest.raises(InvalidParameters):
            block.Hints.from_proto(bad)


def test_safety_from_fake_mountinfo(tmp_path: Path) -> None:
    """A partition mounted, a dm device (LVM) over a disk holding /, swap, and holders."""
    sys_root = tmp_path / "sys"
    proc_root = tmp_path / "proc"

    def dev(path: Path, num: str) -> None:
        write(path / "dev", num)
        links = sys_root / "dev" / "block"
        links.mkdir(parents=True, exist_ok=True)
        (links / num).symlink_to(path)

    blk = sys_root / "block"
    for name, num in (("sda", "8:0"), ("sdb", "8:16"), ("sdc", "8:32"), ("sdd", "8:48")):
        dev(blk / name, num)
        (blk / name / "holders").mkdir()
    dev(blk / "sda" / "sda1", "8:1")
    write(blk / "sda" / "sda1" / "partition", "1")
    dev(blk / "dm-0", "253:0")
    (blk / "dm-0" / "slaves").mkdir()
    (blk / "dm-0" / "slaves" / "sdb").symlink_to(blk / "sdb")
    (blk / "sdd" / "holders" / "md0").mkdir()
    write(proc_root / "self" / "mountinfo",
          "22 1 253:0 / / rw,relatime - ext4 /dev/mapper/vg-root rw\n"
          "30 22 8:1 / /boot rw,relatime - ext4 /dev/sda1 rw\n"
          "31 22 0:21 / /proc rw - proc proc rw")
    write(proc_root / "swaps", "Filename\tType\tSize\tUsed\tPriority")

    def check(name: str) -> None:
        block.check_safe(block.Disk(name=name, path=Path("/dev") / name, size=1), sys_root, proc_root)

    with pytest.raises(ProtectedDevice, match="sda1 mounted at /boot"):
        check("sda")
    with pytest.raises(ProtectedDevice, match=r"root filesystem.*dm-0"):
        check("sdb")
    with pytest.raises(ProtectedDevice, match="held by md0"):
        check("sdd")
    check("sdc")


def test_real_root_disk_is_protected() -> None:
    st = os.stat("/")
    root = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for disk in block.list_disks():
        sysdir = Path("/sys/block") / disk.name
        nums = [(sysdir / "dev").read_text().strip()] + [
            (p / "dev").read_text().strip() for p in sysdir.iterdir() if (p / "partition").exists()
        ]
        if root in nums:
            with pytest.raises(ProtectedDevice):
                block.check_safe(disk)
            return
    pytest.skip("the root filesystem is not on a listed disk here")


def test_file_disk_and_helpers(tmp_path: Path) -> None:
    path = tmp_path / "d"
    random_file(path, 4 * MiB)
    disk = disk_for_path(path)
    assert disk.is_file and disk.size == 4 * MiB and disk.transport == "file"
    with block.opened(disk, write=True) as fd:
        assert block.size_of(fd) == 4 * MiB
        assert block_sizes(fd) == (512, 4096)
        offsets = block.sample_offsets(disk.size, 16, 4096, seed=1)
        assert offsets[0] == 0 and offsets[-1] == disk.size - 4096 and len(offsets) == 16
        assert not block.reads_zeros(fd, offsets, 4096)
        block.discard(fd)
        assert block.reads_zeros(fd, offsets, 4096) and block.size_of(fd) == 4 * MiB
        os.pwrite(fd, b"x" * MiB, 0)
        block.zero_out(fd, 4096, 8192)
        assert os.pread(fd, 4096, 0) == b"x" * 4096 and os.pread(fd, 8192, 4096) == bytes(8192)
        assert not block.reread_partitions(fd)
    with pytest.raises(InvalidParameters):
        disk_for_path("/dev/null")


@pytest.mark.root
def test_loop_device_ioctls(tmp_path: Path) -> None:
    backing = tmp_path / "b"
    random_file(backing, 8 * MiB)
    with loop_device(backing) as disk:
        assert disk.transport == "loop" and disk.size == 8 * MiB
        assert disk_for_path(disk.path).name == disk.name
        assert any(d.name == disk.name for d in block.list_disks())
        block.check_safe(disk)
        with block.opened(disk, write=True) as fd:
            assert block.size_of(fd) == 8 * MiB
            assert block_sizes(fd)[0] in (512, 4096)
            with pytest.raises(ProtectedDevice, match="in use"):
                block.open_disk(disk, write=True)  # a second O_EXCL open is refused
            block.zero_out(fd, 0, MiB)
            assert os.pread(fd, MiB, 0) == bytes(MiB)
            if disk.supports_discard:
                block.discard(fd)
                assert block.reads_zeros(fd, block.sample_offsets(disk.size, 64, 4096), 4096)
            block.clear_ends(fd, disk.size)
    data = backing.read_bytes()
    assert not data[-MiB:].strip(b"\0")
