"""PCR 7 judged event by event (agent/gateway/verifier/pcr7.py), on event logs written as OVMF's Secure
Boot build writes them (tests/tpmsim.py's writer): Secure Boot on with the fleet's keys and its
db certificate as the authority passes; off, setup mode, a swapped PK, a foreign db authority, an
event whose digest is not of its data and an event of another kind are each refused by name; off
is reported where the policy does not require it. Through the policy file too (its
``secure_boot`` section, ``policy_secure_boot``)."""

from __future__ import annotations

import hashlib
import struct
import uuid
from typing import Any

import pytest

from agent.errors import InvalidParameters
from agent.gateway.verifier import eventlog, pcr7
from agent.gateway.verifier.policy import Policy
from agent.gateway.verifier.refused import PolicyFailed
from tests.tpmsim import Ev, ev, event_log, image

OWNER = uuid.UUID("8b1f9c52-3d4e-4a6b-9e21-6c0d5f7a1b33")
FLEET_CERT = b"0\x82 the fleet's db certificate (DER)"
OTHER_CERT = b"0\x82 another db certificate (DER)"
PK, KEK = b"PK signature list", b"KEK signature list"
DB = b"db signature list: " + FLEET_CERT
DBX = b"dbx signature list"


def var(name: str, value: bytes) -> bytes:
    guid = pcr7.CONFIG.get(name, pcr7.IMAGE_SECURITY_DATABASE)
    return guid.bytes_le + struct.pack("<QQ", len(name), len(value)) + name.encode("utf-16-le") + value


def boot(*, secure_boot: bytes = b"\x01", pk: bytes = PK, authority: bytes | None = FLEET_CERT,
         extra: list[tuple[int, int, bytes, bytes]] | None = None) -> list[tuple[int, int, bytes, bytes]]:
    events = [ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, var("SecureBoot", secure_boot)),
              ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, var("PK", pk)),
              ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, var("KEK", KEK)),
              ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, var("db", DB)),
              ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, var("dbx", DBX)),
              *[ev(pcr, Ev.SEPARATOR, bytes(4)) for pcr in range(8)],
              *(extra or [])]
    if authority is not None:
        events.append(ev(7, Ev.EFI_VARIABLE_AUTHORITY, var("db", OWNER.bytes_le + authority)))
    events.append(ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), hashlib.sha256(b"ramdisk uki").digest()))
    return events


def policy(**kw: Any) -> pcr7.SecureBootPolicy:
    doc: dict[str, Any] = {"required": True, "pk": hashlib.sha256(PK).hexdigest(),
                           "kek": hashlib.sha256(KEK).hexdigest(), "db": hashlib.sha256(DB).hexdigest(),
                           "dbx": hashlib.sha256(DBX).hexdigest(),
                           "authorities": [hashlib.sha256(FLEET_CERT).hexdigest()]}
    doc.update(kw)
    return pcr7.SecureBootPolicy.from_json({k: v for k, v in doc.items() if v is not None})


def judge(events: list[tuple[int, int, bytes, bytes]], pol: pcr7.SecureBootPolicy) -> dict[str, str]:
    return pcr7.judge(eventlog.parse(event_log(events)), pol)


def refused(events: list[tuple[int, int, bytes, bytes]], pol: pcr7.SecureBootPolicy) -> PolicyFailed:
    with pytest.raises(PolicyFailed) as info:
        judge(events, pol)
    return info.value


def test_secure_boot_on_with_the_fleets_keys_and_authority_passes() -> None:
    assert judge(boot(), policy()) == {"secure_boot": "on",
                                       "authorities": hashlib.sha256(FLEET_CERT).hexdigest()}


def test_secure_boot_off_is_refused_when_required_and_reported_when_not() -> None:
    e = refused(boot(secure_boot=b"\x00", authority=None), policy())
    assert e.check == "policy_secure_boot" and "Secure Boot is off" in e.reason
    assert judge(boot(secure_boot=b"\x00", authority=None), policy(required=False)) == {"secure_boot": "off"}


def test_setup_mode_is_refused() -> None:
    e = refused(boot(secure_boot=b"\x00", pk=b"", authority=None), policy())
    assert e.check == "policy_secure_boot" and "setup mode" in e.reason
    e = refused(boot(pk=b""), policy(pk=None))
    assert e.check == "policy_secure_boot" and "setup mode" in e.reason


def test_a_swapped_pk_is_refused() -> None:
    e = refused(boot(pk=b"a tenant's PK"), policy())
    assert e.check == "policy_secure_boot" and e.reason.startswith("PK is ")
    assert judge(boot(pk=b"a tenant's PK"), policy(pk=None))["secure_boot"] == "on"   # not judged


def test_a_foreign_db_authority_is_refused() -> None:
    e = refused(boot(authority=OTHER_CERT), policy())
    assert e.check == "policy_secure_boot" and hashlib.sha256(OTHER_CERT).hexdigest() in e.reason
    e = refused(boot(authority=None), policy())
    assert e.check == "policy_secure_boot" and "no image was verified" in e.reason


def test_every_event_is_judged() -> None:
    # A digest that is not of its data: the data read would not be what was extended.
    tampered = boot()
    pcr, kind, _, data = tampered[0]
    tampered[0] = (pcr, kind, hashlib.sha256(var("SecureBoot", b"\x00")).digest(), data)
    assert refused(tampered, policy()).check == "policy_pcr7"
    # An event of a kind PCR 7 should not hold is refused, not skipped.
    odd = boot(extra=[ev(7, Ev.EFI_ACTION, b"UEFI Debug Mode")])
    assert refused(odd, policy()).check == "policy_pcr7"
    # A configuration variable measured after the separator, or twice.
    late = boot(extra=[ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, var("SecureBoot", b"\x01"))])
    assert refused(late, policy()).check == "policy_pcr7"
    # An authority from another database than db (shim's MokList).
    mok = boot(authority=None, extra=[ev(7, Ev.EFI_VARIABLE_AUTHORITY,
                                         var("MokList", OWNER.bytes_le + FLEET_CERT))])
    assert refused(mok, policy()).check == "policy_secure_boot"


def test_bad_policy_sections_are_named() -> None:
    for bad in ({"required": "yes"}, {"pk": "00"}, {"authorities": "ab" * 32}, {"nope": 1}, []):
        with pytest.raises(InvalidParameters, match="secure_boot"):
            pcr7.SecureBootPolicy.from_json(bad)


def test_the_policy_file_judges_pcr7_where_it_has_a_secure_boot_section() -> None:
    uki = hashlib.sha256(b"ramdisk uki").hexdigest()
    doc = {"builds": [{"build_id": "b1", "pcr4": [uki]}], "learn": "first",
           "secure_boot": policy().to_json()}
    pol = Policy.from_json(doc)
    assert pol.to_json()["secure_boot"] == doc["secure_boot"]
    good = eventlog.parse(event_log(boot()))
    matched = pol.judge(good, good.replay(), profile="QEMU")
    assert matched["secure_boot"] == "on" and matched["build"] == "b1"
    off = eventlog.parse(event_log(boot(secure_boot=b"\x00", authority=None)))
    with pytest.raises(PolicyFailed) as info:
        pol.judge(off, off.replay(), profile="QEMU")
    assert info.value.check == "policy_secure_boot"
    # Without the section PCR 7 is the hardware profile's one value, as before.
    plain = Policy.from_json({k: v for k, v in doc.items() if k != "secure_boot"})
    assert "secure_boot" not in plain.judge(off, off.replay(), profile="QEMU")
