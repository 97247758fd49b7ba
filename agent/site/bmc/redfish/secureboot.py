"""UEFI Secure Boot over Redfish: ComputerSystem's SecureBoot resource read, and its writes.

    state = read(s)                       # SecureBootEnable, SecureBootMode, the databases
    set_enable(s, state, True)            # PATCH once, read back
    reset_keys(s, state, "ResetAllKeysToDefault")            # on the resource
    reset_keys(s, state, "DeleteAllKeys", database="db")     # on one database
    enroll(s, state, "db", pem)           # POST to the database's Certificates, read back

The resource (DSP0268 SecureBoot v1_1, SecureBootDatabase v1_0): ``SecureBootEnable`` (the
setting, applied by the firmware at the next boot), ``SecureBootCurrentBoot`` (what this boot
ran with), ``SecureBootMode`` (SetupMode, UserMode, AuditMode, DeployedMode), the
``SecureBootDatabases`` collection (PK, KEK, db, dbx and, where the BMC has them, their
factory ``...Default`` copies), each with ``Certificates`` (Certificate: ``CertificateString``,
PEM) and ``Signatures`` (Signature: ``SignatureString``, a hex digest). A certificate is named by
the SHA-256 of its DER (the fingerprint ``openssl x509 -fingerprint -sha256`` shows), computed
here from its PEM; where the BMC gives only a ``Fingerprint`` with ``FingerprintHashAlgorithm``
SHA-256, that is used. A signature is its hex string, lower case.

Every write goes through ``RedfishSession.write``: sent once; an ambiguous answer is read back
(the state as asked: taken; else Unconfirmed), never sent again. Only the live databases PK,
KEK, db and dbx are read entry by entry (each bounded by MAX_ENTRIES); the defaults are listed
by name only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.errors import BmcRefused, Unsupported
from agent.site.bmc.redfish.session import Doc, RedfishSession, link, text

log = logging.getLogger(__name__)

LIVE = ("PK", "KEK", "db", "dbx")
MAX_ENTRIES = 1024          # certificates plus signatures of one database, at most
MAX_DATABASES = 32


@dataclass(frozen=True)
class Database:
    """One SecureBootDatabase: its certificates by SHA-256 fingerprint, its signatures by hex
    digest, the ResetKeys types its action offers (() where it has no action)."""

    name: str
    ref: str
    certificates: tuple[str, ...] = ()
    subjects: dict[str, str] = field(default_factory=dict)    # fingerprint -> subject, where known
    signatures: tuple[str, ...] = ()
    certificates_ref: str = ""
    reset_target: str = ""
    reset_types: tuple[str, ...] = ()
    unnamed: int = 0        # certificates listed with neither a PEM nor a SHA-256 fingerprint


@dataclass(frozen=True)
class SecureBootState:
    ref: str
    enable: bool | None
    mode: str
    current_boot: str
    reset_target: str = ""               # SecureBoot.ResetKeys's target; "" where not offered
    reset_types: tuple[str, ...] = ()    # its allowable values (() where the BMC lists none)
    databases: dict[str, Database] = field(default_factory=dict)   # live ones, by DatabaseId
    defaults: tuple[str, ...] = ()       # the factory copies the BMC lists (PKDefault, ...)

    def values(self) -> dict[str, str]:
        """The state in bmc.query's ``values`` form (never a secret: fingerprints, digests)."""
        out = {"secure_boot.enable": "" if self.enable is None else str(self.enable).lower(),
               "secure_boot.mode": self.mode, "secure_boot.current_boot": self.current_boot,
               "secure_boot.reset_keys": (",".join(self.reset_types) or "offered") if self.reset_target
               else ""}
        for name, db in sorted(self.databases.items()):
            out[f"secure_boot.{name}.certificates"] = ",".join(db.certificates)
            out[f"secure_boot.{name}.signatures"] = str(len(db.signatures))
            if db.unnamed:
                out[f"secure_boot.{name}.unnamed"] = str(db.unnamed)
        if self.defaults:
            out["secure_boot.defaults"] = ",".join(self.defaults)
        return out


