"""An arm64 node's UEFI PXE boot through the site lab's real path under Secure Boot, attested
(qemu/sitelab.py, qemu/siteattest.py): the provisioning network's namespaces (a bridge, the
node's tap device, a plain DHCP server for addresses) and the site daemon's own dnsmasq in
proxy-DHCP mode with its TFTP, its boot files from ``lab.site_boot_files()``.

The node is QEMU's arm64 ``virt`` under AAVMF (pflash) with the fleet's keys enrolled
(qemu/secureboot.py: PK, KEK, db by virt-fw-vars, Secure Boot on) and a TPM 2.0
(``tpm-tis-device``, swtpm), powered on directly (no BMC: the BMC paths are
test_site_lifecycle.py's). AAVMF's own PXE gets the address from the plain DHCP server and the
boot file from the site's proxy offer to client architecture 11: on this Secure Boot site
``bootaa64.efi``, the site's arm64 UKI signed with the fleet's db key and pinned in
boot-files.json, which AAVMF fetches by TFTP, verifies and starts itself (Debian's GRUB 2.06
without shim, the boot file of a site without Secure Boot, refuses to start an image under
Secure Boot: "shim_lock protocol not found"). The UKI's own command line names the site; the
ramdisk fetches the node's settings from it and joins; PCR 4 holds the UKI alone, PCR 7 is
judged with the fleet's db certificate the authority. A site without Secure Boot serves its
GRUB instead (the first test, its own site lab). Only as far as the join: arm64 under TCG is
slow, and the deploy after it is x86's test.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway.verifier import eventlog, pcr7
from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.refused import PolicyFailed
from agent.site.boot.pxe import BootFile
from initramfs import netgrub, signing, uki
from qemu import secureboot
from qemu import tpm as qemu_tpm
from qemu.harness import AAVMF_CODE, AAVMF_VARS
from qemu.lab import ensure_ramdisk
from qemu.siteattest import SiteAttestation
from qemu.sitelab import SITE_ADDRESS, SITE_HTTP_PORT, SiteLab, missing_network_prerequisites
from qemu.sitelife import Lifecycle, SiteNode, Step, StepFailed, guest_shell, make_node
from tests.e2e.conftest import skip_reason

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "site-arm64"
# efivarfs: the SecureBoot variable (4 bytes of attributes, then its one byte).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@contextlib.contextmanager
def attested_boot(attest: SiteAttestation, node: SiteNode) -> Iterator[list[Step]]:
    """The gateway's verifier up for one boot; the steps shown are printed, the verifier stopped
    and the node powered off however the boot ends."""
    shown: list[Step] = []
    attest.start()
    try:
        yield shown
    finally:
        attest.stop()
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
        node.power.stop(force=True)


def missing() -> str | None:
    reason = skip_reason("arm64") or missing_network_prerequisites() or qemu_tpm.missing()
    if reason is None and not (AAVMF_CODE.is_file() and AAVMF_VARS.is_file()):
        reason = f"no {AAVMF_CODE} / {AAVMF_VARS} (apt-get install qemu-efi-aarch64)"
    if reason is None and shutil.which(uki.objcopy("arm64")) is None:
        reason = f"{uki.objcopy('arm64')} is not installed (apt-get install binutils-aarch64-linux-gnu)"
    return reason


def test_an_arm64_node_pxe_boots_the_sites_grub_through_its_proxy_dhcp_and_attests(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A site without Secure Boot: AAVMF's PXE gets the site's GRUB (``grubaa64.efi``), which
    fetches /boot.grub and the node's /pxe/<mac>.grub from the site's HTTP service and chainloads
    the site's arm64 UKI from its store by digest; PCR 4 holds the GRUB (the policy's one
    loader), the UKI and its kernel."""
    reason = missing()
    if reason is None and shutil.which("grub-mkimage") is None:
        reason = "grub-mkimage is not installed (apt-get install grub-common): the site's arm64 GRUB"
    if reason:
        pytest.skip(reason)
    with SiteLab(tmp_path_factory.mktemp("sitelab-arm64-grub"), ensure_ramdisk(arch="arm64")) as lab:
        boot_files = lab.site_boot_files()
        lab.start_site(boot_files=boot_files)
        attest = SiteAttestation(lab, NODE)
        node = make_node(lab, NODE, uefi=True, tpm_state=attest.tpm_state)
        assert node.power.spec().pflash_code == str(AAVMF_CODE)
        with attested_boot(attest, node) as shown:
            life = Lifecycle(lab, node, None, shown.append, attest=attest)
            life.prepare_ramdisk()            # a UKI entry, boot_file grubaa64.efi
            life.power_on_directly()
            life.pxe_join()                   # /boot.grub, /pxe/<mac>.grub, the UKI, attested
            code, cmdline = guest_shell(node, "cat /proc/cmdline /sys/class/tpm/tpm0/pcr-sha256/12")
        console = lab.console(node.power)
        # The site's TFTP served the GRUB that site_boot_files built for this site's address.
        assert attest.loader_name == netgrub.NAME and attest.loader_digest is not None
        written = json.loads((boot_files / f"{netgrub.NAME}.json").read_text())
        assert written == {"loaders": [attest.loader_digest.hex()],
                           "site": f"http://{SITE_ADDRESS}:{SITE_HTTP_PORT}"}, written
        assert "bc-pxe: GRUB fetching the boot script of the site" in console, console[-3000:]
        assert "bc-pxe: GRUB starting the ramdisk UKI" in console, console[-3000:]
        # PCR 12 zero, as the guest reads it: the site's GRUB passed the UKI no command line.
        assert code == 0 and cmdline.split()[-1] == "0" * 64, cmdline
        # The UKI names the site and nothing of the node (its settings came from the site).
        assert code == 0 and f"bc.site=http://{SITE_ADDRESS}:{SITE_HTTP_PORT}" in cmdline, cmdline
        assert "bc.token" not in cmdline and "bc.node" not in cmdline, cmdline
        # The site's dnsmasq offered the GRUB and sent it whole (its log, in the boot timeline).
        timeline = lab.site_state / "site" / "observe" / "timeline" / f"{NODE}.json"
        attempts = json.loads(timeline.read_text())["attempts"]
        events = [(e["step"], e["detail"]) for a in attempts for e in a["events"]]
        print("the site's timeline of the node:", events)
        assert ("dhcp_offer", "proxy offer") in events and ("tftp_sent", netgrub.NAME) in events, events
        # In order: the entry, the proxy offer, the GRUB sent, /boot.grub, the node's script, the UKI.
        steps = [step for step, _ in events]
        firsts = [steps.index(s) for s in ("prepared", "dhcp_offer", "tftp_sent", "chain_script",
                                            "node_script", "kernel")]
        assert firsts == sorted(firsts), events
        # Attested with the GRUB as the loader (Lifecycle.check_attested: PCR 4 exactly the
        # GRUB, the UKI, its kernel); the same evidence without it among the loaders refused.
        judged = life.joins["ramdisk"]
        assert judged.verdict.status is Status.ATTESTED, judged.verdict
        refused = attest.judge_without_loader(judged)
        assert isinstance(refused, PolicyFailed) and refused.check == "policy_pcr4", refused
        assert attest.loader_digest.hex() in refused.reason, refused


