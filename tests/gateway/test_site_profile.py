"""What the site daemon's results tell the verifier, through a real gateway on loopback: a
bmc.query's system inventory names the node's hardware profile, a bmc.firmware update the site
made opens the node's window; the same result from any other session changes nothing (a node
cannot vouch for its own BMC)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from agent.gateway.verifier.attest import Challenge, Verifier
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Policy
from agent.proto import session_pb2, site_pb2
from agent.security.attest_contract import Identity
from tests.gateway.test_gateway import TIMEOUT, Client
from tests.runtime.harness import make_pki, start_gateway

SITE = "site-1"


@pytest.fixture
def site_pki(tmp_path: Path) -> DevPki:
    return make_pki(tmp_path / "pki", nodes=(SITE, "node-1", "node-2"))


@pytest.fixture
def verifier() -> Verifier:
    return Verifier(Policy(builds=[], learn="first"))


@pytest.fixture
def site_gateway(site_pki: DevPki, verifier: Verifier) -> Iterator[Gateway]:
    gw = start_gateway(site_pki, attestation=JoinAttestation(verifier), site_node=SITE)
    yield gw
    gw.stop()


def answer(gw: Gateway, client: Client, kind: str, request: site_pb2.BmcOperationRequest,
           result: site_pb2.BmcOperationResult) -> str:
    """The gateway sends ``kind`` to the client's node, which answers it with ``result``."""
    cid = gw.send(client.node, kind, request)
    client.recv("command")
    client.send(session_pb2.Frame(accept=session_pb2.Accept(command_id=cid, state=session_pb2.QUEUED)))
    body = session_pb2.ResultBody(command_id=cid, kind=kind, node_id=client.node,
                                  status=session_pb2.SUCCEEDED, payload=result.SerializeToString(),
                                  payload_type=result.DESCRIPTOR.full_name)
    client.send(session_pb2.Frame(result=session_pb2.SignedResult(body=body.SerializeToString())))
    gw.wait_result(cid, TIMEOUT)
    return cid


def profile(verifier: Verifier, node_id: str) -> str:
    identity = Identity(b"", b"", b"", b"", "IBM", "1.0", "Dmi|Says|0.1")
    return verifier.profile_of(Challenge(node_id, b"", b"", b"", b"", identity, 0.0, "CN=EK CA"))[0]


def test_the_sites_bmc_inventory_and_firmware_updates_reach_the_verifier(
        site_gateway: Gateway, site_pki: DevPki, verifier: Verifier) -> None:
    query = site_pb2.BmcOperationRequest(node_id="node-1", bmc_address="192.0.2.10", protocol="redfish",
                                         operation="query")
    seen = site_pb2.BmcOperationResult(operation="query", system=site_pb2.BmcSystem(
        manufacturer="Maker", model="Board", bios_version="1.0"))
    assert profile(verifier, "node-1") == "Dmi|Says|0.1"  # nothing from the site yet: the node's DMI
    # A node that is not the site answers a bmc.query for node-1: its word is not taken.
    other = Client(site_gateway, site_pki, "node-2")
    site_gateway.wait_node("node-2", TIMEOUT)
    answer(site_gateway, other, "bmc.query", query, seen)
    assert profile(verifier, "node-1") == "Dmi|Says|0.1"
    other.close()
    site = Client(site_gateway, site_pki, SITE)
    site_gateway.wait_node(SITE, TIMEOUT)
    cid = answer(site_gateway, site, "bmc.query", query, seen)
    assert profile(verifier, "node-1") == "bmc:Maker|Board|1.0|ek:CN=EK CA"
    assert any(e.what == "attest_site_report" for e in site_gateway.events_for(cid))
    # The site's firmware update for node-1: its window opens, for the boot after it.
    update = site_pb2.BmcOperationRequest(node_id="node-1", bmc_address="192.0.2.10", protocol="redfish",
                                          operation="simple_update",
                                          parameters={"image_uri": "http://192.0.2.1/fw-2.0.bin"})
    answer(site_gateway, site, "bmc.firmware", update, site_pb2.BmcOperationResult(operation="simple_update"))
    state = verifier.states.get("node-1")
    assert state is not None and state.accept
    assert state.accept_by == "site: firmware set simple_update http://192.0.2.1/fw-2.0.bin"
    site.close()


def applied(state: str = "applied", step_state: str = "done",
            running: str = "2.0") -> site_pb2.BmcOperationResult:
    """A bmc.firmware apply's result: one step, BIOS to 2.0, and the inventory read back after it."""
    return site_pb2.BmcOperationResult(
        operation="apply", state=state,
        firmware_plan=[site_pb2.BmcFirmwareStep(match="id=BIOS", component_ids=["BIOS"], found=["1.0"],
                                                expected="2.0", state=step_state)],
        firmware_inventory=[site_pb2.BmcFirmwareComponent(id="BIOS", version=running),
                            site_pb2.BmcFirmwareComponent(id="BMC", version="7.1")])


@pytest.mark.parametrize(("result", "window"), [
    (applied(), "site: firmware set q35 (BIOS 2.0)"),
    (applied(running="1.0"), ""),                    # the BMC's inventory does not show the set's version
    (applied(step_state="not_reached"), ""),         # a step not carried out to its end
    (site_pb2.BmcOperationResult(operation="apply", state="at the set"), ""),   # nothing changed
    (applied(state="1 step(s)"), ""),                # a plan's answer, not an apply's
], ids=["reached", "version-not-read-back", "step-not-done", "at-the-set", "planned-only"])
def test_an_apply_opens_the_window_only_where_its_result_shows_the_set_reached(
        site_gateway: Gateway, site_pki: DevPki, verifier: Verifier, result: site_pb2.BmcOperationResult,
        window: str) -> None:
    """bmc.firmware apply (a firmware set carried out) opens the node's window named by the set and
    the versions the BMC read back; a result that does not show every step done and every
    component at its version opens none (the gateway fails closed on the site's word too)."""
    site = Client(site_gateway, site_pki, SITE)
    site_gateway.wait_node(SITE, TIMEOUT)
    request = site_pb2.BmcOperationRequest(node_id="node-1", bmc_address="192.0.2.10", protocol="redfish",
                                           operation="apply", parameters={"profile": "q35"})
    cid = answer(site_gateway, site, "bmc.firmware", request, result)
    site.close()
    state = verifier.states.get("node-1")
    told = [e.detail for e in site_gateway.events_for(cid) if e.what == "attest_site_report"]
    if window:
        assert state is not None and state.accept and state.accept_by == window, state
        named = window.removeprefix("site: firmware set ")
        assert told == [f"node-1: site updated its firmware to set {named}"], told
    else:
        assert (state is None or not state.accept) and not told, (state, told)
