"""efivars: UEFI boot entries, BootOrder, the memory-overwrite request and the Secure Boot keys,
in the agent itself.

efibootmgr's work done through efivarfs (agent.hw.efivars), so the ramdisk needs no tool and a
test needs no firmware: ``root``/sys/firmware/efi/efivars is the directory acted on. The
release's remedies (agent.policy.release) name these operations.

``enroll_keys`` writes the fleet's PK, KEK, db and dbx from time-based authenticated writes that
the key holder made offline (agent/hw/uefi_auth.py, ``agent uefi-payload``), each given base64:
the ramdisk holds no key, it carries the writes. Every write is parsed and its signature checked
before the first is written, against the key that signs it in the fleet's chain: in setup mode
(SetupMode 1) PK by itself (the one check edk2 makes there), KEK by the PK given with it, db and
dbx by the KEK given with them, each else by the one enrolled (the firmware would take those
unsigned: the check is ours, so nothing the fleet's keys did not sign is written); in user mode
(SetupMode 0) PK and KEK by the enrolled PK, db and dbx by the enrolled KEK, as the firmware
checks them (an update the fleet's own keys signed). Anything else is refused, named, with
nothing written: a tenant's own PK in user mode is replaced only at the firmware's setup or
through the BMC. Then db, dbx, KEK and PK last (the PK ends setup mode), each read back (its
digest the write's value's), and SetupMode 0 after the PK. The firmware enforces the keys from
the next boot (edk2 turns SecureBootEnable on then: a PK enrolled and no SecureBootEnable).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from pathlib import Path

from agent.drivers.base import Arg, ArgType, Driver, Operation, Settings, Values, register
from agent.errors import AgentError, InvalidParameters, Reason, Unsupported
from agent.hw import efivars, uefi_auth

ENTRY = Arg("entry", ArgType.STRING, "a boot entry's number, 4 hex digits (0003)", pattern=r"[0-9A-Fa-f]{4}")
ORDER = Arg("order", ArgType.STRING, "entry numbers in order, comma-separated (0001,0002)",
            pattern=r"[0-9A-Fa-f]{4}(,[0-9A-Fa-f]{4}){0,63}")
VARIABLE = Arg("variable", ArgType.STRING, "a variable as efivarfs names it, Name-GUID",
               pattern=r"[A-Za-z0-9_]{1,64}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SECURE_BOOT_VARIABLES = (("PK", efivars.GLOBAL), ("KEK", efivars.GLOBAL),
                         ("db", efivars.IMAGE_SECURITY), ("dbx", efivars.IMAGE_SECURITY))


def variables(root: Path) -> efivars.Efivars:
    found = efivars.Efivars(root / str(efivars.EFIVARS).lstrip("/"))
    # sysfs makes the directory on a UEFI boot; it is empty until efivarfs is mounted on it.
    if not found.present or not any(found.directory.iterdir()):
        raise Unsupported(f"no UEFI variables under {found.directory} (legacy BIOS boot, or efivarfs "
                          "not mounted)")
    return found


def _list(_: Values, root: Path, _settings: Settings) -> str:
    v = variables(root)
    return json.dumps({
        "boot_entries": [{"number": f"{e.number:04X}", "description": e.description, "sha256": e.sha256}
                         for e in v.boot_entries()],
        "boot_order": [f"{n:04X}" for n in v.boot_order() or ()],
        "secure_boot": v.flag("SecureBoot"), "setup_mode": v.flag("SetupMode"),
        "memory_overwrite_request_control": v.flag("MemoryOverwriteRequestControl", efivars.MOR),
        **{f"{name.lower()}_sha256": v.sha256(name, guid) for name, guid in SECURE_BOOT_VARIABLES},
    }, indent=1)  # fmt: skip


def _delete_entry(values: Values, root: Path, _settings: Settings) -> str:
    number = efivars.parse_number(str(values["entry"]))
    variables(root).delete_boot_entry(number)
    return f"deleted {efivars.boot_name(number)}\n"


def _set_order(values: Values, root: Path, _settings: Settings) -> str:
    order = [int(n, 16) for n in str(values["order"]).split(",")]
    variables(root).set_boot_order(order)
    return "BootOrder " + ",".join(f"{n:04X}" for n in order) + "\n"


def _delete_variable(values: Values, root: Path, _settings: Settings) -> str:
    name, _, guid = str(values["variable"]).partition("-")
    v = variables(root)
    found = v.read(name, guid)
    if found is None:
        return f"{values['variable']}: not there (nothing to delete)\n"
    if found.attributes & efivars.AUTHENTICATED:
        raise Unsupported(f"{name} is an authenticated variable: only a signed write deletes it")
    v.delete(name, guid)
    return f"deleted {values['variable']}\n"


def _set_load_order(values: Values, root: Path, _settings: Settings) -> str:
    name = str(values["variable"])
    order = [int(n, 16) for n in str(values["order"]).split(",") if n]
    variables(root).write(name, b"".join(struct.pack("<H", n) for n in order))
    return f"{name} " + ",".join(f"{n:04X}" for n in order) + "\n"


ENROLL_ORDER = ("db", "dbx", "KEK", "PK")         # PK last: it ends setup mode
_B64 = f"[A-Za-z0-9+/]{{4,{(uefi_auth.MAX_PAYLOAD + 2) // 3 * 4}}}={{0,2}}"
PAYLOADS = tuple(Arg(name.lower(), ArgType.STRING, f"the authenticated write of {name} (base64), "
                     "made offline by the key holder", required=False, pattern=_B64)
                 for name in ENROLL_ORDER)
_BY_ARG = {name.lower(): name for name in ENROLL_ORDER}


def enroll_keys(v: efivars.Efivars, payloads: dict[str, bytes]) -> dict[str, object]:
    """Write the authenticated ``payloads`` (database name -> EFI_VARIABLE_AUTHENTICATION_2 write)
    through ``v``, each checked first (module docstring); what was written and read back."""
    if not payloads:
        raise InvalidParameters("enroll_keys: give the fleet's authenticated writes (pk, kek, db, dbx: "
                                "the control plane's, made offline by the key holder)")
    writes = {}
    for name in ENROLL_ORDER:
        if name in payloads:
            try:
                writes[name] = uefi_auth.parse(payloads[name])
            except InvalidParameters as exc:
                raise InvalidParameters(f"enroll_keys: the {name} write: {exc.message}",
                                        variable=name) from None
    pk = writes.get("PK")
    if pk is not None and [len(sl.entries) for sl in pk.lists] != [1]:
        raise InvalidParameters("enroll_keys: the PK write holds one certificate, and only one",
                                variable="PK")
    setup_mode = v.flag("SetupMode")
    if setup_mode is None:
        raise Unsupported("no SetupMode variable: this firmware has no UEFI Secure Boot")
    enrolled = {name: _certificates(v.value(name, guid) or b"")
                for name, (guid, _) in uefi_auth.DATABASES.items() if name in ("PK", "KEK")}
    for name, write in writes.items():
        signer = uefi_auth.DATABASES[name][1]
        if name == "PK" and setup_mode:
            trusted, whose = uefi_auth.certificates(write.value), "its own certificate"
        elif setup_mode and signer in writes:
            trusted, whose = uefi_auth.certificates(writes[signer].value), f"the {signer} given with it"
        else:
            trusted, whose = enrolled[signer], f"the enrolled {signer}"
        if not uefi_auth.verify(write, name, trusted):
            mode = "setup mode" if setup_mode else "user mode (SetupMode 0)"
            raise Unsupported(
                f"enroll_keys: the {name} write is not signed by {whose}"
                + ("" if trusted else " (there is none)") + f"; in {mode} the firmware would refuse it. "
                "Nothing written" + ("" if setup_mode else ": a PK that is not the fleet's is replaced only "
                                     "at the firmware's setup or through the node's BMC"),
                variable=name, setup_mode=setup_mode, refused="unsigned_for_this_mode")
    done: list[str] = []
    for name, write in writes.items():
        guid = uefi_auth.DATABASES[name][0]
        try:
            v.write(name, payloads[name], attributes=uefi_auth.ATTRIBUTES, guid=guid)
        except AgentError as exc:
            raise AgentError(f"enroll_keys: the firmware refused the {name} write ({exc.message}); "
                             f"written before it: {', '.join(done) or 'nothing'}", reason=Reason.TOOL_FAILED,
                             variable=name, written=",".join(done)) from None
        have = v.sha256(name, guid)
        if have != write.value_sha256:
            raise AgentError(f"enroll_keys: {name} reads back sha256 {have[:16]}, not the write's "
                             f"{write.value_sha256[:16]}; written before it: {', '.join(done) or 'nothing'}",
                             reason=Reason.TOOL_FAILED, variable=name, written=",".join(done))
        done.append(name)
    after = v.flag("SetupMode")
    if pk is not None and after != 0:
        raise AgentError(f"enroll_keys: the PK is written but SetupMode reads {after}, not 0",
                         reason=Reason.TOOL_FAILED, written=",".join(done))
    return {"written": done, "setup_mode": after, "secure_boot": v.flag("SecureBoot"),
            **{f"{name.lower()}_sha256": v.sha256(name, guid) for name, guid in SECURE_BOOT_VARIABLES}}


def _certificates(value: bytes) -> list[bytes]:
    """The certificates an enrolled database holds; none where its value is not signature lists."""
    try:
        return uefi_auth.certificates(value)
    except InvalidParameters:
        return []


def _enroll_keys(values: Values, root: Path, _settings: Settings) -> str:
    payloads = {}
    for arg in PAYLOADS:
        if arg.name in values:
            try:
                payloads[_BY_ARG[arg.name]] = base64.b64decode(str(values[arg.name]), validate=True)
            except binascii.Error:
                raise InvalidParameters(f"enroll_keys: {arg.name} is not base64", argument=arg.name) from None
    return json.dumps(enroll_keys(variables(root), payloads), indent=1) + "\n"


def _set_mor(values: Values, root: Path, _settings: Settings) -> str:
    variables(root).write("MemoryOverwriteRequestControl", bytes([int(values["value"])]),
                          guid=efivars.MOR)
    return f"MemoryOverwriteRequestControl {values['value']}\n"


DRIVER = register(
    Driver(
        name="efivars",
        tool="",
        description="UEFI variables through efivarfs, in the agent: boot entries, load orders, MOR, "
                    "a variable deleted, the Secure Boot keys enrolled",
        install_hint="a UEFI boot with efivarfs mounted on /sys/firmware/efi/efivars",
        operations={
            op.name: op
            for op in (
                Operation("list", "boot entries, BootOrder, Secure Boot state and database digests (JSON)",
                          build=lambda v: ["list"], local=_list),
                Operation("delete_boot_entry", "delete Boot#### and take it out of BootOrder",
                          build=lambda v: ["delete_boot_entry", str(v["entry"])], args=(ENTRY,),
                          changes_state=True, local=_delete_entry),
                Operation("set_boot_order", "write BootOrder",
                          build=lambda v: ["set_boot_order", str(v["order"])], args=(ORDER,),
                          changes_state=True, local=_set_order),
                Operation("delete_variable", "delete one UEFI variable (not an authenticated one)",
                          build=lambda v: ["delete_variable", str(v["variable"])], args=(VARIABLE,),
                          changes_state=True, local=_delete_variable),
                Operation("set_load_order", "write BootOrder, DriverOrder or SysPrepOrder (empty: none)",
                          build=lambda v: ["set_load_order", str(v["variable"]), str(v["order"])],
                          args=(Arg("variable", ArgType.STRING, choices=efivars.LOAD_ORDERS),
                                Arg("order", ArgType.STRING, "entry numbers in order, comma-separated",
                                    pattern=r"([0-9A-Fa-f]{4}(,[0-9A-Fa-f]{4}){0,63})?")),
                          changes_state=True, local=_set_load_order),
                Operation("enroll_keys", "write the fleet's db, dbx, KEK and PK (PK last) from authenticated "
                          "writes signed offline; refused, nothing written, where the firmware would refuse "
                          "one (JSON: what was written and read back)",
                          build=lambda v: ["enroll_keys", *(a.name for a in PAYLOADS if a.name in v)],
                          args=PAYLOADS, changes_state=True, local=_enroll_keys),
                Operation("set_memory_overwrite", "MemoryOverwriteRequestControl (1: clear memory at reset)",
                          build=lambda v: ["set_memory_overwrite", str(v["value"])],
                          args=(Arg("value", ArgType.INT, minimum=0, maximum=1),),
                          changes_state=True, local=_set_mor),
            )
        },
    )
)
