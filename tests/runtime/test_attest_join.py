"""Attestation at the join, end to end on this machine: a real agent process whose TPM is a
swtpm measured as firmware would, the reference gateway's verifier, and an attested kind's
result verified only when its boot attested."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway import Gateway
from agent.gateway.attest import Status, Verdict, Verifier, load_certificates
from agent.gateway.attest_join import JoinAttestation
from agent.gateway.attest_policy import Build, Policy
from agent.gateway.certs import DevPki
from tests.runtime.harness import AgentProcess, start_gateway
from tests.tpmsim import UEFI_BOOT, SimTpm, h, manufactured_tpm, measure, sim

__all__ = ["manufactured_tpm", "sim"]

TIMEOUT = 60


@pytest.fixture
def attesting_gateway(pki: DevPki, sim: SimTpm) -> Iterator[Gateway]:
    policy = Policy(builds=[Build("b1", h(b"ramdisk uki"), {})], learn="first")
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