def fingerprint_of(pem: str) -> str:
    """The SHA-256 of a PEM certificate's DER, lower-case hex; ValueError when it is not one."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    cert = x509.load_pem_x509_certificate(pem.encode())
    return cert.fingerprint(hashes.SHA256()).hex()


def subject_of(pem: str) -> str:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(pem.encode()).subject.rfc4514_string()
    except ValueError:
        return ""


def _hex(value: object) -> str:
    word = text(value).replace(":", "").replace(" ", "").lower()
    return word if word and all(c in "0123456789abcdef" for c in word) else ""


def _certificate(doc: Doc) -> tuple[str, str]:
    """(fingerprint, subject) of one Certificate resource; ("", "") when it names none."""
    pem = text(doc.get("CertificateString"))
    if pem:
        try:
            return fingerprint_of(pem), subject_of(pem)
        except ValueError:
            pass
    if text(doc.get("FingerprintHashAlgorithm")).upper().replace("-", "") in ("SHA256", "TPM_ALG_SHA256"):
        subject = doc.get("Subject")
        name = text(subject.get("CommonName")) if isinstance(subject, dict) else ""
        return _hex(doc.get("Fingerprint")), name
    return "", ""


def _members(s: RedfishSession, ref: str, what: str) -> list[Doc]:
    """The collection's members as documents: expanded in one GET where the service root says the
    BMC takes ``$expand`` (DSP0266 ProtocolFeaturesSupported.ExpandQuery: ``.`` with levels; every
    recorded tree does), else, or for a member it left a link, one GET each (a dbx holds hundreds)."""
    if not ref:
        return []
    expand = s.root().get("ProtocolFeaturesSupported")
    expand = expand.get("ExpandQuery") if isinstance(expand, dict) else None
    query = "?$expand=.($levels=1)" if isinstance(expand, dict) and expand.get("NoLinks") \
        and expand.get("Levels") else ""
    listed = [m for m in s.get(ref.rstrip("/") + query).get("Members", []) if isinstance(m, dict)]
    if len(listed) > MAX_ENTRIES:
        raise BmcRefused(f"Redfish BMC {s.target.address}: {what} lists {len(listed)} entries, "
                         f"more than {MAX_ENTRIES}", bmc_message=f"{len(listed)} members")
    docs: list[Doc] = []
    for member in listed:
        ref_of = member.get("@odata.id")
        if set(member) <= {"@odata.id"} and isinstance(ref_of, str) and ref_of:
            member = s.get(ref_of)          # not expanded: read it
        docs.append(member)
    return docs


def _actions(doc: Doc, name: str) -> tuple[str, tuple[str, ...]]:
    actions = doc.get("Actions")
    action = actions.get(name) if isinstance(actions, dict) else None
    if not isinstance(action, dict):
        return "", ()
    allowed = action.get("ResetKeysType@Redfish.AllowableValues")
    types = tuple(v for v in allowed if isinstance(v, str)) if isinstance(allowed, list) else ()
    return text(action.get("target")), types


def _database(s: RedfishSession, name: str, ref: str, doc: Doc) -> Database:
    certs: list[str] = []
    subjects: dict[str, str] = {}
    unnamed = 0
    certs_ref = link(doc, "Certificates")
    for member in _members(s, certs_ref, f"{name}'s Certificates"):
        fp, subject = _certificate(member)
        if not fp:         # iDRAC: CertificateString null, a SHA-1 Thumbprint in its Oem copy only
            unnamed += 1
            continue
        certs.append(fp)
        if subject:
            subjects[fp] = subject
    listed = _members(s, link(doc, "Signatures"), f"{name}'s Signatures")
    sigs = [_hex(m.get("SignatureString")) for m in listed]
    target, types = _actions(doc, "#SecureBootDatabase.ResetKeys")
    return Database(name, ref, tuple(certs), subjects, tuple(x for x in sigs if x), certs_ref,
                    target, types, unnamed + sum(1 for x in sigs if not x))


def secure_boot_ref(s: RedfishSession) -> str:
    ref = link(s.system(), "SecureBoot")
    if not ref:
        raise Unsupported(f"Redfish BMC {s.target.address}: its System has no SecureBoot resource")
    return ref


def read(s: RedfishSession) -> SecureBootState:
    """The SecureBoot resource and its live databases; Unsupported where the System has none."""
    ref = secure_boot_ref(s)
    doc = s.get(ref)
    enable = doc.get("SecureBootEnable")
    target, types = _actions(doc, "#SecureBoot.ResetKeys")
    databases: dict[str, Database] = {}
    defaults: list[str] = []
    dbs_ref = link(doc, "SecureBootDatabases")
    members = s.members(dbs_ref) if dbs_ref else []
    for member in members[:MAX_DATABASES]:
        db = s.get(member)
        name = text(db.get("DatabaseId")) or text(db.get("Id")) or member.rstrip("/").rsplit("/", 1)[-1]
        if name in LIVE:
            databases[name] = _database(s, name, member, db)
        else:
            defaults.append(name)
    return SecureBootState(ref, enable if isinstance(enable, bool) else None,
                           text(doc.get("SecureBootMode")), text(doc.get("SecureBootCurrentBoot")),
                           target, types, databases, tuple(sorted(defaults)))


# -- writes: each sent once and read back ---------------------------------------------------


def set_enable(s: RedfishSession, state: SecureBootState, want: bool) -> SecureBootState:
    """PATCH SecureBootEnable (with If-Match where the resource has an ETag), read back; the
    firmware applies it at the next boot (SecureBootCurrentBoot says what this boot ran with)."""
    def enabled() -> bool:
        return s.get(state.ref).get("SecureBootEnable") is want

    s.write("PATCH", state.ref, {"SecureBootEnable": want}, etag=True, taken=enabled)
    if not enabled():
        raise BmcRefused(f"Redfish BMC {s.target.address} accepted SecureBootEnable {want} but "
                         "reads back otherwise", bmc_message="read back otherwise")
    log.info("Redfish %s: SecureBootEnable set to %s (at the next boot)", s.target.address, want)
    return read(s)


def reset_keys(s: RedfishSession, state: SecureBootState, reset_type: str, *, database: str = "",
               taken: Callable[[SecureBootState], bool] | None = None) -> tuple[SecureBootState, bool]:
    """POST ResetKeys ``reset_type`` on the resource, or on ``database``, once; Unsupported where
    the BMC offers no such action or lists other types. The read back: DeleteAllKeys leaves the
    database(s) empty, DeletePK the PK; a reset to the defaults is read back by the caller's
    check (``taken``: a callable over the new state). The state after, and whether it is applied
    now: False where the BMC answered 202, a task the firmware runs at the next boot (BlueField)."""
    where = f"Redfish BMC {s.target.address}"
    if database:
        db = state.databases.get(database)
        target, types = (db.reset_target, db.reset_types) if db else ("", ())
        action = "SecureBootDatabase.ResetKeys"
    else:
        target, types, action = state.reset_target, state.reset_types, "SecureBoot.ResetKeys"
    if not target:
        raise Unsupported(f"{where}: no {action} action{' on ' + database if database else ''}")
    if types and reset_type not in types:
        raise Unsupported(f"{where}: {action} takes {', '.join(types)}, not {reset_type}")

    def emptied(new: SecureBootState) -> bool:
        names = [database] if database else ["PK"] if reset_type == "DeletePK" else list(LIVE)
        return all(not (new.databases[n].certificates or new.databases[n].signatures)
                   for n in names if n in new.databases)

    def done() -> bool:
        new = read(s)
        if taken is not None:
            return taken(new)
        return emptied(new) and reset_type in ("DeleteAllKeys", "DeletePK")

    answer = s.write("POST", target, {"ResetKeysType": reset_type}, taken=done)
    log.info("%s: %s %s%s", where, action, reset_type, f" on {database}" if database else "")
    new = read(s)
    if answer is not None and answer.status == 202:
        return new, False
    if reset_type in ("DeleteAllKeys", "DeletePK") and not emptied(new):
        raise BmcRefused(f"{where} accepted {action} {reset_type} but its keys read back present",
                         bmc_message="keys read back present")
    return new, True


def enroll(s: RedfishSession, state: SecureBootState, database: str,
           pem: str) -> tuple[SecureBootState, bool]:
    """POST a PEM certificate to ``database``'s Certificates collection once (DSP0268:
    CertificateCollection is insertable; CertificateString and CertificateType PEM), read back
    by its fingerprint; Unsupported where the database has no Certificates collection. The state
    after, and whether it is applied now (False: a 202, a task for the next boot)."""
    db = state.databases.get(database)
    if db is None or not db.certificates_ref:
        raise Unsupported(f"Redfish BMC {s.target.address}: no Certificates collection on {database}")
    fp = fingerprint_of(pem)

    def present() -> bool:
        return fp in read(s).databases[database].certificates

    answer = s.write("POST", db.certificates_ref, {"CertificateString": pem, "CertificateType": "PEM"},
                     taken=present)
    new = read(s)
    if answer is not None and answer.status == 202:
        log.info("Redfish %s: certificate %s for %s waits for the next boot", s.target.address, fp[:16],
                 database)
        return new, False
    if fp not in new.databases[database].certificates:
        raise BmcRefused(f"Redfish BMC {s.target.address} accepted the certificate for {database} "
                         f"but does not list it (sha256 {fp[:16]})", bmc_message="not listed")
    log.info("Redfish %s: certificate %s enrolled in %s", s.target.address, fp[:16], database)
    return new, True
