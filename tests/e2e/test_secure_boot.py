"""Secure Boot on, end to end (issue 52): an x86 node under OVMF's Secure Boot build with the
fleet's own keys enrolled PXE-boots the site's signed iPXE, which chains the site's signed UKI;
and what the fleet did not sign is refused by the firmware and named by the site.

One site lab for the module (qemu/sitelab.py: the provisioning network, the site daemon with
its dnsmasq and TFTP), one node, one boot per test; the rig is qemu/sitesecure.py's (the demo's
``--secure-boot`` runs the same):

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
- The rest of the site-driven life on that node, Secure Boot still on: deploy.image through the
  site's route writes an image whose ESP holds a UKI of its kernel and initramfs signed by the
  fleet's db key (qemu/nodeimage.py), disk.wipe, boot.cleanUp, then a power cycle to the disk,
  which the firmware boots itself (no -kernel): the installed system joins in role node, its
  agent reads SecureBoot 1 and the databases the ramdisk read (efivars), PCR 4 holds the
  disk's UKI alone and PCR 7 the fleet's db certificate as its authority. The same image with
  the UKI's signature removed is refused by the firmware from the disk and named.
- A UKI signed by another key, an unsigned one, and one the fleet signed then revoked (its
  Authenticode digest appended to dbx in the node's variable store, the one every boot of the
  module runs with: the signed path attests with that dbx measured): iPXE fetches it, the
  firmware refuses to start it, the node's console says so, and the site names
  ``secure_boot_violation`` with the console's line (the BMC's SOL, kept by the site), not a
  timeout.
- An unsigned ipxe.efi (the site restarted with Debian's as it is): the firmware refuses it
  ("Access Denied"), named the same way.
- The release gate's Secure Boot part through a BMC (item 5), last since it rewrites the node's
  store: the node left by a tenant with Secure Boot off and its own db certificate, its BMC the
  project's Redfish emulator (DMTF's recorded rackmount) whose SecureBoot resource is the node's
  own variable store file (redfish_emulator/machine.py ``NodeVariables``): bmc.query secure_boot
  names both, bmc.firmware restore_secure_boot puts them back into the file (no boot: the gate
  reads the BMC), and the node's one boot, by PXE through that BMC, is signed, enforcing and
  attested.

Marked qemu and slow: eight boots (the first test's PXE boot and its disk boot, one per
refusal, the put-back's), 6 min 22 s under TCG on a shared 2-core machine (nice; the first test
2 min 20 s of it, the put-back's 68 s); 5 min 37 s before the put-back's test at a load average
of about 2 (the first test 2 min 24 s of it, 1 min 15 s before its deploy, wipe and disk boot;
the unsigned disk 20 s); the five boots before took 4 min 26 s there, 11 min 29 s at a load
average of about 15.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

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
from qemu import secureboot, sitesecure
from qemu.lab import Ramdisk
from qemu.siteattest import pcr4_applications
from qemu.sitelab import IPXE_DIR, SiteLab
from qemu.sitelife import Bmc, Lifecycle, Step, guest_shell
from qemu.sitesecure import SecureRig
from tests.site.bmc.redfish_emulator import PASSWORD as EMU_PASSWORD
from tests.site.bmc.redfish_emulator import USER as EMU_USER
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.machine import PoweredMachine
from tests.site.conftest import PASSWORD, REF, USERNAME

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "sb-node"
# The last test's BMC: DMTF's recorded rackmount (per-database ResetKeys, PEM certificate POSTs).
REDFISH_TREE = "dmtf_public_rackmount1"
REDFISH_REF = "sb-node-redfish"
# efivarfs: the SecureBoot variable (4 bytes of attributes, then its one byte).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
DATABASES = (("PK", pcr7.EFI_GLOBAL_VARIABLE), ("KEK", pcr7.EFI_GLOBAL_VARIABLE),
             ("db", pcr7.IMAGE_SECURITY_DATABASE), ("dbx", pcr7.IMAGE_SECURITY_DATABASE))


@pytest.fixture(scope="module")
def rig(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRig]:
    reason = sitesecure.missing()
    if reason:
        pytest.skip(reason)
    with SiteLab(tmp_path_factory.mktemp("sitelab-sb"), ramdisk_parts) as lab:
        SecretStore(lab.secrets_dir).put(REF, Credentials(USERNAME, PASSWORD))
        with sitesecure.secure_rig(lab, NODE, USERNAME, PASSWORD, REF) as rig:
            yield rig


def test_a_node_with_secure_boot_on_boots_signed_attests_and_boots_its_deployed_disk(rig: SecureRig) -> None:
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
        # The rest of the site-driven life, Secure Boot still on: deploy (the image's ESP holds
        # its UKI signed by the fleet's db key), wipe, clean up, then the firmware's boot of
        # the deployed disk (no -kernel) into the installed system, which joins in role node.
        life.http_proxy()
        life.deploy()
        life.wipe()
        life.clean_up()
        life.boot_device("disk")
        life.power_cycle()
        life.disk_join()
        installed = life.command(NODE, "driver.invoke", {"driver": "efivars", "operation": "list",
                                                         "arguments": {}})[1]
    finally:
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
        sitesecure.power_off(rig)
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
    assert keys_code == 0 and {"pk", "kek", "db", "dbx"} <= set(found), keys_out
    log_ = eventlog.parse(judged.evidence.event_log)
    assert pcr7.judge(log_, pcr7.SecureBootPolicy.from_json(
        {"required": True, **found, "authorities": [fleet]}))["secure_boot"] == "on"
    # (dbx as the ramdisk read it holds the revoked build; a dbx without that entry is refused)
    for wrong in ({"authorities": [rig.keys.cert_sha256("other-db")]}, {"pk": "ab" * 32}, {"dbx": "cd" * 32}):
        with pytest.raises(PolicyFailed) as info:
            pcr7.judge(log_, pcr7.SecureBootPolicy.from_json({"required": True, **found, **wrong}))
        assert info.value.check == "policy_secure_boot", info.value
    # The installed system, booted by the firmware from the deployed disk with Secure Boot on:
    # its own agent (role node, the disk's root mounted: Lifecycle.disk_join) reads SecureBoot 1
    # and the databases the ramdisk read (the site turned nothing off to hand the node over).
    assert installed.exit_code == 0, installed
    efi = json.loads(bytes(installed.stdout))
    assert (efi["secure_boot"], efi["setup_mode"]) == (1, 0), efi
    assert {k: efi[f"{k}_sha256"] for k in ("pk", "kek", "db", "dbx")} == found, (efi, found)
    node_join = life.joins["node"]
    assert node_join.role == "node" and node_join.boot_id != judged.boot_id, node_join
    print(f"the installed system's join: {node_join.verdict}")
    # What the firmware started: the ESP's UKI alone (its Authenticode digest; QEMU's -kernel
    # would have been the kernel), verified by the fleet's db certificate (PCR 7's authority).
    assert pcr4_applications(node_join.evidence) == [bytes.fromhex(node.image.loader_authenticode)]
    node_log = eventlog.parse(node_join.evidence.event_log)
    assert pcr7.judge(node_log, pcr7.SecureBootPolicy.from_json(
        {"required": True, **found, "authorities": [fleet]}))["secure_boot"] == "on"


@pytest.mark.parametrize("signer", ["other-db", "unsigned", "dbx"])
def test_a_uki_the_fleet_did_not_sign_is_refused_by_the_firmware_and_named(rig: SecureRig,
                                                                           signer: str) -> None:
    """Signed by a key not in db, unsigned, or signed by the fleet's key but its digest in dbx."""
    if signer == "dbx":
        entry = sitesecure.revoked_entry(rig)
    else:
        key = rig.keys.other_key() if signer == "other-db" else None
        entry = sitesecure.unsigned_uki_entry(rig, f"uki-{signer}.efi", key)
    cause, detail, console = sitesecure.boot_refused(rig, entry)
    print(f"cause {cause}: {detail}\n-- console (tail) --\n{console[-2500:]}")
    assert cause == "secure_boot_violation", (cause, detail, console[-3000:])
    assert "Linux version" not in console.split("iPXE initialising")[-1]   # no kernel started


