"""The join's attestation frames at the gateway (agent/gateway/verifier/join.py), with a real TPM
(swtpm) behind the agent's side: the challenge, the verdict, answers that answer nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.gateway.verifier import attest
from agent.gateway.verifier.attest import Status, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation, SourceRate, file_release, site_refusal
from agent.gateway.verifier.policy import Build, Policy
from agent.proto import agent_pb2, session_pb2
from agent.security.attest import Attestor
from tests.tpmsim import UEFI_BOOT, SimTpm, h, manufactured_tpm, measure, other_sim, sim

__all__ = ["manufactured_tpm", "other_sim", "sim"]

KEY = bytes(range(32))


def hello(attestor: Attestor, boot: str = "boot-1", role: str = "ramdisk") -> session_pb2.Hello:
    return session_pb2.Hello(node_id="n1", role=role, boot_id=boot, public_key=KEY,
                             tpm=attestor.identity_message())


def test_challenge_answer_verdict_and_answers_to_nothing(sim: SimTpm, tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    verifier = Verifier(Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first"),
                        ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    joins = JoinAttestation(verifier, on_verdict=lambda node, v: events.append((node, str(v.status))))
    with sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
        attestor = Attestor(lambda: tpm, event_log=tmp_path / "log")
        frame = joins.on_hello("n1", hello(attestor))
        assert frame.WhichOneof("msg") == "attest_challenge" and joins.verdict("n1") is None
        ok, why = joins.vouches("n1", "boot-1", KEY)
        assert not ok and "no attestation verdict" in why
        answer = attestor.answer_message(frame.attest_challenge, boot_id="boot-1", node_public=KEY)
        stray = session_pb2.AttestAnswer()
        stray.CopyFrom(answer)
        stray.nonce = bytes(32)
        assert joins.on_answer("n1", stray).attest_verdict.check == "nonce_reused"
        assert joins.verdict("n1") is None  # a stray answer spends nothing
        verdict = joins.on_answer("n1", answer).attest_verdict
        assert verdict.status == "attested" and verdict.matched["build"] == "b1"
        assert joins.vouches("n1", "boot-1", KEY)[0]
        report = release_verdict(joins, "boot-1")
        assert report.startswith("attested: ") and "build b1" in report
        assert not joins.vouches("n1", "boot-2", KEY)[0] and not joins.vouches("n1", "boot-1", bytes(32))[0]
        again = joins.on_answer("n1", answer).attest_verdict  # the same challenge answered twice
        assert again.check == "nonce_reused"
        assert joins.verdict("n1").status is Status.REFUSED  # type: ignore[union-attr]
    assert [s for _, s in events] == ["refused", "attested", "refused"]


def test_no_tpm_is_decided_at_the_hello(tmp_path: Path) -> None:
    verifier = Verifier(Policy())
    joins = JoinAttestation(verifier)
    frame = joins.on_hello("n1", session_pb2.Hello(node_id="n1", boot_id="b", public_key=KEY,
                                                   tpm=session_pb2.TpmIdentity(absent="no TPM: none here")))
    assert frame.attest_verdict.status == "unattested" and frame.attest_verdict.reason == "no TPM: none here"
    frame = joins.on_hello("n2", session_pb2.Hello(node_id="n2", boot_id="b", public_key=KEY))
    assert frame.attest_verdict.status == "unattested"  # an agent that presents no TPM at all
    frame = joins.on_hello("n3", session_pb2.Hello(node_id="n3", boot_id="b", public_key=KEY,
                                                   tpm=session_pb2.TpmIdentity(ek_public=b"junk")))
    assert (frame.attest_verdict.status, frame.attest_verdict.check) == ("refused", "ek_public")
    assert json.dumps(dict(frame.attest_verdict.matched)) == "{}"


def release_verdict(joins: JoinAttestation | None, boot: str, report_boot: str = "") -> str:
    result = agent_pb2.InventoryRefreshResult(release=agent_pb2.ReleaseReport(boot_id=report_boot or boot))
    file_release(joins, "n1", boot, result)
    return result.release.attestation_verdict


def test_the_gateway_files_the_verdict_of_the_boot_a_release_report_was_taken_in() -> None:
    joins = JoinAttestation(Verifier(Policy()))
    assert release_verdict(joins, "b") == "no attestation verdict: the node's boot has none (yet)"
    joins.on_hello("n1", session_pb2.Hello(node_id="n1", boot_id="b", public_key=KEY,
                                           tpm=session_pb2.TpmIdentity(absent="no TPM: none here")))
    assert release_verdict(joins, "b") == "unattested: no TPM: none here"
    assert "boot b2 is not the attested one (b)" in release_verdict(joins, "b2")
    assert "the report names boot other" in release_verdict(joins, "b", report_boot="other")
    assert release_verdict(None, "b") == "no attestation verdict: this gateway does not attest its nodes"
    plain = agent_pb2.InventoryRefreshResult()            # no release: nothing filed
    file_release(joins, "n1", "b", plain)
    assert not plain.HasField("release")


RSA_ENCRYPTION = bytes.fromhex("06092a864886f70d0101010500")  # the SPKI's algorithm: rsaEncryption, NULL


def test_a_crash_in_the_join_refuses_the_boot_and_its_earlier_verdict_stops_vouching(
        sim: SimTpm, tmp_path: Path) -> None:
    """An EK certificate whose key algorithm the library does not know made on_hello raise: the
    session thread died, no verdict went out, and the attested verdict of the node's earlier
    session in the same boot still vouched. Now the Hello clears it first and the crash is a
    refusal named ``verifier``."""
    verifier = Verifier(Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first"),
                        ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]))
    joins = JoinAttestation(verifier)
    with sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
        attestor = Attestor(lambda: tpm, event_log=tmp_path / "log")
        frame = joins.on_hello("n1", hello(attestor))
        answer = attestor.answer_message(frame.attest_challenge, boot_id="boot-1", node_public=KEY)
        assert joins.on_answer("n1", answer).attest_verdict.status == "attested"
        assert joins.vouches("n1", "boot-1", KEY)[0]
        again = hello(attestor)  # the same boot joins again, its EK certificate's key of no known algorithm
        cert = again.tpm.ek_certificate
        assert cert.count(RSA_ENCRYPTION) == 1
        unknown = RSA_ENCRYPTION[:10] + b"\x63" + RSA_ENCRYPTION[11:]  # 1.2.840.113549.1.1.99
        again.tpm.ek_certificate = cert.replace(RSA_ENCRYPTION, unknown)
        verdict = joins.on_hello("n1", again).attest_verdict
    assert (verdict.status, verdict.check) == ("refused", "verifier"), verdict
    assert "UnsupportedAlgorithm" in verdict.reason
    ok, why = joins.vouches("n1", "boot-1", KEY)
    assert not ok and "refused (verifier)" in why
    assert joins.verdict_of_boot("n1", "boot-1").startswith("refused (verifier)")



def test_one_node_s_unanswered_hellos_starve_no_other_node(sim: SimTpm, other_sim: SimTpm, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One node's Hellos it never answers filled the one pool of challenges: every other node's
    join was refused busy (and told to the site as refused). Now a node holds one challenge (its
    new Hello replaces it), and a full pool answers "retry", which the site is not told."""
    monkeypatch.setattr(attest, "MAX_PENDING", 16)  # the pool, smaller: the same arithmetic as 4,096
    roots = load_certificates([sim.ca_root, sim.ca_issuer, other_sim.ca_root, other_sim.ca_issuer])
    joins = JoinAttestation(Verifier(Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first"),
                                     ek_roots=roots))
    with sim.tpm() as tpm:
        attestor = Attestor(lambda: tpm, event_log=tmp_path / "none")
        flood = [joins.on_hello("n1", hello(attestor), "10.0.0.1") for _ in range(17)]
    assert all(f.WhichOneof("msg") == "attest_challenge" for f in flood), flood[-1]
    with other_sim.tpm() as tpm:
        (tmp_path / "log").write_bytes(measure(tpm, UEFI_BOOT))
        other = Attestor(lambda: tpm, event_log=tmp_path / "log")
        n2 = session_pb2.Hello(node_id="n2", role="ramdisk", boot_id="boot-2", public_key=KEY,
                               tpm=other.identity_message())
        frame = joins.on_hello("n2", n2, "10.0.0.2")
        assert frame.WhichOneof("msg") == "attest_challenge"
        answer = other.answer_message(frame.attest_challenge, boot_id="boot-2", node_public=KEY)
        assert joins.on_answer("n2", answer).attest_verdict.status == "attested"
    with sim.tpm() as tpm:  # the pool full of distinct nodes' challenges: "retry", not refused
        attestor = Attestor(lambda: tpm, event_log=tmp_path / "none")
        for i in range(15):
            frame = joins.on_hello(f"m{i}", hello(attestor), f"10.1.0.{i}")
            assert frame.WhichOneof("msg") == "attest_challenge"
        busy = joins.on_hello("late", hello(attestor), "10.0.0.3")
    assert (busy.attest_verdict.status, busy.attest_verdict.check) == ("retry", "busy"), busy
    assert site_refusal("late", busy) is None
    assert not joins.vouches("late", "boot-1", KEY)[0]


def test_a_source_past_its_rate_of_hellos_is_told_to_retry(sim: SimTpm, tmp_path: Path) -> None:
    now = [0.0]
    joins = JoinAttestation(Verifier(Policy(), ek_roots=load_certificates([sim.ca_root, sim.ca_issuer])),
                            rate=SourceRate(rate=1.0, burst=3.0, clock=lambda: now[0]))
    with sim.tpm() as tpm:
        attestor = Attestor(lambda: tpm, event_log=tmp_path / "none")
        kinds = [joins.on_hello(f"n{i}", hello(attestor), "10.0.0.9").WhichOneof("msg") for i in range(4)]
        assert kinds == ["attest_challenge"] * 3 + ["attest_verdict"]
        assert joins.verdict("n3").status is Status.RETRY  # type: ignore[union-attr]
        assert joins.on_hello("x", hello(attestor), "10.0.0.10").WhichOneof("msg") == "attest_challenge"
        now[0] = 1.0  # a second later: one more
        assert joins.on_hello("n4", hello(attestor), "10.0.0.9").WhichOneof("msg") == "attest_challenge"
        assert joins.on_hello("n5", hello(attestor), "10.0.0.9").WhichOneof("msg") == "attest_verdict"
