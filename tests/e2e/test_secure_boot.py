"""Secure Boot on, end to end (issue 52): an x86 node under OVMF's Secure Boot build with the
fleet's own keys enrolled PXE-boots the site's signed iPXE, which chains the site's signed UKI;
and what the fleet did not sign is refused by the firmware and named by the site.

One site lab for the module (qemu/sitelab.py: the provisioning network, the site daemon with
its dnsmasq and TFTP), one node, one boot per test:

- The fleet's keys are made at test time (qemu/secureboot.py: PK, KEK, db, and another db key
  never enrolled) and enrolled by virt-fw-vars into a copy of OVMF_VARS_4M.fd; the node runs
  OVMF_CODE_4M.secboot.fd on pflash with SMM, a TPM 2.0 (swtpm) and no NIC ROM, so the
  firmware's own PXE starts what the site's TFTP serves.
- The site's boot files are Debian's iPXE signed with the fleet's db key and pinned in
  boot-files.json, as the build makes them (initramfs/signing.py, ``lab.site_boot_files``); the
  site's UKI is signed with the same key.
- The signed path joins, attested under a policy that requires Secure Boot and the fleet's db
  certificate as the authority (PCR 7 judged event by event: agent/gateway/verifier/pcr7.py); PCR 4
  holds the signed ipxe.efi's and the signed UKI's Authenticode digests, the build's reference
  values (signing left them as they were), and the ramdisk reads SecureBoot = 1 from its
  firmware; the same evidence with another PK or another db authority is refused.
- A UKI signed by another key, and an unsigned one: iPXE fetches it, the firmware refuses to
  start it, the node's console says so, and the site names ``secure_boot_violation`` with the
  console's line (the BMC's SOL, kept by the site), not a timeout.
- An unsigned ipxe.efi (the site restarted with Debian's as it is): the firmware refuses it
  ("Access Denied"), named the same way.

Marked qemu and slow: four boots, 7 min 8 s under TCG on a shared 2-core machine (nice).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.gateway.verifier import eventlog, pcr7
from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.refused import PolicyFailed
from agent.images.filesource import file_digest
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.boot.dnsmasq import BOOT_MANIFEST
from agent.site.boot.pxe import BootFile
from initramfs import signing, uki
from qemu import secureboot
from qemu import tpm as qemu_tpm
from qemu.ipmisim import IpmiSim, start_ipmi_sim
from qemu.lab import Ramdisk
from qemu.siteattest import SiteAttestation
from qemu.sitebreak import cause_of
from qemu.sitelab import IPXE_DIR, SiteLab, missing_network_prerequisites
from qemu.sitelife import Bmc, Lifecycle, SiteNode, Step, guest_shell, make_node
from tests.site.conftest import PASSWORD, REF, USERNAME

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "sb-node"
CAUSE_TIMEOUT = 240.0
# efivarfs: the SecureBoot variable (4 bytes of attributes, then its one byte).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
DATABASES = (("PK", pcr7.EFI_GLOBAL_VARIABLE), ("KEK", pcr7.EFI_GLOBAL_VARIABLE),
             ("db", pcr7.IMAGE_SECURITY_DATABASE), ("dbx", pcr7.IMAGE_SECURITY_DATABASE))


@dataclass
class Rig:
    lab: SiteLab
    keys: secureboot.FleetKeys
    boot_files: Path
    attest: SiteAttestation
    node: SiteNode
    life: Lifecycle
    ipmi: IpmiSim


@pytest.fixture(scope="module")
def rig(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    reason = missing_network_prerequisites() or qemu_tpm.missing() or secureboot.missing()
    for tool in ("ipmi_sim", "ipmitool"):
        if reason is None and shutil.which(tool) is None:
            reason = f"{tool} is not installed (apt-get install openipmi ipmitool)"
    if reason:
        pytest.skip(reason)
    with SiteLab(tmp_path_factory.mktemp("sitelab-sb"), ramdisk_parts) as lab:
        keys = secureboot.FleetKeys.generate(lab.workdir / "fleet-keys")
        boot_files = lab.site_boot_files(keys.db_key(), grub=False)
        lab.start_site(boot_files=boot_files)
        # The policy requires Secure Boot and the fleet's db certificate as each image's authority.
        attest = SiteAttestation(lab, NODE, keys.db_key(), secure_boot={
            "required": True, "authorities": [keys.cert_sha256("fleet-db")]})
        node = make_node(lab, NODE, uefi=True, tpm_state=attest.tpm_state, firmware_pxe=True,
                         secure_boot_vars=keys.enrolled_vars(lab.workdir / "enrolled-vars.fd"))
        SecretStore(lab.secrets_dir).put(REF, Credentials(USERNAME, PASSWORD))
        sim = lab.in_lan(start_ipmi_sim, lab.workdir / "ipmi", node.power, USERNAME, PASSWORD,
                         sol=lab.sol(node.power))
        attest.start()    # the lab's gateway attests the node's joins
        try:
            yield Rig(lab, keys, boot_files, attest, node,
                      Lifecycle(lab, node, Bmc("ipmi", sim.address, REF), attest=attest), sim)
        finally:
            attest.stop()
            sim.stop()


def power_off(rig: Rig) -> None:
    rig.life.bmc_op("bmc.power", "off", graceful_timeout_seconds="0")


def wait_cause(rig: Rig) -> tuple[str, str]:
    """The cause the site names for the node's boot (its inventory.refresh, as a control plane
    asks), polled until one is named."""
    deadline = time.monotonic() + CAUSE_TIMEOUT
    while time.monotonic() < deadline:
        cause, detail = cause_of(rig.life.site("inventory.refresh", {"skip_gpus": True}), NODE)
        if cause:
            return cause, detail
        time.sleep(3)
    raise rig.life.fail(f"the site named no cause within {CAUSE_TIMEOUT:g}s")


def uki_entry(rig: Rig, name: str, sign: signing.DbKey | None) -> dict[str, Any]:
    """An entry whose UKI is the site's build as ``sign`` leaves it (None: unsigned), in the
    images' upstream as ``name``."""
    image = rig.lab.www / name
    unsigned = rig.lab.workdir / "site-uki-unsigned-esp" / "EFI" / "BOOT" / "BOOTX64.EFI"
    if not unsigned.is_file():
        rig.lab.uki("site-uki-unsigned", settings=SiteAttestation.uki_settings())
    shutil.copyfile(unsigned, image)
    if uki.parse_pe(image.read_bytes()).cert_size:
        raise AssertionError(f"{unsigned} is signed: the refusal needs the unsigned build")
    if sign is not None:
        signing.sign(image, sign)
    entry = rig.attest.entry(NODE)
    entry.update(uki_url=rig.lab.upstream_url(name), uki_digest={"hex": file_digest(image)})
    return entry


