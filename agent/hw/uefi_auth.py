"""UEFI Secure Boot's key databases and their time-based authenticated writes: made offline by
the key holder, parsed and checked by the ramdisk before it writes them (agent/drivers/efivars.py,
``enroll_keys``).

A database (PK, KEK, db, dbx) holds EFI_SIGNATURE_LISTs (UEFI 2.10, 32.4.1): a list's type GUID,
its size, a header size (0 here), each entry's size, then entries of the same size, each an owner
GUID and the data (an X.509 certificate's DER, or a SHA-256 digest).

A write of one is an EFI_VARIABLE_AUTHENTICATION_2 (UEFI 2.10, 8.2.2) then the new value:

    EFI_TIME (16 bytes: year u16, month, day, hour, minute, second, pad, nanosecond u32 = 0,
              time zone i16 = 0, daylight = 0, pad: all the zero fields zero, or firmware refuses)
    WIN_CERTIFICATE_UEFI_GUID: dwLength u32 (the header, the GUID and CertData), wRevision
              0x0200, wCertificateType 0x0EF1 (WIN_CERT_TYPE_EFI_GUID), CertType
              EFI_CERT_TYPE_PKCS7_GUID, CertData: a DER PKCS#7 SignedData, detached, over
              VariableName (UTF-16LE, no NUL) || VendorGuid || Attributes (u32 LE) ||
              TimeStamp || the new value
    the new value (its EFI_SIGNATURE_LISTs)

CertData is the SignedData itself (as the spec says), not wrapped in a ContentInfo: edk2's
AuthVariableLib takes either (it looks for the SHA-256 OID at the offset each form puts it, 13
or 32, then lets its Pkcs7Verify wrap a bare SignedData), so the spec's form is the one that
every firmware following the spec takes. The signature has no authenticated attributes
(PKCS7_NOATTR, as the spec's examples): its RSA signature is over the SHA-256 of the signed
bytes. Who signs: PK by the PK's own key (in setup mode the firmware checks the new PK with
itself), KEK by the PK, db and dbx by a KEK.

    payload = signed_write("db", x509_list(fleet_db_der, owner), kek_key, kek_cert)   # offline
    write = parse(payload)                  # the node: its time stamp, signature and value
    verify(write, "db", [kek_cert_der])     # True when a KEK's certificate signed it

Signing (``signed_write``) is the key holder's (``agent uefi-payload``, agent/cli/uefi_payload.py),
never the ramdisk's or the site's: they hold no key. Parsing needs nothing beyond the standard
library; ``verify`` imports cryptography (Debian's python3-cryptography is in the ramdisk).
"""

from __future__ import annotations

import datetime
import hashlib
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.errors import InvalidParameters
from agent.hw import efivars

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

EFI_CERT_X509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")
EFI_CERT_SHA256 = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328")
EFI_CERT_TYPE_PKCS7 = uuid.UUID("4aafd29d-68df-49ee-8aa9-347d375665a7")
WIN_CERT_TYPE_EFI_GUID = 0x0EF1
WIN_CERT_REVISION = 0x0200
TIME_BASED_AUTHENTICATED = 0x20
# NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS | TIME_BASED_AUTHENTICATED_WRITE_ACCESS
ATTRIBUTES = efivars.ATTRS_NV_BS_RT | TIME_BASED_AUTHENTICATED
# Each database, where it lives, and the database whose keys sign a write of it.
DATABASES = {"PK": (efivars.GLOBAL, "PK"), "KEK": (efivars.GLOBAL, "PK"),
             "db": (efivars.IMAGE_SECURITY, "KEK"), "dbx": (efivars.IMAGE_SECURITY, "KEK")}
MAX_PAYLOAD = 256 * 1024              # a database write: a dbx of thousands of digests fits
_LIST_HEADER = 28                     # type GUID, list size, header size, entry size
_AUTH_HEADER = 16 + 24                # EFI_TIME, WIN_CERTIFICATE_UEFI_GUID before CertData
_SHA256_OID = bytes.fromhex("608648016503040201")
_PKCS7_SIGNED_DATA_OID = bytes.fromhex("2a864886f70d010702")


