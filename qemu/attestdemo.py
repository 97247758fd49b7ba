"""The demo's attestation part (`./dev demo --uefi`): the ramdisk as a UKI booted by OVMF on a
machine with a TPM (swtpm), the gateway's verdict and what PCR 4 matched; then the same UKI
with one byte changed in its initramfs, refused (docs/attestation.md).

    attestdemo.run(lab, workdir, say)     # within a Lab: two nodes of their own
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.gateway.verifier.attest import Verdict, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Build, Policy
from qemu import tpm as qemu_tpm
from qemu.lab import Lab

NODES = ("attest-demo", "attest-demo-tampered")
NOTE = "/etc/bettercompute/build-note"


def run(lab: Lab, workdir: Path, say: Callable[[str], None], timeout: float = 600) -> list[Verdict]:
    """Boot the UKI (accepted) and a tampered one (refused); the verdicts, in that order."""
    missing = qemu_tpm.missing()
    if missing:
        say(f"ATTESTATION: skipped ({missing})")
        return []
    root = workdir / "attest"
    for i in range(len(NODES)):  # a TPM each: the gateway binds one TPM to one node
        qemu_tpm.manufacture(root / f"state-{i}", root / "ca")
    builds = []
    boots = []
    for node, note in zip(NODES, (b"0", b"1"), strict=True):
        esp, values = lab.uki(node, files={NOTE: b"0"})  # the build the policy accepts
        builds.append(Build.from_values(values))
        if note != b"0":
            esp, _ = lab.uki(node, files={NOTE: note})  # what this node boots instead
        boots.append((node, esp, values))
    _, esp, values = boots[0]
    # The UKI; on arm64 the kernel after it (its stub starts it through LoadImage).
    whats = ("the UKI", "its kernel")[:len(values["pcr4"])]
    images = " then ".join(f"{v[:16]}... ({what})" for v, what in zip(values["pcr4"], whats, strict=True))
    pcr9 = ", PCR 9 empty (the stub hands over to the kernel)" if "pcr9" in values else ""
    say(f"UKI built: the ramdisk as one PE image; its reference values: build {values['build_id']}, "
        f"PCR 4 {images}, PCR 11 {values['pcr11'][:16]}...{pcr9}, PCR 12 empty")
    ca = root / "ca"
    roots = load_certificates([ca / qemu_tpm.CA_ROOT, ca / qemu_tpm.CA_ISSUER])
    joins = JoinAttestation(Verifier(Policy(builds=builds, learn="first"), ek_roots=roots))
    lab.gateway.attestation = joins
    verdicts = []
    try:
        for i, ((node, esp, _), label) in enumerate(zip(
                boots, ("its UKI", "its UKI with one byte changed in the initramfs"), strict=True)):
            say(f"powering on {node} (UEFI, OVMF, a TPM 2.0 by swtpm): {label}, from its ESP")
            with qemu_tpm.Swtpm(root / f"state-{i}", root / "swtpm.sock") as swtpm:
                machine = lab.boot(node, uefi=True, tpm=swtpm.socket, esp=esp)
                try:
                    lab.wait_joined(machine, node, timeout)
                    verdict = joins.wait_verdict(node, 120)
                    assert verdict is not None, "no attestation verdict"
                    verdicts.append(verdict)
                finally:
                    machine.stop()
            if verdict.attested:
                m = verdict.matched
                checked = "9, 11 and 12" if 9 in builds[0].pcrs else "11 and 12"
                say(f"ATTESTED: PCR 4 matched build {m['build']} (the UKI's Authenticode digest "
                    f"{m['pcr4'][:16]}...), PCRs {checked} as the build says, the firmware's PCRs 0, 2, 7 "
                    f"{'learned' if m.get('learned') else 'enforced'} for {m['profile']}; EK {m['ek']} "
                    "certified by the TPM maker's CA (here swtpm's local one)")
            else:
                say(f"{str(verdict.status).upper()} ({verdict.check}): {verdict.reason}")
    finally:
        lab.gateway.attestation = None
    return verdicts
