"""The ramdisk UKI: assembled with objcopy around Debian's systemd-boot stub, its Authenticode
digest checked against osslsigncode's, its PCR 11 expectation from its sections."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from initramfs import uki

STUB = uki.STUBS["amd64"]


@pytest.fixture
def built(tmp_path: Path) -> Path:
    if not STUB.is_file():
        pytest.skip(f"no {STUB} (apt-get install systemd-boot-efi)")
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy is not installed (apt-get install binutils)")
    (tmp_path / "vmlinuz").write_bytes(STUB.read_bytes())  # a PE image, as a kernel with its EFI stub is
    (tmp_path / "initrd").write_bytes(b"070701 an initramfs" * 300)
    uki.write(STUB, tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyS0 bc.role=ramdisk",
              tmp_path / "ramdisk.efi", build_id="test-1")
    return tmp_path / "ramdisk.efi"


def test_the_uki_holds_the_kernel_initrd_and_command_line(built: Path) -> None:
    data = built.read_bytes()
    pe = uki.parse_pe(data)
    assert pe.section(".linux") == (built.parent / "vmlinuz").read_bytes()
    assert pe.section(".initrd") == (built.parent / "initrd").read_bytes()
    assert pe.section(".cmdline") == b"console=ttyS0 bc.role=ramdisk"
    assert b"ID=bettercompute-ramdisk" in pe.section(".osrel")
    assert len(data) % 8 == 0
    names = [s.name for s in pe.sections]
    assert names.index(".text") < names.index(".osrel") < names.index(".linux") < names.index(".initrd")
    spans = sorted((s.virtual_address, s.virtual_address + s.virtual_size) for s in pe.sections)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no section overlaps another


def test_reference_values_beside_it(built: Path) -> None:
    values = json.loads(built.with_name("ramdisk.efi.json").read_text())
    data = built.read_bytes()
    assert values["build_id"] == "test-1" and values["sha256"] == hashlib.sha256(data).hexdigest()
    pe = uki.parse_pe(data)
    assert values["pcr4"] == [uki.authenticode_sha256(data).hex(),
                              uki.authenticode_sha256(pe.section(".linux")).hex()]
    assert values["pcr12"] == "00" * 32
    # PCR 11 by the UKI specification's order: .linux, .osrel, .cmdline, .initrd; name, then contents.
    pcr = bytes(32)
    for name in (".linux", ".osrel", ".cmdline", ".initrd"):
        for part in (name.encode() + b"\0", pe.section(name)):
            pcr = hashlib.sha256(pcr + hashlib.sha256(part).digest()).digest()
    assert values["pcr11"] == pcr.hex()


def test_a_changed_command_line_changes_pcr4_and_pcr11(built: Path, tmp_path: Path) -> None:
    other = uki.write(STUB, tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyS0 init=/bin/sh",
                      tmp_path / "other.efi")
    mine = json.loads(built.with_name("ramdisk.efi.json").read_text())
    assert other["pcr4"] != mine["pcr4"] and other["pcr11"] != mine["pcr11"]


def test_authenticode_digest_agrees_with_osslsigncode(built: Path, tmp_path: Path) -> None:
    if shutil.which("osslsigncode") is None or shutil.which("openssl") is None:
        pytest.skip("osslsigncode or openssl is not installed")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "k.pem",
                    "-out", "c.pem", "-subj", "/CN=uki test", "-days", "1"], cwd=tmp_path, check=True,
                   capture_output=True)
    subprocess.run(["osslsigncode", "sign", "-certs", "c.pem", "-key", "k.pem", "-in", str(built),
                    "-out", "signed.efi"], cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run(["osslsigncode", "verify", "-in", "signed.efi"], cwd=tmp_path, capture_output=True,
                         text=True).stdout
    calculated = next(line.split(":")[1].strip() for line in out.splitlines()
                      if line.startswith("Calculated message digest"))
    want = uki.authenticode_sha256(built.read_bytes()).hex()
    assert calculated.lower() == want
    # Signing leaves the digest as it was: the certificate table is not hashed.
    assert uki.authenticode_sha256((tmp_path / "signed.efi").read_bytes()).hex() == want


def test_not_a_pe_image() -> None:
    with pytest.raises(uki.PeError):
        uki.parse_pe(b"\x7fELF" + bytes(100))


def test_a_sites_command_line_names_the_site_and_nothing_of_a_node() -> None:
    line = uki.site_cmdline("amd64", "http://10.0.0.2:8088")
    assert line.startswith("console=ttyS0,115200 ") and line.endswith(" bc.site=http://10.0.0.2:8088")
    assert "console=ttyAMA0" in uki.site_cmdline("arm64", "http://site.example:80")
    for bad in ("https://10.0.0.2:8443", "http://10.0.0.2", "http://10.0.0.2:8088/x", "http://a b:1",
                "http://10.0.0.2:8088 bc.token=x", "10.0.0.2:8088", "http://$(reboot):1"):
        with pytest.raises(ValueError, match="http://host:port"):
            uki.site_cmdline("amd64", bad)


def test_the_build_refuses_bad_uki_options_before_building() -> None:
    from initramfs import build

    with pytest.raises(SystemExit) as info:
        build.main(["--iso-uki"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        build.main(["--uki-site", "http://10.0.0.2:8088/../x"])
    assert info.value.code == 2