def test_an_arm64_node_pxe_boots_the_sites_signed_uki_under_secure_boot_and_attests(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    reason = missing() or secureboot.missing("arm64")
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("sitelab-arm64")
    with SiteLab(workdir, ensure_ramdisk(arch="arm64")) as lab:
        keys = secureboot.FleetKeys.generate(workdir / "fleet-keys")
        fleet = keys.cert_sha256("fleet-db")
        attest = SiteAttestation(lab, NODE, keys.db_key(), firmware_uki=True,
                                 secure_boot={"required": True, "authorities": [fleet]})
        boot_files = lab.site_boot_files(keys.db_key(), grub=False, uki=attest.image)
        lab.start_site(boot_files=boot_files)
        node = make_node(lab, NODE, uefi=True, tpm_state=attest.tpm_state,
                         secure_boot_vars=keys.enrolled_vars(workdir / "enrolled-vars.fd", arch="arm64"))
        assert node.power.spec().pflash_code == str(AAVMF_CODE)
        with attested_boot(attest, node) as shown:
            life = Lifecycle(lab, node, None, shown.append, attest=attest)
            # The site refuses an entry for its UKI boot file naming another build: the TFTP
            # would start its own UKI whatever the entry says.
            entry = {"node_id": NODE, "mac_address": node.mac, "ttl_seconds": 60, **attest.entry(NODE),
                     "uki_digest": {"hex": "0" * 64}}
            with pytest.raises(StepFailed) as info:
                life.site("boot.prepareRamdisk", entry)
            assert f"serves the UKI with sha256 {attest.uki_sha256}" in str(info.value), info.value
            life.prepare_ramdisk()            # a UKI entry, boot_file bootaa64.efi
            life.power_on_directly()
            life.pxe_join()                   # the UKI by TFTP, /pxe/<mac>.cmdline, attested
            code, out = guest_shell(node, "cat /proc/cmdline /sys/class/tpm/tpm0/pcr-sha256/12; "
                                          f"od -An -tu1 {SECURE_BOOT_VAR}")
        console = lab.console(node.power)
        # The site's TFTP served the signed UKI the boot files pin, and no GRUB ran.
        pinned = json.loads((boot_files / "boot-files.json").read_text())["files"]
        assert set(pinned) == {BootFile.BIOS, BootFile.UEFI, BootFile.UEFI_ARM64_UKI}, pinned
        assert pinned[BootFile.UEFI_ARM64_UKI]["sha256"] == attest.uki_sha256, pinned
        assert signing.verify(boot_files / BootFile.UEFI_ARM64_UKI, keys.cert("fleet-db"))
        print("the firmware's PXE:", [line.strip() for line in console.splitlines() if "NBP" in line])
        assert f"NBP filename is {BootFile.UEFI_ARM64_UKI}" in console, console[-3000:]
        assert f"NBP filesize is {attest.image.stat().st_size} Bytes" in console, console[-3000:]
        assert "Welcome to GRUB" not in console and "bc-pxe" not in console, console[-3000:]
        # PCR 12 zero: nothing passed the UKI a command line; its own names the site and
        # nothing of the node (its settings came from the site); the firmware says SecureBoot = 1.
        assert code == 0 and f"bc.site=http://{SITE_ADDRESS}:{SITE_HTTP_PORT}" in out, out
        assert "bc.token" not in out and "bc.node" not in out, out
        assert re.search(r"(?m)^0{64}$", out), out
        assert re.search(r"(?m)^\s*6\s+0\s+0\s+0\s+1\s*$", out), out
        # The site's dnsmasq offered the UKI and sent it whole (its log, in the boot timeline).
        timeline = lab.site_state / "site" / "observe" / "timeline" / f"{NODE}.json"
        attempts = json.loads(timeline.read_text())["attempts"]
        events = [(e["step"], e["detail"]) for a in attempts for e in a["events"]]
        print("the site's timeline of the node:", events)
        sent = [e["t"] for a in attempts for e in a["events"] if e["step"] in ("dhcp_offer", "tftp_sent")]
        print(f"the proxy offer to the UKI sent whole by TFTP: {sent[-1] - sent[0]:.1f}s")
        assert ("dhcp_offer", "proxy offer") in events, events
        assert ("tftp_sent", BootFile.UEFI_ARM64_UKI.value) in events, events
        steps = [step for step, _ in events]
        firsts = [steps.index(s) for s in ("prepared", "dhcp_offer", "tftp_sent")]
        assert firsts == sorted(firsts), events
        # Attested with no loader before the UKI (Lifecycle.check_attested: PCR 4 the UKI
        # alone), PCR 7 judged: Secure Boot on, the fleet's db certificate the authority.
        judged = life.joins["ramdisk"]
        assert judged.verdict.status is Status.ATTESTED, judged.verdict
        assert judged.verdict.matched["secure_boot"] == "on", judged.verdict
        assert judged.verdict.matched["authorities"] == fleet, judged.verdict
        with pytest.raises(PolicyFailed) as refused:   # the same log, another db certificate
            pcr7.judge(eventlog.parse(judged.evidence.event_log), pcr7.SecureBootPolicy.from_json(
                {"required": True, "authorities": [keys.cert_sha256("other-db")]}))
        assert refused.value.check == "policy_secure_boot", refused.value


def test_the_arm64_site_lab_node_with_a_tpm_gets_aavmf_with_its_own_variables(tmp_path: Path) -> None:
    """The lab's arm64 node with a TPM (no boot): AAVMF's code and a copy of its variables in
    the node's folder (the node's UEFI settings are its own, as a server's are)."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    with SiteLab(tmp_path / "lab", ensure_ramdisk(arch="arm64")) as lab:
        power = lab.powered_node("n1", kernel=lab.ramdisk.kernel, initrd=lab.ramdisk.base, append="",
                                 uefi=True, tpm_state=tmp_path / "tpm")
        spec = power.spec()
        assert spec.pflash_code == str(AAVMF_CODE)
        variables = Path(spec.pflash_vars)
        assert variables.parent == power.dir and variables.read_bytes() == AAVMF_VARS.read_bytes()
        plain = lab.powered_node("n2", kernel=lab.ramdisk.kernel, initrd=lab.ramdisk.base, append="")
        assert plain.spec().pflash_code == ""     # no TPM: the firmware as before (-bios)
