"""efivars.enroll_keys: the fleet's authenticated writes carried to the node and written through
efivarfs, db, dbx and KEK first and PK last, read back; refused, nothing written, where the
firmware would refuse one. The firmware is a fake here (what edk2's AuthVariableLib does with a
time-based write: the header stripped, the value kept, SetupMode 0 once a PK is in); QEMU's OVMF
does it for real in tests/e2e/test_release.py."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.drivers.efivars import enroll_keys
from agent.errors import AgentError, InvalidParameters, Reason, Unsupported
from agent.hw import efivars, uefi_auth
from agent.proto import agent_pb2
from tests.commands.test_driver import request
from tests.hw.test_uefi_auth import OWNER, Key


class Firmware(efivars.Efivars):
    """efivarfs over a firmware that keeps a time-based write's value (what a test's directory
    of files cannot do), records the order of writes, and leaves setup mode at a PK."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.written: list[str] = []

    def write(self, name: str, value: bytes, attributes: int = efivars.ATTRS_NV_BS_RT,
              guid: str = efivars.GLOBAL) -> None:
        assert attributes == 0x27
        self.written.append(name)
        super().write(name, uefi_auth.parse(value).value, attributes, guid)
        if name == "PK":
            super().write("SetupMode", b"\0", 0x6)


@pytest.fixture(scope="module")
def keys() -> dict[str, Key]:
    return {name: Key(name) for name in ("pk", "kek", "db", "tenant")}


def node(tmp_path: Path, keys: dict[str, Key], *, setup_mode: bool) -> Path:
    """efivarfs as a tenant left it: the fleet's KEK, the tenant's certificate in db beside the
    fleet's, and the PK deleted (setup mode) or the fleet's."""
    directory = tmp_path / "sys/firmware/efi/efivars"
    directory.mkdir(parents=True)
    v = efivars.Efivars(directory)
    v.write("SetupMode", bytes([setup_mode]), 0x6)
    v.write("SecureBoot", b"\0", 0x6)
    v.write("KEK", uefi_auth.x509_list(keys["kek"].cert, OWNER), 0x27)
    db = uefi_auth.x509_list(keys["db"].cert, OWNER) + uefi_auth.x509_list(keys["tenant"].cert, OWNER)
    v.write("db", db, 0x27, efivars.IMAGE_SECURITY)
    if not setup_mode:
        v.write("PK", uefi_auth.x509_list(keys["pk"].cert, OWNER), 0x27)
    return directory


def fleet(keys: dict[str, Key]) -> dict[str, bytes]:
    """The fleet's writes as its key holder makes them: db by the KEK, KEK and PK by the PK."""
    return {"db": keys["kek"].write("db", uefi_auth.x509_list(keys["db"].cert, OWNER)),
            "KEK": keys["pk"].write("KEK", uefi_auth.x509_list(keys["kek"].cert, OWNER)),
            "PK": keys["pk"].write("PK", uefi_auth.x509_list(keys["pk"].cert, OWNER))}


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_in_setup_mode_db_kek_then_pk_are_written_and_read_back(tmp_path: Path, keys: dict[str, Key]) -> None:
    v = Firmware(node(tmp_path, keys, setup_mode=True))
    writes = fleet(keys)
    report = enroll_keys(v, writes)
    assert v.written == ["db", "KEK", "PK"] and report["written"] == ["db", "KEK", "PK"]
    assert report["setup_mode"] == 0 and v.flag("SetupMode") == 0
    for name in ("db", "KEK", "PK"):
        assert report[f"{name.lower()}_sha256"] == uefi_auth.parse(writes[name]).value_sha256
    assert v.value("db", efivars.IMAGE_SECURITY) == uefi_auth.x509_list(keys["db"].cert, OWNER)


def test_a_write_not_signed_as_the_firmware_checks_it_is_refused_with_nothing_written(
        tmp_path: Path, keys: dict[str, Key]) -> None:
    directory = node(tmp_path, keys, setup_mode=True)
    before = files(directory)
    v = Firmware(directory)
    good = fleet(keys)
    tenant_pk = keys["tenant"].write("PK", uefi_auth.x509_list(keys["pk"].cert, OWNER))   # not self-signed
    kek_by_tenant = keys["tenant"].write("KEK", uefi_auth.x509_list(keys["kek"].cert, OWNER))
    db_by_pk = keys["pk"].write("db", uefi_auth.x509_list(keys["db"].cert, OWNER))
    for writes, why in (({**good, "PK": tenant_pk}, "the PK write is not signed by its own certificate"),
                        ({**good, "KEK": kek_by_tenant},
                         "the KEK write is not signed by the PK given with it"),
                        ({**good, "db": db_by_pk}, "the db write is not signed by the KEK given with it"),
                        ({"KEK": good["KEK"]}, r"not signed by the enrolled PK \(there is none\)")):
        with pytest.raises(Unsupported, match=why) as refused:
            enroll_keys(v, writes)
        assert refused.value.details["refused"] == "unsigned_for_this_mode"
    assert v.written == [] and files(directory) == before
    # db alone in setup mode: checked with the KEK enrolled (the fleet's here).
    assert enroll_keys(v, {"db": good["db"]})["written"] == ["db"]


