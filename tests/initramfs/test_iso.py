"""initramfs/iso.py: the ramdisk on a bootable ISO, built from stand-in kernel and initramfs
files (the real ones boot in tests/e2e/test_virtual_media*.py), read back by xorriso."""

from __future__ import annotations

import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from initramfs import build as ramdisk
from initramfs import iso

pytestmark = pytest.mark.slow  # downloads the GRUB packages once (apt-get download)


def need_tools() -> None:
    reason = iso.missing_tools()
    if reason:
        pytest.skip(reason)
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("needs apt-get and root (the GRUB packages are downloaded like the ramdisk's)")


def files_of(image: Path) -> dict[str, int]:
    out = subprocess.run(["xorriso", "-indev", str(image), "-find", "/", "-type", "f", "-exec", "lsdl"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 9 and parts[0].startswith("-"):
            found[parts[-1].strip("'")] = int(parts[4])
    return found


def extract(image: Path, path: str, dest: Path) -> bytes:
    subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(image), "-extract", path, str(dest)],
                   capture_output=True, check=True, timeout=60)
    return dest.read_bytes()


def el_torito(image: Path) -> str:
    return subprocess.run(["xorriso", "-indev", str(image), "-report_el_torito", "plain"],
                          capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_iso_boot_entries_files_sbom_and_reproducible(arch: str, tmp_path: Path) -> None:
    need_tools()
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initrd.img"
    kernel.write_bytes(os.urandom(300_000))
    initrd.write_bytes(os.urandom(200_000))
    sbom = json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
                       "components": [{"bom-ref": "pkg:deb/debian/busybox", "name": "busybox"}]}).encode()
    out = ramdisk.out_dir(ramdisk.ARCHES[arch])
    first = iso.build_iso(kernel, initrd, tmp_path / "a.iso", arch=arch, sbom=sbom, out=out)
    second = iso.build_iso(kernel, initrd, tmp_path / "b.iso", arch=arch, sbom=sbom, out=out)
    assert first.read_bytes() == second.read_bytes()  # the same inputs, the same bytes
    files = files_of(first)
    assert files["/boot/vmlinuz"] == 300_000 and files["/boot/initrd.img"] == 200_000
    assert extract(first, "/boot/vmlinuz", tmp_path / "k") == kernel.read_bytes()
    # The boot loader is small: everything but the two files is well under 1 MB.
    overhead = first.stat().st_size - 500_000
    assert overhead < 1_000_000, overhead
    report = el_torito(first)
    platforms = [line.split()[6] for line in report.splitlines() if line.startswith("El Torito boot img :")]
    assert platforms == (["BIOS", "UEFI"] if arch == "amd64" else ["UEFI"])
    # Licences and SBOM: the GRUB packages', inside and beside.
    packages = [ld.package for ld in iso.LOADERS[arch]]
    bom = json.loads(extract(first, "/licenses/sbom.cdx.json", tmp_path / "sbom.json"))
    assert bom == json.loads(first.with_name("a.iso.cdx.json").read_bytes())
    names = {c["name"] for c in bom["components"]}
    assert {"busybox", *packages} <= names
    grub = next(c for c in bom["components"] if c["name"] == packages[0])
    assert any(lic["license"]["name"].startswith("GPL-3") for lic in grub["licenses"]), grub["licenses"]
    tar = lzma.decompress(extract(first, "/licenses/debian-copyright.tar.xz", tmp_path / "c.tar.xz"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert sorted(t.getnames()) == sorted(f"{p}/copyright" for p in packages)


def test_the_uki_script_has_nothing_grub_would_parse_as_a_quote() -> None:
    script = iso.grub_uki_script()
    assert not any(c in script for c in "\"'$;{}|&<>\\#"), script
    assert script.splitlines()[-2:] == ["chainloader /boot/ramdisk.efi", "boot"]


def test_cmdline_that_grub_would_parse_refused() -> None:
    with pytest.raises(iso.IsoError, match="GRUB"):
        iso.grub_script("console=ttyS0 $(reboot)")
    assert "bc.media=cdrom" in iso.default_cmdline("amd64")
    assert "console=ttyAMA0" in iso.default_cmdline("arm64")


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_with_a_uki_the_uefi_core_chainloads_it_with_no_arguments(arch: str, tmp_path: Path) -> None:
    """The EFI core's script chainloads /boot/ramdisk.efi (no arguments, no tpm module) and its
    Authenticode digest is written for the policy's loaders; amd64's BIOS boots the kernel,
    arm64's ISO (UEFI only) holds the UKI and no kernel beside it."""
    from initramfs.uki import authenticode_sha256, pe_arch

    need_tools()
    kernel, initrd, uki = tmp_path / "vmlinuz", tmp_path / "initrd.img", tmp_path / "ramdisk.efi"
    kernel.write_bytes(os.urandom(100_000))
    initrd.write_bytes(os.urandom(100_000))
    uki.write_bytes(b"MZ" + os.urandom(50_000))  # only copied: GRUB reads it at boot
    out = ramdisk.out_dir(ramdisk.ARCHES[arch])
    image = iso.build_iso(kernel, initrd, tmp_path / "u.iso", arch=arch, out=out, uki=uki)
    assert extract(image, "/boot/ramdisk.efi", tmp_path / "u") == uki.read_bytes()
    efi_img = extract(image, "/boot/efi.img", tmp_path / "efi.img")
    assert efi_img
    core_name = {"amd64": "BOOTX64.EFI", "arm64": "BOOTAA64.EFI"}[arch]
    subprocess.run(["mcopy", "-i", str(tmp_path / "efi.img"), f"::/EFI/BOOT/{core_name}",
                    str(tmp_path / "core")],
                   check=True, timeout=60, env={**os.environ, "MTOOLS_SKIP_CHECK": "1"})
    core = (tmp_path / "core").read_bytes()
    assert b"chainloader /boot/ramdisk.efi\n" in core and b"linux /boot/vmlinuz" not in core
    assert b"tpm" not in core.lower().replace(b"tpmfs", b"")  # GRUB's measuring module left out
    assert pe_arch(core) == arch
    loaders = json.loads(image.with_name("u.iso.loaders.json").read_text())
    assert loaders == {"loaders": [authenticode_sha256(core).hex()]}
    platforms = [line.split()[6] for line in el_torito(image).splitlines()
                 if line.startswith("El Torito boot img :")]
    files = files_of(image)
    if arch == "amd64":  # BIOS still boots the kernel and initramfs (its core is compressed)
        assert files["/boot/vmlinuz"] == 100_000
        assert platforms == ["BIOS", "UEFI"]
    else:  # UEFI only: the kernel and initramfs are in the UKI alone
        assert "/boot/vmlinuz" not in files and "/boot/initrd.img" not in files, files
        assert platforms == ["UEFI"]
    # Without a UKI, no loaders file is left from an earlier build.
    iso.build_iso(kernel, initrd, tmp_path / "u.iso", arch=arch, out=out)
    assert not image.with_name("u.iso.loaders.json").exists()
    assert files_of(image)["/boot/vmlinuz"] == 100_000


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_with_a_db_key_the_uefi_boot_is_the_signed_uki_itself(arch: str, tmp_path: Path) -> None:
    """Secure Boot: the El Torito EFI image holds the signed UKI as the removable-media loader,
    no GRUB (whose lockdown refuses to chainload without shim: initramfs/iso.py), the UKI not
    beside it on the ISO, and loaders.json lists no loader; a UKI the key did not sign, and a
    signed ISO without a UKI, are refused before anything is written."""
    from initramfs import signing
    from tests.initramfs.test_signing import IPXE, keypair

    need_tools()
    for tool in ("sbsign", "sbverify", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install sbsigntool openssl)")
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed (a PE image to sign)")
    db = signing.DbKey.load(*keypair(tmp_path, "fleet-db"))
    other = signing.DbKey.load(*keypair(tmp_path, "other-db"))
    kernel, initrd, uki = tmp_path / "vmlinuz", tmp_path / "initrd.img", tmp_path / "ramdisk.efi"
    kernel.write_bytes(os.urandom(100_000))
    initrd.write_bytes(os.urandom(100_000))
    shutil.copyfile(IPXE, uki)   # a PE image standing in for the UKI: the ISO only carries it
    out = ramdisk.out_dir(ramdisk.ARCHES[arch])
    with pytest.raises(iso.IsoError, match="needs a UKI"):
        iso.build_iso(kernel, initrd, tmp_path / "n.iso", arch=arch, out=out, db_key=db)
    with pytest.raises(iso.IsoError, match="not signed by the db key"):
        iso.build_iso(kernel, initrd, tmp_path / "n.iso", arch=arch, out=out, uki=uki, db_key=db)
    signing.sign(uki, other)
    with pytest.raises(iso.IsoError, match="not signed by the db key"):
        iso.build_iso(kernel, initrd, tmp_path / "n.iso", arch=arch, out=out, uki=uki, db_key=db)
    assert not (tmp_path / "n.iso").exists()
    shutil.copyfile(IPXE, uki)
    signing.sign(uki, db)
    image = iso.build_iso(kernel, initrd, tmp_path / "s.iso", arch=arch, out=out, uki=uki, db_key=db)
    extract(image, "/boot/efi.img", tmp_path / "efi.img")
    name = {"amd64": "BOOTX64.EFI", "arm64": "BOOTAA64.EFI"}[arch]
    started = tmp_path / name
    subprocess.run(["mcopy", "-i", str(tmp_path / "efi.img"), f"::/EFI/BOOT/{name}", str(started)],
                   check=True, timeout=60, env={**os.environ, "MTOOLS_SKIP_CHECK": "1"})
    assert started.read_bytes() == uki.read_bytes()
    assert "/boot/ramdisk.efi" not in files_of(image)
    assert json.loads(image.with_name("s.iso.loaders.json").read_text()) == {"loaders": []}
    # The same UKI unsigned-ISO way (no db key): GRUB's core chainloads it, and is the loader.
    plain = iso.build_iso(kernel, initrd, tmp_path / "p.iso", arch=arch, out=out, uki=uki)
    assert len(json.loads(plain.with_name("p.iso.loaders.json").read_text())["loaders"]) == 1
    assert "/boot/ramdisk.efi" in files_of(plain)
