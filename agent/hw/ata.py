"""ATA Security Erase through hdparm: support, frozen state, and the erase itself.

``hdparm -I`` prints the drive's security state (the Security: section); a drive that is
"frozen" (the BIOS sent SECURITY FREEZE LOCK at boot) refuses every security command until a
power cycle or a suspend/resume, so an erase is refused with UNSUPPORTED and that advice.
The erase sets a temporary user password ("NULL"), then runs SECURITY ERASE UNIT (enhanced
when asked), which also clears the password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import Unsupported
from agent.hw.nvme import Runner

PASSWORD = "NULL"  # noqa: S105  (a throwaway password: the erase clears it)


@dataclass(frozen=True)
class Security:
    supported: bool
    enabled: bool
    locked: bool
    frozen: bool
    enhanced: bool
    minutes: int            # the drive's estimate for the erase asked (0 if unknown)
    enhanced_minutes: int


def parse_identify(text: str) -> Security:
    """The Security: section of ``hdparm -I``."""
    section = text.split("Security:", 1)[1] if "Security:" in text else ""
    section = re.split(r"\n\S", section, maxsplit=1)[0]  # up to the next top-level heading
    lines = [line.strip() for line in section.splitlines()]

    def state(word: str) -> bool | None:
        for line in lines:
            parts = line.split()
            if parts == [word]:
                return True
            if parts == ["not", word]:
                return False
        return None

    times = re.search(r"(\d+)min for SECURITY ERASE UNIT\.\s*(\d+)min for ENHANCED", section)
    return Security(
        supported=state("supported") is True,
        enabled=state("enabled") is True,
        locked=state("locked") is True,
        frozen=state("frozen") is True,
        enhanced="supported: enhanced erase" in section,
        minutes=int(times.group(1)) if times else 0,
        enhanced_minutes=int(times.group(2)) if times else 0,
    )


def identify(run: Runner, device: str) -> Security:
    return parse_identify(run(["hdparm", "-I", device]).text)


def erase(run: Runner, device: str, *, enhanced: bool, timeout: float) -> None:
    sec = identify(run, device)
    if not sec.supported:
        raise Unsupported(f"{device}: no ATA security feature set")
    if sec.frozen:
        raise Unsupported(
            f"{device}: security is frozen (set by the firmware at boot); suspend and resume the"
            " machine or re-plug the drive, then retry",
        )
    if sec.locked:
        raise Unsupported(f"{device}: security is locked with an unknown password")
    if enhanced and not sec.enhanced:
        raise Unsupported(f"{device}: enhanced security erase not supported")
    run(["hdparm", "--user-master", "u", "--security-set-pass", PASSWORD, device])
    flag = "--security-erase-enhanced" if enhanced else "--security-erase"
    run(["hdparm", "--user-master", "u", flag, PASSWORD, device], timeout=timeout)
