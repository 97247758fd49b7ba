"""The reference gateway's verifier: is this node's boot the one its TPM says, and one we accept?

A join is two steps. ``challenge`` checks who the TPM is (the EK certificate's chain to the
configured EK roots, or an EK pinned for the node; the EK bound to the node and to no other,
ek_changed and ek_in_use, agent/gateway/verifier/state.py; the EK's and the AK's public areas) and
makes a credential for the AK that only that EK's TPM can activate (TPM2_MakeCredential:
KDFa, RSA-OAEP with the "IDENTITY" label, AES-128-CFB and an HMAC over the AK's name),
with a fresh nonce. ``verify`` then takes the node's answer and refuses on the first check
that fails, naming it:

    nonce_reused      the challenge was answered already, expired, or is not this node's
    activation        the TPM did not release the credential's secret (the AK is not in it)
    quote_signature   the quote is not signed by the AK
    quote_magic, quote_type, quote_signer, quote_nonce
                      TPMS_ATTEST not made by a TPM, not a quote, signed by another key, or its
                      qualifying data is not this nonce, boot id and node key
    pcr_selection, pcr_digest   not PCRs 0-12 of SHA-256; the PCR values do not hash to it
    counters          the TPM's reset/restart counters and clock went back: a replayed quote
                      (kept across restarts in the state folder, with the EK bindings)
    event_log         the log does not parse, or does not replay to the quoted PCRs
    policy_*          the boot is not one the policy accepts (policy.py)
    firmware_changed  the node's host firmware (PCR 0 and 2) measured other values than at its last
                      attested join, and no window is open (the site's own firmware update, or
                      an operator's accept): a change behind the site's back, either way

The verdict is ``attested`` (what matched; the EK is bound to the node from then on),
``unattested`` (no event log, or a BIOS boot, with why), ``refused`` (the check, and why) or
``retry`` (busy: one challenge per node, the pool full). It fails closed: an exception anywhere
is a refusal named ``verifier``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.decrepit.ciphers.modes import CFB  # TPM2 credentials use AES-CFB
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from agent.errors import AgentError, InvalidParameters
from agent.gateway.verifier import eventlog
from agent.gateway.verifier.policy import Policy
from agent.gateway.verifier.refused import PolicyFailed, Refused
from agent.gateway.verifier.state import Counters, NodeState, NodeStates, StateFull
from agent.gateway.verifier.x509chain import MAX_CHAIN, issued_by, verify_chain
from agent.hw import tpm as tpmwire
from agent.security.attest_contract import (
    LEFT_EVENT,
    LEFT_PCR,
    QUOTED_PCRS,
    Evidence,
    Identity,
    pcr_digest,
    qualifying_data,
)

log = logging.getLogger(__name__)

CHALLENGE_TTL = 120.0
MAX_PENDING = 4096
# Joins verified at once; the rest wait their turn off the interpreter's lock, so that many
# joins arriving together leave the other sessions' threads their share (bench/attest_verify.py).
MAX_VERIFYING = 2
MAX_SITE_INVENTORY = 100_000  # nodes whose BMC inventory the site reported, as join.MAX_NODES
UNREPLAYED_PCRS = {10}  # IMA's: its log is IMA's own, not the firmware's


class Status(enum.StrEnum):
    ATTESTED = "attested"
    UNATTESTED = "unattested"
    REFUSED = "refused"
    RETRY = "retry"  # the gateway is busy: join again later (nothing was judged; the site is not told)


@dataclass(frozen=True)
class Verdict:
    status: Status
    check: str = ""       # refused: the check that failed
    reason: str = ""      # why, for a person
    matched: dict[str, str] = field(default_factory=dict)

    @property
    def attested(self) -> bool:
        return self.status is Status.ATTESTED

    def __str__(self) -> str:
        if self.status is Status.ATTESTED:
            return "attested: " + ", ".join(f"{k} {v}" for k, v in sorted(self.matched.items()))
        return f"{self.status}" + (f" ({self.check})" if self.check else "") + f": {self.reason}"


class Busy(Exception):
    """No room for another challenge now: the node is told to join again later, not refused."""


@dataclass(frozen=True)
class Challenge:
    """What the gateway sends; ``secret`` and ``identity`` stay with it."""

    node_id: str
    nonce: bytes
    credential_blob: bytes
    encrypted_secret: bytes
    secret: bytes = field(repr=False)
    identity: Identity = field(repr=False)
    issued: float = 0.0
    ek_maker: str = ""   # who vouched for the EK: its certificate's anchor, or "pinned"


# TPM2 credential protection (Part 1, 24) ---------------------------------------------------

def kdfa(key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int) -> bytes:
    """KDFa with HMAC-SHA256 (Part 1, 11.4.10.2); the label gets its terminating zero."""
    label = label if label.endswith(b"\0") else label + b"\0"
    out = b""
    counter = 0
    while len(out) * 8 < bits:
        counter += 1
        out += hmac.new(key, tpmwire.u32(counter) + label + context_u + context_v
                        + tpmwire.u32(bits), hashlib.sha256).digest()
    return out[:bits // 8]


def kdfe(z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int) -> bytes:
    """KDFe with SHA-256 (Part 1, 11.4.10.3): the seed from an ECDH shared secret's x."""
    out = b""
    counter = 0
    while len(out) * 8 < bits:
        counter += 1
        out += hashlib.sha256(tpmwire.u32(counter) + z + label + party_u + party_v).digest()
    return out[:bits // 8]


def ek_key(ek_public: bytes) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
    """The EK's public key: RSA 2048 (template L-1) or NIST P-256 (L-2)."""
    fields = tpmwire.parse_public(ek_public)
    if fields.type == tpmwire.Alg.ECC:
        r = tpmwire.Reader(fields.unique, "the EK's point")
        x, y = r.b2(), r.b2()
        return ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"),
                                             ec.SECP256R1()).public_key()
    return rsa.RSAPublicNumbers(65537, int.from_bytes(fields.unique, "big")).public_key()


