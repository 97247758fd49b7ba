"""The SPDM and RIM verifiers against a real H100's attestation that NVIDIA published.

The data is fetched at test setup into ~/.cache (tests/published.py); these tests skip where it
is absent. Nothing here states an expected digest: the report's measurements are judged against
a golden table recorded from the report itself (the fleet's first reading) or against NVIDIA's
own signed RIMs, and every mutation must be refused by its check's name.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.gateway.verifier.refused import Refused
from agent.gateway.verifier.rim import verify_rim
from agent.gateway.verifier.spdm import (
    GoldenTable,
    golden_from_rim,
    judge,
    load_chain,
    parse_report,
    split_exchange,
    verify_report,
)
from agent.gateway.verifier.x509chain import verify_chain
from tests.published import nv_verifier


@pytest.fixture(scope="module")
def published() -> Path:
    return nv_verifier()


def _exchange(root: Path) -> bytes:
    return bytes.fromhex((root / "samples" / "hopperAttestationReport.txt").read_text().strip())


def _roots(root: Path, name: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates((root / "certs" / name).read_bytes())


def _rims(root: Path) -> list[Path]:
    return sorted((root / "samples").glob("*_PROD.swidtag"))


def _signed_at(rim: bytes) -> datetime:
    """A time inside the RIM signer's validity: its notBefore (the shipped signers have since expired)."""
    import base64
    import re
    der = base64.b64decode("".join(re.search(rb"<ds:X509Certificate>(.*?)</ds:X509Certificate>",
                                             rim, re.S)[1].decode().split()))  # type: ignore[index]
    return x509.load_der_x509_certificate(der).not_valid_before_utc


def test_the_published_h100_report_parses_and_verifies(published: Path) -> None:
    report = parse_report(*split_exchange(_exchange(published)))
    chain = load_chain((published / "samples" / "hopperCertChain.txt").read_bytes())
    assert "GSP FMC LF" in chain[0].subject.rfc4514_string()
    assert len(report.blocks) == 64 and {b.index for b in report.blocks} == set(range(1, 65))
    assert all(not b.raw and len(b.value) == 48 for b in report.blocks)  # SHA-384 digests
    assert report.firmware_version() == "96.00.9F.00.01"  # the opaque data's VBIOS field
    assert report.opaque_fields()[3].rstrip(b"\0") == b"550.90.07"  # the driver's version
    table = GoldenTable.parse(GoldenTable.record(report, "96.00.9F.00.01"))
    verdict = verify_report(report, chain, _roots(published, "verifier_device_root.pem"),
                            nonce=report.nonce, table=table)
    assert verdict.firmware == "96.00.9F.00.01" and verdict.anchor == "O=NVIDIA,CN=NVIDIA Device Identity CA"
    assert verdict.measurements == 64


@pytest.mark.parametrize("offset", [0, 5, 41, 37 + 8 + 3 * 55 + 10, 37 + 3700, -97, -1])
def test_a_changed_byte_in_the_report_is_refused(published: Path, offset: int) -> None:
    """Anywhere in the request, the record, the opaque data or the signature."""
    exchange = bytearray(_exchange(published))
    original = bytes(exchange)
    exchange[offset] ^= 0x01
    nonce = parse_report(*split_exchange(original)).nonce
    chain = load_chain((published / "samples" / "hopperCertChain.txt").read_bytes())
    table = GoldenTable.parse(GoldenTable.record(parse_report(*split_exchange(original)), "96.00.9F.00.01"))
    with pytest.raises(Refused) as refused:
        verify_report(parse_report(*split_exchange(bytes(exchange))), chain,
                      _roots(published, "verifier_device_root.pem"), nonce=nonce, table=table)
    expected = {0: "version", 5: "nonce", 41: "report"}.get(offset, "signature")
    assert refused.value.check == expected, refused.value.reason


def test_another_nonce_is_refused(published: Path) -> None:
    report = parse_report(*split_exchange(_exchange(published)))
    chain = load_chain((published / "samples" / "hopperCertChain.txt").read_bytes())
    with pytest.raises(Refused) as refused:
        verify_report(report, chain, _roots(published, "verifier_device_root.pem"), nonce=bytes(32))
    assert refused.value.check == "nonce"


