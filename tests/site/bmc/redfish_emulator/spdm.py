"""SPDM responders for the emulator: the recorded trees list ComponentIntegrity (GB200, GH200,
DGX H100) but no measurement answer, so these make their own.

    spdm = SpdmResponders.install(bmc)      # every responder the recording lists
    spdm.device_ca                          # the test device maker's root (the gateway's root)
    spdm.rim(), spdm.rim_root               # a RIM for the devices' firmware, and its signer's root
    spdm.wrong_nonce.add("HGX_IRoT_GPU_0")  # misbehaviours, per device
    spdm.bad_signature.add(...); spdm.changed[device] = index

Made at test time: a device CA (ECDSA P-384) and under it, per responder, an identity key
whose leaf certificate replaces the recording's CertChain (the recorded chains are real
devices', whose keys nobody here has). Each answer is an SPDM 1.1 exchange as DSP0274 writes it
(GET_MEASUREMENTS with the requester's nonce and slot, MEASUREMENTS with DMTF-format blocks, a
responder nonce, NVIDIA-format opaque data giving the firmware version, and an ECDSA P-384
signature over SHA-384 of request || response), base64 in DMTF's SignedMeasurements. The RIM is
a SWID tag in NVIDIA's RIM form, signed as NVIDIA's are (enveloped XML-DSig, C14N 1.1,
ECDSA P-384 over SHA-384) by a RIM signer under its own test root.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from agent.gateway.verifier.rim import canonical, parse_document
from tests.site.bmc.redfish_emulator.server import ROOT, Doc, RedfishEmulator

ACTION = "#ComponentIntegrity.SPDMGetSignedMeasurements"
FIRMWARE = "96.00.A0.00.01"  # the version the emulated devices report (NVIDIA's opaque VBIOS field)
INDICES = range(1, 9)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bettercompute tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
          *, ca: bool) -> x509.Certificate:
    now = datetime.now(UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    return builder.sign(signer, hashes.SHA384())


def _pem(*certs: x509.Certificate) -> str:
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def _sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA384())))
    return r.to_bytes(48, "big") + s.to_bytes(48, "big")


def measurement(index: int, firmware: str = FIRMWARE) -> bytes:
    """The SHA-384 digest the devices report at ``index`` for ``firmware`` (made up)."""
    return hashlib.sha384(f"{firmware}/{index}".encode()).digest()


def opaque(firmware: str) -> bytes:
    """NVIDIA's opaque field 6 (VBIOS version): 96.00.A0.00.01 as 0x9600A000 little-endian, then 01."""
    parts = [int(p, 16) for p in firmware.split(".")]
    major = (parts[0] << 24) | (parts[1] << 16) | (parts[2] << 8) | parts[3]
    value = struct.pack("<IB3x", major, parts[4])
    return struct.pack("<HH", 6, len(value)) + value


def exchange(key: ec.EllipticCurvePrivateKey, nonce: bytes, slot: int, blocks: dict[int, bytes],
             firmware: str) -> bytes:
    """GET_MEASUREMENTS (signature requested, all indices) || MEASUREMENTS, signed."""
    request = bytes([0x11, 0xE0, 0x01, 0xFF]) + nonce + bytes([slot])
    record = b"".join(bytes([i, 0x01]) + struct.pack("<H", 3 + len(v)) + bytes([0x01])
                      + struct.pack("<H", len(v)) + v for i, v in sorted(blocks.items()))
    data = opaque(firmware)
    response = (bytes([0x11, 0x60, 0x00, 0x00, len(blocks)]) + len(record).to_bytes(3, "little") + record
                + os.urandom(32) + struct.pack("<H", len(data)) + data)
    return request + response + _sign(key, request + response)


def signed_rim(firmware: str, digests: dict[int, bytes], key: ec.EllipticCurvePrivateKey,
               chain: list[x509.Certificate]) -> bytes:
    """A SWID tag in NVIDIA's RIM form for ``digests`` (SPDM index -> digest), signed."""
    resources = "".join(
        f'\n        <ns0:Resource type="Measurement" index="{i - 1}" active="True" alternatives="1" '
        f'ns2:Hash0="{d.hex()}" name="Measurement_{i - 1}" size="48"/>'
        for i, d in sorted(digests.items()))
    body = (
        '<SoftwareIdentity xmlns="http://standards.iso.org/iso/19770/-2/2015/schema.xsd" '
        'xmlns:ns0="http://standards.iso.org/iso/19770/-2/2015/schema.xsd" '
        'xmlns:ns2="http://www.w3.org/2001/04/xmlenc#sha384" corpus="false" name="TESTGPU" patch="false" '
        'supplemental="false" tagId="test" version="1.0" tagVersion="0">\n'
        '    <ns0:Entity name="bettercompute tests" role="softwareCreator tagCreator"/>\n'
        f'    <ns0:Meta colloquialVersion="{firmware}" product="TESTGPU"/>\n'
        f'    <ns0:Payload>{resources}\n    </ns0:Payload>\n'
        '</SoftwareIdentity>')
    digest = base64.b64encode(hashlib.sha384(canonical(parse_document(body.encode()))).digest()).decode()
    signed_info = (
        '<ds:SignedInfo><ds:CanonicalizationMethod Algorithm="http://www.w3.org/2006/12/xml-c14n11"/>'
        '<ds:SignatureMethod Algorithm="http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384"/>'
        '<ds:Reference URI=""><ds:Transforms>'
        '<ds:Transform Algorithm="http://www.w3.org/2000/09/xmldsig#enveloped-signature"/>'
        '<ds:Transform Algorithm="http://www.w3.org/2006/12/xml-c14n11"/></ds:Transforms>'
        '<ds:DigestMethod Algorithm="http://www.w3.org/2001/04/xmldsig-more#sha384"/>'
        f'<ds:DigestValue>{digest}</ds:DigestValue></ds:Reference></ds:SignedInfo>')
    # SignedInfo is signed as it reads in place: canonicalized with the namespaces in scope there.
    placed = body.replace("\n</SoftwareIdentity>", f'\n<ds:Signature xmlns:ds="http://www.w3.org/2000/09/xmldsig#">'
                          f"{signed_info}</ds:Signature></SoftwareIdentity>")
    info = parse_document(placed.encode()).elements()[-1].elements()[0]
    value = base64.b64encode(_sign(key, canonical(info))).decode()
    ders = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in chain]
    certs = "".join(f"<ds:X509Certificate>{der}</ds:X509Certificate>" for der in ders)
    return body.replace("\n</SoftwareIdentity>", f'\n<ds:Signature xmlns:ds="http://www.w3.org/2000/09/xmldsig#">'
                        f"{signed_info}<ds:SignatureValue>{value}</ds:SignatureValue><ds:KeyInfo><ds:X509Data>"
                        f"{certs}</ds:X509Data></ds:KeyInfo></ds:Signature></SoftwareIdentity>").encode()


