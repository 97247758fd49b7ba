"""The ramdisk UKI: assembled with objcopy around Debian's systemd-boot stub, its Authenticode
digest checked against osslsigncode's, its PCR 11 expectation from its sections; for amd64 and
for arm64 (the stub taken out of Debian's arm64 systemd-boot-efi .deb, the kernel unpacked)."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from initramfs import debs, uki

STUB = uki.STUBS["amd64"]
# What x86_kernel's image takes in memory beyond its file (its BSS).
BSS = 0x46000


def x86_kernel(*, version: int = 0x20F, xloadflags: int = 0x7F, handover: int = 0x190) -> bytes:
    """A PE32+ image with an x86 boot protocol header, laid out as a bzImage with its EFI stub
    is: the PE header at 0x40, the setup header at 0x1F1 ('HdrS', its version, xloadflags, the
    handover entry's offset), one .text section, and SizeOfImage beyond the file (BSS)."""
    data = bytearray(0x2000)
    data[:2] = b"MZ"
    struct.pack_into("<I", data, 0x3C, 0x40)
    data[0x40:0x44] = b"PE\0\0"
    struct.pack_into("<HHIIIHH", data, 0x44, 0x8664, 1, 0, 0, 0, 240, 0x206)
    opt = 0x58
    struct.pack_into("<HBBIIIIIQIIHHHHHHIIIIHHQQQQII", data, opt, 0x20B, 2, 20, 0x1000, 0, 0, 0x1000, 0x1000,
                     0, 0x1000, 0x200, 0, 0, 1, 0, 0, 0, 0, 0x2000 + BSS, 0x1000, 0, 10, 0, 0, 0, 0, 0, 0, 16)
    struct.pack_into("<8sIIIIIIHHI", data, opt + 240, b".text", 0x1000, 0x1000, 0x1000, 0x1000, 0, 0, 0, 0,
                     0x60000020)
    data[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", data, 0x206, version)
    struct.pack_into("<H", data, 0x236, xloadflags)
    struct.pack_into("<I", data, 0x264, handover)
    return bytes(data)


def test_the_fake_kernel_is_shaped_as_a_bzimage_is() -> None:
    kernel = x86_kernel()
    assert uki.pe_arch(kernel) == "amd64"
    assert uki.parse_pe(kernel).size_of_image == len(kernel) + BSS


@pytest.fixture
def built(tmp_path: Path) -> Path:
    if not STUB.is_file():
        pytest.skip(f"no {STUB} (apt-get install systemd-boot-efi)")
    if shutil.which(uki.objcopy("amd64")) is None:
        pytest.skip(f"{uki.objcopy('amd64')} is not installed (apt-get install binutils)")
    (tmp_path / "vmlinuz").write_bytes(x86_kernel())
    (tmp_path / "initrd").write_bytes(b"070701 an initramfs" * 300)
    uki.write(STUB, tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyS0 bc.role=ramdisk",
              tmp_path / "ramdisk.efi", build_id="test-1")
    return tmp_path / "ramdisk.efi"


def test_the_uki_holds_the_kernel_initrd_and_command_line(built: Path) -> None:
    data = built.read_bytes()
    pe = uki.parse_pe(data)
    kernel = bytearray((built.parent / "vmlinuz").read_bytes())
    # The same kernel, but for its EFI stub's version (0: systemd-stub hands over to it).
    at = uki.parse_pe(bytes(kernel)).image_version_at
    assert at == 0x40 + 24 + 44 and pe.section(".linux")[at:at + 2] == b"\0\0"
    kernel[at:at + 2] = b"\0\0"
    assert pe.section(".linux") == kernel
    assert pe.section(".initrd") == (built.parent / "initrd").read_bytes()
    assert pe.section(".cmdline") == b"console=ttyS0 bc.role=ramdisk"
    assert b"ID=bettercompute-ramdisk" in pe.section(".osrel")
    assert len(data) % 8 == 0
    names = [s.name for s in pe.sections]
    assert names.index(".text") < names.index(".osrel") < names.index(".linux") < names.index(".initrd")
    spans = sorted((s.virtual_address, s.virtual_address + s.virtual_size) for s in pe.sections)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no section overlaps another
    # The kernel's BSS is left free before the initramfs: started where it lies, it clears it.
    linux, initrd = (next(s for s in pe.sections if s.name == n) for n in (".linux", ".initrd"))
    assert initrd.virtual_address >= linux.virtual_address + len(kernel) + BSS


def test_reference_values_beside_it(built: Path) -> None:
    values = json.loads(built.with_name("ramdisk.efi.json").read_text())
    data = built.read_bytes()
    assert values["build_id"] == "test-1" and values["sha256"] == hashlib.sha256(data).hexdigest()
    pe = uki.parse_pe(data)
    # The firmware measures the UKI; the stub hands over to the kernel, no LoadImage: nothing
    # more in PCR 4, nothing in PCR 9 (the kernel's stub takes no initramfs through LoadFile2).
    assert values["pcr4"] == [uki.authenticode_sha256(data).hex()]
    assert values["pcr9"] == values["pcr12"] == "00" * 32
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


def osslsigncode_digest(image: Path, tmp_path: Path) -> tuple[str, Path]:
    """The Authenticode digest osslsigncode calculates for ``image`` (signed with a throwaway
    key: it reads the digest of a signed image), and the signed image."""
    if shutil.which("osslsigncode") is None or shutil.which("openssl") is None:
        pytest.skip("osslsigncode or openssl is not installed")
    if not (tmp_path / "k.pem").exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "k.pem",
                        "-out", "c.pem", "-subj", "/CN=uki test", "-days", "1"], cwd=tmp_path, check=True,
                       capture_output=True)
    signed = tmp_path / f"{image.name}.signed"
    subprocess.run(["osslsigncode", "sign", "-certs", "c.pem", "-key", "k.pem", "-in", str(image),
                    "-out", str(signed)], cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run(["osslsigncode", "verify", "-in", str(signed)], cwd=tmp_path, capture_output=True,
                         text=True).stdout
    calculated = next(line.split(":")[1].strip() for line in out.splitlines()
                      if line.startswith("Calculated message digest"))
    return calculated.lower(), signed


def test_authenticode_digest_agrees_with_osslsigncode(built: Path, tmp_path: Path) -> None:
    calculated, signed = osslsigncode_digest(built, tmp_path)
    want = uki.authenticode_sha256(built.read_bytes()).hex()
    assert calculated == want
    # Signing leaves the digest as it was: the certificate table is not hashed.
    assert uki.authenticode_sha256(signed.read_bytes()).hex() == want


def test_not_a_pe_image() -> None:
    with pytest.raises(uki.PeError):
        uki.parse_pe(b"\x7fELF" + bytes(100))


# -- arm64 ------------------------------------------------------------------------------------

def arm64_kernels() -> list[Path]:
    """Debian's arm64 kernels unpacked by the arm64 ramdisk's build, looked for when the test runs:
    on a fresh clone the e2e tests (collected first) build it before this file's tests run."""
    return sorted((debs.out_dir(debs.ARCHES["arm64"]) / "kernel/boot").glob("vmlinuz-*-arm64"))


@pytest.fixture(scope="module")
def arm64_stub() -> Path:
    """Debian's arm64 stub, out of its .deb (downloaded once into initramfs/out/arm64/)."""
    if shutil.which(uki.objcopy("arm64")) is None:
        pytest.skip(f"{uki.objcopy('arm64')} is not installed (apt-get install binutils-aarch64-linux-gnu)")
    known = subprocess.run(["apt-cache", "show", "--no-all-versions", f"{uki.STUB_PACKAGE}:arm64"],
                           capture_output=True, check=False)
    if known.returncode != 0:
        pytest.skip("apt does not know arm64 packages here (dpkg --add-architecture arm64; apt-get update)")
    return uki.find_stub("arm64")


@pytest.fixture
def built_arm64(arm64_stub: Path, tmp_path: Path) -> Path:
    # The kernel gzipped, as initramfs/out/arm64/vmlinuz is; a PE image (the stub itself) inside.
    (tmp_path / "vmlinuz").write_bytes(gzip.compress(arm64_stub.read_bytes(), mtime=0))
    (tmp_path / "initrd").write_bytes(b"070701 an arm64 initramfs" * 300)
    uki.write(arm64_stub, tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyAMA0 bc.role=ramdisk",
              tmp_path / "ramdisk.efi", build_id="test-arm64")
    return tmp_path / "ramdisk.efi"


def test_the_arm64_stub_comes_out_of_its_deb(arm64_stub: Path) -> None:
    assert arm64_stub.name == "linuxaa64.efi.stub"
    assert uki.pe_arch(arm64_stub.read_bytes()) == "arm64"
    assert uki.find_stub("arm64") == arm64_stub  # unpacked once, found again
    if uki.STUBS["amd64"].is_file():
        assert uki.pe_arch(uki.STUBS["amd64"].read_bytes()) == "amd64"


def test_the_arm64_uki_holds_the_kernel_unpacked(built_arm64: Path, arm64_stub: Path) -> None:
    data = built_arm64.read_bytes()
    assert uki.pe_arch(data) == "arm64"
    pe = uki.parse_pe(data)
    # LoadImage takes a PE image: the gzipped kernel went in unpacked.
    assert pe.section(".linux") == arm64_stub.read_bytes()
    assert pe.section(".initrd") == (built_arm64.parent / "initrd").read_bytes()
    assert pe.section(".cmdline") == b"console=ttyAMA0 bc.role=ramdisk"
    names = [s.name for s in pe.sections]
    assert names.index(".text") < names.index(".osrel") < names.index(".linux") < names.index(".initrd")
    spans = sorted((s.virtual_address, s.virtual_address + s.virtual_size) for s in pe.sections)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert all(s.virtual_address % 0x1000 == 0 for s in pe.sections)


def test_arm64_reference_values_and_osslsigncode_agree(built_arm64: Path, tmp_path: Path) -> None:
    values = json.loads(built_arm64.with_name("ramdisk.efi.json").read_text())
    data = built_arm64.read_bytes()
    pe = uki.parse_pe(data)
    assert values["build_id"] == "test-arm64" and values["pcr12"] == "00" * 32
    assert values["pcr11"] == uki.predicted_pcr11(data).hex()
    calculated, _ = osslsigncode_digest(built_arm64, tmp_path)
    assert values["pcr4"][0] == calculated == uki.authenticode_sha256(data).hex()
    assert values["pcr4"][1] == uki.authenticode_sha256(pe.section(".linux")).hex()


def test_the_arm64_kernel_digest_agrees_with_osslsigncode(tmp_path: Path) -> None:
    """PCR 4's second value: Debian's arm64 kernel Image, which the stub starts by LoadImage."""
    kernels = arm64_kernels()
    if not kernels:
        pytest.skip("no arm64 kernel unpacked (python -m initramfs.build --arch arm64)")
    image = kernels[-1]
    assert uki.pe_arch(image.read_bytes()) == "arm64"
    calculated, _ = osslsigncode_digest(image, tmp_path)
    assert uki.authenticode_sha256(image.read_bytes()).hex() == calculated


@pytest.mark.parametrize(("header", "why"), [
    ({"version": 0x20A}, "boot protocol 0x20a"),
    ({"xloadflags": 0x7F & ~uki.XLF_EFI_HANDOVER_64}, "no 64-bit EFI handover"),
    ({"handover": 0}, "no 64-bit EFI handover"),
])
def test_a_kernel_without_a_handover_entry_is_refused(tmp_path: Path, header: dict[str, int],
                                                      why: str) -> None:
    (tmp_path / "vmlinuz").write_bytes(x86_kernel(**header))
    with pytest.raises(uki.PeError, match=why):
        uki.handover_kernel(tmp_path / "vmlinuz", tmp_path)


def test_a_pe_image_that_is_no_x86_kernel_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vmlinuz").write_bytes(b"MZ" + bytes(0x300))
    with pytest.raises(uki.PeError, match="no x86 boot protocol header"):
        uki.handover_kernel(tmp_path / "vmlinuz", tmp_path)


def test_a_kernel_that_is_no_gzip_goes_in_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "Image").write_bytes(b"MZ" + bytes(64))
    assert uki.pe_kernel(tmp_path / "Image", tmp_path) == tmp_path / "Image"
    (tmp_path / "Image.gz").write_bytes(gzip.compress(b"MZ" + bytes(64)))
    assert uki.pe_kernel(tmp_path / "Image.gz", tmp_path).read_bytes() == b"MZ" + bytes(64)


def test_an_image_for_another_machine() -> None:
    stub = uki.STUBS["amd64"]
    if not stub.is_file():
        pytest.skip(f"no {stub}")
    data = bytearray(stub.read_bytes())
    at = int.from_bytes(data[0x3C:0x40], "little") + 4
    data[at:at + 2] = (0x01C4).to_bytes(2, "little")  # ARMv7 Thumb
    with pytest.raises(uki.PeError, match="0x1c4"):
        uki.pe_arch(bytes(data))


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
