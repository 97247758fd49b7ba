"""The gateway's verifier against a real TPM (swtpm) measured as firmware would: an attested join,
and every refusal that can be made without QEMU, each with its check named."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

from agent.errors import InvalidParameters, TpmFailed
from agent.gateway.verifier import eventlog
from agent.gateway.verifier.attest import (
    Challenge,
    Status,
    Verdict,
    Verifier,
    check_ek_certificate,
    ek_key,
    load_certificates,
)
from agent.gateway.verifier.policy import SEPARATED_PCRS as SEPARATED
from agent.gateway.verifier.policy import Build, Policy
from agent.gateway.verifier.refused import PolicyFailed, Refused
from agent.hw import tpm as tpmwire
from agent.security.attest import Attestor
from agent.security.attest_contract import Evidence, Identity
from tests.runtime.harness import ROOT
from tests.tpmsim import (
    BIOS_BOOT,
    UEFI_BOOT,
    Ev,
    SimTpm,
    ev,
    event_log,
    h,
    image,
    manufactured_tpm,
    measure,
    other_sim,
    sim,
)

__all__ = ["manufactured_tpm", "other_sim", "sim"]

RAMDISK = h(b"ramdisk uki")
NODE_KEY = bytes(range(32))
PROFILE = "QEMU|Standard PC (Q35 + ICH9, 2009)|1.16.2"


@dataclass
class Node:
    """A node: its TPM (swtpm), the event log its firmware wrote, its DMI, its boot and key."""

    sim: SimTpm
    root: Path
    node_id: str = "node-1"
    boot_id: str = "5d6c8d9e-0000-4000-8000-000000000001"
    node_key: bytes = NODE_KEY

    def boot(self, events: list[tuple[int, int, bytes, bytes]] = UEFI_BOOT) -> None:
        with self.sim.tpm() as tpm:
            (self.root / "log").write_bytes(measure(tpm, events))

    ek: str = "auto"
    profile: str = PROFILE  # what its DMI says: "maker|model|firmware version"

    def attestor(self, tpm: tpmwire.Tpm) -> Attestor:
        dmi = self.root / "dmi"
        dmi.mkdir(parents=True, exist_ok=True)
        names = ("sys_vendor", "product_name", "bios_version")
        for name, value in zip(names, self.profile.split("|"), strict=True):
            (dmi / name).write_text(value + "\n")
        return Attestor(lambda: tpm, event_log=self.root / "log", dmi=dmi, ek=self.ek)

    def identity(self) -> Identity:
        with self.sim.tpm() as tpm:
            return self.attestor(tpm).identity()

    def answer(self, ch: Challenge) -> Evidence:
        with self.sim.tpm() as tpm:
            return self.attestor(tpm).answer(credential_blob=ch.credential_blob,
                                             encrypted_secret=ch.encrypted_secret, nonce=ch.nonce,
                                             boot_id=self.boot_id, node_public=self.node_key)

    def join(self, verifier: Verifier) -> Verdict:
        ch = verifier.challenge(self.node_id, self.identity())
        return verifier.verify(ch, self.answer(ch), boot_id=self.boot_id, node_public=self.node_key)


def replayed(events: list[tuple[int, int, bytes, bytes]], pcr: int) -> str:
    return eventlog.parse(event_log(events)).replay([pcr])[pcr].hex()


def policy_doc(**extra: object) -> dict[str, object]:
    return {"builds": [{"build_id": "b1", "pcr4": RAMDISK.hex(), "pcr9": replayed(UEFI_BOOT, 9),
                        "pcr11": bytes(32).hex(), "pcr12": bytes(32).hex()}],
            "learn": "first", **extra}


@pytest.fixture
def node(sim: SimTpm, tmp_path: Path) -> Node:
    n = Node(sim, tmp_path)
    n.boot()
    return n


@pytest.fixture
def verifier(sim: SimTpm, tmp_path: Path) -> Iterator[Verifier]:
    (tmp_path / "policy.json").write_text(json.dumps(policy_doc()))
    yield Verifier(Policy.load(tmp_path / "policy.json"),
                   ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))


def refused(verdict: Verdict, check: str) -> None:
    assert verdict.status is Status.REFUSED, verdict
    assert verdict.check == check, verdict


# Attested, and what is learned --------------------------------------------------------------

def test_an_attested_join_learns_then_enforces_the_profile(node: Node, verifier: Verifier,
                                                            tmp_path: Path) -> None:
    first = node.join(verifier)
    assert first.status is Status.ATTESTED, first
    assert first.matched["build"] == "b1" and first.matched["learned"] == "pcr0,pcr2,pcr7"
    assert first.matched["profile"] == PROFILE
    saved = json.loads((tmp_path / "policy.json").read_text())
    assert saved["profiles"][PROFILE]["pcr0"] == [replayed(UEFI_BOOT, 0)]
    second = node.join(verifier)
    assert second.status is Status.ATTESTED and "learned" not in second.matched
    reloaded = Policy.load(tmp_path / "policy.json")
    assert reloaded.profiles == verifier.policy.profiles


def test_a_profile_the_policy_file_cannot_keep_is_not_learned(node: Node, tmp_path: Path) -> None:
    """Learned profiles live in the policy file: one that could not be written there is refused,
    and not kept in memory to attest the next join (nor lost at the gateway's next start)."""
    (tmp_path / "policy.json").write_text(json.dumps(policy_doc()))
    policy = Policy.load(tmp_path / "policy.json")
    (tmp_path / "policy.json").unlink()
    (tmp_path / "policy.json").mkdir()  # the file's place taken: the atomic rename fails
    verifier = Verifier(policy, ek_roots=load_certificates([node.sim.ca_root, node.sim.ca_issuer]))
    for _ in range(2):
        verdict = node.join(verifier)
        refused(verdict, "policy_profile")
        assert "cannot be written" in verdict.reason, verdict
    assert policy.profiles == {}
    (tmp_path / "policy.json").rmdir()
    assert node.join(verifier).matched["learned"] == "pcr0,pcr2,pcr7"
    assert PROFILE in json.loads((tmp_path / "policy.json").read_text())["profiles"]


def test_a_missing_ek_ca_file_is_a_usage_error(tmp_path: Path) -> None:
    """`agent gateway serve --ek-ca` naming no file: exit 2 and the file named, before any key or
    socket is needed (it was exit 70, "internal error: FileNotFoundError")."""
    (tmp_path / "policy.json").write_text(json.dumps(policy_doc()))
    (tmp_path / "not-a-cert.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    for ca, said in ((tmp_path / "vendor-ek-ca.pem", "cannot read it"),
                     (tmp_path / "not-a-cert.pem", "not a PEM or DER certificate")):
        out = subprocess.run(
            [sys.executable, "-m", "agent", "gateway", "serve", "--cert", str(tmp_path / "gw.pem"),
             "--key", str(tmp_path / "gw.key"), "--attest-policy", str(tmp_path / "policy.json"),
             "--ek-ca", str(ca)],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert str(ca) in out.stderr and said in out.stderr and "internal error" not in out.stderr, out.stderr


def test_firmware_changed_for_an_enrolled_profile(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    node.boot()
    assert node.join(verifier).attested
    sim.restart()  # power cycle; another firmware build this time
    other_firmware = [ev(0, Ev.S_CRTM_VERSION, "1.1".encode("utf-16-le") + b"\0\0"), *UEFI_BOOT[1:]]
    node.boot(other_firmware)
    refused(node.join(verifier), "firmware_changed")  # the node's own PCR 0 moved, with no window


def test_an_unknown_profile_is_refused_where_the_policy_learns_none(node: Node, verifier: Verifier) -> None:
    verifier.policy.learn = "never"
    refused(node.join(verifier), "policy_profile")


# Unattested ---------------------------------------------------------------------------------

def test_a_bios_boot_is_unattested_with_its_reason(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    node.boot(BIOS_BOOT)
    verdict = node.join(verifier)
    assert verdict.status is Status.UNATTESTED and "BIOS boot" in verdict.reason


def test_no_event_log_is_unattested(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)  # nothing measured, no log file
    verdict = node.join(verifier)
    assert verdict.status is Status.UNATTESTED and "no event log" in verdict.reason


# Refused: the TPM's identity ----------------------------------------------------------------

def test_an_ek_certificate_from_another_ca(node: Node, other_sim: SimTpm, verifier: Verifier) -> None:
    foreign = Verifier(verifier.policy, ek_roots=load_certificates([other_sim.ca_root, other_sim.ca_issuer]))
    verdict = foreign.try_challenge(node.node_id, node.identity())
    assert isinstance(verdict, Verdict)
    refused(verdict, "ek_certificate")


def test_an_ek_certificate_signed_by_a_configured_certificate_that_is_no_ca(node: Node) -> None:
    """The EK's chain had a walk of its own that took any configured certificate whose key signed
    it; it is now x509chain.verify_chain's, which wants every issuer a CA."""
    mine = node.identity()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a leaf, not a CA")])
    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: x509.Name, public: CertificatePublicKeyTypes, ca: bool) -> x509.Certificate:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(name).public_key(public)
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))

    not_ca = cert(name, key.public_key(), ca=False)
    ek_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ek")])
    ek_cert = cert(ek_name, ek_key(mine.ek_public), ca=False)
    with pytest.raises(Refused, match="is not a CA") as e:
        check_ek_certificate(ek_cert.public_bytes(serialization.Encoding.DER), mine.ek_public, [not_ca])
    assert e.value.check == "ek_certificate"


def test_an_ek_certificate_past_its_dates_still_names_its_tpm(node: Node) -> None:
    """A TPM outlives its maker's certificates: the EK's chain is checked by signature and CA, not
    by validity period (as the walk before x509chain did); a chain to no root is still refused."""
    mine = node.identity()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "an EK CA long expired")])
    long_ago = datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC)

    def cert(subject: x509.Name, public: CertificatePublicKeyTypes, ca: bool) -> x509.Certificate:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public)
                .serial_number(x509.random_serial_number()).not_valid_before(long_ago)
                .not_valid_after(long_ago + datetime.timedelta(days=365))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))

    root = cert(ca_name, ca_key.public_key(), ca=True)
    ek_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ek")])
    ek_cert = cert(ek_name, ek_key(mine.ek_public), ca=False)
    der = ek_cert.public_bytes(serialization.Encoding.DER)
    assert "an EK CA long expired" in check_ek_certificate(der, mine.ek_public, [root])
    other = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another CA")]),
                 ec.generate_private_key(ec.SECP256R1()).public_key(), ca=True)
    with pytest.raises(Refused) as e:
        check_ek_certificate(der, mine.ek_public, [other])
    assert e.value.check == "ek_certificate"


