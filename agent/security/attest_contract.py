"""What the node and the gateway's verifier must agree on for a join with attestation.

Which PCRs a quote covers, the qualifying data that binds it to one nonce, boot and node key,
the PCR digest the quote carries, the mark a boot leaves in PCR 11 when it leaves the measured
boot, and the identity and evidence records with their one conversion to and from the wire
(agent/proto/session.proto). The node's side (agent/security/attest.py: its TPM, the answer)
and the verifier (agent/gateway/verifier/) both import this module and nothing of each other.
Standard library only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from agent.hw import tpm as tpmwire
from agent.proto import session_pb2

QUOTE_DOMAIN = b"bettercompute.attest.v1\0"
QUOTED_PCRS = tuple(range(13))  # 0-12: firmware, boot loaders and the stub's PCRs 11 and 12
NONCE_BYTES = (16, 64)
# Extended into PCR 11 before the agent leaves the measured boot (a kexec into another kernel,
# an agent upgrade): what runs next was not measured, and the gateway then sees PCR 11 differ
# from the build's and says so (docs/attestation.md, "Leaving the measured boot").
LEFT_PCR = 11
LEFT_EVENT = hashlib.sha256(b"bettercompute.left-measured-boot.v1\0").digest()


def qualifying_data(nonce: bytes, boot_id: str, node_public: bytes) -> bytes:
    """SHA-256 over the domain, then each field with its length: what TPM2_Quote's extraData holds."""
    h = hashlib.sha256(QUOTE_DOMAIN)
    for part in (nonce, boot_id.encode("ascii"), node_public):
        h.update(tpmwire.u32(len(part)) + part)
    return h.digest()


def pcr_digest(pcrs: dict[int, bytes]) -> bytes:
    """What a quote's pcrDigest holds: SHA-256 over the values in PCR order."""
    return hashlib.sha256(b"".join(pcrs[i] for i in sorted(pcrs))).digest()


@dataclass(frozen=True)
class Identity:
    """What the gateway needs before it can challenge: the TPM's EK, its certificate, the AK."""

    ek_public: bytes       # TPMT_PUBLIC
    ek_certificate: bytes  # DER, b"" where NV holds none
    ak_public: bytes       # TPMT_PUBLIC
    ak_name: bytes
    manufacturer: str      # e.g. "IBM", "INTC", "NTC", "STM", "IFX"
    firmware: str          # "major.minor" of TPM_PT_FIRMWARE_VERSION_1, then _2 in hex
    platform: str          # what the node's DMI says: "maker|model|firmware version"


@dataclass(frozen=True)
class Evidence:
    """The answer to a challenge."""

    activated: bytes       # the credential's secret, as the TPM released it
    quote: bytes           # TPMS_ATTEST
    signature: bytes       # TPMT_SIGNATURE
    pcrs: dict[int, bytes]
    event_log: bytes


# On the wire -------------------------------------------------------------------------------

def identity_message(i: Identity) -> session_pb2.TpmIdentity:
    return session_pb2.TpmIdentity(
        ek_public=i.ek_public, ek_certificate=i.ek_certificate, ak_public=i.ak_public,
        ak_name=i.ak_name, manufacturer=i.manufacturer, firmware=i.firmware, platform=i.platform)


def identity_from(msg: session_pb2.TpmIdentity) -> Identity:
    return Identity(bytes(msg.ek_public), bytes(msg.ek_certificate), bytes(msg.ak_public),
                    bytes(msg.ak_name), msg.manufacturer, msg.firmware, msg.platform)


def answer_message(nonce: bytes, ev: Evidence) -> session_pb2.AttestAnswer:
    return session_pb2.AttestAnswer(
        nonce=nonce, activated=ev.activated, quote=ev.quote, signature=ev.signature,
        pcrs=[session_pb2.PcrValue(index=i, sha256=v) for i, v in sorted(ev.pcrs.items())],
        event_log=ev.event_log)


def evidence_from(msg: session_pb2.AttestAnswer) -> Evidence:
    return Evidence(bytes(msg.activated), bytes(msg.quote), bytes(msg.signature),
                    {p.index: bytes(p.sha256) for p in msg.pcrs}, bytes(msg.event_log))
