"""The release gate's BIOS area (checked at the site): each attribute's current and pending value."""

from __future__ import annotations

import json
from typing import Any

from agent.policy.release.findings import Found, bmc_remedy
from agent.policy.release.state import BmcObserved


def check_bios(seen: BmcObserved, out: Found) -> None:
    if seen.bios is None:
        why = seen.unread.get("bios", "not read")
        out.add("bios.unreadable", "BIOS attributes", "unreadable", "bios",
                f"the BIOS attributes cannot be read: {why}")
        return
    for v in seen.bios:
        if not v.registered:
            out.add("bios.unknown_attribute", "in the AttributeRegistry", "unknown", v.name,
                    f"BIOS attribute {v.name} is not in the BMC's AttributeRegistry: the baseline is "
                    "not this BIOS's")
            continue
        if v.invalid:
            out.add("bios.invalid_value", "a value of its type", v.invalid, v.name,
                    f"BIOS attribute {v.name}: the baseline's value does not fit the registry: {v.invalid}")
            continue
        pending_differs = v.pending is not None and v.pending != v.expected
        if v.current == v.expected and not pending_differs:
            continue
        found = f"current {_shown(v.current)}"
        if v.pending is not None:
            found += f", pending {_shown(v.pending)}"
        out.add("bios.attribute", _shown(v.expected), found, v.name,
                f"BIOS attribute {v.name} is {found}, the baseline's {_shown(v.expected)}"
                + ("; set back, it takes effect at the next reset" if v.pending == v.expected else ""),
                bmc_remedy("bmc.firmware", "set_bios", attributes=json.dumps({v.name: v.expected})))


def _shown(value: Any) -> str:
    if value is None:
        return "(absent)"
    return str(value).lower() if isinstance(value, bool) else str(value)
