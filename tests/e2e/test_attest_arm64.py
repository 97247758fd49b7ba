"""Attestation on arm64's real (emulated) firmware: the arm64 ramdisk as a UKI (initramfs/uki.py:
Debian's arm64 systemd-boot stub, the kernel's Image, the initramfs) booted from an ESP folder
by AAVMF (Debian's qemu-efi-aarch64, on pflash with a copy of its variables) on QEMU's virt
machine with a TPM 2.0 (``tpm-tis-device``, swtpm). The ramdisk's /init loads the TPM's driver
(tpm_tis, a module in Debian's arm64 cloud kernel) before the agent starts; the join is attested
with PCRs 4, 11 and 12 as uki.py predicted, and the node's disk.wipe certificate counts as
verified. GRUB in front of the UKI (``chainloader`` with no arguments) is measured before it, and with
GRUB listed as a loader the join attests (from an ESP folder). The arm64 virtual-media ISO boots
with Secure Boot on: AAVMF with the fleet's keys enrolled starts the ISO's signed UKI, PCR 7
judged (issue 52). The site's
arm64 PXE path (the site's GRUB from its TFTP, the node's GRUB script and the UKI from its HTTP
service) is test_site_arm64_pxe.py's, through the site lab's real proxy DHCP and TFTP.

Marked qemu and slow: arm64 under TCG boots in minutes.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway.verifier import eventlog, pcr7
from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.policy import Build
from agent.gateway.verifier.refused import PolicyFailed
from initramfs import build as ramdisk
from initramfs import iso, signing, uki
from qemu import secureboot
from qemu import tpm as qemu_tpm
from qemu.harness import AAVMF_CODE, AAVMF_VARS, Machine, grub_chainloader
from qemu.lab import Lab, ensure_ramdisk
from qemu.sitemedia import user_net_config
from tests.e2e.conftest import JOIN_TIMEOUT, run_command, skip_reason
from tests.e2e.test_attest_uefi import attest, verdict

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "attest-arm64"
MAC = "52:54:00:12:34:56"  # the lab's NIC
# efivarfs: the SecureBoot variable (4 bytes of attributes, then its one byte).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@pytest.fixture(scope="module")
def arm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    reason = skip_reason("arm64") or qemu_tpm.missing()
    if reason is None and not (AAVMF_CODE.is_file() and AAVMF_VARS.is_file()):
        reason = f"no {AAVMF_CODE} / {AAVMF_VARS} (apt-get install qemu-efi-aarch64)"
    if reason is None and shutil.which(uki.objcopy("arm64")) is None:
        reason = f"{uki.objcopy('arm64')} is not installed (apt-get install binutils-aarch64-linux-gnu)"
    if reason:
        pytest.skip(reason)
    with Lab(tmp_path_factory.mktemp("lab-attest-arm64"), ensure_ramdisk(arch="arm64")) as lab:
        yield lab


def firmware_variables(tmp_path: Path) -> Path:
    """A writable copy of AAVMF's variables for one machine (pflash unit 1)."""
    variables = tmp_path / "AAVMF_VARS.fd"
    shutil.copyfile(AAVMF_VARS, variables)
    return variables


def event_log(machine: Machine) -> eventlog.EventLog:
    """The firmware's event log as the guest's kernel exposes it (through the test ramdisk's
    shell, parsed here)."""
    # Between marks that the shell's echo of the command line does not hold as lines of their own.
    status, out = machine.shell("echo LOG-''START;"
                                " base64 </sys/kernel/security/tpm0/binary_bios_measurements; echo LOG-''END")
    found = re.search(r"(?ms)^LOG-START$(.*?)^LOG-END$", out)
    assert status == 0 and found, out
    return eventlog.parse(base64.b64decode("".join(found.group(1).split())))


def pcr4_images(machine: Machine) -> list[str]:
    """The EFI applications the firmware measured into PCR 4, in order."""
    return [e.sha256.hex() for e in event_log(machine).of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)]


