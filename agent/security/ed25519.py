"""Ed25519 signatures (RFC 8032) through libcrypto, the OpenSSL library that Python's own
hashlib and ssl modules load, called with ctypes; and the PEM forms of RFC 8410.

    key = PrivateKey.generate()          # or PrivateKey(seed), PrivateKey.from_pem(pem)
    sig = key.sign(data)                 # 64 bytes
    verify(key.public, sig, data)        # True / False, never raises for a bad signature

Why not the cryptography package: in the ramdisk, under software emulation, importing its
Ed25519 and making one signature took 9.3 s the first time and 10 MiB of resident memory (its
Python modules, its cffi and Rust extensions), against 1.4 s and 1.4 MiB here, because the
library is already there for TLS (docs/performance.md). The calls are OpenSSL's own, the ones
cryptography makes underneath: EVP_PKEY_new_raw_private_key / _public_key and the one-shot
EVP_DigestSign / EVP_DigestVerify, in OpenSSL since 1.1.1. cryptography is still what the
reference gateway builds X.509 certificates with, and what disk.wipe's random overwrite uses.

Keys: a private key is its 32-byte seed, a public key its 32 bytes. In PEM they are RFC 8410's
PKCS#8 PrivateKeyInfo and SubjectPublicKeyInfo, whose DER for Ed25519 is a fixed prefix and
the 32 bytes; they are written and read as such, and any other DER (another algorithm, an
encrypted key, PKCS#8 v2 with attributes) is refused with a clear error.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import os
import threading

from agent.errors import InvalidParameters, MissingDependency

SEED_BYTES = 32
PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64

_NID_ED25519 = 1087  # EVP_PKEY_ED25519
_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")  # PrivateKeyInfo, v1, Ed25519
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")           # SubjectPublicKeyInfo, Ed25519

_FUNCTIONS: tuple[tuple[str, object, list[object]], ...] = (
    ("EVP_PKEY_new_raw_private_key", ctypes.c_void_p,
     [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    ("EVP_PKEY_new_raw_public_key", ctypes.c_void_p,
     [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    ("EVP_PKEY_get_raw_public_key", ctypes.c_int,
     [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    ("EVP_PKEY_free", None, [ctypes.c_void_p]),
    ("EVP_MD_CTX_new", ctypes.c_void_p, []),
    ("EVP_MD_CTX_free", None, [ctypes.c_void_p]),
    ("EVP_DigestSignInit", ctypes.c_int,
     [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
    ("EVP_DigestSign", ctypes.c_int,
     [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]),
    ("EVP_DigestVerifyInit", ctypes.c_int,
     [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
    ("EVP_DigestVerify", ctypes.c_int,
     [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]),
    ("ERR_clear_error", None, []),
)

_lib: ctypes.PyDLL | None = None
_lib_path = ""
_lib_lock = threading.Lock()


def _libcrypto_path() -> str:
    """The libcrypto that hashlib (and ssl) run on: the one mapped into this process after
    importing _hashlib; otherwise whatever the system's loader finds."""
    import _hashlib  # noqa: F401  (maps libcrypto into the process)

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libcrypto.so"):
                    return fields[5].strip()
    except OSError:
        pass
    import ctypes.util  # (it imports tempfile, shutil and more: only for this fallback)

    found = ctypes.util.find_library("crypto")
    if not found:
        raise MissingDependency("Ed25519: no libcrypto (OpenSSL >= 1.1.1) found", module="libcrypto")
    return found


def library_path() -> str:
    """The libcrypto in use (loading it if needed)."""
    _libcrypto()
    return _lib_path


