"""The node's SPDM device verdicts (agent/gateway/verifier/spdm_verdict.py's DeviceResult) on the
gateway's live path, and folded into its release record.

The round, as the gateway's sessions run it (agent/gateway/server.py): the control plane asks the
site for the node's responders (bmc.query responders), the gateway issues one nonce per device
(``Gateway.device_nonces``, written by ``nonces_parameter``), the site asks each responder once
(bmc.query measurements, agent/commands/bmc_spdm.py) and its result comes back through the site's
own session: ``site_round`` judges it (every device the gateway issued a nonce for or the site
listed: one left out is refused ``missing``; a failed command refuses them all), the site's
result gets a release report of its own with the verdicts folded in, and the gateway keeps the
round as the node's, for the node's boot that was current when it was judged (``Rounds``,
bounded). A release report of that boot (its inventory.refresh, signed in that boot, within
``ROUND_TTL`` of the round) has the round folded in too, and its attestation verdict says how
its devices fared (``summary``); a round of another boot (the previous tenant's, before its
reboot; or one judged while the node had no session) counts for no report: a device reflashed
after it would pass unseen.

``fold``: a ``DeviceAttestation`` per device, and each refused device a finding that no remedy
puts back (``device.attestation``, the failed check named), so the report is not pool-ready
while one device is refused. An empty list of results adds nothing (a BMC without responders:
docs/attestation.md says what that does not prove).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message

from agent.gateway.verifier.spdm_verdict import DeviceChallenges, DeviceEvidence, DeviceResult
from agent.proto import agent_pb2, session_pb2, site_pb2

ROUND_TTL = 3600.0  # a round older than this vouches for no release report
MAX_NODES = 100_000
AREA = "devices"


def fold(report: agent_pb2.ReleaseReport, results: Iterable[DeviceResult]) -> None:
    for r in results:
        entry = report.devices.add(device=r.device, verified=r.verified, check=r.check, reason=r.reason,
                                   bmc_firmware=r.bmc_firmware, bmc_component=r.bmc_component)
        if r.verdict is not None:
            entry.firmware, entry.golden = r.verdict.firmware, r.verdict.golden
            continue
        report.cannot_restore.add(
            check="device.attestation", expected="verified", found=f"refused ({r.check})", where=r.device,
            message=f"device {r.device}: SPDM attestation refused at {r.check}: {r.reason}")
        report.pool_ready = False


def summary(results: list[DeviceResult]) -> str:
    """The round in a line: "devices: 8 verified", or "devices: 1 of 8 refused: X (signature)"."""
    refused = [r for r in results if not r.verified]
    if not refused:
        return f"devices: {len(results)} verified"
    named = ", ".join(f"{r.device} ({r.check})" for r in refused[:8])
    more = " ..." if len(refused) > 8 else ""
    return f"devices: {len(refused)} of {len(results)} refused: {named}{more}"


def nonces_parameter(issued: dict[str, bytes]) -> str:
    """bmc.query measurements' ``nonces``: ``device=hex`` pairs, comma separated."""
    return ",".join(f"{device}={nonce.hex()}" for device, nonce in issued.items())


@dataclass(frozen=True)
class DeviceRound:
    node_id: str
    at: float  # the gateway's clock when it judged the round
    results: list[DeviceResult]
    boot_id: str = ""  # the node's boot current then ("" none: the node had no session)


class Rounds:
    """Each node's last round; bounded (past ``max_nodes`` the oldest node's is forgotten)."""

    def __init__(self, ttl: float = ROUND_TTL, max_nodes: int = MAX_NODES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.max_nodes, self.clock = ttl, max_nodes, clock
        self._rounds: OrderedDict[str, DeviceRound] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, node_id: str, results: list[DeviceResult], boot_id: str = "") -> DeviceRound:
        done = DeviceRound(node_id, self.clock(), results, boot_id)
        with self._lock:
            self._rounds.pop(node_id, None)
            self._rounds[node_id] = done
            while len(self._rounds) > self.max_nodes:
                self._rounds.popitem(last=False)
        return done

    def fresh(self, node_id: str, boot_id: str) -> DeviceRound | None:
        """The node's last round, if it was judged in the node's boot ``boot_id`` and is younger
        than the time to live."""
        with self._lock:
            done = self._rounds.get(node_id)
        if done is None or not boot_id or done.boot_id != boot_id:
            return None
        return done if self.clock() - done.at < self.ttl else None


def judge(challenges: DeviceChallenges, node_id: str,
          result: site_pb2.BmcOperationResult) -> list[DeviceResult]:
    """A result per device the gateway issued a nonce for or the site listed; a device without an
    answer is refused ``missing`` with the site's word on why."""
    expected = [*challenges.issued(node_id), *(d.device for d in result.devices)]
    evidence = [DeviceEvidence(d.device, d.signed_measurements, d.certificate_chain, d.firmware,
                               d.firmware_component)
                for d in result.devices if d.signed_measurements]
    why = {d.device: d.error for d in result.devices if d.error}
    bmc = {d.device: d for d in result.devices}
    out = []
    for r in challenges.verify(node_id, expected, evidence):
        if r.check == "missing" and r.device in bmc:  # not answered: the BMC's word on it still named
            d = bmc[r.device]
            reason = f"{r.reason}: {why[r.device]}" if why.get(r.device) else r.reason
            r = DeviceResult(r.device, None, r.check, reason, d.firmware, d.firmware_component)
        out.append(r)
    return out


def site_round(challenges: DeviceChallenges | None, rounds: Rounds, command: bytes, status: int,
               reason: str, result: Message | None, boot_of: Callable[[str], str]) -> DeviceRound | None:
    """A result of the site's own session for bmc.query measurements judged, its release report
    filled, and the round kept as its node's, for the boot ``boot_of`` says is the node's now;
    None for any other result. A measurements command that failed refuses every device the
    gateway issued a nonce for (a round that could not be read is a finding, never a pass)."""
    if challenges is None:
        return None
    body, request = session_pb2.CommandBody(), site_pb2.BmcOperationRequest()
    try:
        body.ParseFromString(command)
        request.ParseFromString(body.payload)
    except DecodeError:
        return None
    if body.kind != "bmc.query" or request.operation != "measurements" or not request.node_id:
        return None
    if status == session_pb2.SUCCEEDED and isinstance(result, site_pb2.BmcOperationResult):
        results = judge(challenges, request.node_id, result)
        result.release.CopyFrom(agent_pb2.ReleaseReport(pool_ready=True, checked=[AREA]))
        fold(result.release, results)
    else:
        results = [DeviceResult(device, None, "missing", f"the site's bmc.query measurements did not "
                                f"succeed: {reason or session_pb2.Status.Name(status)}")
                   for device in challenges.issued(request.node_id)]
    return rounds.record(request.node_id, results, boot_of(request.node_id))


def node_report(rounds: Rounds, node_id: str, boot_id: str, result: Message | None) -> DeviceRound | None:
    """The node's own release report (inventory.refresh's ``release``, signed in its boot
    ``boot_id``) with its last fresh round of that boot folded in and said in its attestation
    verdict; None where there is no report, or no round of that boot (a report that names
    another boot than the one that signed it takes none)."""
    if not isinstance(result, agent_pb2.InventoryRefreshResult) or not result.HasField("release"):
        return None
    report = result.release
    if report.boot_id and report.boot_id != boot_id:
        return None
    done = rounds.fresh(node_id, boot_id)
    if done is None:
        return None
    fold(report, done.results)
    report.checked.append(AREA)
    report.attestation_verdict = "; ".join(filter(None, (report.attestation_verdict, summary(done.results))))
    return done