def test_a_pinned_ek(node: Node, other_sim: SimTpm, verifier: Verifier, tmp_path: Path) -> None:
    mine = node.identity()
    pinned = Verifier(verifier.policy, pinned_ek={"node-1": hashlib.sha256(mine.ek_public).digest()})
    assert isinstance(pinned.try_challenge("node-1", mine), Challenge)  # no CA configured at all
    theirs = Node(other_sim, tmp_path / "other").identity()
    refused(_as_verdict(pinned.try_challenge("node-1", theirs)), "ek_pinned")


def test_an_ak_not_in_this_tpm(node: Node, other_sim: SimTpm, verifier: Verifier, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    foreign_ak = Node(other_sim, tmp_path / "other").identity()
    claimed = dataclasses.replace(node.identity(), ak_public=foreign_ak.ak_public, ak_name=foreign_ak.ak_name)
    ch = verifier.challenge(node.node_id, claimed)
    with pytest.raises(TpmFailed, match="TPM_RC_INTEGRITY") as err:  # the TPM refuses to activate
        node.answer(ch)
    refused(verifier.verify(ch, str(err.value), boot_id=node.boot_id, node_public=NODE_KEY), "activation")
    made_up = dataclasses.replace(_honest_evidence(node, verifier), activated=bytes(32))
    ch = verifier.challenge(node.node_id, claimed)  # a node that makes the secret up (its one challenge)
    refused(verifier.verify(ch, made_up, boot_id=node.boot_id, node_public=NODE_KEY), "activation")


def test_a_bit_flipped_in_the_ak_public_key(node: Node, verifier: Verifier) -> None:
    ident = node.identity()
    flipped = bytearray(ident.ak_public)
    flipped[-1] ^= 1  # the point's y: no longer on the curve
    claimed = dataclasses.replace(ident, ak_public=bytes(flipped), ak_name=tpmwire.name_of(bytes(flipped)))
    refused(_as_verdict(verifier.try_challenge(node.node_id, claimed)), "ak_public")


# Refused: the quote -------------------------------------------------------------------------

def test_a_bit_flipped_in_the_quote_or_its_signature(node: Node, verifier: Verifier) -> None:
    for field_name in ("quote", "signature"):
        ch = verifier.challenge(node.node_id, node.identity())
        evidence = node.answer(ch)
        flipped = bytearray(getattr(evidence, field_name))
        flipped[len(flipped) // 2] ^= 0x10
        evidence = dataclasses.replace(evidence, **{field_name: bytes(flipped)})
        refused(verifier.verify(ch, evidence, boot_id=node.boot_id, node_public=NODE_KEY), "quote_signature")


def test_a_replayed_quote(node: Node, verifier: Verifier) -> None:
    ch = verifier.challenge(node.node_id, node.identity())
    old = node.answer(ch)
    assert verifier.verify(ch, old, boot_id=node.boot_id, node_public=NODE_KEY).attested
    ch = verifier.challenge(node.node_id, node.identity())
    fresh = node.answer(ch)  # the TPM activates the new credential; the quote is the old one
    replay = dataclasses.replace(fresh, quote=old.quote, signature=old.signature, pcrs=old.pcrs)
    refused(verifier.verify(ch, replay, boot_id=node.boot_id, node_public=NODE_KEY), "quote_nonce")


def test_a_nonce_reused(node: Node, verifier: Verifier) -> None:
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    assert verifier.verify(ch, evidence, boot_id=node.boot_id, node_public=NODE_KEY).attested
    refused(verifier.verify(ch, evidence, boot_id=node.boot_id, node_public=NODE_KEY), "nonce_reused")


def test_the_quote_binds_the_boot_and_the_node_key(node: Node, verifier: Verifier) -> None:
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    refused(verifier.verify(ch, evidence, boot_id="another-boot", node_public=NODE_KEY), "quote_nonce")
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    refused(verifier.verify(ch, evidence, boot_id=node.boot_id, node_public=bytes(32)), "quote_nonce")


def test_a_second_node_presenting_the_first_ones_quote(node: Node, other_sim: SimTpm, verifier: Verifier,
                                                       tmp_path: Path) -> None:
    first = node.answer(ch := verifier.challenge(node.node_id, node.identity()))
    assert verifier.verify(ch, first, boot_id=node.boot_id, node_public=NODE_KEY).attested
    (tmp_path / "second").mkdir()
    second = Node(other_sim, tmp_path / "second", node_id="node-2", node_key=bytes(32))
    second.boot()
    roots = load_certificates([other_sim.ca_root, other_sim.ca_issuer, node.sim.ca_root, node.sim.ca_issuer])
    both = Verifier(verifier.policy, ek_roots=roots)
    ch = both.challenge("node-2", second.identity())
    own = second.answer(ch)  # its own TPM activates; the quote it shows is the first node's
    shown = dataclasses.replace(own, quote=first.quote, signature=first.signature, pcrs=first.pcrs)
    refused(both.verify(ch, shown, boot_id=second.boot_id, node_public=second.node_key), "quote_signature")
    ch = both.challenge("node-2", node.identity())  # or it claims to be the first node's TPM
    refused(both.verify(ch, first, boot_id=second.boot_id, node_public=second.node_key), "activation")


def test_a_tpm_state_rolled_back(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    sim.stop()
    shutil.copytree(sim.state, tmp_path / "snapshot")
    for _ in range(2):  # two boots: resetCount goes up twice
        sim.start()
        node.boot()
        assert node.join(verifier).attested
        sim.stop()
    shutil.rmtree(sim.state)
    shutil.copytree(tmp_path / "snapshot", sim.state)  # the TPM as it was: one reset fewer
    sim.start()
    node.boot()
    refused(node.join(verifier), "counters")


def test_pcr_values_that_do_not_hash_to_the_quote(node: Node, verifier: Verifier) -> None:
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    pcrs = dict(evidence.pcrs)
    pcrs[4] = h(b"what the node would like PCR 4 to be")
    refused(verifier.verify(ch, dataclasses.replace(evidence, pcrs=pcrs), boot_id=node.boot_id,
                            node_public=NODE_KEY), "pcr_digest")


# Refused: the event log and the policy ------------------------------------------------------

def test_a_tampered_event_log(node: Node, verifier: Verifier) -> None:
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    log = evidence.event_log
    i = log.index(RAMDISK)
    forged = log[:i] + h(b"another ramdisk") + log[i + 32:]
    refused(verifier.verify(ch, dataclasses.replace(evidence, event_log=forged), boot_id=node.boot_id,
                            node_public=NODE_KEY), "event_log")
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    refused(verifier.verify(ch, dataclasses.replace(evidence, event_log=log[:-5]), boot_id=node.boot_id,
                            node_public=NODE_KEY), "event_log")


def test_another_ramdisk(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    events = [e if e[2] != RAMDISK else ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), h(b"tampered"))
              for e in UEFI_BOOT]
    node.boot(events)
    refused(node.join(verifier), "policy_pcr4")


def test_a_loader_the_policy_does_not_know(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    ipxe = ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), h(b"ipxe.efi"))
    at = UEFI_BOOT.index(next(e for e in UEFI_BOOT if e[2] == RAMDISK))
    node.boot([*UEFI_BOOT[:at], ipxe, *UEFI_BOOT[at:]])
    refused(node.join(verifier), "policy_pcr4")
    verifier.policy.loaders.add(h(b"ipxe.efi"))
    sim.restart()
    node.boot([*UEFI_BOOT[:at], ipxe, *UEFI_BOOT[at:]])
    assert node.join(verifier).attested


def test_an_arm64_build_under_secure_boot_shows_its_uki_alone(sim: SimTpm, tmp_path: Path,
                                                              verifier: Verifier) -> None:
    """An arm64 build starts the UKI, then its kernel (the stub's LoadImage); under Secure Boot
    the stub's own security override starts the kernel unmeasured, so PCR 4 ends with the UKI:
    accepted only where the build states that form (``pcr4_secure_boot``, initramfs/uki.py),
    which the policy file keeps."""
    arm64 = {**policy_doc()["builds"][0], "pcr4": [RAMDISK.hex(), h(b"kernel").hex()]}
    verifier.policy.builds = [Build.from_values(arm64)]
    node = Node(sim, tmp_path)
    node.boot()       # PCR 4 ends with the UKI: no kernel after it
    refused(node.join(verifier), "policy_pcr4")
    verifier.policy.builds = [Build.from_values({**arm64, "pcr4_secure_boot": [RAMDISK.hex()]})]
    sim.restart()
    node.boot()
    verdict = node.join(verifier)
    assert verdict.attested and verdict.matched["pcr4"] == RAMDISK.hex(), verdict
    kept = verifier.policy.to_json()["builds"][0]
    assert kept["pcr4_secure_boot"] == [RAMDISK.hex()]
    assert Build.from_values(kept) == verifier.policy.builds[0]
    # Either form where PCR 4 ends with it (what came before is judged as loaders); nothing else.
    other = Build.from_values({**arm64, "pcr4_secure_boot": [RAMDISK.hex()]})
    assert other.started([h(b"shim"), RAMDISK]) == (RAMDISK,)
    assert other.started([RAMDISK, h(b"kernel")]) == (RAMDISK, h(b"kernel"))
    assert other.started([RAMDISK, h(b"another")]) is None
    with pytest.raises(InvalidParameters):
        Build.from_values({**arm64, "pcr4_secure_boot": RAMDISK.hex()})


def _chained_by_ipxe(probe: bytes = RAMDISK,
                     cmdline: bytes | None = None) -> list[tuple[int, int, bytes, bytes]]:
    """UEFI_BOOT as the site's boot entry makes it (seen under OVMF): the firmware's PXE starts
    ipxe.efi, which loads the UKI once to probe it and again to start it; iPXE's name for the
    image as the stub's command line (PCR 12) where ``cmdline`` is given."""
    at = UEFI_BOOT.index(next(e for e in UEFI_BOOT if e[2] == RAMDISK))
    chain = [ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), h(b"ipxe.efi")),
             ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), probe)]
    extra = [] if cmdline is None else [ev(12, Ev.IPL, cmdline)]
    return [*UEFI_BOOT[:at], *chain, *UEFI_BOOT[at:], *extra]


