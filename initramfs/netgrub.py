"""The site's GRUB for arm64 UEFI PXE: the boot file the site's TFTP serves to arm64 nodes.

    python -m initramfs.build --arch arm64 --uki-site http://10.0.0.2:8088
    # -> OUT/ramdisk.efi (the site's UKI) and OUT/grubaa64.efi (this GRUB), each with a .json
    #    beside it: the UKI's reference values; GRUB's Authenticode digest for the policy's loaders

arm64 firmware's PXE starts an EFI image by TFTP, and there is no iPXE for it to start (QEMU's
NIC ROMs, and iPXE's arm64 builds are not in Debian): the site's dnsmasq serves this GRUB
(``grubaa64.efi``, from the site's ``site_ipxe_dir``: agent/site/boot/dnsmasq.py) to client
architecture 11. Its embedded script fetches the site's ``/boot.grub`` over HTTP, which runs
the node's own GRUB script by its MAC (agent/site/boot/pxe.py: ``chainloader`` of the UKI from
the site's store, with no arguments, so PCR 12 stays empty). The site's address is in the image
(GRUB configures its network from the firmware's DHCP answer, which under a proxy DHCP is the
network's DHCP server's, not the site's): one build per site, as the UKI is.

The image is made by the host's ``grub-mkimage`` from the modules of Debian's
grub-efi-arm64-bin (downloaded and unpacked as the ISO's, initramfs/iso.py), without GRUB's
``tpm`` module (it would measure GRUB's commands into PCR 8 and what it reads into PCR 9).
The firmware measures it into PCR 4 before the UKI: its Authenticode digest, written beside
it, goes into the attestation policy's ``loaders`` (docs/attestation.md).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from agent.errors import InvalidParameters
from agent.proc import run
from agent.site.boot.pxe import BootFile, grub_http_device
from initramfs.uki import authenticode_sha256

NAME = BootFile.UEFI_ARM64.value
# configfile brings GRUB's normal mode (the script engine: ${net_default_mac}); minicmd: exit.
MODULES = ("efinet", "http", "configfile", "chain", "echo", "boot", "minicmd")


def embedded_script(site_url: str) -> str:
    """What the image runs: the site's /boot.grub; when the site does not answer, back to
    the firmware (the next boot device). No quote in it: GRUB's parser would take the lines
    after one as a single word."""
    try:
        server = grub_http_device(site_url)
    except InvalidParameters as exc:
        raise ValueError(exc.message) from None
    return ("echo bc-pxe: GRUB fetching the boot script of the site\n"
            f"configfile {server}/boot.grub\n"
            "echo bettercompute: the site did not answer, booting the next device\n"
            "exit\n")


def build(site_url: str, target: Path, out: Path) -> str:
    """``target``: the site's GRUB for arm64 (``out``: the arm64 build directory, where the
    GRUB package is downloaded and unpacked); ``target``.json beside it holds its Authenticode
    digest (``{"loaders": [hex], "site": URL}``); returns that digest."""
    from initramfs import iso

    script_text = embedded_script(site_url)
    ((_loader, _deb, unpacked),) = iso.grub_trees("arm64", out)
    modules = unpacked / "usr/lib/grub/arm64-efi"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".netgrub-", dir=target.parent) as tmp:
        script = Path(tmp) / "grub.cfg"
        script.write_text(script_text)
        image = Path(tmp) / NAME
        run(["grub-mkimage", "-O", "arm64-efi", "-d", str(modules), "-o", str(image),
             "-p", "/", "-c", str(script), *MODULES], timeout=120)
        image.replace(target)
    values = {"loaders": [authenticode_sha256(target.read_bytes()).hex()], "site": site_url}
    target.with_name(target.name + ".json").write_text(json.dumps(values, indent=2) + "\n")
    return values["loaders"][0]
