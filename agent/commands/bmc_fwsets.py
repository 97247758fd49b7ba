"""bmc.firmware plan and apply, and the release gate's firmware half (bmc.query baseline with
``expect.firmware``): the site's firmware set of a hardware profile (setting
site_firmware_sets; agent/site/bmc/redfish/fwsets.py) against the BMC's FirmwareInventory,
the plan carried out by agent/site/bmc/redfish/fwapply.py, the gate's findings made by
agent/site/bmc/fwrelease.py. Called by agent/commands/bmc.py's handlers.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.commands.base import Context
from agent.errors import BmcRefused, InvalidParameters, Unsupported
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc import fwrelease
from agent.site.bmc.client import BmcClient
from agent.site.bmc.redfish import firmware, fwapply, fwsets
from agent.site.bmc.redfish.client import RedfishClient


def release_firmware(ctx: Context, profile: str, client: BmcClient
                     ) -> tuple[list[agent_pb2.Mismatch], list[agent_pb2.FirmwareVersion]]:
    """The release gate's firmware findings and version list (agent/site/bmc/fwrelease.py)."""
    fwset = load_firmware_set(ctx, profile)
    if not isinstance(client, RedfishClient):
        return fwrelease.check(fwset, [], "IPMI has no firmware inventory; check it over redfish")
    try:
        inventory = firmware.inventory(client)
    except (Unsupported, BmcRefused) as exc:
        return fwrelease.check(fwset, [], exc.message)
    return fwrelease.check(fwset, inventory)


def load_firmware_set(ctx: Context, profile: str) -> fwsets.FirmwareSet:
    """The firmware set of ``profile`` from the site's file (setting site_firmware_sets), read
    at each use: an operator's edit counts from the next command."""
    path = ctx.config.site_firmware_sets
    if path is None:
        raise InvalidParameters("the site has no firmware sets: set site_firmware_sets (docs/site.md)")
    sets = fwsets.load(path)
    if profile not in sets:
        raise InvalidParameters(f"firmware sets {path}: no profile {profile!r}"
                                f" (it has {', '.join(sorted(sets))})")
    return sets[profile]


def firmware_set(ctx: Context, operation: str, profile: str, client: RedfishClient,
                 result: site_pb2.BmcOperationResult, *, power: Callable[[fwsets.After], None],
                 progress: Callable[[int, str], None]) -> site_pb2.BmcOperationResult:
    """bmc.firmware plan (what differs from the profile's set, in order) and apply (that plan
    carried out, the inventory read back after each step, ``power`` doing a step's reboot or
    AC cycle), filling ``result``."""
    fwset = load_firmware_set(ctx, profile)
    planned = fwsets.plan(fwset, firmware.inventory(client))
    offer = fwapply.offered(client)
    for step in planned.steps:
        method = fwapply.method_for(step.entry, offer)
        result.firmware_plan.append(fwsets.step_message(step, str(method or "")))
    if planned.missing:
        result.values["missing"] = "; ".join(str(e.match) for e in planned.missing)
    if operation == "plan" or not planned.steps:
        result.state = f"{len(planned.steps)} step(s)" if planned.steps else "at the set"
        return result
    site = ctx.site_services
    images = fwapply.Images(site.store, site.fetch_options) if site is not None else fwapply.Images(None)
    done = fwapply.apply(client, planned, images, power=power, settle=ctx.sleep, progress=progress)
    del result.firmware_plan[:]
    result.firmware_plan.extend(done)
    result.firmware_inventory.extend(firmware.inventory(client))
    result.state = "applied"
    result.attempts = client.attempts
    return result
