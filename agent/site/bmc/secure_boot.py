"""The release gate's Secure Boot part at the site: the node's UEFI keys and state as its BMC
reports them (Redfish SecureBoot, agent/site/bmc/redfish/secureboot.py), against the fleet's
policy, and put back where the BMC can.

The policy is a JSON file on the site server (its path the ``policy`` parameter of bmc.query
secure_boot and bmc.firmware restore_secure_boot), data, not code:

    {"secure_boot": "required",            # or "off_allowed" (a profile that accepts it off)
     "pk":  [{"sha256": "ab12..."}],       # the certificates each database holds, exactly
     "kek": [{"sha256": "...", "pem": "kek.pem"}],   # a PEM (beside the policy) to enroll it
     "db":  [{"pem": "fleet-db.pem"}],     # the fingerprint computed from the PEM
     "dbx": ["80b4d96931bf0d02fd91a61e19d14f1da452e66db2408ca8604d411f92659f0a"],  # at least these
     "restore": "defaults"}                # or "enroll"

Findings (``Mismatch.check``), in the node side's shape (agent/policy/release/'s uefi.*):

  secure_boot.unreadable   no SecureBoot resource, or it could not be read     -
  secure_boot.off          SecureBootEnable false where the policy requires it  PATCH SecureBootEnable
  secure_boot.setup_mode   SetupMode (no PK: nothing enforced)                 the keys put back
  secure_boot.pk_foreign   a PK the policy does not name (a tenant's)           the keys put back
  secure_boot.kek_foreign  a KEK the policy does not name (a tenant's)          the keys put back
  secure_boot.db_extra     a db certificate or hash the policy does not name    the keys put back
  secure_boot.pk_missing, kek_missing, db_missing
                           a certificate the policy names is not there          the keys put back
  secure_boot.dbx_missing  a revocation the policy names is not in dbx          the keys put back

"The keys put back" is bmc.firmware restore_secure_boot, offered where this BMC has the writes:
with ``restore: defaults`` SecureBoot.ResetKeys ResetAllKeysToDefault (the fleet keeps the
factory keys); with ``restore: enroll`` each differing database emptied by its own ResetKeys
DeleteAllKeys and the policy's PEMs POSTed to its Certificates (db, then KEK, then PK, which
ends setup mode); dbx is put back only by the defaults (with ``enroll`` a missing revocation is
reported for an operator). Where the BMC offers neither, the finding has no remedy:
the node's ramdisk can write the variables while the platform is in setup mode, else an operator
at the firmware's setup screen. After a restore the state is read again and checked again: what
is still off is reported, never passed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import limits
from agent.errors import BmcRefused, InvalidParameters, Unsupported
from agent.policy.release import findings
from agent.proto import agent_pb2
from agent.site.bmc.redfish import secureboot
from agent.site.bmc.redfish.session import RedfishSession

log = logging.getLogger(__name__)

MAX_POLICY_BYTES = 1024 * 1024
MAX_KEYS = 64                 # certificates per database in a policy
MAX_DBX = 4096
KEY_DATABASES = ("PK", "KEK", "db")
_FIELDS = {"PK": "pk", "KEK": "kek", "db": "db"}
_EXTRA = {"PK": "pk_foreign", "KEK": "kek_foreign", "db": "db_extra"}
_AT_BOOT = " (a task the firmware runs at the next boot)"


@dataclass(frozen=True)
class SecureBootPolicy:
    required: bool
    keys: dict[str, frozenset[str]]         # "PK"/"KEK"/"db" -> fingerprints, exactly these
    pems: dict[str, tuple[str, ...]]        # "PK"/"KEK"/"db" -> PEMs to enroll (may be fewer)
    dbx: frozenset[str]                     # revocations that must be present
    restore: str                            # "defaults" | "enroll"
    path: str = ""


def _hex64(where: str, value: object) -> str:
    word = value.lower().replace(":", "") if isinstance(value, str) else ""
    if len(word) != 64 or any(c not in "0123456789abcdef" for c in word):
        raise InvalidParameters(f"{where}: a SHA-256 in hex (64 digits)")
    return word


def load(path: Path) -> SecureBootPolicy:
    """The policy at ``path``, checked whole: InvalidParameters names what is wrong."""
    where = f"Secure Boot policy {path}"
    try:
        raw = path.read_bytes()[:MAX_POLICY_BYTES + 1]
    except OSError as exc:
        raise InvalidParameters(f"{where}: cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise InvalidParameters(f"{where}: larger than {MAX_POLICY_BYTES} bytes")
    doc = limits.loads_json(raw, what=where, max_bytes=MAX_POLICY_BYTES)
    if not isinstance(doc, dict):
        raise InvalidParameters(f"{where}: a JSON object")
    unknown = sorted(set(doc) - {"secure_boot", "pk", "kek", "db", "dbx", "restore"})
    if unknown:
        raise InvalidParameters(f"{where}: unknown field(s) {', '.join(unknown)}")
    mode = doc.get("secure_boot", "required")
    if mode not in ("required", "off_allowed"):
        raise InvalidParameters(f"{where}: secure_boot is required or off_allowed")
    restore = doc.get("restore", "defaults")
    if restore not in ("defaults", "enroll"):
        raise InvalidParameters(f"{where}: restore is defaults or enroll")
    keys: dict[str, frozenset[str]] = {}
    pems: dict[str, tuple[str, ...]] = {}
    for name in KEY_DATABASES:
        entries = doc.get(_FIELDS[name], [])
        if not isinstance(entries, list) or len(entries) > MAX_KEYS:
            raise InvalidParameters(f"{where}: {_FIELDS[name]} is a list of at most {MAX_KEYS} certificates")
        fps: set[str] = set()
        texts: list[str] = []
        for i, entry in enumerate(entries):
            fps.add(_entry(f"{where}: {_FIELDS[name]}[{i}]", entry, path.parent, texts))
        keys[name], pems[name] = frozenset(fps), tuple(texts)
    dbx = doc.get("dbx", [])
    if not isinstance(dbx, list) or len(dbx) > MAX_DBX:
        raise InvalidParameters(f"{where}: dbx is a list of at most {MAX_DBX} SHA-256 digests")
    return SecureBootPolicy(mode == "required", keys, pems,
                            frozenset(_hex64(f"{where}: dbx[{i}]", d) for i, d in enumerate(dbx)),
                            restore, str(path))


def _entry(where: str, entry: Any, base: Path, pems: list[str]) -> str:
    if not isinstance(entry, dict) or not set(entry) <= {"sha256", "pem"} or not entry:
        raise InvalidParameters(f"{where}: an object with sha256 and/or pem")
    fp = _hex64(where, entry["sha256"]) if "sha256" in entry else ""
    if "pem" in entry:
        name = entry["pem"]
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise InvalidParameters(f"{where}: pem is a file name beside the policy")
        try:
            with (base / name).open("rb") as f:
                pem = f.read(64 * 1024).decode()
            computed = secureboot.fingerprint_of(pem)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise InvalidParameters(f"{where}: {name} is not a readable PEM certificate ({exc})") from None
        if fp and fp != computed:
            raise InvalidParameters(f"{where}: {name}'s SHA-256 is {computed}, not the sha256 given")
        fp = computed
        pems.append(pem)
    return fp


# -- the check --------------------------------------------------------------------------------


def can_restore(policy: SecureBootPolicy, state: secureboot.SecureBootState) -> bool:
    """Whether this BMC has the writes ``policy.restore`` needs for the keys."""
    if policy.restore == "defaults":
        appendable = all(name in state.databases and state.databases[name].certificates_ref
                         for name in KEY_DATABASES if policy.pems[name])
        return appendable and bool(state.reset_target) and (
            not state.reset_types or "ResetAllKeysToDefault" in state.reset_types)
    for name in KEY_DATABASES:
        db = state.databases.get(name)
        if db is None or db.unnamed or len(policy.pems[name]) != len(policy.keys[name]):
            return False
        if _extras(policy, state, name) and not db.reset_target:
            return False          # what is there cannot be taken out
        if policy.keys[name] - set(db.certificates) and not db.certificates_ref:
            return False
    return True


def _extras(policy: SecureBootPolicy, state: secureboot.SecureBootState, name: str) -> set[str]:
    db = state.databases.get(name)
    return (set(db.certificates) | set(db.signatures)) - policy.keys[name] if db else set()


class _Findings:
    """The mismatches in the node side's shape (agent/policy/release/'s), a remedy each where
    this BMC has the writes."""

    def __init__(self) -> None:
        self.mismatches: list[agent_pb2.Mismatch] = []

    def add(self, check: str, expected: object, found: object, where: str, message: str,
            remedy: agent_pb2.BmcRemedy | None = None) -> None:
        m = agent_pb2.Mismatch(check=check, expected=str(expected), found=str(found), where=where,
                               message=message)
        if remedy is not None:
            m.bmc_remedy.CopyFrom(remedy)
        self.mismatches.append(m)


def check(policy: SecureBootPolicy, state: secureboot.SecureBootState | None,
          unread: str = "") -> list[agent_pb2.Mismatch]:
    """Every way ``state`` differs from ``policy``, each with the site remedy where this BMC has
    the writes; a state not read is one finding, never a pass."""
    found = _Findings()
    if state is None:
        found.add("secure_boot.unreadable", "SecureBoot", "unreadable", "SecureBoot",
                  f"the node's Secure Boot state cannot be read from its BMC: {unread or 'not read'}")
        return found.mismatches
    fix = findings.bmc_remedy("bmc.firmware", "restore_secure_boot", policy=policy.path)
    keys_fix = fix if can_restore(policy, state) else None
    elsewhere = ("" if keys_fix else "; this BMC cannot put the keys back "
                 + ("(the node is in setup mode: its OS may enroll them until a PK is set; our ramdisk "
                    "does: efivars.enroll_keys, the fleet's signed writes)" if state.mode == "SetupMode"
                    else "(an operator at the firmware's setup)"))
    if policy.required and state.enable is not True:
        found.add("secure_boot.off", "enabled", "absent" if state.enable is None else "disabled",
                  "SecureBootEnable", "Secure Boot is turned off on the node (SecureBootEnable "
                  f"{state.enable}, this boot {state.current_boot or 'unknown'}); the fleet requires it", fix)
    if policy.required and state.mode == "SetupMode":
        found.add("secure_boot.setup_mode", "UserMode", state.mode, "SecureBootMode",
                  "the node's firmware is in setup mode: it has no platform key and enforces nothing"
                  + elsewhere, keys_fix)
    for name, listed in sorted(state.databases.items()):
        if listed.unnamed:
            found.add("secure_boot.unreadable", "SHA-256 fingerprints", f"{listed.unnamed} unnamed", name,
                      f"the BMC lists {listed.unnamed} entries of {name} with neither a PEM nor a SHA-256 "
                      "fingerprint: they cannot be compared with the fleet's (check them from the "
                      "node: the ramdisk's uefi.* digests)")
    for name in KEY_DATABASES:
        db = state.databases.get(name)
        want = policy.keys[name]
        have = set(db.certificates) | set(db.signatures) if db else set()
        for fp in sorted(have - want):
            subject = db.subjects.get(fp, "") if db else ""
            found.add(f"secure_boot.{_EXTRA[name]}", "absent", fp, name,
                      f"{name} holds {'a certificate' if subject else 'an entry'} the fleet's policy does "
                      f"not name (sha256 {fp[:16]}{', ' + subject if subject else ''})" + elsewhere, keys_fix)
        for fp in sorted(want - have):
            found.add(f"secure_boot.{name.lower()}_missing", fp, "absent", name,
                      f"{name} lacks the fleet's certificate sha256 {fp[:16]}" + elsewhere, keys_fix)
    dbx = state.databases.get("dbx")
    missing = sorted(policy.dbx - (set(dbx.signatures) | set(dbx.certificates) if dbx else set()))
    if missing:
        found.add("secure_boot.dbx_missing", f"{len(policy.dbx)} revocations", f"{len(missing)} missing",
                  "dbx", f"dbx lacks {len(missing)} of the fleet's revocations (first {missing[0][:16]})"
                  + elsewhere, keys_fix if policy.restore == "defaults" else None)
    return found.mismatches


def report(mismatches: list[agent_pb2.Mismatch]) -> agent_pb2.ReleaseReport:
    out = agent_pb2.ReleaseReport(pool_ready=not mismatches, checked=["secure_boot"])
    for m in mismatches:
        (out.restorable if findings.restorable(m) else out.cannot_restore).append(m)
    return out


def observe(s: RedfishSession) -> tuple[secureboot.SecureBootState | None, str]:
    """The state, or None and why it could not be read (the check names it)."""
    try:
        return secureboot.read(s), ""
    except (Unsupported, BmcRefused) as exc:
        return None, exc.message


# -- putting it back ----------------------------------------------------------------------------


def restore(s: RedfishSession, policy: SecureBootPolicy) -> tuple[secureboot.SecureBootState, list[str]]:
    """Put the node's keys and Secure Boot back as ``policy`` says, with the writes this BMC has,
    each once and read back; the state after, and the writes made (for the result)."""
    state = secureboot.read(s)
    done: list[str] = []
    keys_off = [m for m in check(policy, state) if m.check != "secure_boot.off"]
    if keys_off and can_restore(policy, state):
        if policy.restore == "defaults":
            # The factory's keys, then the fleet's own certificates appended (its PEMs: a fleet
            # that keeps the vendor's keys and adds its db certificate, docs/site.md).
            appended = {secureboot.fingerprint_of(p) for n in KEY_DATABASES for p in policy.pems[n]}

            def matches(new: secureboot.SecureBootState) -> bool:
                return not [m for m in check(policy, new) if m.check != "secure_boot.off"
                            and not (m.check.endswith("_missing") and m.expected in appended)]

            if not matches(state):
                state, now = secureboot.reset_keys(s, state, "ResetAllKeysToDefault", taken=matches)
                done.append("ResetKeys ResetAllKeysToDefault" + ("" if now else _AT_BOOT))
            for name in reversed(KEY_DATABASES):
                for pem in policy.pems[name]:
                    if secureboot.fingerprint_of(pem) not in state.databases[name].certificates:
                        state, now = secureboot.enroll(s, state, name, pem)
                        done.append(f"{name} certificate {secureboot.fingerprint_of(pem)[:16]} appended"
                                    + ("" if now else _AT_BOOT))
        else:
            for name in reversed(KEY_DATABASES):    # PK last: enrolling it ends setup mode
                if _extras(policy, state, name):
                    state, now = secureboot.reset_keys(s, state, "DeleteAllKeys", database=name)
                    done.append(f"{name} ResetKeys DeleteAllKeys" + ("" if now else _AT_BOOT))
                for pem in policy.pems[name]:
                    if secureboot.fingerprint_of(pem) in state.databases[name].certificates:
                        continue          # a pending delete (BlueField): what is there stays
                    state, now = secureboot.enroll(s, state, name, pem)
                    done.append(f"{name} certificate {secureboot.fingerprint_of(pem)[:16]} enrolled"
                                + ("" if now else _AT_BOOT))
    if policy.required and state.enable is not True:
        state = secureboot.set_enable(s, state, True)
        done.append("SecureBootEnable true")
    return state, done


def restore_report(s: RedfishSession, policy: SecureBootPolicy) -> tuple[agent_pb2.ReleaseReport, list[str]]:
    """restore, then the check again: the report of what is still off (named, never passed)."""
    state, done = restore(s, policy)
    return report(check(policy, state)), done