def test_an_arm64_uki_under_aavmf_attests_and_its_wipe_is_verified(arm_lab: Lab, tmp_path: Path) -> None:
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    variables = firmware_variables(tmp_path)
    esp, values = arm_lab.uki(NODE)
    assert (esp / "EFI" / "BOOT" / "BOOTAA64.EFI").is_file()
    joins = attest(arm_lab, tmp_path / "ca", [Build.from_values(values)])
    disks = arm_lab.standard_disks(NODE, size=64 * 1024 * 1024)
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
        machine = arm_lab.boot(NODE, tpm=swtpm.socket, esp=esp, disks=disks[:1],
                               pflash=(AAVMF_CODE, variables))
        try:
            assert "tpm-tis-device,tpmdev=tpm0" in " ".join(machine.argv())
            arm_lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
            # The driver came from the ramdisk's modules; the firmware's log is in securityfs.
            status, out = machine.shell(
                "cut -d' ' -f1 /proc/modules; wc -c </sys/kernel/security/tpm0/binary_bios_measurements;"
                " cat /sys/class/tpm/tpm0/pcr-sha256/4")
            assert status == 0, out
            assert "tpm_tis" in out.split() and "tpm_tis_core" in out.split(), out
            assert int(out.split()[-2]) > 0, out  # the event log's size
            assert pcr4_images(machine) == values["pcr4"]  # the UKI, then the kernel the stub started
            found = verdict(joins, NODE)
            assert found.status is Status.ATTESTED, f"{found}\n{out}\n{machine.console_tail()}"
            assert found.matched["build"] == values["build_id"] and found.matched["pcr4"] == values["pcr4"][0]
            cid, _, _ = run_command(arm_lab, machine, NODE, "disk.wipe",
                                    {"disks": [{"serial": disks[0].serial}], "method": "BEST_AVAILABLE",
                                     "verify": "FULL"})
            ok, why = arm_lab.gateway.verified(cid)
            assert ok, why
        finally:
            machine.stop()
            arm_lab.gateway.attestation = None


def test_grub_chainloading_the_uki_is_measured_and_attests_as_a_loader(arm_lab: Lab, tmp_path: Path) -> None:
    node = "attest-arm64-grub"
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    esp, values = arm_lab.uki(node)
    image = esp / "EFI" / "Linux" / "ramdisk.efi"
    image.parent.mkdir(parents=True)
    (esp / "EFI" / "BOOT" / "BOOTAA64.EFI").rename(image)
    grub = grub_chainloader(esp / "EFI" / "BOOT" / "BOOTAA64.EFI", "/EFI/Linux/ramdisk.efi")
    grub_digest = uki.authenticode_sha256(grub.read_bytes())
    joins = attest(arm_lab, tmp_path / "ca", [Build.from_values(values)])
    joins.verifier.policy.loaders.add(grub_digest)
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
        machine = arm_lab.boot(node, tpm=swtpm.socket, esp=esp,
                               pflash=(AAVMF_CODE, firmware_variables(tmp_path)))
        try:
            arm_lab.wait_joined(machine, node, JOIN_TIMEOUT)
            assert "bc-grub: starting /EFI/Linux/ramdisk.efi" in machine.console()
            # GRUB, then the UKI it chainloaded through the firmware's LoadImage, then the kernel.
            assert pcr4_images(machine) == [grub_digest.hex(), *values["pcr4"]]
            found = verdict(joins, node)
            assert found.status is Status.ATTESTED, f"{found}\n{machine.console_tail()}"
            assert found.matched["pcr4"] == values["pcr4"][0]  # PCR 12 zero: GRUB passed no options
        finally:
            machine.stop()
            arm_lab.gateway.attestation = None