def _libcrypto() -> ctypes.PyDLL:
    global _lib, _lib_path
    with _lib_lock:
        if _lib is None:
            path = _libcrypto_path()
            try:
                # PyDLL: each call keeps Python's GIL (CDLL drops and takes it again around every
                # call). A verify is six calls of microseconds; on a site daemon with hundreds of
                # BMC threads each retake of the GIL waited its turn, 2.4 ms per verify in all.
                lib = ctypes.PyDLL(path)
                for name, restype, argtypes in _FUNCTIONS:
                    fn = getattr(lib, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
            except (OSError, AttributeError) as exc:
                raise MissingDependency(
                    f"Ed25519: {path} is not a usable libcrypto (OpenSSL >= 1.1.1 needed): {exc}",
                    module="libcrypto",
                ) from exc
            _lib, _lib_path = lib, path
        return _lib


def _failed(lib: ctypes.PyDLL, what: str) -> RuntimeError:
    lib.ERR_clear_error()  # leave no error behind for the ssl module to misreport later
    return RuntimeError(f"Ed25519: {what} failed in libcrypto")


class PrivateKey:
    """An Ed25519 private key, held by libcrypto as long as this object lives."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_BYTES:
            raise InvalidParameters(f"an Ed25519 private key is {SEED_BYTES} bytes, not {len(seed)}")
        lib = _libcrypto()
        self._pkey: int | None = lib.EVP_PKEY_new_raw_private_key(_NID_ED25519, None, bytes(seed), SEED_BYTES)
        if not self._pkey:
            raise _failed(lib, "loading a private key")
        self.seed = bytes(seed)
        out = ctypes.create_string_buffer(PUBLIC_BYTES)
        size = ctypes.c_size_t(PUBLIC_BYTES)
        got = lib.EVP_PKEY_get_raw_public_key(self._pkey, out, ctypes.byref(size))
        if got != 1 or size.value != PUBLIC_BYTES:
            raise _failed(lib, "deriving the public key")
        self.public: bytes = out.raw

    @classmethod
    def generate(cls) -> PrivateKey:
        return cls(os.urandom(SEED_BYTES))

    @classmethod
    def from_pem(cls, data: bytes, *, source: str = "key") -> PrivateKey:
        der = _from_pem(data, "PRIVATE KEY", source)
        if len(der) != len(_PKCS8_PREFIX) + SEED_BYTES or not der.startswith(_PKCS8_PREFIX):
            raise InvalidParameters(f"{source}: not an Ed25519 private key (PKCS#8 of RFC 8410)")
        return cls(der[len(_PKCS8_PREFIX):])

    def pem(self) -> bytes:
        return _to_pem("PRIVATE KEY", _PKCS8_PREFIX + self.seed)

    def sign(self, data: bytes) -> bytes:
        lib = _libcrypto()
        ctx = lib.EVP_MD_CTX_new()
        if not ctx:
            raise _failed(lib, "EVP_MD_CTX_new")
        try:
            sig = ctypes.create_string_buffer(SIGNATURE_BYTES)
            size = ctypes.c_size_t(SIGNATURE_BYTES)
            data = bytes(data)
            if (lib.EVP_DigestSignInit(ctx, None, None, None, self._pkey) != 1
                    or lib.EVP_DigestSign(ctx, sig, ctypes.byref(size), data, len(data)) != 1
                    or size.value != SIGNATURE_BYTES):
                raise _failed(lib, "signing")
            return sig.raw
        finally:
            lib.EVP_MD_CTX_free(ctx)

    def __del__(self) -> None:
        pkey, self._pkey = getattr(self, "_pkey", None), None
        if pkey and _lib is not None:
            _lib.EVP_PKEY_free(pkey)


def verify(public: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is ``public``'s Ed25519 signature of ``data``."""
    if len(public) != PUBLIC_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    lib = _libcrypto()
    pkey = lib.EVP_PKEY_new_raw_public_key(_NID_ED25519, None, bytes(public), PUBLIC_BYTES)
    if not pkey:
        lib.ERR_clear_error()
        return False
    ctx = lib.EVP_MD_CTX_new()
    try:
        data = bytes(data)
        ok = bool(ctx) and lib.EVP_DigestVerifyInit(ctx, None, None, None, pkey) == 1 and (
            lib.EVP_DigestVerify(ctx, bytes(signature), SIGNATURE_BYTES, data, len(data)) == 1
        )
        if not ok:
            lib.ERR_clear_error()
        return ok
    finally:
        if ctx:
            lib.EVP_MD_CTX_free(ctx)
        lib.EVP_PKEY_free(pkey)


def public_pem(public: bytes) -> bytes:
    if len(public) != PUBLIC_BYTES:
        raise InvalidParameters(f"an Ed25519 public key is {PUBLIC_BYTES} bytes, not {len(public)}")
    return _to_pem("PUBLIC KEY", _SPKI_PREFIX + public)


def public_from_pem(data: bytes, *, source: str = "key") -> bytes:
    der = _from_pem(data, "PUBLIC KEY", source)
    if len(der) != len(_SPKI_PREFIX) + PUBLIC_BYTES or not der.startswith(_SPKI_PREFIX):
        raise InvalidParameters(f"{source}: PEM public key is not Ed25519 (RFC 8410)")
    return der[len(_SPKI_PREFIX):]


def _to_pem(label: str, der: bytes) -> bytes:
    b64 = base64.b64encode(der)
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return b"".join([f"-----BEGIN {label}-----\n".encode(), *(line + b"\n" for line in lines),
                     f"-----END {label}-----\n".encode()])


def _from_pem(data: bytes, label: str, source: str) -> bytes:
    """The DER inside one PEM block with this exact label (no headers, nothing around it)."""
    text = bytes(data).strip()
    begin, end = f"-----BEGIN {label}-----".encode(), f"-----END {label}-----".encode()
    if not text.startswith(begin) or not text.endswith(end) or len(text) < len(begin) + len(end):
        first = text.split(b"\n", 1)[0][:40].decode("ascii", "replace")
        raise InvalidParameters(f"{source}: not an unencrypted PEM {label.lower()} (starts {first!r})")
    try:
        return base64.b64decode(b"".join(text[len(begin) : -len(end)].split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParameters(f"{source}: PEM {label.lower()} is not valid base64 ({exc})") from exc
