"""The virtual-media ISO on real firmware with Secure Boot on: an OVMF node (the Secure Boot
build, the fleet's own keys enrolled) with a TPM 2.0 (swtpm) boots the ISO, whose El Torito EFI
image is the signed ramdisk UKI itself; the UKI reads its settings from its config medium, and
its join is attested with PCR 7 judged.

The ISO is the one the build makes with ``--iso-uki --db-key`` (initramfs/iso.py's
``build_iso(uki=..., db_key=...)``): the UKI signed with the fleet's db key is the removable-media
loader of the ISO's EFI image, with no GRUB before it (Debian's GRUB 2.06 refuses to chainload
anything under Secure Boot without shim: initramfs/iso.py, "Secure Boot"). The fleet's keys are
made at test time (qemu/secureboot.py: PK, KEK, db) and enrolled by virt-fw-vars into a copy of
OVMF_VARS_4M.fd, Secure Boot on; the node runs OVMF_CODE_4M.secboot.fd on pflash with SMM. The
firmware verifies the UKI against db and measures it into PCR 4 and its authority into PCR 7.

The UKI's command line is the ISO's (bc.media=cdrom: nothing of the node); the node's id,
gateway, token and static address are on its config medium (agent/site/boot/vmedia.py), as
for the ISO's kernel boot. The policy holds the UKI's reference values (initramfs/uki.py), no
loader (the ISO's loaders.json lists none: PCR 4 is the UKI alone), and a ``secure_boot``
section requiring Secure Boot with the fleet's db certificate as every image's authority (PCR 7
judged event by event: agent/gateway/verifier/pcr7.py); PCR 12 must be empty. Secure Boot was
on, not only claimed: the verdict's PCR 7 judgement names it on with the fleet's authority (the
same evidence with another db certificate is refused), the ramdisk reads SecureBoot = 1 from its
firmware and its kernel says it is locked down. Marked qemu and slow: one boot.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.gateway.verifier import eventlog, pcr7
from agent.gateway.verifier.attest import Status, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Build, Policy
from agent.gateway.verifier.refused import PolicyFailed
from initramfs import build as ramdisk
from initramfs import iso, signing
from qemu import secureboot
from qemu import tpm as qemu_tpm
from qemu.lab import Lab
from qemu.siteattest import RecordingVerifier, pcr4_applications
from qemu.sitemedia import user_net_config
from tests.e2e.conftest import JOIN_TIMEOUT, skip_reason
from tests.e2e.test_attest_uefi import verdict

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "attest-media"
# efivarfs: the SecureBoot variable (4 bytes of attributes, then its one byte).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def test_the_signed_iso_boots_its_signed_uki_with_secure_boot_on_and_the_node_attests(
        lab: Lab, tmp_path: Path) -> None:
    reason = skip_reason(uefi=True) or qemu_tpm.missing() or iso.missing_tools() or secureboot.missing()
    if reason:
        pytest.skip(reason)
    keys = secureboot.FleetKeys.generate(tmp_path / "keys")
    esp, values = lab.uki("media-build", settings={"media": "cdrom"},
                          sign=lambda image: signing.sign(image, keys.db_key()))
    signed_uki = esp / "EFI" / "BOOT" / "BOOTX64.EFI"
    initrd = lab.workdir / "media-build-initrd.img"  # the UKI's; BIOS boots it beside
    arch = ramdisk.ARCHES[lab.ramdisk.arch]
    image = iso.build_iso(lab.ramdisk.kernel, initrd, tmp_path / "ramdisk.iso", arch=arch.name,
                          out=ramdisk.out_dir(arch), uki=signed_uki, db_key=keys.db_key())
    loaders = json.loads(image.with_name("ramdisk.iso.loaders.json").read_text())["loaders"]
    assert loaders == []    # the firmware starts the UKI itself
    config = user_net_config(lab, NODE, tmp_path)
    variables = keys.enrolled_vars(tmp_path / "enrolled-vars.fd")
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    fleet = keys.cert_sha256("fleet-db")
    recorder = RecordingVerifier(
        Policy(builds=[Build.from_values(values)], loaders={bytes.fromhex(d) for d in loaders}, learn="first",
               secure_boot=pcr7.SecureBootPolicy.from_json({"required": True, "authorities": [fleet]})),
        ek_roots=load_certificates([tmp_path / "ca" / n for n in (qemu_tpm.CA_ROOT, qemu_tpm.CA_ISSUER)]))
    joins = JoinAttestation(recorder)
    lab.gateway.attestation = joins  # the lab's gateway attests from its next session on
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
        machine = lab.boot(NODE, uefi=True, tpm=swtpm.socket, media=[str(image), str(config)],
                           pflash=(secureboot.OVMF_SECBOOT_CODE, variables), secure_boot=True)
        try:
            lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
            found = verdict(joins, NODE)
            assert found.status is Status.ATTESTED, f"{found}\n{machine.console_tail()}"
            assert found.matched["pcr4"] == values["pcr4"][0], found
            console = machine.console()
            code, cmdline = machine.shell("cat /proc/cmdline")
            assert code == 0 and "bc.media=cdrom" in cmdline and "bc.token" not in cmdline, cmdline
            code, pcr12 = machine.shell("cat /sys/class/tpm/tpm0/pcr-sha256/12")
            assert code == 0 and pcr12.split()[-1] == "0" * 64, pcr12  # GRUB passed no command line
            code, sb = machine.shell(f"od -An -tu1 {SECURE_BOOT_VAR}; dmesg | grep -i 'secure boot'")
        finally:
            machine.stop()
            lab.gateway.attestation = None
    # Secure Boot was on and enforced: PCR 7 judged from the event log says on, not in setup
    # mode, and the fleet's db certificate the authority that verified GRUB and the UKI.
    assert found.matched["secure_boot"] == "on", found
    assert found.matched["authorities"] == fleet, found
    # The firmware says so to the ramdisk (SecureBoot = 1 after its 4 bytes of attributes), and
    # Debian's kernel locked itself down for it.
    assert code == 0 and re.search(r"(?m)^\s*6\s+0\s+0\s+0\s+1\s*$", sb), sb
    assert "secureboot: Secure boot enabled" in sb and "locked down from EFI Secure Boot" in sb, sb
    # What the firmware started: the UKI alone, no GRUB.
    (judged,) = [j for j in recorder.judged if j.node_id == NODE]
    assert pcr4_applications(judged.evidence) == [bytes.fromhex(v) for v in values["pcr4"]], judged
    assert "Welcome to GRUB" not in console and "bc-init" in console, console[-3000:]
    # The same evidence with another db certificate as the only authority is refused.
    with pytest.raises(PolicyFailed) as info:
        pcr7.judge(eventlog.parse(judged.evidence.event_log), pcr7.SecureBootPolicy.from_json(
            {"required": True, "authorities": [keys.cert_sha256("other-db")]}))
    assert info.value.check == "policy_secure_boot", info.value
