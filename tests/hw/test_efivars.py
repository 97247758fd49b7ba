"""agent.hw.efivars against a directory of efivarfs-format files (4 attribute bytes, then the value)."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
from pathlib import Path

import pytest

from agent.errors import InvalidParameters, NotFound
from agent.hw import efivars


def plant(directory: Path, name: str, value: bytes, guid: str = efivars.GLOBAL, attributes: int = 7) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}-{guid}").write_bytes(struct.pack("<I", attributes) + value)


@pytest.fixture
def vars_dir(tmp_path: Path) -> Path:
    d = tmp_path / "efivars"
    plant(d, "Boot0000", efivars.load_option("UEFI PXEv4 (MAC:525400123456)"))
    plant(d, "Boot0001", efivars.load_option("debian"))
    plant(d, "Boot000A", efivars.load_option("tenant"))
    plant(d, "BootOrder", struct.pack("<3H", 0x000A, 0x0000, 0x0001))
    plant(d, "BootCurrent", struct.pack("<H", 0))              # not a Boot#### entry
    plant(d, "SecureBoot", b"\x01", attributes=6)
    plant(d, "db", b"certificates", efivars.IMAGE_SECURITY, attributes=0x27)
    plant(d, "MemoryOverwriteRequestControl", b"\x01", efivars.MOR)
    return d


def test_reads_boot_entries_order_flags_and_digests(vars_dir: Path) -> None:
    v = efivars.Efivars(vars_dir)
    entries = v.boot_entries()
    assert [(e.number, e.description) for e in entries] == [
        (0, "UEFI PXEv4 (MAC:525400123456)"), (1, "debian"), (0xA, "tenant")]
    assert entries[1].sha256 == hashlib.sha256(efivars.load_option("debian")).hexdigest()
    assert v.boot_order() == [0xA, 0, 1]
    assert v.flag("SecureBoot") == 1 and v.flag("SetupMode") is None
    assert v.flag("MemoryOverwriteRequestControl", efivars.MOR) == 1
    assert v.sha256("db", efivars.IMAGE_SECURITY) == hashlib.sha256(b"certificates").hexdigest()
    assert v.sha256("PK") == "absent"
    var = v.read("db", efivars.IMAGE_SECURITY)
    assert var is not None and var.attributes == 0x27


def test_a_malformed_load_option_has_no_description(vars_dir: Path) -> None:
    plant(vars_dir, "Boot0002", b"\x01\x00")
    plant(vars_dir, "Boot0003", struct.pack("<IH", 1, 4) + "no end".encode("utf-16-le"))
    by_number = {e.number: e.description for e in efivars.Efivars(vars_dir).boot_entries()}
    assert by_number[2] == "" and by_number[3] == ""


def test_a_description_is_printable_and_bounded(vars_dir: Path) -> None:
    plant(vars_dir, "Boot0005", efivars.load_option("evil\ngate: passed\x1b[2J" + "x" * 300))
    (entry,) = [e for e in efivars.Efivars(vars_dir).boot_entries() if e.number == 5]
    assert entry.description.startswith("evil?gate: passed?[2J") and len(entry.description) == 128


def test_delete_takes_the_entry_out_of_boot_order(vars_dir: Path) -> None:
    v = efivars.Efivars(vars_dir)
    v.delete_boot_entry(0xA)
    assert not (vars_dir / f"Boot000A-{efivars.GLOBAL}").exists()
    assert v.boot_order() == [0, 1]
    assert (vars_dir / f"BootOrder-{efivars.GLOBAL}").read_bytes()[:4] == struct.pack("<I", 7)
    with pytest.raises(NotFound, match="Boot000A does not exist"):
        v.delete_boot_entry(0xA)


def test_set_boot_order_and_write_keep_the_format(vars_dir: Path) -> None:
    v = efivars.Efivars(vars_dir)
    v.set_boot_order([1, 0])
    assert (vars_dir / f"BootOrder-{efivars.GLOBAL}").read_bytes() == struct.pack("<I2H", 7, 1, 0)
    v.write("MemoryOverwriteRequestControl", b"\x00", guid=efivars.MOR)
    assert v.flag("MemoryOverwriteRequestControl", efivars.MOR) == 0
    with pytest.raises(InvalidParameters):
        v.set_boot_order([0x10000])


def test_entry_numbers() -> None:
    assert efivars.parse_number("Boot000a") == 10 and efivars.parse_number("3") == 3
    for bad in ("", "00000", "zz", "Boot"):
        with pytest.raises(InvalidParameters):
            efivars.parse_number(bad)


def test_no_efivarfs_means_no_entries(tmp_path: Path) -> None:
    v = efivars.Efivars(tmp_path / "absent")
    assert not v.present and v.boot_entries() == [] and v.boot_order() is None


@pytest.mark.root
def test_an_immutable_file_is_made_mutable_before_it_is_deleted_or_written(vars_dir: Path) -> None:
    """efivarfs marks its files immutable; ext4 here takes the same FS_IOC_SETFLAGS ioctl."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_LINUX_IMMUTABLE)")
    paths = [vars_dir / f"Boot000A-{efivars.GLOBAL}", vars_dir / f"BootOrder-{efivars.GLOBAL}"]
    for path in paths:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("this filesystem has no immutable flag")
    with pytest.raises(PermissionError):
        paths[0].unlink()
    efivars.Efivars(vars_dir).delete_boot_entry(0xA)          # deletes one, rewrites the other
    assert not paths[0].exists() and efivars.Efivars(vars_dir).boot_order() == [0, 1]