def test_a_changed_chain_is_refused(published: Path) -> None:
    report = parse_report(*split_exchange(_exchange(published)))
    chain = load_chain((published / "samples" / "hopperCertChain.txt").read_bytes())
    device_root = _roots(published, "verifier_device_root.pem")
    # A certificate's signature changed: its issuer no longer vouches for it.
    der = bytearray(chain[1].public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0x01
    with pytest.raises(Refused) as refused:
        verify_report(report, [chain[0], x509.load_der_x509_certificate(bytes(der)), *chain[2:]],
                      device_root, nonce=report.nonce)
    assert refused.value.check == "chain"
    # Another maker's root configured: the chain reaches none.
    with pytest.raises(Refused) as refused:
        verify_report(report, chain, _roots(published, "verifier_RIM_root.pem"), nonce=report.nonce)
    assert refused.value.check == "chain"
    # The chain of one GPU presented with a leaf that did not sign (its issuer in its place).
    with pytest.raises(Refused) as refused:
        verify_report(report, chain[1:], device_root, nonce=report.nonce)
    assert refused.value.check == "signature"


def test_every_shipped_rim_verifies_to_nvidias_rim_root(published: Path) -> None:
    roots = _roots(published, "verifier_RIM_root.pem")
    versions = set()
    for path in _rims(published):
        data = path.read_bytes()
        rim = verify_rim(data, roots, at=_signed_at(data))
        assert rim.version.replace(".", "").upper() in path.name.upper()  # 96.00.74.00.14: _9600740014_
        assert rim.measurements and all(len(d) == 48 for m in rim.measurements.values() for d in m.digests)
        versions.add(rim.version)
    assert len(versions) >= 10 and "96.00.9F.00.01" not in versions


def test_a_rim_with_an_expired_signer_is_refused_now(published: Path) -> None:
    data = _rims(published)[0].read_bytes()
    with pytest.raises(Refused) as refused:
        verify_rim(data, _roots(published, "verifier_RIM_root.pem"), at=datetime(2040, 1, 1, tzinfo=UTC))
    assert refused.value.check == "rim_chain" and "not valid at" in refused.value.reason


@pytest.mark.parametrize("where", ["measurement", "version", "signature_value", "certificate"])
def test_a_changed_byte_in_a_rim_is_refused(published: Path, where: str) -> None:
    data = _rims(published)[0].read_bytes()
    at = _signed_at(data)
    if where == "measurement":
        start = data.index(b'Hash0="', data.index(b'index="1"')) + 7
        changed = data[:start] + (b"0" if data[start:start + 1] != b"0" else b"1") + data[start + 1:]
    elif where == "version":
        changed = data.replace(b'colloquialVersion="96.', b'colloquialVersion="97.', 1)
    elif where == "signature_value":
        start = data.index(b"<ds:SignatureValue>") + 19
        changed = data[:start] + (b"A" if data[start:start + 1] != b"A" else b"B") + data[start + 1:]
    else:
        start = data.index(b"<ds:X509Certificate>", data.index(b"</ds:X509Certificate>")) + 200
        changed = data[:start] + (b"A" if data[start:start + 1] != b"A" else b"B") + data[start + 1:]
    assert changed != data
    with pytest.raises(Refused) as refused:
        verify_rim(changed, _roots(published, "verifier_RIM_root.pem"), at=at)
    expected = "rim_chain" if where == "certificate" else "rim_signature"
    assert refused.value.check == expected, refused.value.reason


def test_the_report_against_another_vbios_rim_names_the_measurements_that_differ(published: Path) -> None:
    """No shipped RIM is for this GPU's VBIOS: judged against one for another VBIOS, the
    measurements of the firmware that changed are named; a RIM is never taken for another version."""
    report = parse_report(*split_exchange(_exchange(published)))
    chain = load_chain((published / "samples" / "hopperCertChain.txt").read_bytes())
    data = next(p for p in _rims(published) if "9600740014" in p.name).read_bytes()
    rim = verify_rim(data, _roots(published, "verifier_RIM_root.pem"), at=_signed_at(data))
    with pytest.raises(Refused) as refused:
        judge(report, golden_from_rim(rim))
    assert refused.value.check == "measurement" and "measurement 2:" in refused.value.reason
    assert "measurement 4:" not in refused.value.reason  # a measurement both VBIOS versions share
    with pytest.raises(Refused) as refused:  # the RIM is not for this VBIOS, so it is not used
        verify_report(report, chain, _roots(published, "verifier_device_root.pem"), nonce=report.nonce,
                      rims=[rim])
    assert refused.value.check == "golden"


def test_a_measurement_the_fleet_recorded_otherwise_is_refused_by_index(published: Path) -> None:
    report = parse_report(*split_exchange(_exchange(published)))
    chain = load_chain((published / "samples" / "hopperCertChain.txt").read_bytes())
    recorded = GoldenTable.record(report, "96.00.9F.00.01")
    entry = recorded["firmware"]["96.00.9F.00.01"]  # type: ignore[index]
    entry["5"] = ["00" * 48]
    del entry["12"]
    with pytest.raises(Refused) as refused:
        verify_report(report, chain, _roots(published, "verifier_device_root.pem"), nonce=report.nonce,
                      table=GoldenTable.parse(recorded))
    assert refused.value.check == "measurement"
    assert "measurement 5: " in refused.value.reason
    assert "measurement 12: no golden value" in refused.value.reason
    assert "measurement 4:" not in refused.value.reason


@pytest.mark.parametrize("tree", ["nvidia_gb200", "nvidia_gh200", "nvidia_dgxh100"])
def test_the_recorded_bmcs_device_chains_reach_nvidias_device_root(published: Path, tree: str,
                                                                   tmp_path: Path) -> None:
    """The CertChains the recorded BMCs serve for their SPDM responders are real devices' chains:
    each that holds one verifies to the root NVIDIA's verifier ships; a changed one does not."""
    import json

    from tests.site.bmc.redfish_emulator.server import unpack
    root = unpack(tree, tmp_path)
    device_root = _roots(published, "verifier_device_root.pem")
    anchored, without = 0, []
    for index in sorted(root.glob("Chassis/*/Certificates/CertChain/index.json")):
        pem = json.loads(index.read_text()).get("CertificateString")
        if not isinstance(pem, str) or "BEGIN CERTIFICATE" not in pem:
            without.append(index.parts[-4])  # GB200's CX7: none; GH200's BMC ERoT: an error
            continue
        chain = load_chain(pem.encode())
        assert verify_chain(chain, device_root, check="chain") == "O=NVIDIA,CN=NVIDIA Device Identity CA"
        anchored += 1
        with pytest.raises(Refused) as refused:
            verify_chain(chain[:1] + chain[2:], device_root, check="chain")  # a link left out
        assert refused.value.check == "chain"
    assert anchored >= 6 and len(without) <= 1, (anchored, without)
