"""The SPDM device verdicts on the gateway's live path (agent/gateway/spdm_report.py): rounds on
GB200's recorded responders through the emulator, run by the real bmc.query handler and carried
over the real gateway's sessions; one device's signature broken: the site's result and the node's
release report list every device, the refused one is a finding that nothing puts back, the
report is not pool-ready and the node's verdict names it; a clean round leaves them so."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.message import Message

from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import InvalidParameters
from agent.gateway import Gateway
from agent.gateway.verifier.rim import verify_rim
from agent.gateway.verifier.spdm_verdict import DeviceChallenges
from agent.proto import agent_pb2, session_pb2, site_pb2
from tests.gateway.test_gateway import TIMEOUT, Client
from tests.runtime.harness import make_pki, start_gateway
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import parse_kind
from tests.site.bmc.redfish_emulator.spdm import SpdmResponders
from tests.site.bmc.test_bmc_redfish import REF

SITE, NODE = "site-1", "node-1"
INVENTORY = "/redfish/v1/UpdateService/FirmwareInventory"
EROT = "01.03.0262.0000_n04"       # the recorded GB200's ERoTs' firmware


def _serve(gw: Gateway, site: Client, config: Config, request: site_pb2.BmcOperationRequest
           ) -> tuple[session_pb2.ResultBody, Message | None]:
    """The gateway sends ``request`` to the site's session; the site runs it with the real
    bmc.query handler (against the emulator) and answers over that session."""
    cid = gw.send(SITE, "bmc.query", request)
    signed = site.recv("command").command
    payload = site_pb2.BmcOperationRequest.FromString(session_pb2.CommandBody.FromString(signed.body).payload)
    handler = handler_for("bmc.query")
    assert handler is not None
    result = handler.run(Context.local("bmc.query", config, timeout=60), handler.parse(payload))
    body = session_pb2.ResultBody(command_id=cid, kind="bmc.query", node_id=SITE,
                                  status=session_pb2.SUCCEEDED, payload=result.SerializeToString(),
                                  payload_type=result.DESCRIPTOR.full_name)
    site.send(session_pb2.Frame(result=session_pb2.SignedResult(body=body.SerializeToString())))
    return gw.wait_result(cid, TIMEOUT)


def _release(gw: Gateway, node: Client) -> agent_pb2.ReleaseReport:
    """The node's own release report (inventory.refresh, in the client's boot), as the gateway files it."""
    cid = gw.send(NODE, "inventory.refresh", {})
    node.recv("command")
    boot = node.hello.boot_id
    refresh = agent_pb2.InventoryRefreshResult(release=agent_pb2.ReleaseReport(
        boot_id=boot, pool_ready=True, checked=["uefi"]))
    body = session_pb2.ResultBody(command_id=cid, kind="inventory.refresh", node_id=NODE, boot_id=boot,
                                  status=session_pb2.SUCCEEDED, payload=refresh.SerializeToString(),
                                  payload_type=refresh.DESCRIPTOR.full_name)
    node.send(session_pb2.Frame(result=session_pb2.SignedResult(body=body.SerializeToString())))
    _, message = gw.wait_result(cid, TIMEOUT)
    assert isinstance(message, agent_pb2.InventoryRefreshResult)
    return message.release


def test_through_the_gateway_a_refused_device_is_in_the_nodes_verdict_and_a_verified_one_is_not(
        trees: Path, emulator_config: Config, tmp_path: Path) -> None:
    """The round on the live path: the real gateway on loopback TLS (the site's session and the
    node's), the real bmc.query handler against GB200's recorded responders: the gateway's nonces
    out, the site's evidence judged where its result arrives, the verdicts in the site's result
    and in the node's next release report and attestation verdict."""
    pki = make_pki(tmp_path / "pki", nodes=(SITE, NODE))
    with RedfishEmulator.of("nvidia_gb200", trees) as bmc:
        spdm = SpdmResponders.install(bmc)
        devices = DeviceChallenges([spdm.device_ca], rims=[verify_rim(spdm.rim(), [spdm.rim_root])])
        gw = start_gateway(pki, site_node=SITE, devices=devices, heartbeat_seconds=10.0)
        site, node = Client(gw, pki, SITE), Client(gw, pki, NODE)
        try:
            request = site_pb2.BmcOperationRequest(node_id=NODE, bmc_address=bmc.address,
                                                   protocol="redfish", operation="responders",
                                                   credentials_ref=REF)
            _, listed = _serve(gw, site, emulator_config, request)
            assert isinstance(listed, site_pb2.BmcOperationResult)
            names = [d.device for d in listed.devices if not d.error]
            assert names and set(names) == set(spdm.keys)

            def measure() -> agent_pb2.ReleaseReport:
                request.operation = "measurements"
                request.parameters["nonces"] = gw.device_nonces(NODE, names)
                _, measured = _serve(gw, site, emulator_config, request)
                assert isinstance(measured, site_pb2.BmcOperationResult)
                return measured.release

            # The BMC's inventory updated for one ERoT (as after a bmc.firmware apply): its verdict
            # names the version the BMC now reports, not the recording's.
            bmc.state.docs[f"{INVENTORY}/HGX_FW_ERoT_CPU_1"]["Version"] = "01.03.0300.0000_n04"
            clean = measure()
            assert clean.pool_ready and not clean.cannot_restore and clean.checked == ["devices"]
            assert {d.device for d in clean.devices} == set(names) and all(d.verified for d in clean.devices)
            assert all(d.firmware == spdm.firmware and d.golden for d in clean.devices)
            # Each device's firmware as GB200's FirmwareInventory gives it: the ERoTs, whose
            # inventory entries name them (RelatedItem); the GPUs' IRoTs and the ConnectX-7's are
            # named by no entry in this recording, and their verdicts name no BMC version.
            named = {d.device: (d.bmc_component, d.bmc_firmware) for d in clean.devices if d.bmc_component}
            assert named == {
                "ERoT_BMC_0": ("FW_ERoT_BMC_0", EROT), "HGX_ERoT_BMC_0": ("HGX_FW_ERoT_BMC_0", EROT),
                "HGX_ERoT_CPU_0": ("HGX_FW_ERoT_CPU_0", EROT),
                "HGX_ERoT_CPU_1": ("HGX_FW_ERoT_CPU_1", "01.03.0300.0000_n04"),
                "HGX_ERoT_FPGA_0": ("HGX_FW_ERoT_FPGA_0", EROT),
                "HGX_ERoT_FPGA_1": ("HGX_FW_ERoT_FPGA_1", EROT)}, named
            assert all(not d.bmc_firmware for d in clean.devices if "IRoT" in d.device)
            report = _release(gw, node)
            assert report.pool_ready and len(report.devices) == len(names)
            assert report.attestation_verdict.endswith(f"devices: {len(names)} verified")

            broken = sorted(names)[0]
            spdm.bad_signature.add(broken)
            refused = measure()
            assert not refused.pool_ready
            assert [(m.check, m.where, m.found) for m in refused.cannot_restore] == [
                ("device.attestation", broken, "refused (signature)")]
            report = _release(gw, node)
            assert not report.pool_ready and report.checked == ["uefi", "devices"]
            assert report.attestation_verdict.endswith(
                f"devices: 1 of {len(names)} refused: {broken} (signature)")
            assert [(d.device, d.bmc_firmware) for d in report.devices if not d.verified] == [(broken, EROT)]

            # A device the gateway issued a nonce for and the site brought nothing back for: refused.
            spdm.bad_signature.clear()
            names.append("HGX_not_listed_0")
            left_out = measure()
            assert [(m.where, m.found) for m in left_out.cannot_restore] == [
                ("HGX_not_listed_0", "refused (missing)")]
            assert any(e.what == "devices_attested" for e in gw.events)

            # The node reboots (the next tenant's boot, or a reflash between): the round of its
            # last boot counts for no report of this one; a round in this boot does.
            node.close()
            node = Client(gw, pki, NODE, boot_id="boot-2")
            gw.wait_node(NODE, TIMEOUT, sessions=2)
            report = _release(gw, node)
            assert report.pool_ready and list(report.checked) == ["uefi"] and not report.devices, report
            names.remove("HGX_not_listed_0")
            assert measure().pool_ready
            report = _release(gw, node)
            assert report.checked == ["uefi", "devices"] and len(report.devices) == len(names), report
        finally:
            site.close()
            node.close()
            gw.stop()


@pytest.mark.parametrize("nonces", [
    ",", "HGX_IRoT_GPU_0=" + "ab" * 31, "HGX_IRoT_GPU_0=" + "AB" * 32, "=" + "ab" * 32, "a b=" + "ab" * 32,
    f"x={'ab' * 32},x={'cd' * 32}", ",".join(f"d{n}={'ab' * 32}" for n in range(65))])
def test_measurements_refuses_nonces_it_cannot_read(nonces: str) -> None:
    with pytest.raises(InvalidParameters, match=r"parameter.*nonces"):
        parse_kind("bmc.query", "measurements", nonces=nonces)
