"""The SPDM and RIM verifiers on exchanges and manifests made here (no published data needed):
malformed input is refused by name, never raised as something else, and a manifest cannot pick
a weaker check. tests/gateway/test_spdm_published.py runs them on a real H100's."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from agent.gateway.verifier.refused import Refused
from agent.gateway.verifier.rim import verify_rim
from agent.gateway.verifier.spdm import GoldenTable, parse_report, split_exchange, verify_report
from tests.site.bmc.redfish_emulator.spdm import (
    FIRMWARE,
    INDICES,
    exchange,
    make_cert,
    measurement,
    signed_rim,
)

Pki = tuple[ec.EllipticCurvePrivateKey, list[x509.Certificate], ec.EllipticCurvePrivateKey,
            list[x509.Certificate]]


@pytest.fixture(scope="module")
def pki() -> Pki:
    """(a responder key, its chain leaf first; a RIM signer key, its chain leaf first)."""
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = make_cert("CA", ca_key, "CA", ca_key, ca=True)
    root_key, signer_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    root = make_cert("RIM root", root_key, "RIM root", root_key, ca=True)
    return (key, [make_cert("leaf", key, "CA", ca_key, ca=False), ca],
            signer_key, [make_cert("signer", signer_key, "RIM root", root_key, ca=False), root])


def _blocks() -> dict[int, bytes]:
    return {i: measurement(i) for i in INDICES}


def test_a_made_exchange_verifies(pki: Pki) -> None:
    key, chain, _, _ = pki
    nonce = bytes(range(32))
    report = parse_report(*split_exchange(exchange(key, nonce, 0, _blocks(), FIRMWARE)))
    assert report.firmware_version() == FIRMWARE and [b.index for b in report.blocks] == list(INDICES)
    table = GoldenTable.parse({"firmware": {FIRMWARE: {str(i): [d.hex()] for i, d in _blocks().items()}}})
    assert verify_report(report, chain, [chain[-1]], nonce=nonce, table=table).measurements == len(INDICES)


def test_every_truncation_and_many_changed_bytes_are_refused_by_name(pki: Pki) -> None:
    key, chain, _, _ = pki
    nonce = bytes(32)
    whole = exchange(key, nonce, 0, _blocks(), FIRMWARE)
    table = GoldenTable.parse({"firmware": {FIRMWARE: {str(i): [d.hex()] for i, d in _blocks().items()}}})
    mutated = [whole[:n] for n in range(len(whole))]
    rng = random.Random(54)
    for _ in range(300):
        changed = bytearray(whole)
        changed[rng.randrange(len(changed))] ^= 1 << rng.randrange(8)
        mutated.append(bytes(changed))
    for data in mutated:
        with pytest.raises(Refused) as refused:
            verify_report(parse_report(*split_exchange(data)), chain, [chain[-1]], nonce=nonce, table=table)
        assert refused.value.check in {"report", "version", "nonce", "signature", "golden", "measurement"}


def test_spdm_1_2_is_refused_as_a_version_not_misread(pki: Pki) -> None:
    key, _, _, _ = pki
    request, response = split_exchange(exchange(key, bytes(32), 0, _blocks(), FIRMWARE))
    with pytest.raises(Refused) as refused:
        parse_report(b"\x12" + request[1:], b"\x12" + response[1:])
    assert refused.value.check == "version"


def test_a_made_rim_verifies_and_expires(pki: Pki) -> None:
    _, _, signer_key, signer_chain = pki
    document = signed_rim(FIRMWARE, _blocks(), signer_key, signer_chain)
    rim = verify_rim(document, [signer_chain[-1]])
    assert rim.version == FIRMWARE and rim.measurements[0].digests == (measurement(1),)
    with pytest.raises(Refused) as refused:
        verify_rim(document, [signer_chain[-1]], at=datetime.now(UTC) + timedelta(days=365))
    assert refused.value.check == "rim_chain"
    with pytest.raises(Refused) as refused:
        verify_rim(document, [])
    assert refused.value.check == "rim_chain"


@pytest.mark.parametrize("change", [
    ("xml-c14n11\"/><ds:SignatureMethod", "xml-exc-c14n#\"/><ds:SignatureMethod"),  # another canonicalization
    ("xmldsig-more#sha384", "xmlenc#sha256"),                                      # another digest
    ('URI=""', 'URI="#payload"'),                                                  # a part, not the whole
    ("<ds:Transform Algorithm=\"http://www.w3.org/2000/09/xmldsig#enveloped-signature\"/>", ""),
    ("<SoftwareIdentity ", "<!DOCTYPE x [<!ENTITY e \"e\">]><SoftwareIdentity "),  # entities
    ("</ds:Signature>", "</ds:Signature><ds:Signature xmlns:ds=\"http://www.w3.org/2000/09/xmldsig#\"/>"),
    ("<ns0:Payload>", "<ns0:Payload><?pi x?>"),
    ('active="True"', 'active="False"'),
])
def test_a_rim_that_changes_its_signature_profile_or_content_is_refused(
        pki: Pki, change: tuple[str, str]) -> None:
    _, _, signer_key, signer_chain = pki
    document = signed_rim(FIRMWARE, _blocks(), signer_key, signer_chain).decode()
    assert change[0] in document
    with pytest.raises(Refused) as refused:
        verify_rim(document.replace(change[0], change[1], 1).encode(), [signer_chain[-1]])
    assert refused.value.check == "rim_signature", refused.value.reason
