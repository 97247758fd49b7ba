"""Attestation at the join, end to end on this machine: a real agent process whose TPM is a
swtpm measured as firmware would, the reference gateway's verifier, and an attested kind's
result verified only when its boot attested."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from agent.gateway.verifier.attest import Status, Verdict, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation, SourceRate
from agent.gateway.verifier.policy import Build, Policy
from agent.security.attest import attestor_for
from agent.security.attest_contract import LEFT_EVENT
from tests.runtime.core_harness import Terminating, World, accepted
from tests.runtime.harness import ROOT, AgentProcess, start_gateway, wait_until
from tests.tpmsim import UEFI_BOOT, SimTpm, h, manufactured_tpm, measure, need, sim

__all__ = ["manufactured_tpm", "sim"]

TIMEOUT = 60


@pytest.fixture
def attesting_gateway(pki: DevPki, sim: SimTpm) -> Iterator[Gateway]:
    policy = Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first")
    verifier = Verifier(policy, ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    gw = start_gateway(pki, attestation=JoinAttestation(verifier))
    yield gw
    gw.stop()


def verdict_of(gw: Gateway, node: str = "node-1") -> Verdict:
    assert gw.attestation is not None
    found: Verdict = gw.wait_for(lambda: gw.attestation.verdict(node) if gw.attestation else None,
                                 TIMEOUT, "an attestation verdict")
    return found


def test_an_attested_join_and_a_verified_result(attesting_gateway: Gateway, pki: DevPki, sim: SimTpm,
                                                tmp_path: Path) -> None:
    with sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
    agent = AgentProcess(pki, attesting_gateway, tmp_path / "agent",
                         cmdline=f"bc.tpm=tcp:127.0.0.1:{sim.port} bc.tpm_event_log={tmp_path / 'log'}")
    try:
        agent.start()
        verdict = verdict_of(attesting_gateway)
        assert verdict.status is Status.ATTESTED, verdict
        assert verdict.matched["build"] == "b1"
        verdicts = [e.what for e in attesting_gateway.events if e.what.startswith("attest_")]
        assert verdicts == ["attest_attested"]
        cid = attesting_gateway.send("node-1", "diag.nvml", {})
        attesting_gateway.wait_result(cid, TIMEOUT)
        ok, why = attesting_gateway.verified(cid)
        assert ok, why
    finally:
        agent.kill()
    log = (tmp_path / "agent" / "agent-1.log").read_text()
    assert "attestation verdict: attested" in log


def test_no_tpm_joins_unattested_and_its_results_are_not_verified(attesting_gateway: Gateway, pki: DevPki,
                                                                   tmp_path: Path) -> None:
    agent = AgentProcess(pki, attesting_gateway, tmp_path / "agent", cmdline="bc.tpm=none")
    try:
        agent.start()
        verdict = verdict_of(attesting_gateway)
        assert verdict.status is Status.UNATTESTED and "bc.tpm=none" in verdict.reason
        cid = attesting_gateway.send("node-1", "diag.nvml", {})
        attesting_gateway.wait_result(cid, TIMEOUT)
        ok, why = attesting_gateway.verified(cid)
        assert not ok and "unattested" in why
    finally:
        agent.kill()


def test_a_refused_boot(attesting_gateway: Gateway, pki: DevPki, sim: SimTpm, tmp_path: Path) -> None:
    with sim.tpm() as tpm:
        log = measure(tpm, UEFI_BOOT)
    (tmp_path / "log").write_bytes(log.replace(h(b"ramdisk uki"), h(b"what the node says it booted")))
    agent = AgentProcess(pki, attesting_gateway, tmp_path / "agent",
                         cmdline=f"bc.tpm=tcp:127.0.0.1:{sim.port} bc.tpm_event_log={tmp_path / 'log'}")
    try:
        agent.start()
        verdict = verdict_of(attesting_gateway)
        assert verdict.status is Status.REFUSED and verdict.check == "event_log", verdict
    finally:
        agent.kill()


def test_a_verifier_crash_refuses_the_boot_and_its_earlier_verdict_stops_vouching(
        pki: DevPki, sim: SimTpm, tmp_path: Path) -> None:
    """The TPM's NV holds an EK certificate whose key algorithm the gateway's library does not know
    (written there with the platform's authority): that made the gateway's Hello handling raise,
    no verdict was sent, the site was not told, and the node's attested verdict of the same boot
    still vouched for what it signed. Now the join is refused, ``verifier``, and told to the site."""
    need("tpm2_nvread", "tpm2_nvwrite")
    policy = Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first")
    verifier = Verifier(policy, ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    gw = start_gateway(pki, attestation=JoinAttestation(verifier), site_node="site-1")
    with sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
    agent = AgentProcess(pki, gw, tmp_path / "agent",
                         cmdline=f"bc.tpm=tcp:127.0.0.1:{sim.port} bc.tpm_event_log={tmp_path / 'log'}")
    try:
        agent.start()
        assert verdict_of(gw).attested
        before = gw.send("node-1", "diag.nvml", {})
        gw.wait_result(before, TIMEOUT)
        assert gw.verified(before)[0]
        agent.kill()  # the simulator serves one connection at a time: the agent's, until now
        env = dict(os.environ, TPM2TOOLS_TCTI=sim.tcti)
        subprocess.run(["tpm2_nvread", "-C", "o", "0x01C00002", "-o", str(tmp_path / "ek.der")], env=env,
                       check=True, capture_output=True, timeout=60)
        cert = (tmp_path / "ek.der").read_bytes()
        rsa = bytes.fromhex("06092a864886f70d0101010500")  # rsaEncryption; 1.2.840.113549.1.1.99 instead
        (tmp_path / "bad.der").write_bytes(cert.replace(rsa, rsa[:10] + b"\x63" + rsa[11:]))
        subprocess.run(["tpm2_nvwrite", "-C", "p", "0x01C00002", "-i", str(tmp_path / "bad.der")], env=env,
                       check=True, capture_output=True, timeout=60)
        agent.start()  # the same boot joins again, its TPM's identity read afresh
        assert gw.attestation is not None
        refused = gw.wait_for(lambda: (v := gw.attestation.verdict("node-1")) is not None  # type: ignore[union-attr]
                              and v.status is Status.REFUSED and v, TIMEOUT, "the refusal")
        assert refused.check == "verifier" and "UnsupportedAlgorithm" in refused.reason, refused
        told = gw.wait_for(lambda: [e for e in gw.events if e.what == "join_refused"], TIMEOUT,
                           "the site told")
        assert "attestation refused (verifier)" in told[0].detail
        after = gw.send("node-1", "diag.nvml", {})  # the session goes on; what it signs is not verified
        gw.wait_result(after, TIMEOUT)
        for cid in (before, after):
            ok, why = gw.verified(cid)
            assert not ok, (cid, why)
    finally:
        agent.kill()
        gw.stop()
    assert "attestation verdict: refused (verifier)" in (tmp_path / "agent" / "agent-2.log").read_text()


def test_a_busy_gateway_tells_the_node_to_retry_and_it_rejoins(attesting_gateway: Gateway, pki: DevPki,
                                                               sim: SimTpm, tmp_path: Path) -> None:
    """Past its source's rate of joins the node is told "retry" (not refused, the site not told):
    the agent closes the session, rejoins after its backoff, and is attested once there is room."""
    with sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
    joins = attesting_gateway.attestation
    assert joins is not None
    joins.rate = SourceRate(rate=1e-9, burst=1.0)
    assert joins.rate.allow("127.0.0.1")  # this source's one join spent
    agent = AgentProcess(pki, attesting_gateway, tmp_path / "agent",
                         cmdline=f"bc.tpm=tcp:127.0.0.1:{sim.port} bc.tpm_event_log={tmp_path / 'log'}")
    try:
        agent.start()
        attesting_gateway.wait_for(
            lambda: sum(e.what == "attest_retry" for e in attesting_gateway.events) >= 2, TIMEOUT,
            "the node told twice to retry")
        joins.rate = SourceRate()  # room again
        verdict = attesting_gateway.wait_for(
            lambda: (v := joins.verdict("node-1")) is not None and v.status is Status.ATTESTED and v,
            TIMEOUT, "an attested rejoin")
        assert verdict.attested
        assert attesting_gateway.nodes["node-1"].sessions >= 3
        assert not any(e.what in ("join_refused", "attest_refused") for e in attesting_gateway.events)
    finally:
        agent.kill()
    assert "attestation verdict: retry (busy)" in (tmp_path / "agent" / "agent-1.log").read_text()


def test_gateway_send_shows_a_wipe_verified(pki: DevPki, sim: SimTpm, tmp_path: Path) -> None:
    """`agent gateway send --attest-policy`: the operator sees the erasure certificate verified."""
    with sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
    (tmp_path / "policy.json").write_text(json.dumps(
        {"builds": [{"build_id": "b1", "pcr4": h(b"ramdisk uki").hex()}], "learn": "first"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    send = subprocess.Popen(
        [sys.executable, "-m", "agent", "gateway", "send", "--pki", str(pki.dir),
         "--listen", f"127.0.0.1:{port}",
         "--node", "node-1", "--kind", "disk.wipe", "--payload", '{"disks": [{"serial": "S-1"}]}',
         "--attest-policy", str(tmp_path / "policy.json"),
         "--ek-ca", str(sim.ca_root), "--ek-ca", str(sim.ca_issuer),
         "--wait-node", "60", "--wait-result", "60", "--heartbeat", "1"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    address = types.SimpleNamespace(address=f"127.0.0.1:{port}")
    agent = AgentProcess(pki, address, tmp_path / "agent",  # type: ignore[arg-type]
                         cmdline=f"bc.tpm=tcp:127.0.0.1:{sim.port} bc.tpm_event_log={tmp_path / 'log'}")
    try:
        agent.start()
        out, err = send.communicate(timeout=120)
    finally:
        agent.kill()
        if send.poll() is None:
            send.kill()
    assert send.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "SUCCEEDED" and result["verified"] is True, result
    assert "attested" in result["verified_why"] and "b1" in result["verified_why"]
    assert json.loads((tmp_path / "policy.json").read_text())["profiles"]  # the profile was learned


def test_a_kexec_marks_pcr11_before_the_agent_ends(world: World, sim: SimTpm) -> None:
    """boot.kexec (and daemon.upgrade) mark PCR 11 before the action: the kernel that runs next
    was not measured, and the gateway's next verdict says so (tests/gateway/test_attest.py)."""
    with sim.tpm() as tpm:
        before = tpm.pcr_read([11])[11]
    kexec = Terminating("boot.kexec")
    agent, _ = world.agent({"boot.kexec": kexec}, attestor=attestor_for(f"tcp:127.0.0.1:{sim.port}"))
    accepted(agent.submit(world.command("k1", "boot.kexec")))
    wait_until(lambda: kexec.actions, TIMEOUT, "the kexec action")
    agent.attestor.close()  # swtpm serves one connection at a time
    with sim.tpm() as tpm:
        assert tpm.pcr_read([11])[11] == hashlib.sha256(before + LEFT_EVENT).digest()
