"""efivars: UEFI boot entries, BootOrder and the memory-overwrite request, in the agent itself.

efibootmgr's work done through efivarfs (agent.hw.efivars), so the ramdisk needs no tool and a
test needs no firmware: ``root``/sys/firmware/efi/efivars is the directory acted on. The
release's remedies (agent.policy.release) name these operations.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from agent.drivers.base import Arg, ArgType, Driver, Operation, Settings, Values, register
from agent.errors import Unsupported
from agent.hw import efivars

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


def _set_mor(values: Values, root: Path, _settings: Settings) -> str:
    variables(root).write("MemoryOverwriteRequestControl", bytes([int(values["value"])]),
                          guid=efivars.MOR)
    return f"MemoryOverwriteRequestControl {values['value']}\n"


DRIVER = register(
    Driver(
        name="efivars",
        tool="",
        description="UEFI variables through efivarfs, in the agent: boot entries, load orders, MOR, "
                    "a variable deleted",
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
                Operation("set_memory_overwrite", "MemoryOverwriteRequestControl (1: clear memory at reset)",
                          build=lambda v: ["set_memory_overwrite", str(v["value"])],
                          args=(Arg("value", ArgType.INT, minimum=0, maximum=1),),
                          changes_state=True, local=_set_mor),
            )
        },
    )
)
