"""Secure Boot signing of the boot files a fleet's nodes start: the ramdisk's UKI, the site's
ipxe.efi and (arm64) its GRUB, signed at build time with the fleet's db key.

    key = DbKey.load(Path("db.key"), Path("db.pem"))           # PEM files the operator names
    sign(Path("ramdisk.efi"), key)                              # in place: Authenticode, db cert

The key and certificate are the operator's: PEM files named by the build's flags
(``--db-key``, ``--db-cert``; initramfs/build.py), never their contents in a child's argv or a
log. An encrypted key takes its passphrase from a file (``--db-key-passphrase-file``), never
from argv: it is decrypted here into a 0600 file in a private 0700 folder, handed to sbsign by
path, and removed when the signature is made.

Signing is sbsigntool's ``sbsign`` (Debian's sbsigntool, at build time only: the ramdisk gets
nothing new): a PKCS#7 Authenticode signature over the PE image, appended as its certificate
table. The image's Authenticode digest leaves out the checksum, the certificate table's
directory entry and the table itself, so it is the same before and after signing: what
firmware measures into PCR 4 (the UKI's reference value, initramfs/uki.py) does not change.
``sign`` checks that (``authenticode_sha256`` before and after), that sbsign's own digest in
the signature is ours (``signed_digest``: two implementations agree), and that ``sbverify``
verifies the signature against the certificate, before the signed file replaces the image.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run
from initramfs.uki import PeError, authenticode_sha256, parse_pe

SBSIGN, SBVERIFY = "sbsign", "sbverify"
WIN_CERT_TYPE_PKCS_SIGNED_DATA = 0x0002


class SigningError(RuntimeError):
    """The image could not be signed as asked; the message says why (never the key)."""


@dataclass(frozen=True)
class DbKey:
    """The fleet's db signing key and certificate (PEM files), and where the key's passphrase
    is when the key is encrypted."""

    key: Path
    cert: Path
    passphrase_file: Path | None = None

    @classmethod
    def load(cls, key: Path, cert: Path, passphrase_file: Path | None = None) -> DbKey:
        """The key and certificate checked: each a readable PEM file, the certificate X.509,
        the key the certificate's (decrypted with the passphrase when it is encrypted)."""
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        for what, path in (("key", key), ("certificate", cert), ("passphrase file", passphrase_file)):
            if path is not None and not path.is_file():
                raise SigningError(f"the db {what} {path} is not a file")
        try:
            certificate = x509.load_pem_x509_certificate(cert.read_bytes())
        except ValueError:
            raise SigningError(f"the db certificate {cert} is not a PEM X.509 certificate") from None
        password = _passphrase(passphrase_file)
        try:
            private = load_pem_private_key(key.read_bytes(), password)
        except TypeError:
            raise SigningError(f"the db key {key} is encrypted: name its passphrase file "
                               "(--db-key-passphrase-file)") from None
        except ValueError:
            raise SigningError(f"the db key {key} is no PEM private key, or its passphrase "
                               "is wrong") from None
        if private.public_key() != certificate.public_key():
            raise SigningError(f"the db key {key} is not the key of the certificate {cert}")
        return cls(key, cert, passphrase_file)

    @contextlib.contextmanager
    def plain_key(self) -> Iterator[Path]:
        """A path sbsign can read the key from: the key itself, or when it is encrypted, the key
        decrypted into a 0600 file in a private folder, removed on leaving."""
        if self.passphrase_file is None:
            yield self.key
            return
        from cryptography.hazmat.primitives import serialization

        private = serialization.load_pem_private_key(self.key.read_bytes(), _passphrase(self.passphrase_file))
        with tempfile.TemporaryDirectory(prefix="bc-dbkey-") as folder:  # 0700
            plain = Path(folder) / "db.key"
            fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
            try:
                yield plain
            finally:
                plain.unlink(missing_ok=True)


def _passphrase(path: Path | None) -> bytes | None:
    if path is None:
        return None
    return path.read_bytes().rstrip(b"\r\n")


def signed_digest(data: bytes) -> bytes | None:
    """The image digest an Authenticode signature of ``data`` signed (its SpcIndirectDataContent's
    DigestInfo, the first SHA-256 digest in the PKCS#7 content), read with ``openssl asn1parse``;
    None for an image without a signature."""
    pe = parse_pe(data)
    at, size = struct.unpack_from("<II", data, pe.cert_dir_at)
    if not size:
        return None
    length, _revision, kind = struct.unpack_from("<IHH", data, at)
    if kind != WIN_CERT_TYPE_PKCS_SIGNED_DATA or length > size:
        raise PeError(f"certificate table entry of type {kind:#x}, not PKCS#7 signed data")
    with tempfile.NamedTemporaryFile(suffix=".p7") as f:
        f.write(data[at + 8:at + length])
        f.flush()
        text = run(["openssl", "asn1parse", "-inform", "DER", "-in", f.name], timeout=60).text
    # The content's DigestAlgorithmIdentifier (sha256), then its digest as an OCTET STRING.
    m = re.search(r"OBJECT\s+:sha256\n.*\n.*OCTET STRING\s+\[HEX DUMP\]:([0-9A-F]{64})\n", text)
    return bytes.fromhex(m.group(1)) if m else None


