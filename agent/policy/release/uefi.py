"""The release gate's UEFI area: Secure Boot, its databases, the boot entries and order, MOR."""

from __future__ import annotations

from agent.hw import efivars
from agent.policy.release.findings import Found, invoke
from agent.policy.release.state import Observed, Uefi


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
    for check, want, have in (("uefi.secure_boot", e.secure_boot, u.secure_boot),
                              ("uefi.setup_mode", e.setup_mode, u.setup_mode)):
        if want is not None and bool(have) != want:
            out.add(check, int(want), "absent" if have is None else have, check.split(".")[1],
                    f"{check.split('.')[1]} is {have}, the baseline's {int(want)}")
    for name, want_digest in sorted(e.digests.items()):
        have_digest = u.digests.get(name, efivars.ABSENT)
        if have_digest != want_digest:
            out.add(f"uefi.{name}", want_digest, have_digest, name,
                    f"the Secure Boot variable {name} differs from the baseline's "
                    f"(sha256 {have_digest[:16]})")
    if e.memory_overwrite is not None and u.memory_overwrite != e.memory_overwrite:
        out.add("uefi.memory_overwrite", e.memory_overwrite,
                "absent" if u.memory_overwrite is None else u.memory_overwrite,
                "MemoryOverwriteRequestControl",
                f"MemoryOverwriteRequestControl is {u.memory_overwrite}, the baseline's {e.memory_overwrite}",
                invoke("efivars", "set_memory_overwrite", value=e.memory_overwrite))
