"""The node's SPDM device verdicts (agent/gateway/verifier/spdm_verdict.py's DeviceResult) folded into its
release report: a ``DeviceAttestation`` per device, and each refused device a finding that no
remedy puts back (``device.attestation``, the failed check named), so the report is not
pool-ready while one device is refused. The gateway calls ``fold`` where it joins the node's
report and its attestation verdict; an empty list of results adds nothing (a BMC without
responders: docs/attestation.md says what that does not prove).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.gateway.verifier.spdm_verdict import DeviceResult
from agent.proto import agent_pb2


def fold(report: agent_pb2.ReleaseReport, results: Iterable[DeviceResult]) -> None:
    for r in results:
        entry = report.devices.add(device=r.device, verified=r.verified, check=r.check, reason=r.reason)
        if r.verdict is not None:
            entry.firmware, entry.golden = r.verdict.firmware, r.verdict.golden
            continue
        report.cannot_restore.add(
            check="device.attestation", expected="verified", found=f"refused ({r.check})", where=r.device,
            message=f"device {r.device}: SPDM attestation refused at {r.check}: {r.reason}")
        report.pool_ready = False