@dataclass(frozen=True)
class Entry:
    owner: uuid.UUID
    data: bytes


@dataclass(frozen=True)
class SignatureList:
    type: uuid.UUID
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class AuthenticatedWrite:
    """A parsed EFI_VARIABLE_AUTHENTICATION_2 write: its time stamp (16 bytes as written), its
    SignedData (DER) and the value it writes."""

    timestamp: bytes
    signed_data: bytes
    value: bytes

    @property
    def lists(self) -> list[SignatureList]:
        return signature_lists(self.value)

    @property
    def value_sha256(self) -> str:
        """What the variable's digest is once written (efivars.Efivars.sha256 reads it back)."""
        return hashlib.sha256(self.value).hexdigest()


# -- signature lists ---------------------------------------------------------------------------


def signature_list(kind: uuid.UUID, owner: uuid.UUID, entries: Sequence[bytes]) -> bytes:
    """One EFI_SIGNATURE_LIST of ``entries`` (each the same size) owned by ``owner``."""
    if not entries or len({len(e) for e in entries}) != 1:
        raise InvalidParameters("a signature list holds one or more entries of the same size")
    size = 16 + len(entries[0])
    return (kind.bytes_le + struct.pack("<III", _LIST_HEADER + size * len(entries), 0, size)
            + b"".join(owner.bytes_le + e for e in entries))


def x509_list(der: bytes, owner: uuid.UUID) -> bytes:
    """An EFI_SIGNATURE_LIST of one X.509 certificate (DER), as PK, KEK and db hold one."""
    return signature_list(EFI_CERT_X509, owner, [der])


def sha256_list(digests: Sequence[bytes], owner: uuid.UUID) -> bytes:
    """An EFI_SIGNATURE_LIST of SHA-256 digests (dbx's revoked images)."""
    if any(len(d) != 32 for d in digests):
        raise InvalidParameters("a SHA-256 entry is 32 bytes")
    return signature_list(EFI_CERT_SHA256, owner, list(digests))


def signature_lists(value: bytes) -> list[SignatureList]:
    """The EFI_SIGNATURE_LISTs of a database's value; InvalidParameters when they do not fill it
    exactly (sizes that overrun or leave bytes over, an entry size not dividing its list)."""
    found, at = [], 0
    while at < len(value):
        if len(value) - at < _LIST_HEADER:
            raise InvalidParameters(f"signature list at byte {at}: {len(value) - at} bytes, "
                                    "short of its header")
        kind = uuid.UUID(bytes_le=value[at:at + 16])
        size, header, entry = struct.unpack_from("<III", value, at + 16)
        body = size - _LIST_HEADER - header
        if size > len(value) - at or body < 0 or entry <= 16 or body % entry:
            raise InvalidParameters(f"signature list at byte {at}: sizes {size}/{header}/{entry} do not "
                                    f"fit its {len(value) - at} bytes")
        start = at + _LIST_HEADER + header
        found.append(SignatureList(kind, tuple(
            Entry(uuid.UUID(bytes_le=value[p:p + 16]), value[p + 16:p + entry])
            for p in range(start, start + body, entry))))
        at += size
    return found


def certificates(value: bytes) -> list[bytes]:
    """The X.509 certificates (DER) a database's value holds."""
    return [e.data for sl in signature_lists(value) if sl.type == EFI_CERT_X509 for e in sl.entries]


# -- the authenticated write -------------------------------------------------------------------


def efi_time(when: datetime.datetime) -> bytes:
    """EFI_TIME of ``when`` (UTC) as a time-based write wants it: nanosecond, zone, daylight 0."""
    t = when.astimezone(datetime.UTC)
    return struct.pack("<HBBBBBBIhBB", t.year, t.month, t.day, t.hour, t.minute, t.second, 0, 0, 0, 0, 0)