def test_the_deployed_image_unsigned_is_refused_by_the_firmware_and_named(rig: SecureRig) -> None:
    """The installed image of the first test with its UKI's signature removed, booted from the
    disk by the firmware: refused, named; the tenant's boot chain unsigned does not start."""
    sitesecure.unsigned_disk(rig)
    cause, detail, console = sitesecure.boot_refused(rig, None)   # the console: this boot's
    print(f"cause {cause}: {detail}\n-- console (tail) --\n{console[-2500:]}")
    assert cause == "secure_boot_violation", (cause, detail, console[-3000:])
    assert "Access Denied" in detail, detail
    assert rig.node.power.boots()[-1].device == "disk", rig.node.power.boots()
    assert "Linux version" not in console and "node root" not in console, console[-3000:]


def test_an_unsigned_ipxe_is_refused_by_the_firmware_and_named(rig: SecureRig, tmp_path: Path) -> None:
    lab = rig.lab
    unsigned = tmp_path / "unsigned-boot-files"
    signing.site_boot_files(unsigned, None)     # Debian's iPXE as it is, pinned as it is
    lab.stop_site()
    lab.start_site(boot_files=unsigned)
    try:
        cause, detail, console = sitesecure.boot_refused(rig, rig.attest.entry(NODE))
    finally:
        lab.stop_site()
        lab.start_site(boot_files=rig.boot_files)
    print(f"cause {cause}: {detail}\n-- console (tail) --\n{console[-2500:]}")
    assert cause == "secure_boot_violation", (cause, detail, console[-3000:])
    assert "Access Denied" in detail, detail


