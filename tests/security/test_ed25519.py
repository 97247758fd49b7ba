"""agent/security/ed25519.py: RFC 8032 vectors, agreement with the cryptography package both ways (keys
in PEM, signatures), refusals of what is not an Ed25519 key, and a clean OpenSSL error queue."""

from __future__ import annotations

import ctypes
import threading

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric import ed25519 as c_ed25519

from agent.errors import InvalidParameters
from agent.security import ed25519

# RFC 8032, section 7.1: TEST 1, TEST 2, TEST 3 (secret key, public key, message, signature).
VECTORS = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
]


@pytest.mark.parametrize(("seed", "public", "message", "signature"), VECTORS)
def test_rfc8032_vectors(seed: str, public: str, message: str, signature: str) -> None:
    key = ed25519.PrivateKey(bytes.fromhex(seed))
    assert key.public.hex() == public
    assert key.sign(bytes.fromhex(message)).hex() == signature
    assert ed25519.verify(bytes.fromhex(public), bytes.fromhex(signature), bytes.fromhex(message))


def test_signatures_and_pem_agree_with_the_cryptography_package() -> None:
    ours = ed25519.PrivateKey.generate()
    theirs = serialization.load_pem_private_key(ours.pem(), password=None)
    assert isinstance(theirs, c_ed25519.Ed25519PrivateKey)
    raw = theirs.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert raw == ours.public
    theirs.public_key().verify(ours.sign(b"from us"), b"from us")
    assert ed25519.verify(ours.public, theirs.sign(b"from them"), b"from them")

    other = c_ed25519.Ed25519PrivateKey.generate()
    pem = other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    assert ed25519.PrivateKey.from_pem(pem).pem() == pem
    spki = other.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    raw = other.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert ed25519.public_from_pem(spki) == raw
    assert ed25519.public_pem(raw) == spki
    with pytest.raises(InvalidSignature):
        other.public_key().verify(ours.sign(b"x"), b"x")


def test_bad_signatures_are_false_not_errors() -> None:
    key = ed25519.PrivateKey.generate()
    sig = key.sign(b"data")
    assert ed25519.verify(key.public, sig, b"data")
    assert not ed25519.verify(key.public, sig, b"Data")
    assert not ed25519.verify(key.public, bytes([sig[0] ^ 1]) + sig[1:], b"data")
    assert not ed25519.verify(key.public, sig[:63], b"data")
    assert not ed25519.verify(key.public[:31], sig, b"data")
    assert not ed25519.verify(b"\xff" * 32, sig, b"data")  # not a point on the curve
    assert not ed25519.verify(ed25519.PrivateKey.generate().public, sig, b"data")


def test_failures_leave_no_error_in_the_openssl_queue() -> None:
    lib = ed25519._libcrypto()
    err_get_error = lib.ERR_get_error
    err_get_error.restype = ctypes.c_ulong
    key = ed25519.PrivateKey.generate()
    for public in (b"\xff" * 32, key.public):
        ed25519.verify(public, b"\0" * 64, b"data")
        assert err_get_error() == 0


def test_what_is_not_an_ed25519_key_is_refused_clearly() -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_pem = ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    with pytest.raises(InvalidParameters, match="not an Ed25519 private key"):
        ed25519.PrivateKey.from_pem(ec_pem)
    ec_pub = ec_key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(InvalidParameters, match="not Ed25519"):
        ed25519.public_from_pem(ec_pub)
    encrypted = c_ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"))
    with pytest.raises(InvalidParameters, match="not an unencrypted PEM private key"):
        ed25519.PrivateKey.from_pem(encrypted)
    with pytest.raises(InvalidParameters, match="not valid base64"):
        ed25519.PrivateKey.from_pem(b"-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n")
    with pytest.raises(InvalidParameters, match="32 bytes"):
        ed25519.PrivateKey(b"short")
    with pytest.raises(InvalidParameters, match="not an unencrypted PEM public key"):
        ed25519.public_from_pem(ed25519.PrivateKey.generate().pem())


def test_one_key_signs_from_many_threads() -> None:
    key = ed25519.PrivateKey.generate()
    bad: list[int] = []

    def work(n: int) -> None:
        for i in range(200):
            data = f"{n}-{i}".encode()
            if not ed25519.verify(key.public, key.sign(data), data):
                bad.append(n)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
