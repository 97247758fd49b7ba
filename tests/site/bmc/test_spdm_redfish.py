"""Device attestation over SPDM through the BMC, end to end: the site's Redfish client lists a
recorded tree's ComponentIntegrity responders (GB200, GH200, DGX H100, served by the project's
emulator over TLS on loopback), asks each to sign its measurements with the gateway's nonce,
and the gateway's verifier judges them: the responders' keys, the device CA and the RIM are
made at test time (tests/site/bmc/redfish_emulator/spdm.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.gateway.verifier.rim import verify_rim
from agent.gateway.verifier.spdm import GoldenTable
from agent.gateway.verifier.spdm_verdict import DeviceChallenges, DeviceEvidence, DeviceResult
from agent.site.bmc.client import CallContext, Pacing
from agent.site.bmc.redfish import integrity
from agent.site.bmc.redfish.client import RedfishClient
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.spdm import INDICES, SpdmResponders, measurement


def _call() -> CallContext:
    return CallContext(threading.Event(), time.monotonic() + 60, Pacing(0.05, 0.2, 1.0))


def _round(bmc: RedfishEmulator, gateway: DeviceChallenges) -> dict[str, DeviceResult]:
    """One attestation round as the site runs it: list, nonces from the gateway, ask, verify."""
    client = RedfishClient(bmc.target(), _call())
    try:
        listed = integrity.responders(client)
        nonces = gateway.issue("n1", [r.id for r in listed if not r.unreadable])
        answered, failed = integrity.collect(client, nonces)
    finally:
        client.close()
    evidence = [DeviceEvidence(a.device, a.signed_measurements, a.certificate_chain) for a in answered]
    results = gateway.verify("n1", [r.id for r in listed], evidence)
    assert set(failed) <= {r.device for r in results if not r.verified}
    return {r.device: r for r in results}


@pytest.mark.parametrize("tree", ["nvidia_gb200", "nvidia_gh200", "nvidia_dgxh100"])
def test_every_responder_of_a_recorded_tree_verifies_against_our_rim(trees: Path, tree: str) -> None:
    with RedfishEmulator.of(tree, trees) as bmc:
        spdm = SpdmResponders.install(bmc)
        rim = verify_rim(spdm.rim(), [spdm.rim_root])
        gateway = DeviceChallenges([spdm.device_ca], rims=[rim])
        results = _round(bmc, gateway)
    assert spdm.keys and all(results[d].verified for d in spdm.keys), \
        {d: (r.check, r.reason) for d, r in results.items() if not r.verified}
    verdict = results[next(iter(spdm.keys))].verdict
    assert verdict is not None and verdict.firmware == spdm.firmware and "Test RIM Signer" in verdict.golden
    # Every request carried a nonce of the gateway's, one per device, none repeated.
    nonces = [body["Nonce"] for _, body in spdm.asked]
    assert len(nonces) == len(spdm.keys) == len(set(nonces))
    # A member the BMC lists and cannot read (GH200's HGX_satmc answers 404) is refused, never passed.
    for device, result in results.items():
        if device not in spdm.keys:
            assert result.check == "missing"


def test_a_wrong_nonce_a_bad_signature_and_a_changed_measurement_are_refused_by_name(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_gb200", trees) as bmc:
        spdm = SpdmResponders.install(bmc)
        devices = sorted(spdm.keys)
        spdm.wrong_nonce.add(devices[0])
        spdm.bad_signature.add(devices[1])
        spdm.changed[devices[2]] = 3
        gateway = DeviceChallenges([spdm.device_ca], rims=[verify_rim(spdm.rim(), [spdm.rim_root])])
        results = _round(bmc, gateway)
    assert results[devices[0]].check == "nonce"
    assert results[devices[1]].check == "signature"
    assert results[devices[2]].check == "measurement" and "measurement 3:" in results[devices[2]].reason
    assert all(results[d].verified for d in devices[3:])


def test_another_makers_root_refuses_the_chain_and_a_nonce_is_taken_once(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        spdm = SpdmResponders.install(bmc)
        other = SpdmResponders.install(bmc)  # the same BMC re-keyed: the first CA no longer vouches
        rims = [verify_rim(other.rim(), [other.rim_root])]
        results = _round(bmc, DeviceChallenges([spdm.device_ca], rims=rims))
        assert {r.check for d, r in results.items() if d in other.keys} == {"chain"}
        gateway = DeviceChallenges([other.device_ca], rims=[verify_rim(other.rim(), [other.rim_root])])
        client = RedfishClient(bmc.target(), _call())
        try:
            responder = integrity.responders(client)[0]
            nonce = gateway.issue("n1", [responder.id])[responder.id]
            answer = integrity.signed_measurements(client, responder, nonce)
        finally:
            client.close()
    evidence = [DeviceEvidence(answer.device, answer.signed_measurements, answer.certificate_chain)]
    assert gateway.verify("n1", [responder.id], evidence)[0].verified
    replayed = gateway.verify("n1", [responder.id], evidence)[0]  # the same answer again
    assert replayed.check == "nonce"


def test_without_a_rim_the_fleets_values_judge_and_unknown_firmware_is_refused(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_dgxh100", trees) as bmc:
        spdm = SpdmResponders.install(bmc)
        values = {str(i): [measurement(i, spdm.firmware).hex()] for i in INDICES}
        table = {"firmware": {spdm.firmware: values}}
        results = _round(bmc, DeviceChallenges([spdm.device_ca], table=GoldenTable.parse(table)))
        assert all(results[d].verified for d in spdm.keys)
        assert all("fleet" in getattr(results[d].verdict, "golden", "") for d in spdm.keys)
        results = _round(bmc, DeviceChallenges([spdm.device_ca]))
    assert {results[d].check for d in spdm.keys} == {"golden"}


def test_a_bmc_without_component_integrity_is_unsupported(trees: Path) -> None:
    from agent.errors import Unsupported
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        client = RedfishClient(bmc.target(), _call())
        try:
            with pytest.raises(Unsupported):
                integrity.responders(client)
        finally:
            client.close()


def test_a_devices_firmware_is_the_inventory_component_that_names_it() -> None:
    """integrity.firmware_of: the component whose RelatedItem names the responder's target, else
    one it protects; two that name it with two versions give none (no one version to name)."""
    from agent.proto import site_pb2

    erot = integrity.Responder("ERoT_0", "/ci/ERoT_0", "1.1.0", "", "", "/Chassis/ERoT_0",
                               protects=("/Managers/BMC_0",))
    inventory = [site_pb2.BmcFirmwareComponent(id="FW_BMC_0", version="24.12", related=["/Managers/BMC_0"]),
                 site_pb2.BmcFirmwareComponent(id="FW_ERoT_0", version="01.03", related=["/Chassis/ERoT_0"])]
    found = integrity.firmware_of(erot, inventory)
    assert found is not None and (found.id, found.version) == ("FW_ERoT_0", "01.03")
    found = integrity.firmware_of(erot, inventory[:1])     # no entry for the ERoT: what it protects
    assert found is not None and found.id == "FW_BMC_0"
    twice = [*inventory, site_pb2.BmcFirmwareComponent(id="FW_ERoT_0b", version="01.04",
                                                       related=["/Chassis/ERoT_0"])]
    assert integrity.firmware_of(erot, twice) is None
    assert integrity.firmware_of(integrity.Responder("IRoT_GPU_0", "", "", "", "", "/Chassis/IRoT_GPU_0"),
                                 inventory) is None
