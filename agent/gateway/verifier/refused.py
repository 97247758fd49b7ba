"""The one way a check of the verifier says no: ``Refused(check, reason)``.

``check`` is the name the operator and the site see (ek_certificate, quote_nonce, spdm_chain,
policy_pcr4 ...: the list is in attest.py's and spdm.py's docstrings), ``reason`` the sentence.
Its own module so that the chain walk (x509chain.py), the SPDM and RIM checks and the TPM
verifier (attest.py) all raise the same thing without importing each other.
"""

from __future__ import annotations


class Refused(Exception):
    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check
        self.reason = reason


class PolicyFailed(Refused):
    """A check of the attestation policy (policy_pcr4, policy_pcr7, policy_secure_boot,
    policy_profile ...): what the node booted is not what the policy accepts. Apart from the
    other refusals because an installed system's boot chain, which no policy lists, is
    unattested rather than refused (attest.py)."""