def boot_refused(rig: Rig, entry: dict[str, Any]) -> tuple[str, str, str]:
    """The node booted by PXE with ``entry``; (cause, detail, console) once the site names a cause."""
    rig.life.site("boot.prepareRamdisk", {"node_id": NODE, "mac_address": rig.node.mac,
                                          "boot_file": BootFile.UEFI.value, "ttl_seconds": 1800, **entry})
    rig.life.boot_device("pxe")
    rig.life.power_on()
    try:
        cause, detail = wait_cause(rig)
    finally:
        power_off(rig)
    return cause, detail, rig.lab.console(rig.node.power)


def test_a_node_with_secure_boot_on_boots_the_signed_ipxe_and_uki_and_attests(rig: Rig) -> None:
    lab, node, life = rig.lab, rig.node, rig.life
    # The site serves what the build signed and pinned: ipxe.efi signed by the fleet's db key.
    pinned = json.loads((rig.boot_files / BOOT_MANIFEST).read_text())["files"]
    tftp = lab.site_state / "site" / "boot" / "tftp" / BootFile.UEFI.value
    assert file_digest(tftp) == pinned[BootFile.UEFI.value]["sha256"]
    assert signing.verify(tftp, rig.keys.cert("fleet-db"))
    assert not signing.verify(IPXE_DIR / BootFile.UEFI, rig.keys.cert("fleet-db"))
    # Signing left the Authenticode digest as it was: the loader's digest is Debian's iPXE's.
    assert rig.attest.loader_digest == uki.authenticode_sha256((IPXE_DIR / BootFile.UEFI).read_bytes())
    shown: list[Step] = []
    life.on_step = shown.append
    life.query()
    life.prepare_ramdisk()
    life.boot_device("pxe")
    life.power_on()
    try:
        life.pxe_join()    # attested: PCR 4 is the signed ipxe.efi, then the signed UKI
        code, out = guest_shell(node, f"od -An -tu1 {SECURE_BOOT_VAR}; dmesg | grep -i 'secure boot'")
        # The Secure Boot databases as the ramdisk reads them (their values, after the attributes).
        keys_code, keys_out = guest_shell(node, "cd /sys/firmware/efi/efivars && for v in " + " ".join(
            f"{name}-{guid}" for name, guid in DATABASES) + "; do [ -e $v ] && echo $v $(tail -c +5 $v "
            "| sha256sum); done; true")
    finally:
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
        power_off(rig)
    judged = life.joins["ramdisk"]
    assert judged.verdict.status is Status.ATTESTED, judged.verdict
    assert judged.verdict.matched["pcr4"] == rig.attest.values["pcr4"][0]
    assert signing.verify(rig.attest.image, rig.keys.cert("fleet-db"))
    # The firmware enforced: SecureBoot is 1 (after the 4 bytes of its attributes), and the
    # kernel saw it (Debian's locks itself down under Secure Boot).
    assert code == 0 and re.search(r"(?m)^\s*6\s+0\s+0\s+0\s+1\s*$", out), out
    assert "secureboot: Secure boot enabled" in out and "locked down from EFI Secure Boot" in out, out
    # PCR 7 judged from the event log: on, not in setup mode, the fleet's db certificate the
    # authority that verified the images (iPXE, the UKI).
    fleet = rig.keys.cert_sha256("fleet-db")
    assert judged.verdict.matched["secure_boot"] == "on", judged.verdict
    assert judged.verdict.matched["authorities"] == fleet, judged.verdict
    # The same evidence against the databases the ramdisk read: they are the ones measured;
    # another db certificate as the only authority, or another PK, is refused.
    found = {line.split()[0].split("-")[0].lower(): line.split()[1]
             for line in keys_out.splitlines() if line.split() and "-" in line.split()[0]
             and len(line.split()) > 1 and len(line.split()[1]) == 64}
    assert keys_code == 0 and {"pk", "kek", "db"} <= set(found), keys_out
    log_ = eventlog.parse(judged.evidence.event_log)
    assert pcr7.judge(log_, pcr7.SecureBootPolicy.from_json(
        {"required": True, **found, "authorities": [fleet]}))["secure_boot"] == "on"
    for wrong in ({"authorities": [rig.keys.cert_sha256("other-db")]}, {"pk": "ab" * 32}):
        with pytest.raises(PolicyFailed) as info:
            pcr7.judge(log_, pcr7.SecureBootPolicy.from_json({"required": True, **found, **wrong}))
        assert info.value.check == "policy_secure_boot", info.value