def signed_bytes(name: str, value: bytes, timestamp: bytes, attributes: int = ATTRIBUTES) -> bytes:
    """What the PKCS#7 signature of a write of ``name`` covers."""
    guid = uuid.UUID(DATABASES[name][0])
    return name.encode("utf-16-le") + guid.bytes_le + struct.pack("<I", attributes) + timestamp + value


def _database(name: str) -> str:
    if name not in DATABASES:
        raise InvalidParameters(f"{name!r} is not a Secure Boot database (PK, KEK, db, dbx)")
    return name


def signed_write(name: str, value: bytes, key: PrivateKeyTypes, cert_der: bytes,
                 when: datetime.datetime | None = None) -> bytes:
    """The authenticated write of ``value`` (EFI_SIGNATURE_LISTs; empty: the variable deleted) to
    the database ``name``, signed with ``key`` whose certificate is ``cert_der``, time-stamped
    ``when`` (default now: a write older than the variable's time stamp is refused in user mode)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.serialization import pkcs7

    _database(name)
    if value:
        signature_lists(value)
    timestamp = efi_time(when or datetime.datetime.now(datetime.UTC))
    cert = x509.load_der_x509_certificate(cert_der)
    options = [pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.Binary,
               pkcs7.PKCS7Options.NoAttributes]
    content_info = (pkcs7.PKCS7SignatureBuilder().set_data(signed_bytes(name, value, timestamp))
                    .add_signer(cert, key, hashes.SHA256())  # type: ignore[arg-type]  # RSA or EC
                    .sign(serialization.Encoding.DER, options))
    cert_data = _signed_data(content_info)
    header = struct.pack("<IHH", 24 + len(cert_data), WIN_CERT_REVISION, WIN_CERT_TYPE_EFI_GUID)
    return timestamp + header + EFI_CERT_TYPE_PKCS7.bytes_le + cert_data + value


def parse(payload: bytes) -> AuthenticatedWrite:
    """An EFI_VARIABLE_AUTHENTICATION_2 write taken apart, its form checked as firmware checks it
    (the time stamp's zero fields, the certificate's header and type, a SHA-256 SignedData, the
    value's signature lists); InvalidParameters naming what is wrong."""
    if len(payload) > MAX_PAYLOAD:
        raise InvalidParameters(f"an authenticated write of {len(payload)} bytes: over {MAX_PAYLOAD}")
    if len(payload) < _AUTH_HEADER + 2:
        raise InvalidParameters(f"{len(payload)} bytes: shorter than EFI_VARIABLE_AUTHENTICATION_2")
    timestamp = payload[:16]
    _, month, day, hour, minute, second, pad1, nano, zone, daylight, pad2 = struct.unpack(
        "<HBBBBBBIhBB", timestamp)
    if pad1 or nano or zone or daylight or pad2 or not (1 <= month <= 12 and 1 <= day <= 31) or \
            hour > 23 or minute > 59 or second > 59:
        raise InvalidParameters("the write's EFI_TIME is not a time-based write's (its pad, nanosecond, "
                                "zone and daylight fields must be 0)")
    length, revision, kind = struct.unpack_from("<IHH", payload, 16)
    if revision != WIN_CERT_REVISION or kind != WIN_CERT_TYPE_EFI_GUID or \
            uuid.UUID(bytes_le=payload[24:40]) != EFI_CERT_TYPE_PKCS7:
        raise InvalidParameters("the write's certificate is not a WIN_CERTIFICATE_UEFI_GUID of "
                                "EFI_CERT_TYPE_PKCS7_GUID (revision 0x0200, type 0x0EF1)")
    if not 24 < length <= len(payload) - 16:
        raise InvalidParameters(f"the write's certificate length {length} does not fit its "
                                f"{len(payload)} bytes")
    cert_data = payload[40:16 + length]
    tag, _, end = _tlv(cert_data, 0)
    if tag != 0x30 or end != len(cert_data):
        raise InvalidParameters("the write's CertData is not one DER SignedData filling its certificate")
    if _SHA256_OID not in (cert_data[13:22], cert_data[32:41]):
        raise InvalidParameters("the write's SignedData does not name SHA-256 as its digest")
    value = payload[16 + length:]
    signature_lists(value)
    return AuthenticatedWrite(timestamp, cert_data, value)


def verify(write: AuthenticatedWrite, name: str, trusted: Sequence[bytes]) -> bool:
    """Whether the write of ``name`` is signed by one of the ``trusted`` certificates' keys (DER):
    its signer's RSA PKCS#1 v1.5 (or ECDSA) signature over the SHA-256 of the signed bytes checked
    with that key, as firmware checks it against the database that signs ``name``. A signature
    with authenticated attributes, or through a chain to the trusted certificate, is not one we
    make: not verified here (False)."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    _database(name)
    try:
        signature = _signer_signature(write.signed_data)
    except InvalidParameters:
        return False
    if signature is None:
        return False
    data = signed_bytes(name, write.value, write.timestamp)
    for der in trusted:
        try:
            public = x509.load_der_x509_certificate(der).public_key()
        except ValueError:
            continue
        try:
            if isinstance(public, rsa.RSAPublicKey):
                public.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
            elif isinstance(public, ec.EllipticCurvePublicKey):
                public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            else:
                continue
        except InvalidSignature:
            continue
        return True
    return False


# -- DER, as much as a SignedData needs ------------------------------------------------------


def _tlv(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, where the content starts, where it ends) of the DER element at ``at``."""
    if at + 2 > len(data):
        raise InvalidParameters("DER: an element runs past the end")
    tag, first = data[at], data[at + 1]
    start = at + 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if not 1 <= count <= 4 or start + count > len(data):
            raise InvalidParameters("DER: a length of an unsupported form")
        length = int.from_bytes(data[start:start + count], "big")
        start += count
    if start + length > len(data):
        raise InvalidParameters("DER: an element runs past the end")
    return tag, start, start + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """Each element inside [start, end): (tag, its first byte, content start, content end)."""
    found, at = [], start
    while at < end:
        tag, s, e = _tlv(data, at)
        found.append((tag, at, s, e))
        at = e
    if at != end:
        raise InvalidParameters("DER: elements overrun their container")
    return found


def _signed_data(content_info: bytes) -> bytes:
    """The SignedData of a PKCS#7 ContentInfo (the [0] EXPLICIT content of signedData's OID)."""
    tag, start, end = _tlv(content_info, 0)
    parts = _children(content_info, start, end) if tag == 0x30 else []
    if (len(parts) != 2 or content_info[parts[0][2]:parts[0][3]] != _PKCS7_SIGNED_DATA_OID
            or parts[1][0] != 0xA0):
        raise InvalidParameters("not a PKCS#7 ContentInfo of SignedData")
    inner = _children(content_info, parts[1][2], parts[1][3])
    if len(inner) != 1 or inner[0][0] != 0x30:
        raise InvalidParameters("the ContentInfo holds no SignedData")
    return content_info[inner[0][1]:inner[0][3]]


def _signer_signature(signed_data: bytes) -> bytes | None:
    """The one signer's signature (SignerInfo's encryptedDigest) when it signed with SHA-256 and
    no authenticated attributes; None otherwise."""
    _, start, end = _tlv(signed_data, 0)
    parts = _children(signed_data, start, end)
    if not parts or parts[-1][0] != 0x31:
        raise InvalidParameters("SignedData without signerInfos")
    signers = _children(signed_data, parts[-1][2], parts[-1][3])
    if len(signers) != 1:
        return None
    fields = _children(signed_data, signers[0][2], signers[0][3])
    # version, issuerAndSerialNumber, digestAlgorithm, [0] attributes?, signatureAlgorithm, signature
    if len(fields) < 5 or any(f[0] == 0xA0 for f in fields):
        return None
    digest = _children(signed_data, fields[2][2], fields[2][3])
    if not digest or signed_data[digest[0][2]:digest[0][3]] != _SHA256_OID or fields[4][0] != 0x04:
        return None
    return signed_data[fields[4][2]:fields[4][3]]
