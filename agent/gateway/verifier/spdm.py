"""A device's firmware attested over SPDM: its signed measurements judged at the gateway.

DSP0274 (SPDM) 1.1: the requester sends GET_MEASUREMENTS (version 0x11, code 0xE0; param1 bit 0
asks for a signature, param2 the measurement index, 0xFF for all; then a 32-byte nonce and the
certificate slot), the responder answers MEASUREMENTS (0x11, 0x60; param1, param2; the number of
blocks; the record's length in three bytes; the measurement record; its own 32-byte nonce; two
bytes of opaque length and the opaque data; the signature). In 1.1 the signature is over the
transcript itself: ECDSA (here P-384, ``r || s``) over SHA-384 of the request followed by the
response up to its signature (1.2 signs a prefixed hash instead: refused here as unsupported).

Each measurement block is an index, a measurement specification (bit 0: DMTF's), a size and, in
DMTF's format, a value type (bit 7 set: a raw bit stream; else a digest) and the value. The
opaque data is vendor-defined; NVIDIA's GPUs fill it with little-endian (type, length, value)
fields, among them the VBIOS version (type 6) and the driver version (type 3).

``verify_report`` runs every check and raises ``Refused`` with the failing check's name:
``report`` (does not parse), ``version``, ``nonce``, ``chain``, ``signature``, ``golden`` (no
golden value for this firmware) and ``measurement`` (the reason names each index that differs).
Golden values are the maker's signed RIM for the firmware the device reports, where one is
given, else the fleet's recorded values for it (``GoldenTable``, data an operator keeps).
"""

from __future__ import annotations

import hmac
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from agent.gateway.verifier.refused import Refused
from agent.gateway.verifier.rim import Rim
from agent.gateway.verifier.x509chain import leaf_first, verify_chain

SPDM_11 = 0x11
GET_MEASUREMENTS = 0xE0
MEASUREMENTS = 0x60
NONCE_SIZE = 32
REQUEST_SIZE = 4 + NONCE_SIZE + 1  # header, nonce, slot (1.1)
P384_SIGNATURE = 96
DMTF_SPEC = 0x01
MAX_REPORT = 1 << 16
OPAQUE_VBIOS = 6  # NVIDIA's opaque field types
OPAQUE_DRIVER = 3


@dataclass(frozen=True)
class Block:
    """One measurement block in DMTF's format."""

    index: int
    value_type: int  # bits 6..0 of DMTFSpecMeasurementValueType: 0 immutable ROM, 1 mutable firmware ...
    raw: bool  # bit 7: a raw bit stream rather than a digest
    value: bytes


@dataclass(frozen=True)
class Report:
    """A parsed GET_MEASUREMENTS request and its MEASUREMENTS response."""

    request: bytes = field(repr=False)
    response: bytes = field(repr=False)
    nonce: bytes  # the requester's
    slot: int
    blocks: tuple[Block, ...]
    responder_nonce: bytes
    opaque: bytes = field(repr=False)
    signature: bytes = field(repr=False)

    @property
    def signed(self) -> bytes:
        """What SPDM 1.1 signs: the request, then the response up to its signature."""
        return self.request + self.response[:-len(self.signature)]

    def opaque_fields(self) -> dict[int, bytes]:
        """NVIDIA's (type, length, value) opaque fields; {} when the data is not in that form."""
        fields: dict[int, bytes] = {}
        at = 0
        while at + 4 <= len(self.opaque):
            kind, size = struct.unpack_from("<HH", self.opaque, at)
            if at + 4 + size > len(self.opaque):
                return {}
            fields[kind] = self.opaque[at + 4:at + 4 + size]
            at += 4 + size
        return fields if at == len(self.opaque) else {}

    def firmware_version(self) -> str | None:
        """The VBIOS version an NVIDIA GPU reports in its opaque data (e.g. 96.00.9F.00.01)."""
        value = self.opaque_fields().get(OPAQUE_VBIOS)
        if value is None or len(value) < 5:
            return None
        major = struct.unpack_from("<I", value)[0]
        return ".".join(f"{(major >> shift) & 0xFF:02X}" for shift in (24, 16, 8, 0)) + f".{value[4]:02X}"


