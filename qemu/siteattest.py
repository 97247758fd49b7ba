"""Attestation in the site lab (qemu/sitelab.py): a node with a TPM 2.0 that PXE-boots the site's
UKI through the site's real path, and a gateway that judges its joins.

The path is a server's under UEFI: the node's NIC carries no option ROM, so the firmware's own
PXE asks the network; the plain DHCP server gives the address, the site's dnsmasq (proxy DHCP)
names ``ipxe.efi``, which the firmware fetches from the site's TFTP and starts with LoadImage
(measured into PCR 4); iPXE asks again, gets the site's /boot.ipxe, the node's script, and
chains the site's UKI from the site's store (measured into PCR 4, then the kernel in it). The
UKI is one build for the site: its command line names the site (``bc.site=``) and nothing of
the node, whose settings the ramdisk fetches from /pxe/<mac>.cmdline (the entry's
``kernel_cmdline``).

The gateway's policy is what an operator writes (docs/attestation.md): the UKI build's
reference values (initramfs/uki.py's ``ramdisk.efi.json``) and, as a loader, the Authenticode
SHA-256 of the exact ``ipxe.efi`` the site's TFTP serves; hardware profiles learned on first
use. Every answer the verifier judged is kept with its evidence (``Judged``), so a test can
judge the same evidence again under another policy.

    att = SiteAttestation(lab, "site-n2")           # the node's TPM state, the site's UKI
    node = make_node(lab, "site-n2", uefi=True, tpm_state=att.tpm_state, firmware_pxe=True)
    att.start()                                     # the lab's gateway attests from now on
    Lifecycle(lab, node, bmc, attest=att).run_all() # boot.prepareRamdisk gets the UKI entry
    att.stop()

arm64 (a lab of the arm64 ramdisk, the site started with ``lab.site_boot_files()``): AAVMF's own
PXE gets the site's GRUB (``grubaa64.efi``, initramfs/netgrub.py) from the site's TFTP, GRUB
fetches /boot.grub and the node's /pxe/<mac>.grub, which chainloads the same kind of UKI from
the store; the policy's one loader is that GRUB. Under Secure Boot (``firmware_uki``: the site's
boot files made with ``lab.site_boot_files(key, grub=False, uki=att.image)``) the site's TFTP
serves this signed UKI itself as ``bootaa64.efi`` and AAVMF verifies and starts it: no loader.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from agent.gateway.verifier import eventlog
from agent.gateway.verifier.attest import Challenge, Verdict, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Policy
from agent.gateway.verifier.refused import PolicyFailed
from agent.security.attest_contract import Evidence
from agent.site.boot.pxe import BootFile
from initramfs import signing, uki
from initramfs.signing import DbKey
from qemu import tpm as qemu_tpm
from qemu.lab import GUEST_CA, GUEST_TRUST
from qemu.sitelab import SITE_ADDRESS, SITE_HTTP_PORT, SiteLab

UKI_NAME = "site-ramdisk.efi"     # the site's UKI in the images' upstream (lab.www)


@dataclass(frozen=True)
class Judged:
    """One answer the verifier judged: whose, which boot, the evidence and the verdict."""

    node_id: str
    boot_id: str
    role: str
    evidence: Evidence
    verdict: Verdict


class RecordingVerifier(Verifier):
    """The gateway's verifier, keeping each judged answer with its evidence."""

    def __init__(self, policy: Policy, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.judged: list[Judged] = []
        self._judged_lock = threading.Lock()

    def verify(self, challenge: Challenge, evidence: Evidence | str, *, boot_id: str,
               node_public: bytes, role: str = "ramdisk") -> Verdict:
        verdict = super().verify(challenge, evidence, boot_id=boot_id, node_public=node_public, role=role)
        if isinstance(evidence, Evidence):
            with self._judged_lock:
                self.judged.append(Judged(challenge.node_id, boot_id, role, evidence, verdict))
        return verdict

    def find(self, node_id: str, boot_id: str) -> Judged | None:
        with self._judged_lock:
            return next((j for j in reversed(self.judged)
                         if (j.node_id, j.boot_id) == (node_id, boot_id)), None)


class SiteAttestation:
    """A node's TPM (manufactured under ``lab.workdir``), the site's UKI build in the images'
    upstream, and the gateway's policy and verifier for them."""

    def __init__(self, lab: SiteLab, node_id: str, db_key: DbKey | None = None,
                 secure_boot: dict[str, Any] | None = None, firmware_uki: bool = False) -> None:
        self.lab = lab
        self.tpm_state = lab.workdir / f"{node_id}-tpm"
        ca = lab.workdir / f"{node_id}-tpm-ca"
        qemu_tpm.manufacture(self.tpm_state, ca)
        # db_key: the UKI signed with the fleet's db key (Secure Boot: qemu/secureboot.py);
        # secure_boot: the policy's section that judges PCR 7 (docs/attestation.md).
        esp, self.values = lab.uki("site-uki", settings=self.uki_settings(),
                                   sign=None if db_key is None else lambda image: signing.sign(image, db_key))
        arm64 = lab.ramdisk.arch == "arm64"
        self.image = lab.www / UKI_NAME
        self.image.unlink(missing_ok=True)
        os.link(esp / "EFI" / "BOOT" / ("BOOTAA64.EFI" if arm64 else "BOOTX64.EFI"), self.image)
        self.uki_sha256 = hashlib.sha256(self.image.read_bytes()).hexdigest()
        # The exact boot file the site's TFTP serves the firmware's PXE (the site daemon copies
        # it there from its site_ipxe_dir): ipxe.efi, or on arm64 the site's GRUB; with
        # ``firmware_uki`` (arm64 under Secure Boot) this UKI itself, as bootaa64.efi, and no
        # loader before it (the site need not run yet: its boot files are made from self.image).
        self.loader_digest: bytes | None = None
        if firmware_uki:
            if not arm64:
                raise ValueError("firmware_uki: the arm64 site's boot file (x86 has iPXE)")
            self.loader_name = BootFile.UEFI_ARM64_UKI.value
        else:
            self.loader_name = (BootFile.UEFI_ARM64 if arm64 else BootFile.UEFI).value
            loader = lab.site_state / "site" / "boot" / "tftp" / self.loader_name
            self.loader_digest = uki.authenticode_sha256(loader.read_bytes())
        loaders = [] if self.loader_digest is None else [self.loader_digest.hex()]
        self.policy_doc = {"builds": [self.values], "loaders": loaders, "learn": "first"}
        if secure_boot is not None:   # the policy's PCR 7 judgement (agent/gateway/verifier/pcr7.py)
            self.policy_doc["secure_boot"] = secure_boot
        self.verifier = RecordingVerifier(
            Policy.from_json(self.policy_doc),
            ek_roots=load_certificates([ca / qemu_tpm.CA_ROOT, ca / qemu_tpm.CA_ISSUER]))
        self.joins = JoinAttestation(self.verifier)

    @staticmethod
    def uki_settings() -> dict[str, str]:
        """The site's UKI's command line settings: the site, the lab's CA and signing key."""
        return {"site": f"http://{SITE_ADDRESS}:{SITE_HTTP_PORT}", "ca": GUEST_CA, "trust": GUEST_TRUST,
                "reconnect_min": "0.5", "reconnect_max": "3"}

    def start(self) -> None:
        self.lab.gateway.attestation = self.joins

    def stop(self) -> None:
        self.lab.gateway.attestation = None

    def entry(self, node_id: str) -> dict[str, Any]:
        """boot.prepareRamdisk's fields for the node's UKI entry (boot_file the loader): the
        site's UKI by digest, the node's own settings as the entry's command line."""
        settings = self.lab.settings(node_id)
        return {"boot_file": self.loader_name, "uki_url": self.lab.upstream_url(UKI_NAME),
                "uki_digest": {"hex": self.uki_sha256},
                "kernel_cmdline": " ".join(f"bc.{k}={settings[k]}" for k in ("node", "token", "gateway"))}

    def wait_judged(self, node_id: str, boot_id: str, timeout: float = 120.0) -> Judged:
        """The judged answer of the node's boot ``boot_id``; TimeoutError with the node's
        current verdict (one reached without evidence: no TPM, an identity refused) if none."""
        deadline = time.monotonic() + timeout
        while (found := self.verifier.find(node_id, boot_id)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no judged TPM answer of {node_id} boot {boot_id} within "
                                   f"{timeout:g}s; its verdict: {self.joins.verdict(node_id)}")
            time.sleep(0.1)
        return found

    @property
    def uki_pcr4(self) -> list[bytes]:
        """The build's images, as PCR 4 shows them last: the UKI (and on arm64 the kernel in it)."""
        return [bytes.fromhex(v) for v in self.values["pcr4"]]

    def judge_without_loader(self, judged: Judged) -> PolicyFailed | dict[str, str]:
        """The same evidence judged again by this policy without its loader (``ipxe.efi``, or
        the site's GRUB on arm64): the event log replayed to the quoted PCRs (which the verifier
        checked against the quote), then the policy; what failed (PolicyFailed), or what matched."""
        log_ = eventlog.parse(judged.evidence.event_log)
        replayed = log_.replay([4])
        if replayed[4] != judged.evidence.pcrs[4]:
            raise AssertionError("the recorded event log does not replay to the quoted PCR 4")
        policy = Policy.from_json({**self.policy_doc, "loaders": []})
        try:
            return policy.judge(log_, judged.evidence.pcrs, profile="site-lab")
        except PolicyFailed as e:
            return e


def pcr4_applications(evidence: Evidence) -> list[bytes]:
    """The SHA-256 digests of PCR 4's EV_EFI_BOOT_SERVICES_APPLICATION events, in order: what
    the firmware started."""
    log_ = eventlog.parse(evidence.event_log)
    return [e.sha256 for e in log_.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)]