@dataclass
class SpdmResponders:
    """The responders installed in one emulator, and the test PKI behind them."""

    device_ca: x509.Certificate
    rim_root: x509.Certificate
    firmware: str
    keys: dict[str, ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    wrong_nonce: set[str] = field(default_factory=set)
    bad_signature: set[str] = field(default_factory=set)
    changed: dict[str, int] = field(default_factory=dict)  # device -> an index measured otherwise
    asked: list[tuple[str, Doc]] = field(default_factory=list)
    _rim_key: Any = None
    _rim_chain: list[x509.Certificate] = field(default_factory=list)

    @classmethod
    def install(cls, bmc: RedfishEmulator, firmware: str = FIRMWARE) -> Self:
        ca_key = ec.generate_private_key(ec.SECP384R1())
        ca = make_cert("Test Device CA", ca_key, "Test Device CA", ca_key, ca=True)
        rim_root_key = ec.generate_private_key(ec.SECP384R1())
        rim_root = make_cert("Test RIM Root", rim_root_key, "Test RIM Root", rim_root_key, ca=True)
        rim_key = ec.generate_private_key(ec.SECP384R1())
        rim_signer = make_cert("Test RIM Signer", rim_key, "Test RIM Root", rim_root_key, ca=False)
        made = cls(device_ca=ca, rim_root=rim_root, firmware=firmware, _rim_key=rim_key,
                   _rim_chain=[rim_signer, rim_root])
        state = bmc.state
        with state.lock:
            collection = state.docs.get(f"{ROOT}/ComponentIntegrity", {})
            for member in collection.get("Members", []):
                doc = state.docs.get(str(member.get("@odata.id", "")).rstrip("/"))
                action = (doc or {}).get("Actions", {}).get(ACTION)
                if doc is None or not isinstance(action, dict):
                    continue
                device = str(doc["Id"])
                key = ec.generate_private_key(ec.SECP384R1())
                leaf = make_cert(f"{device} responder", key, "Test Device CA", ca_key, ca=False)
                made.keys[device] = key
                auth = doc["SPDM"]["IdentityAuthentication"]["ResponderAuthentication"]
                chain_ref = str(auth["ComponentCertificate"]["@odata.id"]).rstrip("/")
                state.docs[chain_ref] = {"@odata.id": chain_ref,
                                         "@odata.type": "#Certificate.v1_5_0.Certificate",
                                         "CertificateString": _pem(leaf, ca), "CertificateType": "PEMchain"}
                state.actions[str(action["target"]).rstrip("/")] = made._answer(device, chain_ref)
        return made

    def rim(self) -> bytes:
        """A RIM of our own making for the firmware the devices report."""
        digests = {i: measurement(i, self.firmware) for i in INDICES}
        return signed_rim(self.firmware, digests, self._rim_key, self._rim_chain)

    def _answer(self, device: str, chain_ref: str) -> Any:
        def answer(body: Doc) -> tuple[int, Doc]:
            self.asked.append((device, body))
            try:
                nonce = bytes.fromhex(str(body.get("Nonce", "")))
            except ValueError:
                nonce = b""
            if len(nonce) != 32:
                return 400, {"error": {"code": "Base.1.8.ActionParameterValueFormatError",
                                       "message": "Nonce must be 32 bytes, hex"}}
            if device in self.wrong_nonce:
                nonce = os.urandom(32)  # a replayed or made-up request: another nonce
            blocks = {i: measurement(i, self.firmware) for i in INDICES}
            if device in self.changed:
                blocks[self.changed[device]] = hashlib.sha384(b"changed firmware").digest()
            signed = bytearray(exchange(self.keys[device], nonce, int(body.get("SlotId", 0)), blocks,
                                        self.firmware))
            if device in self.bad_signature:
                signed[-10] ^= 0x01
            return 200, {"SignedMeasurements": base64.b64encode(bytes(signed)).decode(),
                         "Version": "1.1.0", "HashingAlgorithm": "TPM_ALG_SHA_384",
                         "SigningAlgorithm": "TPM_ALG_ECDSA_ECC_NIST_P384",
                         "Certificate": {"@odata.id": chain_ref}}
        return answer
