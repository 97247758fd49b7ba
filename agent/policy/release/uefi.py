"""The release gate's UEFI area: Secure Boot, its databases, the boot entries and order, MOR.

Secure Boot's keys are put back from the node only while its firmware is in setup mode (no PK):
then each of ``uefi.setup_mode``, ``uefi.secure_boot`` and ``uefi.pk``/``kek``/``db``/``dbx`` has
the remedy ``efivars.enroll_keys`` (ENROLL_KEYS) with no arguments: the control plane adds the
fleet's authenticated writes (pk, kek, db, dbx, base64; signed offline by its key holder,
``agent uefi-payload``) before it signs and sends it, once for all of them. The PK it writes ends
setup mode, and edk2 enforces the keys from the next boot. In user mode the keys are reported for
an operator: a PK that is not the fleet's is replaced only at the firmware's setup or through the
BMC (agent/site/bmc/secure_boot.py), and a switch turned off is the firmware's.
"""

from __future__ import annotations

from agent.hw import efivars
from agent.policy.release.findings import Found, invoke
from agent.policy.release.state import Observed, Uefi

ENROLL_KEYS = invoke("efivars", "enroll_keys")   # the control plane adds the fleet's writes
_SETUP_MODE_FIX = " (setup mode: efivars.enroll_keys with the fleet's signed writes puts the keys back)"


def _hex(numbers: tuple[int, ...] | list[int] | None) -> str:
    return ",".join(f"{n:04X}" for n in numbers or ())


def check_uefi(e: Uefi, seen: Observed, out: Found) -> None:
    u = seen.uefi
    if u is None:
        out.add("uefi.unreadable", "UEFI variables", seen.unread.get("uefi", "none"), "",
                f"UEFI variables cannot be read: {seen.unread.get('uefi', 'no efivarfs')}")
        return
    if e.boot_entries:
        for number, entry in sorted(u.boot_entries.items()):
            name = efivars.boot_name(number)
            if number not in e.boot_entries:
                out.add("uefi.boot_entry", "absent", entry.sha256, name,
                        f"{name} ({entry.description or 'no description'}) is not in the baseline",
                        invoke("efivars", "delete_boot_entry", entry=f"{number:04X}"))
            elif entry.sha256 != e.boot_entries[number]:
                out.add("uefi.boot_entry", e.boot_entries[number], entry.sha256, name,
                        f"{name} was changed: now {entry.description or 'no description'!r}")
        for number in sorted(set(e.boot_entries) - set(u.boot_entries)):
            name = efivars.boot_name(number)
            out.add("uefi.boot_entry", e.boot_entries[number], "absent", name,
                    f"{name} ({e.descriptions.get(number) or 'baseline entry'}) is missing")
    if e.boot_order and tuple(u.boot_order or ()) != e.boot_order:
        out.add("uefi.boot_order", _hex(e.boot_order), _hex(u.boot_order), "BootOrder",
                f"BootOrder is {_hex(u.boot_order) or '(none)'}, the baseline's {_hex(e.boot_order)}",
                invoke("efivars", "set_boot_order", order=_hex(e.boot_order)))
    # In setup mode the ramdisk can enroll the fleet's keys; in user mode only their owner can.
    in_setup = u.setup_mode == 1
    enroll, why = (ENROLL_KEYS, _SETUP_MODE_FIX) if in_setup else (None, "")
    for check, want, have in (("uefi.secure_boot", e.secure_boot, u.secure_boot),
                              ("uefi.setup_mode", e.setup_mode, u.setup_mode)):
        if want is not None and bool(have) != want:
            out.add(check, int(want), "absent" if have is None else have, check.split(".")[1],
                    f"{check.split('.')[1]} is {have}, the baseline's {int(want)}" + why, enroll)
    for name, want_digest in sorted(e.digests.items()):
        have_digest = u.digests.get(name, efivars.ABSENT)
        if have_digest != want_digest:
            out.add(f"uefi.{name}", want_digest, have_digest, name,
                    f"the Secure Boot variable {name} differs from the baseline's "
                    f"(sha256 {have_digest[:16]})" + (why or "; in user mode: an operator, or an update "
                                                      "the fleet's enrolled keys signed"), enroll)
    if e.memory_overwrite is not None and u.memory_overwrite != e.memory_overwrite:
        out.add("uefi.memory_overwrite", e.memory_overwrite,
                "absent" if u.memory_overwrite is None else u.memory_overwrite,
                "MemoryOverwriteRequestControl",
                f"MemoryOverwriteRequestControl is {u.memory_overwrite}, the baseline's {e.memory_overwrite}",
                invoke("efivars", "set_memory_overwrite", value=e.memory_overwrite))
