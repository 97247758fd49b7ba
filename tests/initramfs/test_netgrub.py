"""initramfs/netgrub.py: the site's GRUB for arm64 UEFI PXE, built with the host's grub-mkimage
from Debian's arm64 GRUB modules (booted in tests/e2e/test_attest_arm64_site.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from initramfs import build as ramdisk
from initramfs import netgrub
from initramfs.uki import authenticode_sha256, pe_arch

SITE = "http://10.0.0.2:8088"


def test_its_script_fetches_the_sites_boot_grub_and_else_gives_up() -> None:
    lines = netgrub.embedded_script(SITE).splitlines()
    assert lines[1] == "configfile (http,10.0.0.2:8088)/boot.grub"
    assert lines[-1] == "exit"  # back to the firmware: the next boot device
    assert not any(c in "".join(lines) for c in "\"'$;{}|&<>\\#")


@pytest.mark.parametrize("url", ["https://10.0.0.2:8443", "http://10.0.0.2:8088/boot", "10.0.0.2",
                                 "http://a b:80"])
def test_a_site_grub_cannot_reach_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="http://host"):
        netgrub.embedded_script(url)


@pytest.mark.slow  # downloads Debian's arm64 GRUB package once (apt-get download)
def test_the_image_is_arm64_holds_its_script_and_no_tpm_module_and_its_digest_beside_it(
        tmp_path: Path) -> None:
    if shutil.which("grub-mkimage") is None:
        pytest.skip("grub-mkimage is missing (apt-get install grub-common)")
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("needs apt-get and root (the GRUB package is downloaded like the ramdisk's)")
    target = tmp_path / netgrub.NAME
    digest = netgrub.build(SITE, target, ramdisk.out_dir(ramdisk.ARCHES["arm64"]))
    image = target.read_bytes()
    assert pe_arch(image) == "arm64"
    assert b"configfile (http,10.0.0.2:8088)/boot.grub\n" in image
    assert b"tpm" not in image.lower().replace(b"tpmfs", b"")  # GRUB's measuring module left out
    assert digest == authenticode_sha256(image).hex()
    assert json.loads(target.with_name(target.name + ".json").read_text()) == {
        "loaders": [digest], "site": SITE}
    # Another site, another image (its address is in it): one build per site, as the UKI.
    other = netgrub.build("http://10.0.0.3:8088", tmp_path / "other.efi",
                          ramdisk.out_dir(ramdisk.ARCHES["arm64"]))
    assert other != digest