def test_ipxe_chaining_the_uki_with_nothing_passed(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    verifier.policy.loaders.add(h(b"ipxe.efi"))
    node = Node(sim, tmp_path)
    node.boot(_chained_by_ipxe())
    verdict = node.join(verifier)
    assert verdict.attested, verdict
    assert verdict.matched["pcr4"] == RAMDISK.hex()


def test_ipxe_passing_its_name_as_the_uki_command_line(sim: SimTpm, tmp_path: Path,
                                                      verifier: Verifier) -> None:
    """What a plain ``chain URL`` does: systemd-stub takes the name as the command line."""
    verifier.policy.loaders.add(h(b"ipxe.efi"))
    node = Node(sim, tmp_path)
    node.boot(_chained_by_ipxe(cmdline="ramdisk.efi\0".encode("utf-16-le")))
    refused(node.join(verifier), "policy_pcr12")


def test_another_image_probed_before_the_uki_is_no_loader(sim: SimTpm, tmp_path: Path,
                                                          verifier: Verifier) -> None:
    verifier.policy.loaders.add(h(b"ipxe.efi"))
    node = Node(sim, tmp_path)
    node.boot(_chained_by_ipxe(probe=h(b"another image")))
    refused(node.join(verifier), "policy_pcr4")


def test_a_command_line_given_by_the_boot_loader(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    node.boot([*UEFI_BOOT, ev(12, Ev.IPL, "console=ttyS0 init=/bin/sh".encode("utf-16-le"))])
    refused(node.join(verifier), "policy_pcr12")


def test_an_initrd_the_build_does_not_load(sim: SimTpm, tmp_path: Path) -> None:
    """An x86 build says PCR 9 stays zero (its stub hands over to the kernel, initramfs/uki.py):
    an initramfs a loader offered through the LoadFile2 device would show there."""
    handover = [e for e in UEFI_BOOT if e[0] != 9]
    doc = policy_doc()
    doc["builds"] = [{**doc["builds"][0], "pcr9": bytes(32).hex()}]  # type: ignore[index]
    verifier = Verifier(Policy.from_json(doc), ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    node = Node(sim, tmp_path)
    node.boot([*handover, ev(9, Ev.EVENT_TAG, struct.pack("<II", 0x8F3B22EC, 7) + b"initrd\0",
                             h(b"another initramfs"))])
    refused(node.join(verifier), "policy_pcr9")


def test_the_policy_file_is_checked(tmp_path: Path) -> None:
    from agent.errors import InvalidParameters

    for bad in ({"builds": [{"pcr11": "00"}]}, {"learn": "sometimes"}, {"extra": 1},
                {"builds": [{"pcr4": "zz"}]}):
        (tmp_path / "p.json").write_text(json.dumps(bad))
        with pytest.raises(InvalidParameters):
            Policy.load(tmp_path / "p.json")


def _as_verdict(out: Challenge | Verdict) -> Verdict:
    assert isinstance(out, Verdict), out
    return out


def _honest_evidence(node: Node, verifier: Verifier) -> Evidence:
    ch = verifier.challenge(node.node_id, node.identity())
    return node.answer(ch)


# Leaving the measured boot --------------------------------------------------------------------

def test_a_kexec_after_the_agent_marked_pcr11(node: Node, verifier: Verifier) -> None:
    assert node.join(verifier).attested
    with node.sim.tpm() as tpm:
        node.attestor(tpm).leave_measured_boot()  # what boot.kexec does before it ends the agent
    node.boot_id = "5d6c8d9e-0000-4000-8000-000000000002"  # the kernel it kexec'd into
    verdict = node.join(verifier)
    assert verdict.status is Status.UNATTESTED and "kexec" in verdict.reason, verdict


def test_a_kexec_the_agent_did_not_mark(node: Node, verifier: Verifier) -> None:
    assert node.join(verifier).attested
    node.boot_id = "5d6c8d9e-0000-4000-8000-000000000003"  # a new boot id, the TPM not reset
    verdict = node.join(verifier)
    assert verdict.status is Status.UNATTESTED and "not reset since boot" in verdict.reason, verdict
    assert node.join(verifier).status is Status.UNATTESTED  # and so on for the rest of that boot


def test_pcr11_that_no_build_explains(sim: SimTpm, tmp_path: Path, verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    node.boot([*UEFI_BOOT, ev(11, Ev.IPL, b".linux\0")])  # a stub the build does not have
    refused(node.join(verifier), "policy_pcr11")


def test_an_installed_systems_boot_is_unattested_not_refused(sim: SimTpm, tmp_path: Path,
                                                            verifier: Verifier) -> None:
    node = Node(sim, tmp_path)
    node.boot([e if e[2] != RAMDISK else ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), h(b"grubx64.efi"))
               for e in UEFI_BOOT])
    ch = verifier.challenge(node.node_id, node.identity())
    verdict = verifier.verify(ch, node.answer(ch), boot_id=node.boot_id, node_public=NODE_KEY, role="node")
    assert verdict.status is Status.UNATTESTED and "node boot" in verdict.reason, verdict
    ch = verifier.challenge(node.node_id, node.identity())  # the same boot claiming to be a ramdisk
    refused(verifier.verify(ch, node.answer(ch), boot_id=node.boot_id, node_public=NODE_KEY), "policy_pcr4")


def test_an_ecc_p256_ek(node: Node, verifier: Verifier) -> None:
    """The ECC EK of the TCG template L-2 (swtpm certifies a P-384 one only, so it is pinned
    here): MakeCredential by ECDH and KDFe, activated by the TPM."""
    node.ek = "ecc"
    ident = node.identity()
    assert tpmwire.parse_public(ident.ek_public).type == tpmwire.Alg.ECC and not ident.ek_certificate
    refused(_as_verdict(verifier.try_challenge(node.node_id, ident)), "ek_certificate")
    verifier.pinned_ek[node.node_id] = hashlib.sha256(ident.ek_public).digest()
    verdict = node.join(verifier)
    assert verdict.attested, verdict


# Every event of the PCRs the policy relies on --------------------------------------------------
# A loader the policy does not list, started by the firmware before the UKI: the firmware
# extended its digest into PCR 4, and the log that the node sends says something else of it.

LOADER = h(b"a loader the policy does not list")
CALLING = b"Calling EFI Application from Boot Option"
RETURNING = b"Returning from EFI Application from Boot Option"


def _loader_before_the_uki(kind: int, data: bytes, *, before_separator: bool = False,
                           then: list[tuple[int, int, bytes, bytes]] | None = None,
                           ) -> list[tuple[int, int, bytes, bytes]]:
    """UEFI_BOOT with LOADER's measurement logged as ``kind`` with ``data``: after PCR 4's
    separator, just before the UKI (where the firmware starts it), or before the separator;
    ``then`` after the UKI's event."""
    loader = (4, kind, LOADER, data)
    uki = UEFI_BOOT.index(next(e for e in UEFI_BOOT if e[2] == RAMDISK))
    at = UEFI_BOOT.index((4, Ev.SEPARATOR, h(bytes(4)), bytes(4))) if before_separator else uki
    events = [*UEFI_BOOT[:at], loader, *UEFI_BOOT[at:]]
    if then:
        at = events.index(UEFI_BOOT[uki]) + 1
        events[at:at] = then
    return events


RELABELLED = [
    (Ev.EFI_ACTION, CALLING, False, "policy_event_action"),
    (Ev.EFI_ACTION, RETURNING, False, "policy_event_action"),
    (Ev.EFI_ACTION, CALLING, True, "policy_event_action"),
    (Ev.EFI_BOOT_SERVICES_DRIVER, image(), False, "policy_event_type"),
    (Ev.EFI_RUNTIME_SERVICES_DRIVER, image(), False, "policy_event_type"),
    (Ev.EFI_PLATFORM_FIRMWARE_BLOB, struct.pack("<QQ", 0x820000, 0x1000), False, "policy_event_type"),
    (Ev.POST_CODE, b"POST CODE", False, "policy_event_type"),
    (Ev.EFI_GPT_EVENT, bytes(92), False, "policy_event_type"),
    (Ev.EVENT_TAG, b"", False, "policy_event_type"),
    (0x1234, b"", False, "policy_event_type"),
    (Ev.SEPARATOR, bytes(4), False, "policy_separator"),
    (Ev.SEPARATOR, bytes(4), True, "policy_separator"),
    # types the PC Client PFP allows in PCR 4, never after its separator in a UEFI boot
    (Ev.IPL, b"", False, "policy_separator"),
    (Ev.COMPACT_HASH, b"", False, "policy_separator"),
    (Ev.ACTION, b"Calling INT 19h", False, "policy_separator"),
    (Ev.OMIT_BOOT_DEVICE_EVENTS, b"", False, "policy_separator"),
    # and before it: an image all the same, on no accepted list
    (Ev.IPL, b"", True, "policy_pcr4"),
    (Ev.COMPACT_HASH, b"", True, "policy_pcr4"),
    (Ev.ACTION, b"Calling INT 19h", True, "policy_pcr4"),
    (Ev.EFI_BOOT_SERVICES_APPLICATION, image(), True, "policy_pcr4"),
    (Ev.EFI_BOOT_SERVICES_APPLICATION, image(), False, "policy_pcr4"),  # labelled as it is
]


@pytest.mark.parametrize(("kind", "data", "before_separator", "check"), RELABELLED, ids=[
    eventlog.type_name(k).removeprefix("EV_").replace(" ", "-") + ("-before" if b else "-after")
    + ("-" + d.decode().split()[0].lower() if k == Ev.EFI_ACTION else "") for k, d, b, _ in RELABELLED])
def test_a_loader_hidden_by_relabelling_its_event(sim: SimTpm, tmp_path: Path, verifier: Verifier,
                                                  kind: int, data: bytes, before_separator: bool,
                                                  check: str) -> None:
    node = Node(sim, tmp_path)
    node.boot(_loader_before_the_uki(kind, data, before_separator=before_separator))
    verdict = node.join(verifier)
    refused(verdict, check)  # a policy check: the log replayed to the quote (event_log passed)
    assert LOADER.hex() in verdict.reason or check != "policy_pcr4", verdict


@pytest.mark.parametrize(("kind", "data", "check"), [
    (Ev.EFI_ACTION, CALLING, "policy_event_action"),
    (Ev.EFI_BOOT_SERVICES_DRIVER, image(), "policy_event_type"),
])
def test_the_full_forgery_replays_to_the_quote_and_is_refused(sim: SimTpm, tmp_path: Path, kind: int,
                                                              data: bytes, check: str) -> None:
    """The unlisted loader, its event relabelled, then measures what the firmware and the stub
    would have: the UKI's digest into PCR 4 (an EV_EFI_BOOT_SERVICES_APPLICATION event) and the
    UKI's (public) section values into PCR 11, and starts whatever it likes. The log replays to
    the quoted PCRs, PCR 4's boot applications are exactly the build's, PCR 11 is the build's."""
    sections = [ev(11, Ev.IPL, f"{name}\0".encode("utf-16-le"), h(f"the UKI's {name}".encode()))
                for name in (".linux", ".osrel", ".cmdline", ".initrd")]
    doc = policy_doc()
    doc["builds"] = [{**doc["builds"][0], "pcr11": replayed([*UEFI_BOOT, *sections], 11)}]  # type: ignore[index]
    verifier = Verifier(Policy.from_json(doc), ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    node = Node(sim, tmp_path)
    node.boot(_loader_before_the_uki(kind, data, then=sections))
    ch = verifier.challenge(node.node_id, node.identity())
    evidence = node.answer(ch)
    log = eventlog.parse(evidence.event_log)
    assert log.replay(range(13)) == {**evidence.pcrs, 10: bytes(32)}
    assert [e.sha256 for e in log.of(4, Ev.EFI_BOOT_SERVICES_APPLICATION)] == [RAMDISK]
    assert evidence.pcrs[11].hex() == doc["builds"][0]["pcr11"]  # type: ignore[index]
    refused(verifier.verify(ch, evidence, boot_id=node.boot_id, node_public=NODE_KEY), check)
    # What the relabelling hid: the same boot with the loader's event as the firmware logged it
    # attests only once an operator lists the loader.
    verifier.policy.loaders.add(LOADER)
    sim.restart()
    node.boot(_loader_before_the_uki(Ev.EFI_BOOT_SERVICES_APPLICATION, image(), then=sections))
    verdict = node.join(verifier)
    assert verdict.attested, verdict


def _judged(events: list[tuple[int, int, bytes, bytes]]) -> dict[str, str]:
    log = eventlog.parse(event_log(events))
    return Policy.from_json(policy_doc()).judge(log, log.replay(range(13)), PROFILE)


def test_an_action_is_one_of_the_specs_and_hashes_to_its_digest() -> None:
    with pytest.raises(PolicyFailed, match="none of the PC Client PFP's actions") as err:
        _judged(_loader_before_the_uki(Ev.EFI_ACTION, b"Calling EFI Application", before_separator=True))
    assert err.value.check == "policy_event_action"
    made_up = ev(4, Ev.EFI_ACTION, b"Loader started: nothing to see")  # its digest is its text's
    with pytest.raises(PolicyFailed, match="none of the PC Client PFP's actions") as err:
        _judged([*UEFI_BOOT[:-2], made_up, *UEFI_BOOT[-2:]])
    assert err.value.check == "policy_event_action"
    debug = ev(7, Ev.EFI_ACTION, b"UEFI Debug Mode")  # PCR 7's own string, in PCR 7: judged by PCR 7's value
    assert _judged([debug, *UEFI_BOOT])["build"] == "b1"
    with pytest.raises(PolicyFailed) as err:
        _judged([ev(4, Ev.EFI_ACTION, b"UEFI Debug Mode"), *UEFI_BOOT])  # PCR 7's string in PCR 4
    assert err.value.check == "policy_event_action"
    returned = [ev(4, Ev.EFI_ACTION, RETURNING), ev(4, Ev.EFI_ACTION, CALLING)]  # a second boot attempt
    assert _judged([*UEFI_BOOT[:-2], *returned, *UEFI_BOOT[-2:]])["build"] == "b1"


def test_each_firmware_pcr_judged_has_its_one_separator() -> None:
    for pcr in SEPARATED:
        without = [e for e in UEFI_BOOT if e != (pcr, Ev.SEPARATOR, h(bytes(4)), bytes(4))]
        with pytest.raises(PolicyFailed, match=f"no separator in PCR {pcr}") as err:
            _judged(without)
        assert err.value.check == "policy_separator"
    error = [e if e[:2] != (4, Ev.SEPARATOR) else ev(4, Ev.SEPARATOR, b"\x01\0\0\0") for e in UEFI_BOOT]
    with pytest.raises(PolicyFailed, match="error separator") as err:
        _judged(error)
    assert err.value.check == "policy_separator"
    assert _judged(UEFI_BOOT)["build"] == "b1"


def test_pcrs_9_11_12_hold_the_os_loaders_events_only() -> None:
    for pcr in (9, 11, 12):
        with pytest.raises(PolicyFailed, match=f"no such event in PCR {pcr}") as err:
            _judged([*UEFI_BOOT, ev(pcr, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), LOADER)])
        assert err.value.check == "policy_event_type"