def _seed(ek_public: bytes) -> tuple[bytes, bytes]:
    """(seed, the EK-protected form of it: TPM2B_ENCRYPTED_SECRET contents) for the "IDENTITY"
    use: RSA-OAEP with that label, or an ephemeral ECDH key whose point goes with it."""
    key = ek_key(ek_public)
    if isinstance(key, rsa.RSAPublicKey):
        seed = os.urandom(32)
        label = b"IDENTITY\0"
        return seed, key.encrypt(seed, padding.OAEP(padding.MGF1(hashes.SHA256()), hashes.SHA256(), label))
    ephemeral = ec.generate_private_key(ec.SECP256R1())
    z = ephemeral.exchange(ec.ECDH(), key)
    mine, theirs = ephemeral.public_key().public_numbers(), key.public_numbers()
    mx, my, tx = (v.to_bytes(32, "big") for v in (mine.x, mine.y, theirs.x))
    return kdfe(z, b"IDENTITY\0", mx, tx, 256), tpmwire.b2(mx) + tpmwire.b2(my)


def make_credential(ek_public: bytes, ak_name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    """(TPM2B_ID_OBJECT contents, TPM2B_ENCRYPTED_SECRET contents) for an EK of a default
    template (SHA-256 name algorithm, AES-128-CFB): what TPM2_MakeCredential computes."""
    seed, encrypted_seed = _seed(ek_public)
    sym_key = kdfa(seed, b"STORAGE", ak_name, b"", 128)
    encryptor = Cipher(algorithms.AES(sym_key), CFB(bytes(16))).encryptor()
    enc_identity = encryptor.update(tpmwire.b2(secret)) + encryptor.finalize()
    hmac_key = kdfa(seed, b"INTEGRITY", b"", b"", 256)
    outer = hmac.new(hmac_key, enc_identity + ak_name, hashlib.sha256).digest()
    return tpmwire.b2(outer) + enc_identity, encrypted_seed


# Keys and names ---------------------------------------------------------------------------

AkKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def check_ek_public(ek_public: bytes) -> None:
    try:
        got = tpmwire.parse_public(ek_public)
        ek_key(ek_public)
    except (AgentError, ValueError) as e:
        raise Refused("ek_public", f"the EK's public area is not a usable key: {e}") from e
    for template, unique in ((tpmwire.EK_RSA_TEMPLATE, 256), (tpmwire.EK_ECC_TEMPLATE, 2 * (2 + 32))):
        want = tpmwire.parse_public(template)
        if (got.type, got.name_alg, got.attributes, got.auth_policy, got.parameters) == \
                (want.type, want.name_alg, want.attributes, want.auth_policy, want.parameters) \
                and len(got.unique) == unique:
            return
    raise Refused("ek_public", "the EK is not a key of a TCG default EK template (RSA 2048, NIST P-256)")


def check_ak_public(ak_public: bytes) -> AkKey:
    try:
        got = tpmwire.parse_public(ak_public)
        need = (tpmwire.Attr.FIXED_TPM | tpmwire.Attr.FIXED_PARENT | tpmwire.Attr.SENSITIVE_DATA_ORIGIN
                | tpmwire.Attr.RESTRICTED | tpmwire.Attr.SIGN)
        if got.name_alg != tpmwire.Alg.SHA256 or got.attributes & need != need \
                or got.attributes & tpmwire.Attr.DECRYPT:
            raise Refused("ak_public", "the AK is not a restricted signing key that never leaves its TPM")
        if got.type == tpmwire.Alg.ECC:
            r = tpmwire.Reader(got.unique, "the AK's point")
            x, y = r.b2(), r.b2()
            return ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"),
                                                 ec.SECP256R1()).public_key()
        return rsa.RSAPublicNumbers(65537, int.from_bytes(got.unique, "big")).public_key()
    except (AgentError, ValueError) as e:
        raise Refused("ak_public", f"the AK's public area is not a usable key: {e}") from e


