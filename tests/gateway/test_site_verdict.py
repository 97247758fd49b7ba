"""A join refused by attestation reaches the site's timeline, end to end on this machine: the
reference gateway (``site_node``) verifies a real agent process whose TPM is a swtpm and whose
event log does not replay to it, refuses the join, and hands the refusal to a real site daemon
(`agent run --role site`) as boot.cleanUp with join_refused; the site's inventory.refresh then
names the node's last attempt ``refused`` with the gateway's reason, and the node's PXE entry
is gone."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from agent.gateway.verifier.attest import Status, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Build, Policy
from agent.proto import session_pb2
from tests.conftest import free_port
from tests.runtime.harness import AgentProcess, make_pki, start_gateway
from tests.tpmsim import UEFI_BOOT, SimTpm, h, manufactured_tpm, measure, sim

__all__ = ["manufactured_tpm", "sim"]

SITE, NODE = "site-1", "node-1"
MAC = "52:54:00:aa:bb:01"
TIMEOUT = 60


class SiteDaemon(AgentProcess):
    """`agent run --role site` with its real handlers (inventory.refresh's node_boots)."""

    entry = ("-m", "agent")



@pytest.fixture
def site_pki(tmp_path: Path) -> DevPki:
    return make_pki(tmp_path / "pki", nodes=(SITE, NODE))


@pytest.fixture
def gateway(site_pki: DevPki, sim: SimTpm) -> Iterator[Gateway]:
    policy = Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first")
    verifier = Verifier(policy, ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    gw = start_gateway(site_pki, attestation=JoinAttestation(verifier), site_node=SITE)
    yield gw
    gw.stop()


def run(gw: Gateway, kind: str, payload: dict[str, Any]) -> Any:
    body, result = gw.wait_result(gw.send(SITE, kind, payload), TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED and result is not None, body
    return result


def test_a_join_refused_by_attestation_is_named_in_the_site_s_timeline(
        gateway: Gateway, site_pki: DevPki, sim: SimTpm, tmp_path: Path) -> None:
    port = free_port()
    site = SiteDaemon(site_pki, gateway, tmp_path / "site", node_id=SITE, role="site", cmdline="bc.tpm=none",
                      extra_args=("--site-address", "127.0.0.1", "--site-http-port", str(port)))
    with sim.tpm() as tpm:
        log = measure(tpm, UEFI_BOOT)
    (tmp_path / "log").write_bytes(log.replace(h(b"ramdisk uki"), h(b"what the node says it booted")))
    node = AgentProcess(site_pki, gateway, tmp_path / "node", node_id=NODE,
                        cmdline=f"bc.tpm=tcp:127.0.0.1:{sim.port} bc.tpm_event_log={tmp_path / 'log'}")
    site.start()
    try:
        gateway.wait_node(SITE, TIMEOUT)
        run(gateway, "boot.prepareRamdisk", {
            "node_id": NODE, "mac_address": MAC, "boot_file": "ipxe.efi",
            "ipxe_script_url": "http://10.0.0.1/ramdisk.ipxe", "ttl_seconds": 600})
        script = f"http://127.0.0.1:{port}/pxe/{MAC.replace(':', '-')}.ipxe"
        with urllib.request.urlopen(script, timeout=10) as resp:
            assert resp.status == 200
        node.start()
        try:
            told = gateway.wait_for(lambda: [e for e in gateway.events if e.what == "join_refused"],
                                    TIMEOUT, "the refusal told to the site")
            assert gateway.attestation is not None
            verdict = gateway.attestation.verdict(NODE)
            assert verdict is not None and verdict.status is Status.REFUSED and verdict.check == "event_log"
            body, result = gateway.wait_result(told[0].command_id, TIMEOUT)
            assert body.status == session_pb2.SUCCEEDED, body
            assert f"entry {MAC}" in result.removed
        finally:
            node.kill()
        inventory = run(gateway, "inventory.refresh", {"skip_gpus": True})
        boots = {b.node_id: b for b in inventory.node_boots}
        boot = boots[NODE]
        assert (boot.outcome, boot.cause) == ("failed", "refused"), boot
        assert "attestation refused (event_log)" in boot.cause_detail, boot.cause_detail
        assert boot.method == "pxe", boot
        assert any(" refused attestation refused" in s for s in boot.steps), boot.steps
        with pytest.raises(urllib.error.HTTPError) as gone:   # what the site served that boot is gone
            urllib.request.urlopen(script, timeout=10)
        assert gone.value.code == 404
        # The site's own join is no refusal told to it.
        assert all(e.node_id == NODE for e in gateway.events if e.what == "join_refused")
    finally:
        site.terminate()


def test_agent_gateway_serve_takes_the_site_node(site_pki: DevPki, tmp_path: Path) -> None:
    """`agent gateway serve|send --site-node NODE` makes the gateway that tells that site of
    refused joins; without --attest-policy there is nothing to refuse, and it says so."""
    from agent.errors import InvalidParameters
    from agent.gateway.cli import _make_gateway, build_parser

    policy = tmp_path / "policy.json"
    policy.write_text('{"builds": [], "learn": "first"}')
    args = build_parser().parse_args(["serve", "--pki", str(site_pki.dir), "--attest-policy", str(policy),
                                      "--site-node", SITE])
    gw = _make_gateway(args)
    assert gw.site_node == SITE and gw.attestation is not None
    args = build_parser().parse_args(["serve", "--pki", str(site_pki.dir), "--site-node", SITE])
    with pytest.raises(InvalidParameters, match="--site-node needs --attest-policy"):
        _make_gateway(args)
