"""The release gate's firmware comparison (bmc.query baseline with ``expect.firmware``): the
node's FirmwareInventory, read from its BMC, against the site's firmware set of the profile.

``check`` gives the findings and the report's list (each component the set names, its version
against the set's):

- ``firmware.version``: a component not at the set's version; its remedy is ``bmc.firmware
  apply`` of the profile, sent to the same BMC (the plan carries every differing step).
- ``firmware.missing``: a set entry no component matches (the node is not the hardware the
  profile says, or its BMC hides the component): no remedy, a person looks.
- ``firmware.unreadable``: the BMC has no FirmwareInventory to read; no remedy. The gate fails
  closed: what it could not read is never passed.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.proto import agent_pb2, site_pb2
from agent.site.bmc.redfish import fwsets


def check(
    fwset: fwsets.FirmwareSet, inventory: Sequence[site_pb2.BmcFirmwareComponent], why_unread: str = ""
) -> tuple[list[agent_pb2.Mismatch], list[agent_pb2.FirmwareVersion]]:
    if why_unread or not inventory:
        return [agent_pb2.Mismatch(
            check="firmware.unreadable", expected=f"the firmware set {fwset.profile}",
            found=why_unread or "an empty FirmwareInventory",
            message=f"the BMC's firmware inventory could not be read: {why_unread or 'it lists nothing'}",
        )], []
    planned = fwsets.plan(fwset, inventory)
    remedy = agent_pb2.BmcRemedy(kind="bmc.firmware", operation="apply",
                                 parameters={"profile": fwset.profile})
    findings, versions = [], []
    for entry, c in planned.matched:
        ok = c.version == entry.version
        versions.append(agent_pb2.FirmwareVersion(component_id=c.id, name=c.name, version=c.version,
                                                  expected=entry.version, match=str(entry.match), ok=ok))
        if not ok:
            findings.append(agent_pb2.Mismatch(
                check="firmware.version", expected=entry.version, found=c.version, where=c.id,
                message=f"{c.id} runs {c.version or 'no version'};"
                        f" the set {fwset.profile} says {entry.version}",
                bmc_remedy=remedy))
    for entry in planned.missing:
        versions.append(agent_pb2.FirmwareVersion(match=str(entry.match), expected=entry.version))
        findings.append(agent_pb2.Mismatch(
            check="firmware.missing", expected=str(entry.match), found="no such component",
            message=f"the set {fwset.profile} names a component ({entry.match}) the BMC does not list"))
    return findings, versions