def verify_signature(key: AkKey, message: bytes, signature: bytes) -> None:
    """A TPMT_SIGNATURE (ECDSA or RSASSA, SHA-256) over ``message``; Refused quote_signature."""
    try:
        r = tpmwire.Reader(signature, "TPMT_SIGNATURE")
        alg, hash_alg = r.u16(), r.u16()
        if hash_alg != tpmwire.Alg.SHA256:
            raise Refused("quote_signature", f"a signature over hash {hash_alg:#x}, not SHA-256")
        if alg == tpmwire.Alg.ECDSA and isinstance(key, ec.EllipticCurvePublicKey):
            sig_r, sig_s = r.b2(), r.b2()
            r.done()
            der = encode_dss_signature(int.from_bytes(sig_r, "big"), int.from_bytes(sig_s, "big"))
            key.verify(der, message, ec.ECDSA(hashes.SHA256()))
        elif alg == tpmwire.Alg.RSASSA and isinstance(key, rsa.RSAPublicKey):
            sig = r.b2()
            r.done()
            key.verify(sig, message, padding.PKCS1v15(), hashes.SHA256())
        else:
            raise Refused("quote_signature", f"a signature of scheme {alg:#x} for this AK")
    except InvalidSignature as e:
        raise Refused("quote_signature", "the quote's signature does not verify with the AK") from e
    except AgentError as e:
        raise Refused("quote_signature", f"the signature does not parse: {e}") from e


def firmware_of(pcrs: dict[int, bytes]) -> str:
    """What the host firmware measured, in one value: SHA-256 (hex) of PCR 0 (its code) and PCR 2
    (option ROMs, drivers it loaded), as the node's state keeps it (``firmware_changed``)."""
    return hashlib.sha256(pcrs[0] + pcrs[2]).hexdigest()


