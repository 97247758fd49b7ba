"""node.reboot: reboot the node, gracefully or forced, optionally into firmware setup or a
one-time EFI boot entry. Complete when the agent rejoins with a new boot id.

The EFI variables are written in ``run`` (where a failure fails the command: no EFI, no such
boot entry, firmware without a setup indication); the reboot itself is the SelfTermination's
action. The node role keeps its journal on a persistent path, so the proof survives the reboot;
the command line of the next boot is the firmware's, so no ``bc.rejoin`` parameter is needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.commands.base import Context, Handler, SelfTermination
from agent.errors import InvalidParameters
from agent.hw import power
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

_MODES = {agent_pb2.GRACEFUL: power.Mode.GRACEFUL, agent_pb2.FORCED: power.Mode.FORCED}


@dataclass(frozen=True)
class RebootParams:
    mode: agent_pb2.RebootMode
    target: agent_pb2.RebootTarget
    boot_entry: str


class RebootHandler(Handler[agent_pb2.NodeRebootRequest, RebootParams], kind="node.reboot"):
    def __init__(self, power_control: power.Power | None = None) -> None:
        self._power = power_control

    @property
    def power(self) -> power.Power:
        if self._power is None:
            self._power = power.Power()
        return self._power

    def parse(self, payload: agent_pb2.NodeRebootRequest) -> RebootParams:
        if payload.mode not in _MODES:
            raise InvalidParameters(f"node.reboot: unknown mode {payload.mode}")
        if payload.target not in agent_pb2.RebootTarget.values():
            raise InvalidParameters(f"node.reboot: unknown target {payload.target}")
        entry = payload.boot_entry.strip()
        if payload.target == agent_pb2.ONE_TIME_BOOT_ENTRY:
            if not entry:
                raise InvalidParameters("node.reboot: ONE_TIME_BOOT_ENTRY needs boot_entry (e.g. '0003')")
            power.parse_boot_entry(entry)
        elif entry:
            raise InvalidParameters("node.reboot: boot_entry is only for target ONE_TIME_BOOT_ENTRY")
        return RebootParams(payload.mode, payload.target, entry)

    def run(self, ctx: Context, params: RebootParams) -> SelfTermination:
        old_boot_id = ctx.boot_id
        pw = self.power
        if params.target == agent_pb2.FIRMWARE_SETUP:
            ctx.progress(message="asking the firmware to enter its setup on the next boot")
            pw.request_firmware_setup()
        elif params.target == agent_pb2.ONE_TIME_BOOT_ENTRY:
            ctx.progress(message=f"setting EFI BootNext to {params.boot_entry}")
            pw.set_boot_next(params.boot_entry)
        mode = _MODES[params.mode]
        result = agent_pb2.NodeRebootResult(old_boot_id=old_boot_id, mode=params.mode, target=params.target)
        log.info("node.reboot prepared (%s); rebooting once the agent is quiet", mode)
        # An empty proof: the core records its own boot id as the one that must change.
        return SelfTermination(proof={}, action=lambda: pw.reboot(mode), result=result)
