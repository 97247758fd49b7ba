"""The release gate's NIC area: each NIC's firmware configuration against its profile."""

from __future__ import annotations

import re

from agent.policy.release.findings import Found, invoke
from agent.policy.release.state import NicProfile, Observed


def same_value(a: str, b: str) -> bool:
    """mlxconfig's "True(1)" is "1" is "True"; "ETH(2)" is "2": by the number in brackets."""
    def key(value: str) -> str:
        bracket = re.fullmatch(r"[^()]*\((\d+)\)", value.strip())
        text = bracket.group(1) if bracket else value.strip().lower()
        return {"true": "1", "false": "0"}.get(text, text)
    return key(a) == key(b)


def _set_value(value: str) -> str:
    bracket = re.fullmatch(r"[^()]*\((\d+)\)", value)
    return bracket.group(1) if bracket else value


def check_nics(profiles: tuple[NicProfile, ...], seen: Observed, out: Found) -> None:
    for nic in seen.nics:
        profile = next((p for p in profiles if p.matches(nic.ids)), None)
        if profile is None:
            continue
        if profile.firmware_version and nic.firmware_version != profile.firmware_version:
            out.add("nic.firmware_version", profile.firmware_version, nic.firmware_version or "(unknown)",
                    nic.address, f"NIC {nic.address} runs firmware {nic.firmware_version or '(unknown)'}, "
                    f"the profile's is {profile.firmware_version}")
        if not profile.config:
            continue
        if nic.error:
            out.add("nic.unreadable", "configuration", "unreadable", nic.address,
                    f"NIC {nic.address}: its firmware configuration cannot be read: {nic.error}")
            continue
        for name, want in sorted(profile.config.items()):
            current, next_boot = nic.settings.get(name, ("absent", "absent"))
            if same_value(current, want) and same_value(next_boot, want):
                continue
            remedy = None
            if nic.tool and name in nic.settings and "[" not in name:
                remedy = invoke(nic.tool, "set", device=nic.address, parameter=name, value=_set_value(want))
            out.add("nic.config", want, f"current {current}, next boot {next_boot}", f"{nic.address} {name}",
                    f"NIC {nic.address}: {name} is {current} (next boot {next_boot}), the profile's {want}",
                    remedy)