def test_secure_boot_left_off_with_a_tenants_db_certificate_is_put_back_through_the_bmc_then_boots_signed(
        rig: SecureRig) -> None:
    """The release gate's Secure Boot part in QEMU (item 5), one boot. The node's own variable
    store is left as a tenant could leave it (Secure Boot off, its own db certificate beside the
    fleet's); its BMC is the project's Redfish emulator (DMTF's recorded rackmount, which has
    per-database ResetKeys and certificate POSTs) whose SecureBoot resource is that store file
    (redfish_emulator/machine.py ``NodeVariables``). Through the gateway and the site daemon:
    bmc.query secure_boot against the fleet's policy names secure_boot.off and
    secure_boot.db_extra, each with the restore remedy; bmc.firmware restore_secure_boot puts them
    back (the node off: into the file at once) and its read-back is clean; the file holds again
    what the fleet enrolled. Then the BMC powers the node on by PXE: the signed iPXE, the signed
    UKI, Secure Boot enforcing, the join attested with the fleet's db certificate as PCR 7's
    authority. No boot before the put-back: the gate reads the BMC, not the node."""
    lab, node = rig.lab, rig.node
    store = Path(node.power.spec().pflash_vars)
    clean = secureboot.read_store(store)
    assert clean.secure_boot, clean
    tenant = secureboot.Signature("x509", ssl.PEM_cert_to_DER_cert(rig.keys.cert("other-db").read_text()))
    secureboot.write_store(store, secureboot.StoreKeys(
        False, {**clean.databases, "db": (*clean.databases["db"], tenant)}))
    policy = lab.workdir / "sb-policy" / "secure-boot.json"
    policy.parent.mkdir(exist_ok=True)
    for name in ("fleet-pk", "fleet-kek", "fleet-db"):
        shutil.copyfile(rig.keys.cert(name), policy.parent / f"{name}.pem")
    revoked = uki.authenticode_sha256(rig.revoked.read_bytes()).hex()
    policy.write_text(json.dumps({"secure_boot": "required", "restore": "enroll",
                                  "pk": [{"pem": "fleet-pk.pem"}], "kek": [{"pem": "fleet-kek.pem"}],
                                  "db": [{"pem": "fleet-db.pem"}], "dbx": [revoked]}))
    SecretStore(lab.secrets_dir).put(REDFISH_REF, Credentials(EMU_USER, EMU_PASSWORD))
    emu = lab.in_lan(lambda: RedfishEmulator.of(REDFISH_TREE, lab.workdir / "sb-bmc").__enter__())
    machine = PoweredMachine(node.power)
    shown: list[Step] = []
    try:
        emu.attach(machine)
        life = Lifecycle(lab, node, Bmc("redfish", emu.address, REDFISH_REF, verify_tls=False), shown.append,
                         attest=rig.attest)
        started = time.monotonic()
        found = life.bmc_op("bmc.query", "secure_boot", policy=str(policy))
        gated = time.monotonic()
        done = life.bmc_op("bmc.firmware", "restore_secure_boot", policy=str(policy))
        print(f"the gate {gated - started:.1f}s, the put-back {time.monotonic() - gated:.1f}s: "
              f"{done.values['writes']}")
        after = secureboot.read_store(store)
        life.prepare_ramdisk()
        life.boot_device("pxe")
        life.power_on()
        life.pxe_join()     # attested: the signed iPXE, then the signed UKI
        code, out = guest_shell(node, f"od -An -tu1 {SECURE_BOOT_VAR}; dmesg | grep -i 'secure boot'")
    finally:
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
        with contextlib.suppress(AssertionError):
            sitesecure.power_off(rig)
        emu.__exit__()
    print("the BMC did to the node:", ", ".join(machine.events))
    named = {m.check: (m.bmc_remedy.kind, m.bmc_remedy.operation) for m in found.release.restorable}
    restore = ("bmc.firmware", "restore_secure_boot")
    assert named == {"secure_boot.off": restore, "secure_boot.db_extra": restore}, found.release
    assert not found.release.cannot_restore and not found.release.pool_ready, found.release
    other = rig.keys.cert_sha256("other-db")
    assert [m.found for m in found.release.restorable if m.check == "secure_boot.db_extra"] == [other]
    assert done.release.pool_ready, done.release
    fleet_db = rig.keys.cert_sha256("fleet-db")
    assert done.values["writes"] == (f"db ResetKeys DeleteAllKeys; db certificate {fleet_db[:16]} enrolled; "
                                     "SecureBootEnable true"), done.values
    assert after == clean, after         # the node's store: what the fleet enrolled, dbx as it was
    assert machine.events[:3] == ["variables written: db", "variables written: db",
                                  "variables written: SecureBootEnable"], machine.events
    judged = life.joins["ramdisk"]
    assert judged.verdict.status is Status.ATTESTED, judged.verdict
    assert judged.verdict.matched["secure_boot"] == "on", judged.verdict
    assert judged.verdict.matched["authorities"] == fleet_db, judged.verdict
    assert code == 0 and re.search(r"(?m)^\s*6\s+0\s+0\s+0\s+1\s*$", out), out
    assert "secureboot: Secure boot enabled" in out, out
