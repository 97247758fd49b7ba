"""The virtual-media ISO on real firmware: an OVMF node with a TPM 2.0 (swtpm) boots the ISO,
whose GRUB chainloads the ramdisk as a UKI with no arguments, reads its settings from its
config medium, and its join is attested.

The UKI's command line is the ISO's (bc.media=cdrom: nothing of the node); the node's id,
gateway, token and static address are on its config medium (agent/site/boot/vmedia.py), as
for the ISO's kernel boot. The policy holds the UKI's reference values (initramfs/uki.py) and,
as a loader, GRUB's EFI core (the ISO's loaders.json); PCR 12 must be empty. Marked qemu and
slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.policy import Build
from initramfs import build as ramdisk
from initramfs import iso
from qemu import tpm as qemu_tpm
from qemu.lab import Lab
from qemu.sitemedia import user_net_config
from tests.e2e.conftest import JOIN_TIMEOUT, skip_reason
from tests.e2e.test_attest_uefi import attest, verdict

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "attest-media"


def test_the_iso_chainloads_the_uki_and_the_node_attests(lab: Lab, tmp_path: Path) -> None:
    reason = skip_reason(uefi=True) or qemu_tpm.missing() or iso.missing_tools()
    if reason:
        pytest.skip(reason)
    esp, values = lab.uki("media-build", settings={"media": "cdrom"})
    initrd = lab.workdir / "media-build-initrd.img"  # the UKI's; BIOS boots it beside
    arch = ramdisk.ARCHES[lab.ramdisk.arch]
    image = iso.build_iso(lab.ramdisk.kernel, initrd, tmp_path / "ramdisk.iso", arch=arch.name,
                          out=ramdisk.out_dir(arch), uki=esp / "EFI" / "BOOT" / "BOOTX64.EFI")
    loaders = json.loads(image.with_name("ramdisk.iso.loaders.json").read_text())["loaders"]
    config = user_net_config(lab, NODE, tmp_path)
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    joins = attest(lab, tmp_path / "ca", [Build.from_values(values)])
    joins.verifier.policy.loaders.update(bytes.fromhex(d) for d in loaders)
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
        machine = lab.boot(NODE, uefi=True, tpm=swtpm.socket, media=[str(image), str(config)])
        try:
            lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
            found = verdict(joins, NODE)
            assert found.status is Status.ATTESTED, f"{found}\n{machine.console_tail()}"
            assert found.matched["pcr4"] == values["pcr4"][0], found
            machine.wait_console(r"starting the ramdisk UKI from the CD", 5)
            code, cmdline = machine.shell("cat /proc/cmdline")
            assert code == 0 and "bc.media=cdrom" in cmdline and "bc.token" not in cmdline, cmdline
            code, pcr12 = machine.shell("cat /sys/class/tpm/tpm0/pcr-sha256/12")
            assert code == 0 and pcr12.split()[-1] == "0" * 64, pcr12  # GRUB passed no command line
        finally:
            machine.stop()
            lab.gateway.attestation = None
