"""A device's or a signer's certificate chain checked to configured roots, refusals named.

Used by the SPDM verifier (a device's chain, from its attestation report or the BMC's
CertChain) and by the RIM verifier (the manifest signer's chain in its KeyInfo). The chain is
given leaf first (``leaf_first`` orders one given root first); each certificate must be
issued by the next (signature and names), be valid at the time given, and every issuer must
be a CA. The last certificate must be one of the roots or be issued by one.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from agent.gateway.verifier.refused import Refused

MAX_CHAIN = 8


def leaf_first(certs: list[x509.Certificate]) -> list[x509.Certificate]:
    """``certs`` with the leaf first: reversed when it was given root first (as SPDM's
    CERTIFICATE response and some BMCs' CertChain list it)."""
    if len(certs) > 1 and certs[0].subject == certs[1].issuer and certs[1].subject != certs[0].issuer:
        return list(reversed(certs))
    return list(certs)


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def verify_chain(certs: list[x509.Certificate], roots: list[x509.Certificate], *, check: str,
                 at: datetime | None = None, dates: bool = True) -> str:
    """The subject of the configured root that anchors ``certs`` (leaf first); else Refused(check).
    ``dates`` False leaves the validity periods unread (a TPM's EK certificate: attest.py)."""
    when = at or datetime.now(UTC)
    if not certs:
        raise Refused(check, "the certificate chain is empty")
    if len(certs) > MAX_CHAIN:
        raise Refused(check, f"the certificate chain has {len(certs)} certificates, more than {MAX_CHAIN}")
    if not roots:
        raise Refused(check, "no root is configured for this chain")
    for n, cert in enumerate(certs):
        if dates and not cert.not_valid_before_utc <= when <= cert.not_valid_after_utc:
            raise Refused(check, f"certificate {n} ({cert.subject.rfc4514_string()}) is not valid at "
                          f"{when:%Y-%m-%d %H:%M} UTC ({cert.not_valid_before_utc:%Y-%m-%d} to "
                          f"{cert.not_valid_after_utc:%Y-%m-%d})")
        if n + 1 < len(certs):
            issuer = certs[n + 1]
            if not _is_ca(issuer):
                raise Refused(check, f"certificate {n + 1} ({issuer.subject.rfc4514_string()}) is not a CA")
            if not issued_by(cert, issuer):
                raise Refused(check, f"certificate {n} ({cert.subject.rfc4514_string()}) is not signed by "
                              f"certificate {n + 1}")
    top = certs[-1]
    for root in roots:
        if top == root or (top.issuer == root.subject and _is_ca(root) and issued_by(top, root)):
            return root.subject.rfc4514_string()
    raise Refused(check, f"the chain ({top.issuer.rfc4514_string()}) reaches no configured root")
