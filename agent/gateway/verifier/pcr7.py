"""PCR 7 judged from the event log: the Secure Boot state, the keys, and the authority that
verified each image (docs/attestation.md, "PCR 7: Secure Boot").

What UEFI firmware measures into PCR 7 (TCG PC Client PFP, 3.3.4.8 and 10.4.4): each of the
Secure Boot variables SecureBoot, PK, KEK, db and dbx as an EV_EFI_VARIABLE_DRIVER_CONFIG event
(its data a UEFI_VARIABLE_DATA: the variable's GUID and name and its value), an EV_SEPARATOR,
then for each image it verified the db entry that verified it (EV_EFI_VARIABLE_AUTHORITY, once
per entry: an EFI_SIGNATURE_DATA, the owner's GUID and the certificate). The policy's
``secure_boot`` section says what must be seen:

    "secure_boot": {"required": true,                # off (or setup mode): policy_secure_boot
                    "pk": "<sha256 of PK's value>", "kek": "...", "db": "...", "dbx": "...",
                    "authorities": ["<sha256 of the fleet's db certificate, DER>"]}

A digest of a variable is the sha256 of its value without attributes, as the agent's efivars
listing and the release gate report it. Every event of PCR 7 is judged: each digest must be the
sha256 of its data (so the data read is what was extended; the log's replay to the quoted PCR
is the verifier's), and an event of another type than those three is refused, never skipped.
Secure Boot off is accepted only where ``required`` is false, and then reported.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from agent.errors import InvalidParameters
from agent.gateway.verifier import eventlog
from agent.gateway.verifier.refused import PolicyFailed

EFI_GLOBAL_VARIABLE = uuid.UUID("8be4df61-93ca-11d2-aa0d-00e098032b8c")
IMAGE_SECURITY_DATABASE = uuid.UUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")
# The variables measured as Secure Boot's configuration, and where each lives.
CONFIG = {"SecureBoot": EFI_GLOBAL_VARIABLE, "PK": EFI_GLOBAL_VARIABLE, "KEK": EFI_GLOBAL_VARIABLE,
          "db": IMAGE_SECURITY_DATABASE, "dbx": IMAGE_SECURITY_DATABASE}
KEYS = ("pk", "kek", "db", "dbx")
SIGNATURE_OWNER_BYTES = 16


@dataclass(frozen=True)
class Variable:
    guid: uuid.UUID
    name: str
    value: bytes


def parse_variable(data: bytes) -> Variable:
    """A UEFI_VARIABLE_DATA: GUID, UINT64 name length (characters), UINT64 value length, the
    name (UTF-16LE), the value."""
    if len(data) < 32:
        raise ValueError(f"{len(data)} bytes, shorter than a UEFI_VARIABLE_DATA header")
    guid = uuid.UUID(bytes_le=data[:16])
    name_chars, value_len = struct.unpack_from("<QQ", data, 16)
    end = 32 + 2 * name_chars
    if name_chars > 256 or end + value_len != len(data):
        raise ValueError(f"lengths {name_chars}, {value_len} do not fit its {len(data)} bytes")
    name = data[32:end].decode("utf-16-le", "strict")
    return Variable(guid, name, data[end:])


@dataclass(frozen=True)
class SecureBootPolicy:
    required: bool
    keys: dict[str, bytes]           # "pk" | "kek" | "db" | "dbx" -> sha256 of its value
    authorities: frozenset[bytes]    # sha256 of each accepted db certificate (DER)

    @classmethod
    def from_json(cls, doc: Any, source: str = "policy") -> SecureBootPolicy:
        where = f"{source}: secure_boot"
        if not isinstance(doc, dict):
            raise InvalidParameters(f"{where} is a JSON object")
        unknown = set(doc) - {"required", *KEYS, "authorities"}
        if unknown:
            raise InvalidParameters(f"{where}: unknown keys {sorted(unknown)}")
        required = doc.get("required", True)
        if not isinstance(required, bool):
            raise InvalidParameters(f"{where}.required is true or false")
        keys = {k: sha256_hex(doc[k], f"{where}.{k}") for k in KEYS if k in doc}
        authorities = doc.get("authorities", [])
        if not isinstance(authorities, list):
            raise InvalidParameters(f"{where}.authorities is a list of sha256 digests")
        return cls(required, keys, frozenset(sha256_hex(a, f"{where}.authorities") for a in authorities))

    def to_json(self) -> dict[str, Any]:
        return {"required": self.required, **{k: v.hex() for k, v in sorted(self.keys.items())},
                "authorities": sorted(a.hex() for a in self.authorities)}


def sha256_hex(value: Any, where: str) -> bytes:
    """A policy file's SHA-256 digest, 64 hex digits; InvalidParameters naming ``where``."""
    try:
        out = bytes.fromhex(str(value))
    except ValueError:
        out = b""
    if len(out) != 32:
        raise InvalidParameters(f"{where}: {value!r} is no SHA-256 digest (64 hex digits)")
    return out


