"""Secure Boot's authenticated writes (agent/hw/uefi_auth.py): made as the key holder makes them,
parsed back to the spec's fields, verified as edk2 verifies them (the right key, not another),
malformed ones refused by name; and ``agent uefi-payload``, the key holder's command."""

from __future__ import annotations

import datetime
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from agent.errors import InvalidParameters
from agent.hw import efivars, uefi_auth

OWNER = uuid.UUID("8b1f9c52-3d4e-4a6b-9e21-6c0d5f7a1b33")
WHEN = datetime.datetime(2026, 12, 7, 8, 30, 15, tzinfo=datetime.UTC)
SHA256_OID = bytes.fromhex("608648016503040201")


class Key:
    """An RSA 2048 key and its self-signed certificate (DER), made here."""

    def __init__(self, name: str) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.private.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=2))
                     .sign(self.private, hashes.SHA256()).public_bytes(serialization.Encoding.DER))

    def write(self, name: str, value: bytes, when: datetime.datetime = WHEN) -> bytes:
        return uefi_auth.signed_write(name, value, self.private, self.cert, when)


@pytest.fixture(scope="module")
def keys() -> dict[str, Key]:
    return {name: Key(name) for name in ("pk", "kek", "db", "other")}


def test_a_signed_write_parses_back_to_the_specs_fields(keys: dict[str, Key]) -> None:
    digests = [b"\1" * 32, b"\2" * 32]
    value = uefi_auth.x509_list(keys["db"].cert, OWNER) + uefi_auth.sha256_list(digests, OWNER)
    payload = keys["kek"].write("db", value)
    # EFI_TIME: 2026-12-07 08:30:15, every other field zero.
    assert payload[:16] == struct.pack("<HBBBBBBIhBB", 2026, 12, 7, 8, 30, 15, 0, 0, 0, 0, 0)
    length, revision, kind = struct.unpack_from("<IHH", payload, 16)
    assert (revision, kind) == (0x0200, 0x0EF1)
    assert uuid.UUID(bytes_le=payload[24:40]) == uuid.UUID("4aafd29d-68df-49ee-8aa9-347d375665a7")
    cert_data = payload[40:16 + length]
    # A bare SignedData (SEQUENCE, two-byte length, version 1), SHA-256 where edk2 looks for it.
    assert cert_data[:2] == b"\x30\x82" and cert_data[4:7] == b"\x02\x01\x01"
    assert cert_data[13:22] == SHA256_OID
    assert payload[16 + length:] == value
    write = uefi_auth.parse(payload)
    assert (write.timestamp, write.signed_data, write.value) == (payload[:16], cert_data, value)
    lists = write.lists
    assert [(sl.type, [(e.owner, e.data) for e in sl.entries]) for sl in lists] == [
        (uefi_auth.EFI_CERT_X509, [(OWNER, keys["db"].cert)]),
        (uefi_auth.EFI_CERT_SHA256, [(OWNER, b"\1" * 32), (OWNER, b"\2" * 32)])]
    assert uefi_auth.certificates(value) == [keys["db"].cert]


def test_edk2_like_verification_takes_the_signers_key_and_no_other(keys: dict[str, Key]) -> None:
    value = uefi_auth.x509_list(keys["kek"].cert, OWNER)
    write = uefi_auth.parse(keys["pk"].write("KEK", value))
    assert uefi_auth.verify(write, "KEK", [keys["pk"].cert])
    assert uefi_auth.verify(write, "KEK", [keys["other"].cert, keys["pk"].cert])   # any trusted one
    assert not uefi_auth.verify(write, "KEK", [keys["kek"].cert, keys["other"].cert])
    assert not uefi_auth.verify(write, "KEK", [])
    # What is signed is the name, the GUID, the attributes and the time stamp with the value.
    assert not uefi_auth.verify(write, "PK", [keys["pk"].cert])                    # same GUID, other name
    assert not uefi_auth.verify(write, "db", [keys["pk"].cert])
    later = uefi_auth.AuthenticatedWrite(uefi_auth.efi_time(WHEN + datetime.timedelta(seconds=1)),
                                         write.signed_data, write.value)
    assert not uefi_auth.verify(later, "KEK", [keys["pk"].cert])
    other_value = uefi_auth.AuthenticatedWrite(write.timestamp, write.signed_data,
                                               uefi_auth.x509_list(keys["other"].cert, OWNER))
    assert not uefi_auth.verify(other_value, "KEK", [keys["pk"].cert])