def test_the_signed_arm64_iso_boots_its_signed_uki_with_secure_boot_on_and_the_node_attests(
        arm_lab: Lab, tmp_path: Path) -> None:
    """The arm64 virtual-media ISO with Secure Boot on (initramfs/iso.py, "Secure Boot"): the
    fleet's keys made now (qemu/secureboot.py) and enrolled by virt-fw-vars into the node's
    variable store (Debian's AAVMF is built with Secure Boot); the ISO's EFI image is the UKI
    signed with the fleet's db key, which AAVMF verifies and starts with no arguments; the node's
    settings come from its config medium (the second CD). PCR 4 holds the UKI alone (the build's
    ``pcr4_secure_boot``: the stub starts its kernel unmeasured under Secure Boot); PCR 7 is
    judged: Secure Boot on, the fleet's db certificate the authority (another refused); the
    ramdisk reads SecureBoot = 1."""
    node = "attest-arm64-media"
    reason = iso.missing_tools() or secureboot.missing("arm64")
    if reason:
        pytest.skip(reason)
    keys = secureboot.FleetKeys.generate(tmp_path / "keys")
    esp, values = arm_lab.uki("arm64-media-build", settings={"media": "cdrom"},
                              sign=lambda image: signing.sign(image, keys.db_key()))
    arch = ramdisk.ARCHES["arm64"]
    image = iso.build_iso(arm_lab.ramdisk.kernel, arm_lab.workdir / "arm64-media-build-initrd.img",
                          tmp_path / "ramdisk.iso", arch=arch.name, out=ramdisk.out_dir(arch),
                          uki=esp / "EFI" / "BOOT" / "BOOTAA64.EFI", db_key=keys.db_key())
    assert json.loads(image.with_name("ramdisk.iso.loaders.json").read_text())["loaders"] == []
    config = user_net_config(arm_lab, node, tmp_path)
    variables = keys.enrolled_vars(tmp_path / "enrolled-vars.fd", arch="arm64")
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    joins = attest(arm_lab, tmp_path / "ca", [Build.from_values(values)])
    fleet = keys.cert_sha256("fleet-db")
    joins.verifier.policy.secure_boot = pcr7.SecureBootPolicy.from_json(
        {"required": True, "authorities": [fleet]})
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
        machine = arm_lab.boot(node, tpm=swtpm.socket, media=[str(image), str(config)],
                               pflash=(AAVMF_CODE, variables), secure_boot=True)
        try:
            arm_lab.wait_joined(machine, node, JOIN_TIMEOUT)
            assert "Welcome to GRUB" not in machine.console()
            log = event_log(machine)
            started = [e.sha256.hex() for e in log.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)]
            # The UKI alone: under Secure Boot its stub starts the kernel under its own security
            # override, unverified and unmeasured by the firmware (initramfs/uki.py).
            assert started == values["pcr4_secure_boot"] == values["pcr4"][:1], started
            found = verdict(joins, node)
            assert found.status is Status.ATTESTED, f"{found}\n{machine.console_tail()}"
            assert found.matched["pcr4"] == values["pcr4"][0], found
            code, cmdline = machine.shell("cat /proc/cmdline")
            assert code == 0 and "bc.media=cdrom" in cmdline and "bc.token" not in cmdline, cmdline
            code, pcr12 = machine.shell("cat /sys/class/tpm/tpm0/pcr-sha256/12")
            assert code == 0 and pcr12.split()[-1] == "0" * 64, pcr12
            code, sb = machine.shell(f"od -An -tu1 {SECURE_BOOT_VAR}; dmesg | grep -i 'secure boot'")
        finally:
            machine.stop()
            arm_lab.gateway.attestation = None
    # Secure Boot was on and enforced: PCR 7 judged from the event log says on, not in setup
    # mode, the fleet's db certificate the authority that verified the UKI; the firmware says so
    # to the ramdisk (SecureBoot = 1 after its 4 bytes of attributes), and the kernel saw it.
    assert found.matched["secure_boot"] == "on", found
    assert found.matched["authorities"] == fleet, found
    assert code == 0 and re.search(r"(?m)^\s*6\s+0\s+0\s+0\s+1\s*$", sb), sb
    assert "secureboot: Secure boot enabled" in sb, sb
    with pytest.raises(PolicyFailed) as info:   # the same log, another db certificate: refused
        pcr7.judge(log, pcr7.SecureBootPolicy.from_json(
            {"required": True, "authorities": [keys.cert_sha256("other-db")]}))
    assert info.value.check == "policy_secure_boot", info.value
