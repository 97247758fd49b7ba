"""An arm64 node's UEFI PXE boot through the site lab's real path, attested (qemu/sitelab.py,
qemu/siteattest.py): the provisioning network's namespaces (a bridge, the node's tap device, a
plain DHCP server for addresses) and the site daemon's own dnsmasq in proxy-DHCP mode with its
TFTP, its boot files from ``lab.site_boot_files()`` (Debian's iPXE binaries and the site's GRUB
for arm64, initramfs/netgrub.py).

The node is QEMU's arm64 ``virt`` under AAVMF (pflash, its own copy of the variables) with a
TPM 2.0 (``tpm-tis-device``, swtpm), powered on directly (no BMC: the BMC paths are
test_site_lifecycle.py's). AAVMF's own PXE gets the address from the plain DHCP server and the
boot file from the site's proxy offer to client architecture 11, ``grubaa64.efi``, which the
site's TFTP serves; GRUB fetches /boot.grub and the node's /pxe/<mac>.grub from the site's HTTP
service and chainloads the site's arm64 UKI from its store by digest. The ramdisk joins and
attests: PCR 4 holds the site's GRUB (the policy's one loader), the UKI and its kernel. Only as
far as the join: arm64 under TCG is slow, and the deploy after it is x86's test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.refused import PolicyFailed
from initramfs import netgrub, uki
from qemu import tpm as qemu_tpm
from qemu.harness import AAVMF_CODE, AAVMF_VARS
from qemu.lab import ensure_ramdisk
from qemu.siteattest import SiteAttestation
from qemu.sitelab import SITE_ADDRESS, SITE_HTTP_PORT, SiteLab, missing_network_prerequisites
from qemu.sitelife import Lifecycle, Step, guest_shell, make_node
from tests.e2e.conftest import skip_reason

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "site-arm64"


def missing() -> str | None:
    reason = skip_reason("arm64") or missing_network_prerequisites() or qemu_tpm.missing()
    if reason is None and not (AAVMF_CODE.is_file() and AAVMF_VARS.is_file()):
        reason = f"no {AAVMF_CODE} / {AAVMF_VARS} (apt-get install qemu-efi-aarch64)"
    if reason is None and shutil.which(uki.objcopy("arm64")) is None:
        reason = f"{uki.objcopy('arm64')} is not installed (apt-get install binutils-aarch64-linux-gnu)"
    if reason is None and shutil.which("grub-mkimage") is None:
        reason = "grub-mkimage is not installed (apt-get install grub-common): the site's arm64 GRUB"
    return reason


def test_an_arm64_node_pxe_boots_the_sites_grub_through_its_proxy_dhcp_and_attests(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with SiteLab(tmp_path_factory.mktemp("sitelab-arm64"), ensure_ramdisk(arch="arm64")) as lab:
        boot_files = lab.site_boot_files()
        lab.start_site(boot_files=boot_files)
        attest = SiteAttestation(lab, NODE)
        node = make_node(lab, NODE, uefi=True, tpm_state=attest.tpm_state)
        assert node.power.spec().pflash_code == str(AAVMF_CODE)
        shown: list[Step] = []
        life = Lifecycle(lab, node, None, shown.append, attest=attest)
        attest.start()
        try:
            life.prepare_ramdisk()            # a UKI entry, boot_file grubaa64.efi
            life.power_on_directly()
            life.pxe_join()                   # /boot.grub, /pxe/<mac>.grub, the UKI, attested
            code, cmdline = guest_shell(node, "cat /proc/cmdline /sys/class/tpm/tpm0/pcr-sha256/12")
        finally:
            attest.stop()
            for s in shown:
                print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
            node.power.stop(force=True)
        console = lab.console(node.power)
        # The site's TFTP served the GRUB that site_boot_files built for this site's address.
        assert attest.loader_name == netgrub.NAME
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