def test_the_signed_bytes_are_the_specs_concatenation(keys: dict[str, Key]) -> None:
    ts = uefi_auth.efi_time(WHEN)
    assert uefi_auth.signed_bytes("db", b"LIST", ts) == (
        "db".encode("utf-16-le") + uuid.UUID(efivars.IMAGE_SECURITY).bytes_le + struct.pack("<I", 0x27)
        + ts + b"LIST")


def test_malformed_writes_are_refused_by_name(keys: dict[str, Key]) -> None:
    good = keys["kek"].write("db", uefi_auth.x509_list(keys["db"].cert, OWNER))
    length = struct.unpack_from("<I", good, 16)[0]

    def changed(at: int, data: bytes) -> bytes:
        return good[:at] + data + good[at + len(data):]

    for bad, why in ((good[:30], "shorter than EFI_VARIABLE_AUTHENTICATION_2"),
                     (changed(8, b"\1"), "EFI_TIME"),                              # nanosecond
                     (changed(2, b"\x0d"), "EFI_TIME"),                            # month 13
                     (changed(20, b"\x00\x01"), "WIN_CERTIFICATE_UEFI_GUID"),      # revision
                     (changed(22, b"\x02\x00"), "WIN_CERTIFICATE_UEFI_GUID"),      # PKCS_SIGNED_DATA
                     (changed(24, uuid.uuid4().bytes_le), "WIN_CERTIFICATE_UEFI_GUID"),
                     (changed(16, struct.pack("<I", len(good))), "certificate length"),
                     (changed(16, struct.pack("<I", length - 1)), "DER"),
                     (changed(40 + 13, b"\0"), "SHA-256"),
                     (good + b"\0", "signature list"),
                     (good[:-1], "signature list"),
                     (good + b"\0" * uefi_auth.MAX_PAYLOAD, "over")):
        with pytest.raises(InvalidParameters, match=why):
            uefi_auth.parse(bad)
    with pytest.raises(InvalidParameters, match="not a Secure Boot database"):
        keys["kek"].write("Boot0001", b"")
    with pytest.raises(InvalidParameters, match="same size"):
        uefi_auth.signature_list(uefi_auth.EFI_CERT_X509, OWNER, [b"a", b"bb"])


def test_the_key_holders_command_writes_a_payload_the_node_takes(keys: dict[str, Key],
                                                                 tmp_path: Path) -> None:
    def pem(name: str) -> tuple[Path, Path]:
        key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
        key.write_bytes(keys[name].private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret")))
        cert.write_bytes(x509.load_der_x509_certificate(keys[name].cert).public_bytes(serialization.Encoding.PEM))
        return key, cert

    pk_key, pk_cert = pem("pk")
    _, kek_cert = pem("kek")
    (tmp_path / "pass").write_text("s3cret\n")
    argv = [sys.executable, "-m", "agent", "uefi-payload", "--variable", "KEK", "--owner", str(OWNER),
            "--add-cert", str(kek_cert), "--key", str(pk_key), "--cert", str(pk_cert),
            "-o", str(tmp_path / "KEK.auth")]
    done = subprocess.run([*argv, "--key-passphrase-file", str(tmp_path / "pass")], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    write = uefi_auth.parse((tmp_path / "KEK.auth").read_bytes())
    assert write.value == uefi_auth.x509_list(keys["kek"].cert, OWNER)
    assert done.stdout.split()[0] == write.value_sha256 and "s3cret" not in done.stdout + done.stderr
    assert uefi_auth.verify(write, "KEK", [keys["pk"].cert])
    # No passphrase for an encrypted key, a key not the certificate's: refused, nothing written.
    refused = subprocess.run([*argv[:-1], str(tmp_path / "none.auth")], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).parents[2])
    assert refused.returncode == 2 and "--key-passphrase-file" in refused.stderr
    assert not (tmp_path / "none.auth").exists()
