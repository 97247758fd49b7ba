"""A fleet's Secure Boot keys for the QEMU labs, made at test time (never committed), and
OVMF's Secure Boot build with them enrolled.

    keys = FleetKeys.generate(workdir / "keys")      # PK, KEK, db: self-signed, openssl
    variables = keys.enrolled_vars(workdir / "vars.fd")  # a copy of OVMF_VARS_4M.fd, keys in
    # (dbx=[digest, ...]: Authenticode SHA-256 digests revoked, appended to dbx; arch="arm64":
    # a copy of AAVMF_VARS.fd)
    # a node then runs OVMF_CODE_4M.secboot.fd on pflash with its own copy of ``variables``
    # and SMM (MachineSpec.secure_boot: -M q35,smm=on, the pflash's secure property); an
    # arm64 node AAVMF_CODE.fd (FIRMWARE: the code and the empty variables of each arch)
    signing.sign(image, keys.db_key())               # what the node's firmware starts

virt-firmware's ``virt-fw-vars`` (the dev extra) enrolls them into a copy of Debian's empty
variable store: PK (setup mode ends), the KEK, the db certificate, and ``--sb`` (OVMF's
SecureBootEnable): the firmware then starts only images that a db certificate verifies
(docs/site.md, "Secure Boot"). ``other`` is a second db key the fleet did not enroll: an image
it signs is refused as an unsigned one is.

arm64: Debian builds its one AAVMF with Secure Boot (AAVMF_CODE.ms.fd and .snakeoil.fd are
links to AAVMF_CODE.fd), so the node runs AAVMF_CODE.fd as ever with the fleet's keys in its
variables. Debian's AAVMF_VARS.fd is blank (zeros: the firmware formats it at its first start),
which virt-fw-vars cannot read; AAVMF_VARS.ms.fd is a formatted store with Microsoft's keys, so
the empty store the keys go into is that one with every variable deleted (``empty_vars``).
QEMU's arm64 ``virt`` has no SMM and no secure world under it here: the variables are enforced
by the firmware's authenticated-variable code, but nothing below the firmware guards the flash
from a guest that writes it directly (OVMF's SMM does on x86).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run
from initramfs.signing import DbKey
from qemu.harness import AAVMF_CODE

OVMF_SECBOOT_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
OVMF_VARS_EMPTY = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
AAVMF_VARS_FORMATTED = Path("/usr/share/AAVMF/AAVMF_VARS.ms.fd")   # Microsoft's keys: emptied first
# Each arch's Secure Boot firmware: its code, and the variable store the keys go into (on arm64
# after every variable in it is deleted: ``empty_vars``).
FIRMWARE = {"amd64": (OVMF_SECBOOT_CODE, OVMF_VARS_EMPTY), "arm64": (AAVMF_CODE, AAVMF_VARS_FORMATTED)}
OWNER = uuid.UUID("8b1f9c52-3d4e-4a6b-9e21-6c0d5f7a1b33")   # the fleet's signature owner GUID


def virt_fw_vars() -> Path:
    return Path(sys.executable).parent / "virt-fw-vars"


def missing(arch: str = "amd64") -> str | None:
    """Why a Secure Boot node of ``arch`` cannot run here, or None."""
    package = "ovmf" if arch == "amd64" else "qemu-efi-aarch64"
    for path in FIRMWARE[arch]:
        if not path.is_file():
            return f"no {path} (apt-get install {package})"
    if not virt_fw_vars().exists():
        return "no virt-fw-vars (the dev extra's virt-firmware: ./dev test-fast)"
    for tool in ("sbsign", "sbverify", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install sbsigntool openssl)"
    return None


def empty_vars(arch: str, out: Path) -> Path:
    """A formatted variable store with no variable in it for ``arch``'s firmware: OVMF's empty
    one as it is; on arm64 a copy of AAVMF_VARS.ms.fd with each of its variables deleted."""
    template = FIRMWARE[arch][1]
    if arch == "amd64":
        return template
    listing = out.with_name(out.name + ".json")
    run([str(virt_fw_vars()), "--input", str(template), "--output-json", str(listing)], timeout=120)
    names = sorted({v["name"] for v in json.loads(listing.read_text())["variables"]})
    listing.unlink()
    run([str(virt_fw_vars()), "--input", str(template), "--output", str(out),
         *(arg for name in names for arg in ("--delete", name))], timeout=120)
    return out


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A fresh RSA 2048 key and its self-signed certificate, CN ``name`` (test keys)."""
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
         "-days", "2", "-keyout", str(key), "-out", str(cert)], timeout=60)
    key.chmod(0o600)
    return key, cert


@dataclass(frozen=True)
class FleetKeys:
    folder: Path

    @classmethod
    def generate(cls, folder: Path) -> FleetKeys:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in ("fleet-pk", "fleet-kek", "fleet-db", "other-db"):
            self_signed(folder, name)
        return cls(folder)

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.pem"

    def cert_sha256(self, name: str) -> str:
        """The sha256 of a certificate's DER: how an attestation policy names an authority."""
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding

        der = x509.load_pem_x509_certificate(self.cert(name).read_bytes()).public_bytes(Encoding.DER)
        return hashlib.sha256(der).hexdigest()

    def db_key(self) -> DbKey:
        return DbKey.load(self.folder / "fleet-db.key", self.cert("fleet-db"))

    def other_key(self) -> DbKey:
        """A db key the fleet never enrolled."""
        return DbKey.load(self.folder / "other-db.key", self.cert("other-db"))

    def enrolled_vars(self, out: Path, dbx: Sequence[bytes] = (), arch: str = "amd64") -> Path:
        """A copy of the firmware's empty variable store (OVMF's, or AAVMF's with ``arch``
        arm64) with PK, KEK and db enrolled, Secure Boot on. ``dbx``: Authenticode SHA-256
        digests the fleet revoked (an image whose digest is one of them is refused whoever
        signed it)."""
        owner = str(OWNER)
        revoked: list[str] = []
        for digest in dbx:
            if len(digest) != hashlib.sha256().digest_size:
                raise ValueError(f"a dbx entry is a SHA-256 digest (32 bytes), not {len(digest)} bytes")
            revoked += ["--add-dbx-hash", owner, digest.hex()]
        empty = empty_vars(arch, out.with_name(out.name + ".empty"))
        run([str(virt_fw_vars()), "--input", str(empty), "--output", str(out),
             "--set-pk", owner, str(self.cert("fleet-pk")), "--add-kek", owner, str(self.cert("fleet-kek")),
             "--add-db", owner, str(self.cert("fleet-db")), *revoked, "--no-microsoft", "--sb"], timeout=120)
        if empty != FIRMWARE[arch][1]:
            empty.unlink()
        return out