def test_in_user_mode_only_an_update_the_enrolled_keys_signed_is_written(tmp_path: Path,
                                                                        keys: dict[str, Key]) -> None:
    directory = node(tmp_path, keys, setup_mode=False)
    v = Firmware(directory)
    # A tenant's PK enrolled: the fleet's KEK write (signed by the fleet's PK) is refused.
    v.write("PK", keys["tenant"].write("PK", uefi_auth.x509_list(keys["tenant"].cert, OWNER)), 0x27)
    v.written.clear()
    before = files(directory)
    with pytest.raises(Unsupported, match=r"not signed by the enrolled PK; in user mode .* firmware's setup"):
        enroll_keys(v, fleet(keys))
    assert v.written == [] and files(directory) == before
    # A PK whose value is no signature lists holds no certificate: nothing can be checked with it.
    efivars.Efivars(directory).write("PK", b"not a signature list", 0x27)
    with pytest.raises(Unsupported, match=r"not signed by the enrolled PK \(there is none\)"):
        enroll_keys(v, fleet(keys))
    # The fleet's own PK enrolled: db (by the enrolled KEK) and KEK (by the enrolled PK) are an update.
    v.write("PK", keys["pk"].write("PK", uefi_auth.x509_list(keys["pk"].cert, OWNER)), 0x27)
    v.written.clear()
    writes = fleet(keys)
    report = enroll_keys(v, {"db": writes["db"], "KEK": writes["KEK"]})
    assert report["written"] == ["db", "KEK"] and report["setup_mode"] == 0
    assert report["db_sha256"] == uefi_auth.parse(writes["db"]).value_sha256


def test_the_operation_refuses_bad_input_before_anything_is_written(tmp_path: Path,
                                                                   keys: dict[str, Key]) -> None:
    directory = node(tmp_path, keys, setup_mode=True)
    before = files(directory)
    handler = DriverInvoke()
    handler.root = tmp_path
    good = {name.lower(): base64.b64encode(w).decode() for name, w in fleet(keys).items()}

    def run(**arguments: str) -> agent_pb2.DriverInvokeResult:
        result = handler.run(Context.local("driver.invoke"), handler.parse(request("efivars", "enroll_keys",
                                                                                   **arguments)))
        assert isinstance(result, agent_pb2.DriverInvokeResult)
        return result

    with pytest.raises(InvalidParameters, match="give the fleet's authenticated writes"):
        run()
    with pytest.raises(InvalidParameters, match="does not match"):
        run(db="not base64!")
    with pytest.raises(InvalidParameters, match="takes no argument 'boot0001'"):
        run(boot0001=good["db"])
    with pytest.raises(InvalidParameters, match=r"the PK write: .*shorter"):
        run(**{**good, "pk": base64.b64encode(b"\0" * 20).decode()})
    with pytest.raises(InvalidParameters, match=r"the KEK write: .*signature list"):
        run(**{**good, "kek": base64.b64encode(fleet(keys)["KEK"] + b"\0").decode()})
    two = keys["pk"].write("PK", uefi_auth.x509_list(keys["pk"].cert, OWNER) * 2)
    with pytest.raises(InvalidParameters, match="one certificate, and only one"):
        run(**{**good, "pk": base64.b64encode(two).decode()})
    assert files(directory) == before
    # A plain directory is no firmware: db is written whole, and reads back as what it is not.
    with pytest.raises(AgentError, match="db reads back sha256") as failed:
        run(**good)
    assert failed.value.reason == Reason.TOOL_FAILED and failed.value.details["written"] == ""
    assert handler.parse(request("efivars", "enroll_keys", **good)).tail == ("enroll_keys", "db", "kek", "pk")
    no_setup_mode = tmp_path / "bare"
    (no_setup_mode / "sys/firmware/efi/efivars").mkdir(parents=True)
    (no_setup_mode / "sys/firmware/efi/efivars" / f"BootOrder-{efivars.GLOBAL}").write_bytes(
        struct.pack("<IH", 7, 1))
    handler.root = no_setup_mode
    with pytest.raises(Unsupported, match="no UEFI Secure Boot"):
        run(**good)
