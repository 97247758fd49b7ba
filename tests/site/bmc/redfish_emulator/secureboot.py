"""The emulator's UEFI Secure Boot writes: SecureBoot.ResetKeys, SecureBootDatabase.ResetKeys and
a POST to a live database's Certificates, installed as ``State.actions`` for every recording
that has a SecureBoot resource (``install``), with a test's drift helpers (``drift_*``).

What the writes do is the schema's (DMTF DSP0268 SecureBoot v1_1 and SecureBootDatabase v1_0:
ResetAllKeysToDefault puts each database back to its factory copy, DeleteAllKeys empties them,
DeletePK empties PK; a Certificates collection with ``@Redfish.SupportedCertificates`` PEM takes a
POSTed CertificateString) and the UEFI specification's (2.10, section 32.3, "Secure Boot mode
transitions": no PK is Setup Mode, enrolling a PK leaves it for User Mode; a Deployed Mode
platform whose PK is deleted is in Setup Mode). The factory copy is the recording's
``<name>Default`` database where it has one (bmcweb, AMI, DMTF), else the keys as recorded (iDRAC
lists no defaults: its recorded keys are its factory's). The ResetKeys types are the action's
allowable values, or its ActionInfo's (DGX H100), else any of the schema's.

A QEMU node's own variable store behind the resource (``SecureBootKeys.attach_store``, done by
``RedfishEmulator.attach`` for a machine with ``variables``: machine.py's ``NodeVariables``): the
resource is then read from the store file (``load``: SecureBootEnable is OVMF's variable, absent
meaning on where a PK is enrolled; SecureBootMode SetupMode without a PK, else UserMode; each
database's X.509 entries its Certificates, its SHA-256 entries its Signatures, with their
UefiSignatureOwner), again whenever the file changed under the BMC, and every write above and a
SecureBootEnable PATCH is staged into it (``stage``) for the firmware's next boot. Proven in QEMU:
tests/e2e/test_secure_boot.py's put-back, whose node then boots signed with Secure Boot on.

Vendor behaviour:
- NVIDIA BlueField BMC ("BIOS Secure Boot Configuration", BlueField BMC software 23.09 to 25.10:
  "for each operation, a corresponding task is generated within the BMC's Redfish Task Service.
  During the subsequent DPU reboot, the UEFI checks for any pending secure boot tasks and executes
  them"): with ``Quirk.SECURE_BOOT_AT_REBOOT`` a key write answers 202 with a task and takes effect
  at the next ComputerSystem.Reset (``boot``). SecureBootEnable is PATCHed on the
  resource (the same page's example), which every profile takes as the schema says.
"""

from __future__ import annotations

import copy
import itertools
import ssl
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from tests.site.bmc.redfish_emulator.profiles import Quirk

if TYPE_CHECKING:
    from qemu.secureboot import StoreKeys

Doc = dict[str, Any]
LIVE = ("PK", "KEK", "db", "dbx")
SCHEMA_RESETS = ("ResetAllKeysToDefault", "DeleteAllKeys", "DeletePK")
_ids = itertools.count(1000)


class VariableStore(Protocol):
    """A node's own UEFI variable store behind the resource (machine.py's NodeVariables)."""

    def read(self) -> StoreKeys:
        """What the store holds (or the keys staged for it, where a write waits)."""
        ...

    def stage(self, keys: StoreKeys) -> bool:
        """``keys`` for the firmware's next boot: written now where the node is off (True),
        else at its next power-on, before it starts (False)."""
        ...

    def changed(self) -> bool:
        """The store changed since it was last read or written (the node's firmware wrote it)."""
        ...


