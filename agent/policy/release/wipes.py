"""The release gate's wipes area: a verified erasure certificate of this boot for each named disk."""

from __future__ import annotations

from agent.policy.release.findings import Found
from agent.policy.release.state import Observed
from agent.proto import agent_pb2


def disk_names(cert: agent_pb2.ErasureCertificate) -> set[str]:
    """What names the certificate's disk: serial, WWN, kernel name (the non-empty ones)."""
    d = cert.disk
    return {n for n in (d.serial, d.wwn, d.name) if n}


def certificates_of(disks: tuple[str, ...], certificates: list[agent_pb2.ErasureCertificate]) -> list[int]:
    """The index of the first (newest) certificate of each named disk that has one."""
    chosen: list[int] = []
    for disk in disks:
        i = next((i for i, c in enumerate(certificates) if disk in disk_names(c)), None)
        if i is not None and i not in chosen:
            chosen.append(i)
    return chosen


def check_wipes(disks: tuple[str, ...], seen: Observed, out: Found) -> None:
    refused = (f" (kept results that do not count: {'; '.join(seen.wipes_refused)})"
               if seen.wipes_refused else "")
    for disk in disks:
        if not any(disk in disk_names(c) for c in seen.wipes):
            out.add("wipe.certificate", "verified in this boot", "none", disk,
                    f"disk {disk} has no verified erasure certificate of this boot: run disk.wipe on it, "
                    f"then check again{refused}")