def judge(log_: eventlog.EventLog, policy: SecureBootPolicy) -> dict[str, str]:
    """What PCR 7's events show, as the verdict's matched fields; PolicyFailed names the first
    check that did not hold."""
    config: dict[str, bytes] = {}
    authorities: list[bytes] = []
    separated = False
    for ev in log_.of(7):
        if ev.type == eventlog.Ev.NO_ACTION:
            continue                                  # never extended
        if ev.sha256 != hashlib.sha256(ev.data).digest():
            raise PolicyFailed("policy_pcr7", f"PCR 7 event {ev.type:#x}: its digest is not of its data")
        if ev.type == eventlog.Ev.SEPARATOR:
            separated = True
            continue
        if ev.type not in (eventlog.Ev.EFI_VARIABLE_DRIVER_CONFIG, eventlog.Ev.EFI_VARIABLE_AUTHORITY):
            raise PolicyFailed("policy_pcr7", f"PCR 7 holds an event of type {ev.type:#x}, which this "
                             "verifier does not judge")
        try:
            var = parse_variable(ev.data)
        except ValueError as exc:
            raise PolicyFailed("policy_pcr7",
                               f"PCR 7 event {ev.type:#x}: not a UEFI variable: {exc}") from None
        if ev.type == eventlog.Ev.EFI_VARIABLE_DRIVER_CONFIG:
            if separated or CONFIG.get(var.name) != var.guid or var.name in config:
                raise PolicyFailed("policy_pcr7", f"PCR 7: configuration variable {var.name} "
                                 f"({var.guid}) out of place")
            config[var.name] = var.value
        else:
            if not separated or (var.name, var.guid) != ("db", IMAGE_SECURITY_DATABASE):
                raise PolicyFailed("policy_secure_boot", f"an image was verified by an entry of "
                                 f"{var.name} ({var.guid}), not of db")
            if len(var.value) <= SIGNATURE_OWNER_BYTES:
                raise PolicyFailed("policy_pcr7", "PCR 7: an authority without a signature")
            authorities.append(hashlib.sha256(var.value[SIGNATURE_OWNER_BYTES:]).digest())
    on = config.get("SecureBoot") == b"\x01"
    if not on:
        if policy.required:
            state = "absent" if "SecureBoot" not in config else config["SecureBoot"].hex() or "empty"
            setup = "; no PK: the platform is in setup mode" if "PK" in config and not config["PK"] else ""
            raise PolicyFailed("policy_secure_boot", f"Secure Boot is off (SecureBoot {state}{setup}); "
                             "the policy requires it")
        return {"secure_boot": "off"}
    if not config.get("PK"):
        raise PolicyFailed("policy_secure_boot", "no PK: the platform is in setup mode")
    for key in KEYS:
        want = policy.keys.get(key)
        name = {"pk": "PK", "kek": "KEK"}.get(key, key)
        found = hashlib.sha256(config.get(name, b"")).digest() if name in config else None
        if want is not None and found != want:
            raise PolicyFailed("policy_secure_boot", f"{name} is {found.hex() if found else 'not measured'}, "
                             f"the policy says {want.hex()}")
    if policy.authorities:
        if not authorities:
            raise PolicyFailed("policy_secure_boot", "no image was verified by a db certificate")
        foreign = [a for a in authorities if a not in policy.authorities]
        if foreign:
            raise PolicyFailed("policy_secure_boot", f"an image was verified by db entry {foreign[0].hex()}, "
                             "not the fleet's certificate")
    return {"secure_boot": "on", "authorities": ",".join(sorted({a.hex() for a in authorities}))}