def _error(message_id: str, message: str) -> Doc:
    return {"error": {"code": message_id, "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}]}}


class SecureBootKeys:
    """One emulated SecureBoot resource: its live databases and their factory copies."""

    def __init__(self, state: Any, ref: str) -> None:
        self.state, self.ref = state, ref
        self.pending: list[Callable[[], None]] = []
        self.variables: VariableStore | None = None     # the node's own store, where attached
        docs = state.docs
        dbs = docs.get(ref, {}).get("SecureBootDatabases", {}).get("@odata.id", "").rstrip("/")
        self.databases = {name: f"{dbs}/{name}" for name in LIVE if f"{dbs}/{name}" in docs}
        self.factory: dict[str, dict[str, list[Doc]]] = {}
        for name, path in self.databases.items():
            source = f"{dbs}/{name}Default" if f"{dbs}/{name}Default" in docs else path
            self.factory[name] = {kind: [copy.deepcopy(docs[m]) for m in self._members(source, kind)]
                                  for kind in ("Certificates", "Signatures")}

    def _collection(self, db: str, kind: str) -> str:
        return str(self.state.docs.get(db, {}).get(kind, {}).get("@odata.id", "")).rstrip("/")

    def _members(self, db: str, kind: str) -> list[str]:
        coll = self.state.docs.get(self._collection(db, kind), {})
        return [str(m["@odata.id"]).rstrip("/") for m in coll.get("Members", [])
                if str(m.get("@odata.id", "")).rstrip("/") in self.state.docs]

    def set_entries(self, name: str, kind: str, entries: list[Doc]) -> None:
        """``name``'s Certificates or Signatures made exactly ``entries`` (new member paths)."""
        docs, coll = self.state.docs, self._collection(self.databases[name], kind)
        if not coll:
            return
        docs.setdefault(coll, {"@odata.id": coll, "Name": f"{name} {kind}", "Members": []})
        for old in self._members(self.databases[name], kind):
            docs.pop(old, None)
        members = []
        for entry in entries:
            path = f"{coll}/{next(_ids)}"
            docs[path] = {**copy.deepcopy(entry), "@odata.id": path, "Id": path.rsplit("/", 1)[1]}
            members.append({"@odata.id": path})
        docs[coll]["Members"] = members
        docs[coll]["Members@odata.count"] = len(members)
        self.state.changed(coll)
        self._mode()

    def add(self, name: str, kind: str, entry: Doc) -> None:
        docs = self.state.docs
        current = [docs[m] for m in self._members(self.databases[name], kind)]
        self.set_entries(name, kind, [*current, entry])

    def _mode(self) -> None:
        doc = self.state.docs[self.ref]
        has_pk = "PK" in self.databases and bool(self._members(self.databases["PK"], "Certificates"))
        if not has_pk:
            doc["SecureBootMode"] = "SetupMode"
        elif doc.get("SecureBootMode") == "SetupMode":
            doc["SecureBootMode"] = "UserMode"
        self.state.changed(self.ref)

    def reset(self, names: list[str], to_factory: bool) -> None:
        for name in names:
            if name in self.databases:
                for kind in ("Certificates", "Signatures"):
                    self.set_entries(name, kind, self.factory[name][kind] if to_factory else [])

    # -- the node's own variable store behind the resource -----------------------------------

    def attach_store(self, variables: VariableStore) -> None:
        """From now on the resource is ``variables``: read from it now and whenever it changed,
        each write staged into it (``stage``)."""
        self.variables = variables
        self.load()

    def load(self) -> None:
        """The resource made what the node's store holds: SecureBootEnable (OVMF's variable;
        absent: on where a PK is enrolled, as OVMF's AuthVariableLib takes it), SecureBootMode
        (no PK: SetupMode, else UserMode), and each database's certificates and SHA-256
        signatures."""
        assert self.variables is not None
        keys = self.variables.read()
        for name in self.databases:
            entries = keys.databases.get(name, ())
            self.set_entries(name, "Certificates", [_certificate(e.data, e.owner) for e in entries
                                                    if e.kind == "x509"])
            self.set_entries(name, "Signatures", [_signature(e.data, e.owner) for e in entries
                                                  if e.kind == "sha256"])
        doc = self.state.docs[self.ref]
        has_pk = bool(keys.databases.get("PK"))
        doc["SecureBootEnable"] = has_pk if keys.enable is None else keys.enable
        doc["SecureBootMode"] = "UserMode" if has_pk else "SetupMode"
        self.state.changed(self.ref)

    def refresh(self) -> None:
        """Read again where the node's store changed under the BMC (its firmware, its OS)."""
        if self.variables is not None and self.variables.changed():
            self.load()

    def stored(self) -> StoreKeys:
        """The resource as the node's store holds it: each certificate's DER and each SHA-256
        signature, with its UefiSignatureOwner (``_owner``)."""
        from qemu.secureboot import Signature, StoreKeys

        out: dict[str, tuple[Signature, ...]] = {}
        for name, path in self.databases.items():
            entries = []
            for member in self._members(path, "Certificates"):
                doc = self.state.docs[member]
                entries.append(Signature("x509", ssl.PEM_cert_to_DER_cert(doc["CertificateString"]),
                                         _owner(doc)))
            for member in self._members(path, "Signatures"):
                doc = self.state.docs[member]
                entries.append(Signature("sha256", bytes.fromhex(doc["SignatureString"]), _owner(doc)))
            out[name] = tuple(entries)
        enable = self.state.docs[self.ref].get("SecureBootEnable")
        return StoreKeys(enable if isinstance(enable, bool) else None, out)

    def stage(self) -> None:
        """A write the resource took, for the node's store: written at once where the node is
        off (and the resource read back from the store), else at its next power-on."""
        if self.variables is not None and self.variables.stage(self.stored()):
            self.load()

    def boot(self) -> None:
        """The node boots: the writes waiting for it applied (SECURE_BOOT_AT_REBOOT), and
        SecureBootCurrentBoot what the firmware now enforces."""
        while self.pending:
            self.pending.pop(0)()
        doc = self.state.docs[self.ref]
        on = doc.get("SecureBootEnable") is True and doc.get("SecureBootMode") != "SetupMode"
        doc["SecureBootCurrentBoot"] = "Enabled" if on else "Disabled"
        self.state.changed(self.ref)


def _owner(doc: Doc) -> uuid.UUID:
    """An entry's UefiSignatureOwner; for a certificate POSTed without one, the lab fleet's owner
    GUID (qemu/secureboot.py OWNER: a put-back db is then what the fleet enrolled, byte for byte)."""
    from qemu.secureboot import OWNER

    try:
        return uuid.UUID(str(doc.get("UefiSignatureOwner")))
    except ValueError:
        return OWNER


def _certificate(der: bytes, owner: uuid.UUID) -> Doc:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_der_x509_certificate(der)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return {"@odata.type": "#Certificate.v1_7_0.Certificate", "CertificateType": "PEM",
            "CertificateString": ssl.DER_cert_to_PEM_cert(der), "UefiSignatureOwner": str(owner),
            "Subject": {"CommonName": str(names[0].value) if names else ""}}


def _signature(digest: bytes, owner: uuid.UUID) -> Doc:
    return {"@odata.type": "#Signature.v1_0_2.Signature", "SignatureString": digest.hex(),
            "SignatureTypeRegistry": "UEFI", "SignatureType": "EFI_CERT_SHA256_GUID",
            "UefiSignatureOwner": str(owner)}


def _allowed(state: Any, action: Doc) -> list[str]:
    allowed = action.get("ResetKeysType@Redfish.AllowableValues")
    info = state.docs.get(str(action.get("@Redfish.ActionInfo", "")).rstrip("/"), {})
    for param in info.get("Parameters", []):
        if isinstance(param, dict) and param.get("Name") == "ResetKeysType":
            allowed = param.get("AllowableValues")
    return [v for v in allowed if isinstance(v, str)] if isinstance(allowed, list) else list(SCHEMA_RESETS)


def _done(keys: SecureBootKeys, write: Callable[[], None]) -> tuple[int, Doc]:
    def change() -> None:
        write()
        keys.stage()       # the node's own store, where one is attached

    if Quirk.SECURE_BOOT_AT_REBOOT in keys.state.profile.quirks:
        keys.pending.append(change)
        return 202, {"@odata.id": "/redfish/v1/TaskService/Tasks/sb", "TaskState": "New",
                     "Messages": [{"Message": "applied by UEFI at the next boot"}]}
    change()
    return 200, {"@Message.ExtendedInfo": [{"MessageId": "Base.1.8.Success", "Message": "done"}]}


def _resource_reset(keys: SecureBootKeys, action: Doc) -> Callable[[Doc], tuple[int, Doc]]:
    def answer(body: Doc) -> tuple[int, Doc]:
        kind = str(body.get("ResetKeysType", ""))
        allowed = _allowed(keys.state, action)
        dell = {"ResetPK": "PK", "ResetKEK": "KEK", "ResetDB": "db", "ResetDBX": "dbx"}
        if kind not in allowed:
            return 400, _error("Base.1.8.ActionParameterValueNotInList",
                               f"ResetKeysType {kind} not in {allowed}")
        if kind == "ResetAllKeysToDefault":
            return _done(keys, lambda: keys.reset(list(LIVE), True))
        if kind == "DeleteAllKeys":
            return _done(keys, lambda: keys.reset(list(LIVE), False))
        if kind == "DeletePK":
            return _done(keys, lambda: keys.reset(["PK"], False))
        if kind in dell:
            return _done(keys, lambda: keys.reset([dell[kind]], True))
        return 400, _error("Base.1.8.ActionParameterNotSupported", kind)
    return answer


def _database_reset(keys: SecureBootKeys, name: str, action: Doc) -> Callable[[Doc], tuple[int, Doc]]:
    def answer(body: Doc) -> tuple[int, Doc]:
        kind = str(body.get("ResetKeysType", ""))
        allowed = [a for a in _allowed(keys.state, action) if a != "DeletePK"]
        if kind not in allowed or kind not in ("ResetAllKeysToDefault", "DeleteAllKeys"):
            return 400, _error("Base.1.8.ActionParameterValueNotInList",
                               f"ResetKeysType {kind} not in {allowed}")
        return _done(keys, lambda: keys.reset([name], kind == "ResetAllKeysToDefault"))
    return answer


def _enroll(keys: SecureBootKeys, name: str) -> Callable[[Doc], tuple[int, Doc]]:
    def answer(body: Doc) -> tuple[int, Doc]:
        from cryptography import x509

        pem = body.get("CertificateString")
        if body.get("CertificateType") != "PEM" or not isinstance(pem, str):
            return 400, _error("Base.1.8.PropertyMissing", "CertificateString and CertificateType PEM")
        try:
            x509.load_pem_x509_certificate(pem.encode())
        except ValueError:
            return 400, _error("Base.1.8.PropertyValueFormatError", "CertificateString is no PEM certificate")
        entry = {"@odata.type": "#Certificate.v1_7_0.Certificate", "CertificateString": pem,
                 "CertificateType": "PEM"}
        return _done(keys, lambda: keys.add(name, "Certificates", entry))
    return answer


def install(state: Any) -> dict[str, SecureBootKeys]:
    """Every SecureBoot resource of the recording taught its writes; the keys by resource path."""
    found: dict[str, SecureBootKeys] = {}
    for path, doc in list(state.docs.items()):
        if not (path.endswith("/SecureBoot") and "SecureBootEnable" in doc):
            continue
        keys = found[path] = SecureBootKeys(state, path)
        action = doc.get("Actions", {}).get("#SecureBoot.ResetKeys")
        if isinstance(action, dict) and action.get("target"):
            state.actions[str(action["target"]).rstrip("/")] = _resource_reset(keys, action)
        for name, db_path in keys.databases.items():
            db = state.docs[db_path]
            db_action = db.get("Actions", {}).get("#SecureBootDatabase.ResetKeys")
            if isinstance(db_action, dict) and db_action.get("target"):
                state.actions[str(db_action["target"]).rstrip("/")] = _database_reset(keys, name, db_action)
            certs = keys._collection(db_path, "Certificates")
            if certs and "PEM" in state.docs.get(certs, {}).get("@Redfish.SupportedCertificates", ["PEM"]):
                state.actions[certs] = _enroll(keys, name)
    return found