def parse_report(request: bytes, response: bytes) -> Report:
    """The request and response read; Refused ``report`` or ``version`` when they are not a
    signed SPDM 1.1 GET_MEASUREMENTS exchange."""
    if len(request) != REQUEST_SIZE or request[1] != GET_MEASUREMENTS:
        raise Refused("report", f"the request is not a signed SPDM 1.1 GET_MEASUREMENTS "
                      f"({len(request)} bytes, code {request[1:2].hex()})")
    if request[0] != SPDM_11 or response[:1] != bytes([SPDM_11]):
        raise Refused("version", f"SPDM version {request[0]:#x}/{response[:1].hex()}: "
                      "only 1.1 is verified here")
    if not request[2] & 0x01:
        raise Refused("report", "the request did not ask for a signature")
    shortest = 8 + NONCE_SIZE + 2 + P384_SIGNATURE
    if not shortest <= len(response) <= MAX_REPORT or response[1] != MEASUREMENTS:
        raise Refused("report", f"the response is not a MEASUREMENTS answer ({len(response)} bytes)")
    count = response[4]
    length = int.from_bytes(response[5:8], "little")
    record_end = 8 + length
    if record_end + NONCE_SIZE + 2 > len(response):
        raise Refused("report", "the measurement record runs past the response")
    blocks = _blocks(response[8:record_end], count)
    responder_nonce = response[record_end:record_end + NONCE_SIZE]
    at = record_end + NONCE_SIZE
    opaque_length = int.from_bytes(response[at:at + 2], "little")
    opaque = response[at + 2:at + 2 + opaque_length]
    signature = response[at + 2 + opaque_length:]
    if len(opaque) != opaque_length or len(signature) != P384_SIGNATURE:
        raise Refused("report", f"the response ends with {len(signature)} bytes of signature, "
                      f"not an ECDSA P-384 signature ({P384_SIGNATURE})")
    return Report(request=request, response=response, nonce=request[4:4 + NONCE_SIZE], slot=request[-1],
                  blocks=blocks, responder_nonce=responder_nonce, opaque=opaque, signature=signature)


def split_exchange(exchange: bytes) -> tuple[bytes, bytes]:
    """A request and response written one after the other (as NVIDIA's tools keep them)."""
    return exchange[:REQUEST_SIZE], exchange[REQUEST_SIZE:]


def _blocks(record: bytes, count: int) -> tuple[Block, ...]:
    blocks: list[Block] = []
    at = 0
    while at < len(record):
        if at + 4 > len(record):
            raise Refused("report", "a measurement block header runs past the record")
        index, spec, size = record[at], record[at + 1], int.from_bytes(record[at + 2:at + 4], "little")
        value = record[at + 4:at + 4 + size]
        if len(value) != size or size < 3:
            raise Refused("report", f"measurement block {index} runs past the record")
        if spec != DMTF_SPEC:
            raise Refused("report", f"measurement block {index} is not in DMTF's format "
                          f"(specification {spec:#x})")
        value_size = int.from_bytes(value[1:3], "little")
        if 3 + value_size != size:
            raise Refused("report", f"measurement block {index}: value size {value_size} "
                          f"in a {size}-byte block")
        if any(b.index == index for b in blocks):
            raise Refused("report", f"measurement block {index} is given twice")
        blocks.append(Block(index=index, value_type=value[0] & 0x7F, raw=bool(value[0] & 0x80),
                            value=value[3:]))
        at += 4 + size
    if len(blocks) != count:
        raise Refused("report", f"the response says {count} blocks and holds {len(blocks)}")
    return tuple(blocks)


def load_chain(pem: bytes) -> list[x509.Certificate]:
    """A PEM chain (a report's, or a BMC's CertChain), leaf first; Refused ``chain`` if unreadable."""
    try:
        return leaf_first(x509.load_pem_x509_certificates(pem))
    except ValueError as e:
        raise Refused("chain", f"the device's certificate chain does not parse: {e}") from e