@pytest.mark.parametrize("signer", ["other-db", "unsigned"])
def test_a_uki_the_fleet_did_not_sign_is_refused_by_the_firmware_and_named(rig: Rig, signer: str) -> None:
    key = rig.keys.other_key() if signer == "other-db" else None
    cause, detail, console = boot_refused(rig, uki_entry(rig, f"uki-{signer}.efi", key))
    print(f"cause {cause}: {detail}\n-- console (tail) --\n{console[-2500:]}")
    assert cause == "secure_boot_violation", (cause, detail, console[-3000:])
    assert "Linux version" not in console.split("iPXE initialising")[-1]   # no kernel started


def test_an_unsigned_ipxe_is_refused_by_the_firmware_and_named(rig: Rig, tmp_path: Path) -> None:
    lab = rig.lab
    unsigned = tmp_path / "unsigned-boot-files"
    signing.site_boot_files(unsigned, None)     # Debian's iPXE as it is, pinned as it is
    lab.stop_site()
    lab.start_site(boot_files=unsigned)
    try:
        cause, detail, console = boot_refused(rig, rig.attest.entry(NODE))
    finally:
        lab.stop_site()
        lab.start_site(boot_files=rig.boot_files)
    print(f"cause {cause}: {detail}\n-- console (tail) --\n{console[-2500:]}")
    assert cause == "secure_boot_violation", (cause, detail, console[-3000:])
    assert "Access Denied" in detail, detail
