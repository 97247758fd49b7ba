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

import datetime
import hashlib
import json
import shutil
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import InvalidParameters
from agent.hw import uefi_auth
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


# -- a node's variable store: its Secure Boot keys read and written (the BMC's side) -----------

OVMF_SECURE_BOOT_ENABLE = "f0a30bc7-af08-4556-99c4-001009c93a44"    # OVMF's SecureBootEnable
KEY_VARIABLES = {name: guid for name, (guid, _) in uefi_auth.DATABASES.items()}
MAX_STORE_JSON = 4 * 1024 * 1024


class StoreError(ValueError):
    """A variable store that cannot be read or written as asked; the message says why."""


@dataclass(frozen=True)
class Signature:
    """One entry of a signature database: an X.509 certificate (its DER) or a SHA-256 digest."""

    kind: str            # "x509" | "sha256"
    data: bytes
    owner: uuid.UUID = OWNER


@dataclass(frozen=True)
class StoreKeys:
    """What a UEFI variable store holds for Secure Boot: OVMF's SecureBootEnable (None: absent,
    which the firmware takes as on where a PK is enrolled) and PK, KEK, db, dbx entry by entry."""

    enable: bool | None
    databases: dict[str, tuple[Signature, ...]]

    @property
    def secure_boot(self) -> bool:
        """What the firmware enforces at its next boot: a PK, and SecureBootEnable not off."""
        return bool(self.databases.get("PK")) and self.enable is not False


_KINDS = {uefi_auth.EFI_CERT_X509: "x509", uefi_auth.EFI_CERT_SHA256: "sha256"}


def parse_signature_lists(data: bytes) -> tuple[Signature, ...]:
    """The entries of a database's EFI_SIGNATURE_LISTs (agent/hw/uefi_auth.py reads them), one
    after another; StoreError for lists that do not parse or of a type other than X.509 or
    SHA-256."""
    try:
        lists = uefi_auth.signature_lists(data)
    except InvalidParameters as exc:
        raise StoreError(exc.message) from None
    out: list[Signature] = []
    for sl in lists:
        kind = _KINDS.get(sl.type)
        if kind is None:
            raise StoreError(f"a signature list of type {sl.type}: only X.509 and SHA-256 are mapped")
        out.extend(Signature(kind, e.data, e.owner) for e in sl.entries)
    return tuple(out)


def signature_lists(entries: Sequence[Signature]) -> bytes:
    """``entries`` as EFI_SIGNATURE_LISTs: one list per certificate (their sizes differ), then the
    SHA-256 digests, a list per run of one owner's, in the order given."""
    out = b""
    runs: list[tuple[uuid.UUID, list[bytes]]] = []
    for e in entries:
        if e.kind == "x509":
            out += uefi_auth.x509_list(e.data, e.owner)
        elif e.kind == "sha256" and len(e.data) == hashlib.sha256().digest_size:
            if not runs or runs[-1][0] != e.owner:
                runs.append((e.owner, []))
            runs[-1][1].append(e.data)
        else:
            raise StoreError(f"a signature of kind {e.kind} and {len(e.data)} bytes")
    return out + b"".join(uefi_auth.sha256_list(digests, owner) for owner, digests in runs)


def _variables(store: Path) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="vars-") as tmp:
        listing = Path(tmp) / "vars.json"
        run([str(virt_fw_vars()), "--input", str(store), "--output-json", str(listing)], timeout=60)
        raw = listing.read_bytes()
    if len(raw) > MAX_STORE_JSON:
        raise StoreError(f"{store}: its variables are over {MAX_STORE_JSON} bytes of JSON")
    variables = json.loads(raw).get("variables", [])
    if not isinstance(variables, list):
        raise StoreError(f"{store}: virt-fw-vars listed no variables")
    return [v for v in variables if isinstance(v, dict)]


def read_store(store: Path) -> StoreKeys:
    """The Secure Boot keys and setting in the variable store file ``store`` (virt-fw-vars reads
    it; the signature lists parsed here). Only while no firmware runs on it."""
    found = {(str(v.get("name")), str(v.get("guid"))): bytes.fromhex(str(v.get("data", "")))
             for v in _variables(store)}
    enable = found.get(("SecureBootEnable", OVMF_SECURE_BOOT_ENABLE))
    return StoreKeys(None if enable is None else enable[:1] != b"\0",
                     {name: parse_signature_lists(found.get((name, guid), b""))
                      for name, guid in KEY_VARIABLES.items()})


def write_store(store: Path, keys: StoreKeys) -> list[str]:
    """``store`` made to hold ``keys``: each database ``keys`` names that differs set to its
    entries (deleted where it has none), SecureBootEnable set (or deleted: None); the rest of the
    store as it was.
    Written to a sibling, then renamed over it: a failure leaves the store as it was. Only while
    no firmware runs on it. The variables changed, by name."""
    now = read_store(store)
    changed: list[str] = []
    setting: list[dict[str, object]] = []
    delete: list[str] = []
    stamp = uefi_auth.efi_time(datetime.datetime.now(datetime.UTC)).hex()
    for name, guid in KEY_VARIABLES.items():
        if name not in keys.databases:
            continue
        want = keys.databases[name]
        if want == now.databases.get(name, ()):
            continue
        changed.append(name)
        if want:
            setting.append({"name": name, "guid": guid, "attr": uefi_auth.ATTRIBUTES,
                            "data": signature_lists(want).hex(), "time": stamp})
        else:
            delete.append(name)
    if keys.enable != now.enable:
        changed.append("SecureBootEnable")
        if keys.enable is None:
            delete.append("SecureBootEnable")
        else:
            setting.append({"name": "SecureBootEnable", "guid": OVMF_SECURE_BOOT_ENABLE, "attr": 3,
                            "data": "01" if keys.enable else "00"})
    if not changed:
        return []
    with tempfile.TemporaryDirectory(prefix="vars-", dir=store.parent) as tmp:
        listing, out = Path(tmp) / "set.json", Path(tmp) / store.name
        listing.write_text(json.dumps({"version": 2, "variables": setting}))
        run([str(virt_fw_vars()), "--input", str(store), "--output", str(out),
             *(a for name in delete for a in ("--delete", name)),
             *(("--set-json", str(listing)) if setting else ())], timeout=60)
        after = read_store(out)
        if after.enable != keys.enable or any(after.databases[n] != want
                                              for n, want in keys.databases.items()):
            raise StoreError(f"{store}: virt-fw-vars wrote other keys than asked; the store is as it was")
        out.replace(store)
    return changed