def load_certificates(paths: Iterable[Path]) -> list[x509.Certificate]:
    """The EK CAs an operator gave (PEM, several to a file, or DER); one that cannot be read or
    parsed is a usage error (InvalidParameters) naming the file."""
    out: list[x509.Certificate] = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
            out += x509.load_pem_x509_certificates(data) if b"-----BEGIN" in data else \
                [x509.load_der_x509_certificate(data)]
        except OSError as e:
            raise InvalidParameters(f"EK CA {path}: cannot read it: {e.strerror or e}") from e
        except ValueError as e:
            raise InvalidParameters(f"EK CA {path}: not a PEM or DER certificate: {e}") from e
    return out


def check_ek_certificate(der: bytes, ek_public: bytes, roots: list[x509.Certificate]) -> str:
    """The EK certificate's chain to one of ``roots`` (the vendors' EK CAs, intermediates beside
    them), and its key the EK's. Returns the issuer that anchored it."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as e:
        raise Refused("ek_certificate", f"the EK certificate does not parse: {e}") from e
    if cert.public_key() != ek_key(ek_public):
        raise Refused("ek_certificate", "the EK certificate is for another key than the EK")
    # The certificate, then the configured intermediates that lead to an anchor.
    # Not the dates: an EK certificate names a TPM for the TPM's whole life, which its makers'
    # CA certificates often do not outlast; the walk before this one read none either.
    return verify_chain(_path_to_root(cert, roots), roots, check="ek_certificate", dates=False)


def _path_to_root(cert: x509.Certificate, given: list[x509.Certificate]) -> list[x509.Certificate]:
    """``cert`` and the issuers that signed it found among ``given`` (two CAs may share a name),
    leaf first, up to a self-signed one or the longest chain verify_chain takes; verify_chain
    then judges the whole path (validity, CA flags, the anchor)."""
    path = [cert]
    while len(path) < MAX_CHAIN and path[-1].issuer != path[-1].subject:
        issuer = next((c for c in given if c.subject == path[-1].issuer and c not in path
                       and issued_by(path[-1], c)), None)
        if issuer is None:
            break
        path.append(issuer)
    return path


# The verifier -----------------------------------------------------------------------------

class Verifier:
    """Challenges and verdicts for every node of one gateway; thread-safe."""

    def __init__(self, policy: Policy, *, ek_roots: Iterable[x509.Certificate] = (),
                 pinned_ek: dict[str, bytes] | None = None, ttl: float = CHALLENGE_TTL,
                 clock: Callable[[], float] = time.monotonic, states: NodeStates | None = None) -> None:
        self.policy = policy
        self.roots = list(ek_roots)
        self.pinned_ek = dict(pinned_ek or {})  # node id -> SHA-256 of the EK's public area (enrolled)
        self.ttl = ttl
        self.clock = clock
        self._pending: dict[bytes, Challenge] = {}   # nonce -> challenge, one per node
        self._pending_of: dict[str, bytes] = {}      # node id -> the nonce of its one challenge
        # Per node, kept across restarts where it has a folder: the EK bound to it, its counters.
        self.states = states if states is not None else NodeStates()
        self._lock = threading.Lock()
        # node id -> "bmc:maker|model|BIOS version" as the site's bmc.query read them
        self._site_inventory: OrderedDict[str, str] = OrderedDict()
        self._verifying = threading.BoundedSemaphore(MAX_VERIFYING)

    def challenge(self, node_id: str, identity: Identity) -> Challenge:
        """Check who the TPM is and make its challenge; Refused on the first failing check."""
        check_ek_public(identity.ek_public)
        pinned = self.pinned_ek.get(node_id)
        ek_maker = "pinned"  # an EK pinned by an operator has no certificate to name its maker
        if pinned is not None:
            if not hmac.compare_digest(hashlib.sha256(identity.ek_public).digest(), pinned):
                raise Refused("ek_pinned", "the EK is not the one pinned for this node")
        elif not identity.ek_certificate:
            raise Refused("ek_certificate", "no EK certificate in the TPM's NV and no EK pinned for the node")
        else:
            ek_maker = check_ek_certificate(identity.ek_certificate, identity.ek_public, self.roots)
        with self._lock:
            self._check_binding(node_id, hashlib.sha256(identity.ek_public).digest())
        check_ak_public(identity.ak_public)
        if identity.ak_name != tpmwire.name_of(identity.ak_public):
            raise Refused("ak_public", "the AK's name is not its public area's")
        secret, nonce = os.urandom(32), os.urandom(32)
        blob, encrypted = make_credential(identity.ek_public, tpmwire.name_of(identity.ak_public), secret)
        ch = Challenge(node_id, nonce, blob, encrypted, secret, identity, self.clock(), ek_maker)
        with self._lock:
            now = self.clock()
            for key in [k for k, c in self._pending.items() if now - c.issued > self.ttl]:
                self._unpend(key)
            previous = self._pending_of.get(node_id)
            if previous is not None:  # one outstanding challenge per node: the new Hello's
                self._unpend(previous)
            if len(self._pending) >= MAX_PENDING:
                raise Busy(f"{MAX_PENDING} nodes' challenges outstanding: join again later")
            self._pending[nonce] = ch
            self._pending_of[node_id] = nonce
        return ch

    # One TPM, one node ------------------------------------------------------------------------

    def _check_binding(self, node_id: str, ek: bytes) -> NodeState | None:
        """Under the lock: refuses an EK that is not the one bound to the node (``ek_changed``),
        or that is bound to another node (``ek_in_use``); returns the node's state."""
        state = self.states.get(node_id)
        if state is not None and state.ek and not hmac.compare_digest(state.ek, ek):
            raise Refused("ek_changed", f"{node_id} is bound to EK {state.ek.hex()[:16]}, this is "
                          f"{ek.hex()[:16]}: a TPM replaced is enrolled again by an operator "
                          "(agent gateway reenroll)")
        owner = self.states.owner(ek) or next(
            (n for n, pinned in self.pinned_ek.items() if hmac.compare_digest(pinned, ek)), None)
        if owner is not None and owner != node_id:
            raise Refused("ek_in_use", f"EK {ek.hex()[:16]} is bound to another node ({owner}): one TPM "
                          "vouches for one node")
        if state is None and len(self.states) >= self.states.max_nodes:
            raise Refused("capacity", f"the verifier holds {self.states.max_nodes} nodes' TPM bindings and "
                          "counters; it forgets none to make room (that would forget a binding)")
        return state

    def bound(self, node_id: str) -> str:
        """The EK digest (hex) bound or pinned to the node, "" where none is."""
        pinned = self.pinned_ek.get(node_id)
        if pinned is not None:
            return pinned.hex()
        with self._lock:
            state = self.states.get(node_id)
        return state.ek.hex() if state is not None else ""

    def reenroll(self, node_id: str) -> NodeState | None:
        """An operator's word that the node's TPM was replaced: its binding and counters go, and
        its next attested join binds the new EK. Returns what was kept."""
        with self._lock:
            return self.states.release(node_id)

    def profile_of(self, ch: Challenge) -> tuple[str, str]:
        """(the hardware profile, where it came from). From what the node cannot forge alone
        where the site reported the node's BMC inventory (its maker, model and BIOS version as
        the site read them over Redfish or IPMI) and the EK's maker (who vouched for its
        certificate); else the node's own DMI strings, the node's word (docs/attestation.md)."""
        with self._lock:
            bmc = self._site_inventory.get(ch.node_id)
        if bmc is None:
            return ch.identity.platform, "the DMI strings the node reports"
        return f"{bmc}|ek:{ch.ek_maker}", "the site's BMC inventory and the EK's maker"

    def _judge(self, ch: Challenge, log_: eventlog.EventLog, pcrs: dict[int, bytes], profile: str,
               source: str, reset_count: int) -> dict[str, str]:
        """The policy's judgement, with the profile held to what the node attested under before:
        a node whose profile changed is refused until its window is open (``accept``, or the
        site's own firmware update, ``site_updated_firmware``); a new profile is learned only at
        the node's first attestation."""
        with self._lock:
            state = self.states.get(ch.node_id)
        state = state or NodeState(ch.node_id)
        before, by = state.profile, state.accept_by
        # The site's window is for the boot after its firmware update, not one still before it.
        accept = state.accept and reset_count > state.accept_after
        if before and profile != before and not accept:
            raise PolicyFailed("policy_profile", f"{ch.node_id} attested as hardware profile {before!r} and "
                               f"now is {profile!r} (from {source}): a profile is not learned because a "
                               "DMI string changed, nor because the BMC's inventory did (an operator accepts "
                               "a firmware change: agent gateway accept NODE)")
        was, now = state.firmware, firmware_of(pcrs)
        if was and now != was and not accept:
            raise PolicyFailed("firmware_changed", f"{ch.node_id}'s host firmware measured PCR 0/2 "
                               f"{now[:16]}, not {was[:16]} as at its last attested join, and no "
                               "window is open: a firmware change is taken after the site's own update "
                               "of it (bmc.firmware) or an operator's accept (agent gateway accept NODE)")
        matched = self.policy.judge(log_, pcrs, profile, learn=not before, accept=accept)
        if accept and now != was:
            matched["firmware"] = f"{was[:16] or 'none'} -> {now[:16]}"
        if accept and ("learned" in matched or now != was):
            matched["accepted_by"] = by or "operator"
        return matched

    def accept(self, node_id: str, by: str = "operator", *, next_boot: bool = False) -> NodeState:
        """An operator's window for the node: its next attested join may learn its firmware's PCRs
        (a firmware update, a new board); the window closes with that join."""
        with self._lock:
            try:
                return self.states.accept(node_id, by, next_boot=next_boot)
            except StateFull as e:
                raise Refused("capacity", str(e)) from e

    def site_updated_firmware(self, node_id: str, firmware_set: str) -> NodeState:
        """The site reports a firmware update it made itself: "site updated node N's firmware to
        set S". Recorded with the node's state, it opens the node's window for its next attested
        join only (which learns what the new firmware measures); the firmware work calls it when
        an update it applied is done (agent/gateway/verifier/join.py ``site_report``)."""
        if not firmware_set:
            raise InvalidParameters("a firmware update the site made names its firmware set")
        log.info("attestation: the site updated %s's firmware to set %r: its next join may learn",
                 node_id, firmware_set)
        return self.accept(node_id, by=f"site: firmware set {firmware_set}", next_boot=True)

    def site_inventory(self, node_id: str, manufacturer: str, model: str, bios_version: str) -> None:
        """The node's BMC inventory as the site read it (bmc.query): the identity of the node's
        hardware profile from now on (``profile_of``). Bounded: past MAX_SITE_INVENTORY nodes the
        oldest report is forgotten (that node's profile is then its DMI strings, as before)."""
        if not (manufacturer or model or bios_version):
            return  # a BMC that says nothing names no profile
        name = "bmc:" + "|".join(s.replace("|", "/") for s in (manufacturer, model, bios_version))
        with self._lock:
            self._site_inventory[node_id] = name
            self._site_inventory.move_to_end(node_id)
            while len(self._site_inventory) > MAX_SITE_INVENTORY:
                self._site_inventory.popitem(last=False)

    def _bind(self, node_id: str, ek: bytes, profile: str, reset_count: int, firmware: str) -> None:
        """At an attested join: the EK is the node's from now on (checked again under the lock:
        two nodes racing to their first join with one TPM), and so are its profile and what its
        host firmware measured; an open window closes (the site's only with a boot after its
        update)."""
        with self._lock:
            state = self._check_binding(node_id, ek) or NodeState(node_id)
            accept = state.accept and reset_count <= state.accept_after
            if (state.ek, state.profile, state.accept, state.firmware) != (ek, profile, accept, firmware):
                try:
                    self.states.put(replace(state, ek=ek, profile=profile, accept=accept, firmware=firmware))
                except StateFull as e:
                    raise Refused("capacity", str(e)) from e
                if state.ek != ek:
                    log.info("attestation: %s bound to EK %s", node_id, ek.hex()[:16])

    def _unpend(self, nonce: bytes) -> Challenge | None:
        """Under the lock: the challenge of ``nonce`` taken out of the pool."""
        ch = self._pending.pop(nonce, None)
        if ch is not None and self._pending_of.get(ch.node_id) == nonce:
            del self._pending_of[ch.node_id]
        return ch

    def try_challenge(self, node_id: str, identity: Identity) -> Challenge | Verdict:
        """``challenge``, with a refusal as a Verdict."""
        try:
            return self.challenge(node_id, identity)
        except Refused as e:
            verdict = Verdict(Status.REFUSED, e.check, e.reason)
        except Busy as e:
            log.warning("attestation of %s: busy, told to join again later: %s", node_id, e)
            return Verdict(Status.RETRY, "busy", str(e))
        except Exception as e:  # fails closed: a surprise is a refusal, with what it was
            log.exception("attestation of %s: the verifier failed at the challenge", node_id)
            verdict = Verdict(Status.REFUSED, "verifier", f"{type(e).__name__}: {e}")
        log.warning("attestation of %s refused: %s", node_id, verdict)
        return verdict

    def verify(self, challenge: Challenge, evidence: Evidence | str, *, boot_id: str,
               node_public: bytes, role: str = "ramdisk") -> Verdict:
        """The verdict on a node's answer (``evidence``, or the reason its TPM gave none).

        Only the ramdisk is a build the policy lists: an installed system (``role`` node) whose
        boot chain is no ramdisk build is unattested, not refused; its firmware is still judged."""
        try:
            with self._verifying:
                return self._verify(challenge, evidence, boot_id, node_public)
        except PolicyFailed as e:      # before Refused, of which it is one
            if e.check == "policy_pcr4" and role != "ramdisk":
                return Verdict(Status.UNATTESTED, reason=f"a {role} boot: its boot chain is no ramdisk "
                               f"build, and an installed system is not one the policy lists ({e.reason})")
            verdict = Verdict(Status.REFUSED, e.check, e.reason)
        except Refused as e:
            verdict = Verdict(Status.REFUSED, e.check, e.reason)
        except Exception as e:  # fails closed: a surprise is a refusal, with what it was
            log.exception("attestation of %s: the verifier failed", challenge.node_id)
            verdict = Verdict(Status.REFUSED, "verifier", f"{type(e).__name__}: {e}")
        log.warning("attestation of %s refused: %s", challenge.node_id, verdict)
        return verdict

    def _verify(self, ch: Challenge, evidence: Evidence | str, boot_id: str, node_public: bytes) -> Verdict:
        with self._lock:
            pending = self._unpend(ch.nonce)
        if pending is None or pending != ch:
            raise Refused("nonce_reused", "this challenge was answered already, replaced by the node's "
                          "next Hello, or was never made")
        if self.clock() - ch.issued > self.ttl:
            raise Refused("nonce_reused", f"the challenge is older than {self.ttl:.0f} s")
        if isinstance(evidence, str):
            raise Refused("activation", f"the node's TPM gave no answer: {evidence}")
        if not hmac.compare_digest(evidence.activated, ch.secret):
            raise Refused("activation", "the TPM did not release the credential's secret: "
                          "the AK is not in the TPM of this EK")
        ak_key = check_ak_public(ch.identity.ak_public)
        verify_signature(ak_key, evidence.quote, evidence.signature)
        try:
            attest = tpmwire.parse_attest(evidence.quote)
        except AgentError as e:
            raise Refused("quote_type", f"the quote does not parse: {e}") from e
        if attest.magic != tpmwire.GENERATED_VALUE:
            raise Refused("quote_magic", "the quote was not made by a TPM (magic)")
        if attest.type != tpmwire.ST_ATTEST_QUOTE:
            raise Refused("quote_type", "the attestation is not a quote")
        if attest.signer != tpmwire.qualified_name_of_primary(tpmwire.RH_ENDORSEMENT, ch.identity.ak_name):
            raise Refused("quote_signer", "the quote names another signer than this AK")
        if not hmac.compare_digest(attest.extra_data, qualifying_data(ch.nonce, boot_id, node_public)):
            raise Refused("quote_nonce", "the quote's qualifying data is not this challenge's nonce, "
                          "this boot's id and this node's key")
        if attest.pcr_select != {tpmwire.Alg.SHA256: list(QUOTED_PCRS)}:
            raise Refused("pcr_selection", "the quote is not over SHA-256 PCRs 0-12")
        if set(evidence.pcrs) != set(QUOTED_PCRS) or any(len(v) != 32 for v in evidence.pcrs.values()) \
                or pcr_digest(evidence.pcrs) != attest.pcr_digest:
            raise Refused("pcr_digest", "the PCR values sent do not hash to the quoted digest")
        kexec = self._counters(ch.node_id, attest, boot_id)
        if not evidence.event_log:
            return Verdict(Status.UNATTESTED, reason="the firmware left no event log: nothing says what "
                           "the PCRs measured")
        try:
            log_ = eventlog.parse(evidence.event_log)
        except eventlog.BadEventLog as e:
            raise Refused("event_log", str(e)) from e
        replayed = log_.replay(QUOTED_PCRS)
        left, marked = 0, replayed[LEFT_PCR]  # the agent's marks on PCR 11 after the firmware's log
        while left < 4 and marked != evidence.pcrs[LEFT_PCR]:
            left, marked = left + 1, hashlib.sha256(marked + LEFT_EVENT).digest()
        if marked == evidence.pcrs[LEFT_PCR]:
            replayed[LEFT_PCR] = marked
        else:
            left = 0
        for pcr in QUOTED_PCRS:
            if pcr not in UNREPLAYED_PCRS and replayed[pcr] != evidence.pcrs[pcr]:
                raise Refused("event_log", f"the event log replays PCR {pcr} to {replayed[pcr].hex()}, "
                              f"the TPM quoted {evidence.pcrs[pcr].hex()}")
        if not log_.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION):
            return Verdict(Status.UNATTESTED, reason="a BIOS boot: the firmware measured itself, "
                           "not the ramdisk (PCR 4 holds no EFI application)")
        if left:
            return Verdict(Status.UNATTESTED, reason=f"the agent left the measured boot {left} time(s) "
                           "(a kexec or an agent upgrade: PCR 11 marked): what runs now was not measured")
        if kexec:
            return Verdict(Status.UNATTESTED, reason=f"the TPM was not reset since boot {kexec}, which it "
                           "measured: this boot came by kexec, and what runs now was not measured")
        profile, source = self.profile_of(ch)
        matched = self._judge(ch, log_, evidence.pcrs, profile, source, attest.reset_count)
        ek = hashlib.sha256(ch.identity.ek_public).digest()
        self._bind(ch.node_id, ek, profile, attest.reset_count, firmware_of(evidence.pcrs))
        matched["ek"] = ek.hex()[:16]
        return Verdict(Status.ATTESTED, matched=matched)

    def _counters(self, node_id: str, attest: tpmwire.Attest, boot_id: str) -> str:
        """Refuses a quote not past the node's last; returns the boot id the TPM measured where
        this quote is of another boot since the TPM's last reset (a kexec), else ""."""
        now = (attest.reset_count, attest.restart_count, attest.clock)
        with self._lock:
            state = self.states.get(node_id) or NodeState(node_id)
            last = state.counters
            if last is not None and now <= (last.reset, last.restart, last.clock):
                raise Refused("counters", "the TPM's reset/restart counters and clock ({}/{}/{}) are not "
                              "past the last quote's ({}/{}/{}): a replayed quote".format(
                                  *now, last.reset, last.restart, last.clock))
            same_epoch = last is not None and (last.reset, last.restart) == now[:2]
            measured = last.measured_boot if same_epoch and last is not None else boot_id
            try:
                self.states.put(replace(state, counters=Counters(*now, measured)))
            except StateFull as e:
                raise Refused("capacity", str(e)) from e
        return measured if measured != boot_id else ""