def verify(image: Path, cert: Path) -> bool:
    """Whether ``image`` carries a signature that ``cert`` verifies (sbverify)."""
    return run([SBVERIFY, "--cert", str(cert), str(image)], check=False, timeout=60).returncode == 0


def sign(image: Path, key: DbKey, out: Path | None = None) -> bytes:
    """``image`` signed with the db key (into ``out``, default in place: replaced whole once
    the signature is checked); returns its Authenticode SHA-256, the same as before signing."""
    out = out or image
    data = image.read_bytes()
    before = authenticode_sha256(data)
    if parse_pe(data).cert_size:
        raise SigningError(f"{image} is signed already")
    tmp = out.with_name(f".{out.name}.signing")
    try:
        with key.plain_key() as plain:
            argv = [SBSIGN, "--key", str(plain), "--cert", str(key.cert), "--output", str(tmp), str(image)]
            done = run(argv, check=False, timeout=120)
        if done.returncode != 0:
            raise SigningError(f"sbsign could not sign {image}: "
                               f"{done.stderr.decode('utf-8', 'replace').strip()[-500:]}")
        signed = tmp.read_bytes()
        after = authenticode_sha256(signed)
        if after != before:
            raise SigningError(f"{image}: the signed image's Authenticode digest {after.hex()} is "
                               f"not the unsigned one's {before.hex()}")
        if signed_digest(signed) != before:
            raise SigningError(f"{image}: sbsign signed another digest than the image's {before.hex()}")
        if not verify(tmp, key.cert):
            raise SigningError(f"{image}: sbverify does not verify the signature with {key.cert}")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return after


def site_boot_files(folder: Path, key: DbKey | None, *, ipxe_dir: Path = Path("/usr/lib/ipxe"),
                    grub: Path | None = None, uki: Path | None = None) -> dict[str, dict[str, str]]:
    """The site's boot files in ``folder`` (its ``site_ipxe_dir``): Debian's undionly.kpxe (BIOS:
    nothing to sign) and ipxe.efi, and for arm64 the site's GRUB when ``grub`` names one
    (initramfs/netgrub.py) or, under Secure Boot, the site's arm64 UKI when ``uki`` names one
    (served as bootaa64.efi: the firmware starts it itself); the EFI ones signed with ``key``
    (None: as they are). Their digests are pinned in ``folder``/boot-files.json
    (agent/site/boot/dnsmasq.py: the site serves no boot file whose sha256 differs from it);
    returns what it holds, by name."""
    if grub is not None and uki is not None:
        raise SigningError("one arm64 boot file per site: the GRUB or the UKI, not both")
    import hashlib
    import json
    import shutil

    from agent.site.boot.dnsmasq import BOOT_MANIFEST
    from agent.site.boot.pxe import BootFile

    folder.mkdir(parents=True, exist_ok=True)
    sources = {BootFile.BIOS.value: ipxe_dir / BootFile.BIOS, BootFile.UEFI.value: ipxe_dir / BootFile.UEFI}
    if grub is not None:
        sources[BootFile.UEFI_ARM64.value] = grub
    if uki is not None:
        sources[BootFile.UEFI_ARM64_UKI.value] = uki
    pinned: dict[str, dict[str, str]] = {}
    for name, src in sorted(sources.items()):
        if not src.is_file():
            raise SigningError(f"{src}: missing (apt-get install ipxe; the arm64 GRUB: initramfs/netgrub.py)")
        target = folder / name
        if src.resolve() != target.resolve():
            shutil.copyfile(src, target)
        entry = {"sha256": ""}
        if name != BootFile.BIOS.value:
            if key is not None and not parse_pe(target.read_bytes()).cert_size:
                sign(target, key)
            entry["authenticode"] = authenticode_sha256(target.read_bytes()).hex()
            entry["signed"] = "yes" if parse_pe(target.read_bytes()).cert_size else "no"
        entry["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        pinned[name] = entry
    (folder / BOOT_MANIFEST).write_text(json.dumps({"files": pinned}, indent=2, sort_keys=True) + "\n")
    return pinned
