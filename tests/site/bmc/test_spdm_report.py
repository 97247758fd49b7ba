"""The SPDM device verdicts folded into the release report (agent/gateway/spdm_report.py): a
round on GB200's recorded responders through the emulator (tests/site/bmc/test_spdm_redfish.py's
``_round``), one device's signature broken: the report lists every device, the refused one is a
finding that nothing puts back, and the report is not pool-ready; a clean round leaves it so."""

from __future__ import annotations

from pathlib import Path

from agent.gateway.spdm_report import fold
from agent.gateway.verifier.rim import verify_rim
from agent.gateway.verifier.spdm_verdict import DeviceChallenges
from agent.proto import agent_pb2
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.spdm import SpdmResponders
from tests.site.bmc.test_spdm_redfish import _round


def test_a_refused_device_keeps_the_node_out_and_every_device_is_listed(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_gb200", trees) as bmc:
        spdm = SpdmResponders.install(bmc)
        gateway = DeviceChallenges([spdm.device_ca], rims=[verify_rim(spdm.rim(), [spdm.rim_root])])
        clean = _round(bmc, gateway)
        broken = sorted(spdm.keys)[0]
        spdm.bad_signature.add(broken)
        refused = _round(bmc, gateway)
    report = agent_pb2.ReleaseReport(pool_ready=True)
    fold(report, clean.values())
    assert report.pool_ready and not report.cannot_restore
    assert {d.device for d in report.devices} == set(clean) and all(d.verified for d in report.devices)
    assert all(d.firmware == spdm.firmware and d.golden for d in report.devices)

    report = agent_pb2.ReleaseReport(pool_ready=True)
    fold(report, refused.values())
    assert not report.pool_ready
    assert [(m.check, m.where, m.found) for m in report.cannot_restore] == [
        ("device.attestation", broken, "refused (signature)")]
    (entry,) = [d for d in report.devices if d.device == broken]
    assert not entry.verified and entry.check == "signature"
