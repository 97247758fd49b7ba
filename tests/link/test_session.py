"""The agent as a real subprocess (`python -m agent run`) against the reference gateway over TLS.

Lane isolation, the trust matrix end to end, timeout and cancel (child processes killed),
drain, enrollment tokens, self-terminating completion across a restart.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
import types
from pathlib import Path

import pytest

from agent.gateway import CommandRejected, Gateway, State
from agent.gateway.certs import DevPki, server_context
from agent.link import wire
from agent.proc import alive
from agent.proto import session_pb2
from agent.security import trust
from tests.runtime.harness import AgentProcess, make_pki, start_gateway, wait_until

WIPE = {"disks": [{"serial": "S-1"}]}
TIMEOUT = 60.0


def _started(agent: AgentProcess, gw: Gateway) -> None:
    agent.start()
    gw.wait_node(agent.node_id, TIMEOUT)


def test_hello_carries_identity_kinds_and_node_key(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    node = gateway.nodes["node-1"]
    hello = node.hello
    assert (hello.node_id, hello.role, hello.protocol_version) == ("node-1", "ramdisk", 1)
    assert hello.boot_id and hello.agent_version
    assert "disk.wipe" in hello.kinds and "gpu.reset" not in hello.kinds  # gpu.reset: node role only
    assert len(node.public_key) == 32
    assert node.authenticated_by == "certificate"


def test_lane_isolation_control_completes_while_provision_is_held(
    agent_proc: AgentProcess, gateway: Gateway
) -> None:
    _started(agent_proc, gateway)
    agent_proc.spec("wipe-held", hold="release-wipe")
    wipe = gateway.send("node-1", "disk.wipe", WIPE, command_id="wipe-held")
    wait_until(lambda: agent_proc.executions()["wipe-held"] == 1, TIMEOUT, "the wipe to start")
    agent_proc.spec("inv-1", sleep=0.01)
    inv = gateway.send("node-1", "inventory.refresh", {}, command_id="inv-1")
    body, _ = gateway.wait_result(inv, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED
    # The provision command is still held: the control command did not wait for it.
    assert not gateway.commands[wipe].state.final
    assert "wipe-held" not in agent_proc.ended()
    agent_proc.release("release-wipe")
    body, _ = gateway.wait_result(wipe, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED
    assert body.finished_at_unix_ms > gateway.commands[inv].result.finished_at_unix_ms


def test_attested_results_are_signed_by_the_node_key(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    cid = gateway.send("node-1", "diag.nvml", {})
    body, result = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED
    assert result is not None and result.DESCRIPTOR.full_name == "bettercompute.agent.v1.DiagNvmlResult"
    assert not [e for e in gateway.events if e.what == "result_rejected"]


def _signed(
    gw: Gateway, body: session_pb2.CommandBody, key: trust.SigningKey | None
) -> session_pb2.SignedCommand:
    raw = body.SerializeToString(deterministic=True)
    if key is None:
        return session_pb2.SignedCommand(body=raw)
    return key.sign_command(body)


def test_trust_matrix_every_refusal_has_its_reason_and_nothing_runs(
    agent_proc: AgentProcess, gateway: Gateway, pki: DevPki
) -> None:
    _started(agent_proc, gateway)
    control = trust.SigningKey.load(pki.signing_key)
    stranger = trust.SigningKey.generate()
    cases: dict[str, tuple[session_pb2.SignedCommand, str]] = {}

    def body(cid: str, kind: str = "disk.wipe", **kw: object) -> session_pb2.CommandBody:
        b = gateway.build("node-1", kind, WIPE if kind == "disk.wipe" else {}, command_id=cid)
        for k, v in kw.items():
            setattr(b, k, v)
        return b

    cases["t-unsigned"] = (_signed(gateway, body("t-unsigned"), None), "signature_missing")
    cases["t-unknown-key"] = (_signed(gateway, body("t-unknown-key"), stranger), "signature_unknown_key")
    modified = control.sign_command(body("t-modified"))
    tampered = session_pb2.CommandBody.FromString(modified.body)
    tampered.payload = b"\x0a\x04\x0a\x02XX"  # another disk
    modified.body = tampered.SerializeToString()
    cases["t-modified"] = (modified, "signature_invalid")
    forged = control.sign_command(body("t-wrong-key"))
    forged.key_id = control.key_id
    forged.signature = stranger.sign(trust.COMMAND_DOMAIN, forged.body)
    cases["t-wrong-key"] = (forged, "signature_invalid")
    cases["t-other-node"] = (control.sign_command(body("t-other-node", node_id="node-2")), "wrong_node")
    cases["t-expired"] = (control.sign_command(body("t-expired", expires_at_unix_ms=1000)), "expired")
    cases["t-no-expiry"] = (control.sign_command(body("t-no-expiry", expires_at_unix_ms=0)), "expired")
    far = int(time.time() * 1000) + 16 * 60_000  # beyond the agent's 15-minute signature lifetime
    cases["t-too-far"] = (control.sign_command(body("t-too-far", expires_at_unix_ms=far)), "expired")
    earlier = body("t-other-boot", boot_id="an-earlier-boot")
    cases["t-other-boot"] = (control.sign_command(earlier), "wrong_boot")
    cases["t-no-boot"] = (control.sign_command(body("t-no-boot", boot_id="")), "wrong_boot")
    cases["t-site-kind"] = (control.sign_command(body("t-site-kind", kind="bmc.power")), "not_this_daemon")
    cases["t-wrong-role"] = (control.sign_command(body("t-wrong-role", kind="gpu.reset")), "wrong_role")
    cases["t-too-long"] = (
        control.sign_command(body("t-too-long", kind="diag.nvml", timeout_seconds=10_000)),
        "invalid_parameters",
    )
    # Replay: the same id again with other bytes, after the first one ran.
    first = control.sign_command(body("t-replayed"))
    gateway.wait_result(gateway.send_signed("node-1", first), TIMEOUT)
    again = control.sign_command(body("t-replayed", issued_at_unix_ms=first_issued(first) + 1))
    for signed, _ in cases.values():
        gateway.send_signed("node-1", signed)
    gateway.commands.pop("t-replayed")
    gateway.send_signed("node-1", again)
    cases["t-replayed"] = (again, "replayed")
    seen = {}
    for cid, (_, reason) in cases.items():
        with pytest.raises(CommandRejected) as err:
            gateway.wait_result(cid, TIMEOUT)
        seen[cid] = err.value.reason_code
        assert err.value.reason_code == reason, (cid, str(err.value))
    print("trust matrix:", seen)
    runs = agent_proc.executions()
    assert runs["t-replayed"] == 1
    assert not [cid for cid in cases if cid != "t-replayed" and runs[cid]]


def first_issued(signed: session_pb2.SignedCommand) -> int:
    return session_pb2.CommandBody.FromString(signed.body).issued_at_unix_ms


def test_resending_a_known_command_returns_its_state_and_never_runs_it_twice(
    agent_proc: AgentProcess, gateway: Gateway
) -> None:
    _started(agent_proc, gateway)
    cid = gateway.send("node-1", "disk.wipe", WIPE, command_id="once")
    gateway.wait_result(cid, TIMEOUT)
    rec = gateway.commands[cid]
    gateway.send_raw("node-1", session_pb2.Frame(command=rec.signed))
    wait_until(lambda: len([e for e in gateway.events_for(cid) if e.what == "accepted"]) >= 2, TIMEOUT,
               "the second accept")
    accepted = [e for e in gateway.events_for(cid) if e.what == "accepted"]
    assert accepted[-1].detail in ("FINISHED", "ACKNOWLEDGED")
    assert agent_proc.executions()[cid] == 1


def test_timeout_kills_the_handlers_children(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    agent_proc.spec("slow", child=True)
    cid = gateway.send("node-1", "disk.wipe", WIPE, command_id="slow", timeout_seconds=2)
    pid_file = agent_proc.dir / "child-slow.pid"
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), TIMEOUT, "the child"))
    assert alive(pid)
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.TIMED_OUT and body.reason == "timeout"
    wait_until(lambda: not alive(pid), 15, f"child {pid} to be killed")


def test_cancel_kills_the_handlers_children(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    agent_proc.spec("cancel-me", child=True)
    cid = gateway.send("node-1", "deploy.image", {}, command_id="cancel-me")
    pid_file = agent_proc.dir / "child-cancel-me.pid"
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), TIMEOUT, "the child"))
    gateway.cancel(cid, "test cancels")
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.CANCELLED and body.reason == "cancelled"
    wait_until(lambda: not alive(pid), 15, f"child {pid} to be killed")


def test_a_stuck_handler_is_abandoned_at_its_deadline(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    agent_proc.spec("stuck", stuck=True)
    cid = gateway.send("node-1", "inventory.refresh", {}, command_id="stuck", timeout_seconds=1)
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.TIMED_OUT
    after = gateway.send("node-1", "inventory.refresh", {})  # the lane still serves
    assert gateway.wait_result(after, TIMEOUT)[0].status == session_pb2.SUCCEEDED


def test_progress_and_log_lines_reach_the_gateway(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    agent_proc.spec("chatty", progress=5, log=3, sleep=0.3)
    cid = gateway.send("node-1", "diag.dcgm", {}, command_id="chatty")
    gateway.wait_result(cid, TIMEOUT)
    rec = gateway.commands[cid]
    assert rec.progress is not None and rec.progress.done == 5 and rec.progress.total == 5
    assert [line.message for line in rec.logs if "test handler line" in line.message] == [
        f"test handler line {i} of chatty" for i in (1, 2, 3)
    ]


def test_drain_finishes_running_work_then_says_goodbye(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    agent_proc.spec("draining", sleep=1.0)
    cid = gateway.send("node-1", "deploy.image", {}, command_id="draining")
    wait_until(lambda: agent_proc.executions()[cid], TIMEOUT, "the command to start")
    gateway.drain("node-1", "test drain")
    late = gateway.send("node-1", "inventory.refresh", {}, command_id="late")
    assert gateway.wait_result(cid, TIMEOUT)[0].status == session_pb2.SUCCEEDED
    with pytest.raises(CommandRejected) as err:
        gateway.wait_result(late, TIMEOUT)
    assert err.value.reason_code == "draining"
    wait_until(lambda: [e for e in gateway.events if e.what == "goodbye"], TIMEOUT, "goodbye")
    assert agent_proc.proc is not None
    assert agent_proc.proc.wait(TIMEOUT) == 0


def test_enrollment_token_instead_of_a_client_certificate(
    pki: DevPki, gateway: Gateway, tmp_path: Path
) -> None:
    gateway.tokens["tok-123"] = "node-2"
    good = AgentProcess(pki, gateway, tmp_path / "good", node_id="node-2", token="tok-123").start()
    bad = AgentProcess(pki, gateway, tmp_path / "bad", node_id="node-3", token="tok-wrong").start()
    try:
        node = gateway.wait_node("node-2", TIMEOUT)
        assert node.authenticated_by == "token"
        wait_until(lambda: [e for e in gateway.events if e.what == "session_refused"], TIMEOUT, "a refusal")
        assert "node-3" not in gateway.nodes
        assert bad.alive  # refused, but keeps trying (with backoff); it does not crash
    finally:
        good.kill()
        bad.kill()


def test_self_terminating_command_completes_when_the_agent_rejoins_after_a_new_boot(
    agent_proc: AgentProcess, gateway: Gateway
) -> None:
    agent_proc.role = "ramdisk"
    (agent_proc.dir / "boot_id").write_text("boot-A")
    _started(agent_proc, gateway)
    cid = gateway.send("node-1", "boot.kexec", {}, command_id="kexec-1")
    assert agent_proc.proc is not None
    assert agent_proc.proc.wait(TIMEOUT) == 0  # the action ended the agent
    assert gateway.commands[cid].state is State.AWAITING_REJOIN
    (agent_proc.dir / "boot_id").write_text("boot-B")
    agent_proc.start()
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED
    assert (body.details["old_boot_id"], body.details["new_boot_id"]) == ("boot-A", "boot-B")
    assert agent_proc.executions()[cid] == 1


def test_self_terminating_command_fails_when_the_node_does_not_come_back(
    agent_proc: AgentProcess, gateway: Gateway
) -> None:
    (agent_proc.dir / "boot_id").write_text("boot-A")
    _started(agent_proc, gateway)
    cid = gateway.send("node-1", "boot.kexec", {}, command_id="kexec-lost", timeout_seconds=3)
    rec = gateway.wait(cid, TIMEOUT)
    assert rec.state is State.FAILED
    body, _ = gateway.wait_result(cid, 1)
    assert body.status == session_pb2.FAILED and body.reason == "rejoin_timeout"


def test_agent_restarted_in_the_same_boot_reports_the_self_termination_failed(
    agent_proc: AgentProcess, gateway: Gateway
) -> None:
    (agent_proc.dir / "boot_id").write_text("boot-A")
    _started(agent_proc, gateway)
    cid = gateway.send("node-1", "boot.kexec", {}, command_id="kexec-same")
    assert agent_proc.proc is not None and agent_proc.proc.wait(TIMEOUT) == 0
    agent_proc.start()  # same boot id: the kexec did not happen
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.FAILED and body.reason == "interrupted"


def test_agent_reconnects_after_the_gateway_restarts(agent_proc: AgentProcess, gateway: Gateway) -> None:
    _started(agent_proc, gateway)
    gateway.restart()
    gateway.wait_node("node-1", TIMEOUT, sessions=2)
    cid = gateway.send("node-1", "inventory.refresh", {})
    assert gateway.wait_result(cid, TIMEOUT)[0].status == session_pb2.SUCCEEDED


def test_agent_refuses_a_gateway_its_ca_did_not_sign(pki: DevPki, tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other-pki")
    impostor = start_gateway(other)  # a gateway with a certificate from another CA
    agent = AgentProcess(pki, impostor, tmp_path / "agent")
    try:
        agent.start()
        wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in agent.logs(), TIMEOUT, "the agent to refuse it")
        assert "node-1" not in impostor.nodes and agent.alive
    finally:
        agent.kill()
        impostor.stop()


def test_agent_detects_a_silent_gateway_and_reconnects(pki: DevPki, tmp_path: Path) -> None:
    """A gateway that welcomes, then never sends another byte: dead within 3 intervals."""
    ctx = server_context(pki.gateway_cert, pki.gateway_key, pki.ca)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[float] = []
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            tls = ctx.wrap_socket(conn, server_side=True)
            wire.recv_frame(tls, 10)
            welcome = session_pb2.Welcome(gateway_id="silent", heartbeat_interval_ms=200, dead_after_ms=600)
            wire.send_frame(tls, session_pb2.Frame(welcome=welcome))
            accepted.append(time.monotonic())
            held.append(tls)  # keep it open, say nothing

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    silent = types.SimpleNamespace(address=f"127.0.0.1:{server.getsockname()[1]}")
    agent = AgentProcess(pki, silent, tmp_path / "agent")  # type: ignore[arg-type]
    try:
        agent.start()
        wait_until(lambda: len(accepted) >= 3, TIMEOUT, "the agent to give up on the silent gateway twice")
        assert "peer_dead" in agent.logs()
        gaps = [b - a for a, b in itertools.pairwise(accepted)]
        print(f"silent gateway: reconnects after {[round(g, 2) for g in gaps]} s (dead_after 0.6 s)")
    finally:
        agent.kill()
        stop.set()
        thread.join(5)
        server.close()
        for s in held:
            s.close()
