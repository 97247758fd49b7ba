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


def test_cmdline_that_grub_would_parse_refused() -> None:
    with pytest.raises(iso.IsoError, match="GRUB"):
        iso.grub_script("console=ttyS0 $(reboot)")
    assert "bc.media=cdrom" in iso.default_cmdline("amd64")
    assert "console=ttyAMA0" in iso.default_cmdline("arm64")