def check_signature(report: Report, leaf: x509.Certificate) -> None:
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise Refused("signature", "the device's leaf key is not ECDSA P-384")
    r = int.from_bytes(report.signature[:48], "big")
    s = int.from_bytes(report.signature[48:], "big")
    try:
        key.verify(encode_dss_signature(r, s), report.signed, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature as e:
        raise Refused("signature", "the MEASUREMENTS signature does not verify with the device's leaf "
                      "certificate over the transcript") from e


# Golden values ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Golden:
    """The accepted values for one firmware: index -> accepted digests (any one matches).
    ``source`` says where they came from (a RIM's signer, or the fleet's table)."""

    firmware: str
    source: str
    values: Mapping[int, frozenset[bytes]]


def golden_from_rim(rim: Rim) -> Golden:
    """A verified RIM's active measurements, re-indexed as NVIDIA numbers them in SPDM
    (the RIM's index + 1); inactive ones are not judged."""
    return Golden(firmware=rim.version, source=f"RIM signed by {rim.signer}",
                  values={m.index + 1: frozenset(m.digests) for m in rim.measurements.values() if m.active})


class GoldenTable:
    """The fleet's recorded measurements, per firmware version (a JSON file an operator keeps):

    ``{"firmware": {"96.00.9F.00.01": {"2": ["<hex>", ...], ...}}}``. Every index the device
    reports must be listed; an empty list marks an index not judged."""

    def __init__(self, entries: Mapping[str, Golden]) -> None:
        self.entries = dict(entries)

    @classmethod
    def load(cls, path: Path) -> GoldenTable:
        return cls.parse(json.loads(path.read_text()), source=str(path))

    @classmethod
    def parse(cls, data: object, *, source: str = "the fleet's table") -> GoldenTable:
        if not isinstance(data, dict) or not isinstance(data.get("firmware"), dict):
            raise ValueError(f"{source}: a golden table is {{\"firmware\": {{version: {{index: [hex]}}}}}}")
        entries: dict[str, Golden] = {}
        for version, indices in data["firmware"].items():
            if not isinstance(indices, dict):
                raise ValueError(f"{source}: firmware {version}: not an object of indices")
            values: dict[int, frozenset[bytes]] = {}
            for index, digests in indices.items():
                if not index.isdigit() or not isinstance(digests, list) or \
                        not all(isinstance(d, str) for d in digests):
                    raise ValueError(f"{source}: firmware {version}, index {index!r}: a list of hex digests")
                values[int(index)] = frozenset(bytes.fromhex(d) for d in digests)
            entries[str(version)] = Golden(firmware=str(version), source=source, values=values)
        return cls(entries)

    @staticmethod
    def record(report: Report, firmware: str) -> dict[str, object]:
        """A table entry from a report verified by other means (the fleet's first, trusted reading)."""
        return {"firmware": {firmware: {str(b.index): [b.value.hex()] for b in report.blocks}}}


def judge(report: Report, golden: Golden) -> None:
    """Each measurement against its golden values; Refused ``measurement`` naming every index that
    differs or has none."""
    wrong: list[str] = []
    for block in report.blocks:
        accepted = golden.values.get(block.index)
        if accepted is None:
            wrong.append(f"measurement {block.index}: no golden value")
        elif accepted and not any(hmac.compare_digest(block.value, a) for a in accepted):
            wrong.append(f"measurement {block.index}: {block.value.hex()[:16]}... is not a golden value")
    if wrong:
        raise Refused("measurement", f"against {golden.firmware} ({golden.source}): " + "; ".join(wrong))


@dataclass(frozen=True)
class DeviceVerdict:
    """A device whose report passed every check."""

    firmware: str
    anchor: str  # the configured root its chain reached
    golden: str  # where the golden values came from
    measurements: int


def verify_report(report: Report, chain: list[x509.Certificate], roots: list[x509.Certificate], *,
                  nonce: bytes, rims: Iterable[Rim] = (), table: GoldenTable | None = None,
                  firmware: str | None = None, at: datetime | None = None) -> DeviceVerdict:
    """Every check on one device's report, in order; Refused with the first failing check's name.

    ``nonce`` is the one the gateway issued for this request; ``chain`` the device's, leaf first;
    ``firmware`` the version to look golden values up by when the report does not say it
    (devices other than NVIDIA's GPUs: the BMC's inventory)."""
    if not hmac.compare_digest(report.nonce, nonce):
        raise Refused("nonce", "the request's nonce is not the one the gateway issued")
    anchor = verify_chain(chain, roots, check="chain", at=at)
    check_signature(report, chain[0])
    version = report.firmware_version() or firmware
    if version is None:
        raise Refused("golden", "the device reports no firmware version and none was given")
    golden = next((golden_from_rim(r) for r in rims if r.version.upper() == version.upper()), None)
    if golden is None and table is not None:
        golden = table.entries.get(version)
    if golden is None:
        raise Refused("golden", f"no RIM and no fleet value for firmware {version}")
    judge(report, golden)
    return DeviceVerdict(firmware=version, anchor=anchor, golden=golden.source,
                         measurements=len(report.blocks))
