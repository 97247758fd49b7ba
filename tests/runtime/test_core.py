"""The Agent in process: admission, lanes, journal replay, frames (self-termination: test_core_rejoin).

Real threads, real journal files, real child processes. Test handlers serve real kind names
and are passed through ``handlers=``; a "crash" is an Agent that is stopped (its journal
closed) while its handler is still blocked, followed by a new Agent on the same state dir.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from agent import catalog
from agent.catalog import Lane, Role
from agent.commands.base import Context, Handler, ResourceLocks
from agent.config import Config
from agent.hw.bootid import rejoin_markers
from agent.proto import agent_pb2, session_pb2
from agent.runtime.core import Agent, read_boot_id
from agent.runtime.journal import Journal
from agent.security.trust import SigningKey, verify_result
from tests.runtime.core_harness import (
    NODE,
    WAIT,
    Blocking,
    Picky,
    Quick,
    World,
    accepted,
    rejected,
)
from tests.runtime.harness import wait_until
from tests.runtime.procs import kill_leftovers, wait_group_gone

# -- lanes --------------------------------------------------------------------------------------


def test_control_command_completes_while_provision_is_held(world: World) -> None:
    wipe = Blocking("disk.wipe")
    inv = Quick("inventory.refresh")
    agent, frames = world.agent({"disk.wipe": wipe, "inventory.refresh": inv})
    accepted(agent.submit(world.command("w1", "disk.wipe")))
    assert wipe.started.wait(WAIT)
    assert accepted(agent.submit(world.command("i1", "inventory.refresh"))).state == session_pb2.QUEUED
    body = frames.result("i1")
    assert body.status == session_pb2.SUCCEEDED
    assert not wipe.release.is_set() and frames.of("result", "w1") == []
    wipe.release.set()
    assert frames.result("w1").status == session_pb2.SUCCEEDED


def test_timeout_kills_children_and_reports_timed_out(world: World) -> None:
    groups: list[int] = []

    def body(ctx: Context) -> Message:
        with ctx.running(["sh", "-c", "sleep 300 & sleep 300; wait"]) as child:
            groups.append(child.popen.pid)
            ctx.run(["sleep", "300"])
        return agent_pb2.InventoryRefreshResult()

    agent, frames = world.agent({"inventory.refresh": Quick("inventory.refresh", body)})
    accepted(agent.submit(world.command("t1", "inventory.refresh", timeout=1)))
    result = frames.result("t1")
    try:
        assert result.status == session_pb2.TIMED_OUT and result.reason == "timeout"
        assert groups and all(wait_group_gone(g, 5) == [] for g in groups)
    finally:
        for g in groups:
            kill_leftovers(g)


def test_cancel_kills_children_and_reports_cancelled(world: World) -> None:
    groups: list[int] = []
    started = threading.Event()

    def body(ctx: Context) -> Message:
        with ctx.running(["sleep", "300"]) as child:
            groups.append(child.popen.pid)
            started.set()
            ctx.run(["sleep", "300"])
        return agent_pb2.WipeResult()

    agent, frames = world.agent({"disk.wipe": Quick("disk.wipe", body)})
    accepted(agent.submit(world.command("c1", "disk.wipe")))
    assert started.wait(WAIT)
    agent.cancel("c1", "operator")
    result = frames.result("c1")
    try:
        assert result.status == session_pb2.CANCELLED and result.reason == "cancelled"
        assert "operator" in result.message
        assert wait_group_gone(groups[0], 5) == []
    finally:
        kill_leftovers(groups[0])


# -- admission ----------------------------------------------------------------------------------


def test_role_and_kind_refusals_run_nothing(world: World) -> None:
    handlers: dict[str, Handler[Any]] = {k: Quick(k) for k in ("bmc.power", "gpu.reset", "inventory.refresh")}
    agent, _ = world.agent(handlers)
    assert rejected(agent.submit(world.command("s1", "bmc.power"))) == "not_this_daemon"
    assert rejected(agent.submit(world.command("g1", "gpu.reset"))) == "wrong_role"
    unknown = session_pb2.CommandBody(command_id="u1", kind="gpu.overclock", node_id=NODE)
    unknown_cmd = session_pb2.SignedCommand(body=unknown.SerializeToString())
    assert rejected(agent.submit(unknown_cmd)) == "unknown_kind"
    assert all(not h.calls for h in handlers.values())  # type: ignore[attr-defined]
    assert agent.state_of("s1") == session_pb2.COMMAND_STATE_UNSPECIFIED


def test_trust_refusals_through_submit(world: World) -> None:
    wipe = Quick("disk.wipe")
    agent, _ = world.agent({"disk.wipe": wipe})
    stranger = SigningKey.generate()
    now = int(time.time() * 1000)
    unsigned = world.command("t-unsigned", "disk.wipe", sign=False)
    assert rejected(agent.submit(unsigned)) == "signature_missing"
    other = world.command("t-other", "disk.wipe", sign=False)
    assert rejected(agent.submit(stranger.sign_command(session_pb2.CommandBody.FromString(other.body)))) \
        == "signature_unknown_key"
    good = world.command("t-mod", "disk.wipe")
    body = session_pb2.CommandBody.FromString(good.body)
    body.payload = agent_pb2.WipeRequest(passes=7).SerializeToString()
    tampered = session_pb2.SignedCommand(body=body.SerializeToString(), key_id=good.key_id,
                                         signature=good.signature)
    assert rejected(agent.submit(tampered)) == "signature_invalid"
    assert rejected(agent.submit(world.command("t-node", "disk.wipe", node_id="node-2"))) == "wrong_node"
    expired = world.command("t-exp", "disk.wipe", expires_at_unix_ms=now - 1)
    assert rejected(agent.submit(expired)) == "expired"
    assert rejected(agent.submit(world.command("t-noexp", "disk.wipe", expires_at_unix_ms=0))) == "expired"
    assert wipe.calls == []
    # none of the refused ids is remembered: a correct command may use one of them later
    assert accepted(agent.submit(world.command("t-unsigned", "disk.wipe")))


def test_a_destructive_command_captured_in_one_boot_is_refused_in_the_next(world: World) -> None:
    """The journal (tmpfs) does not survive a reboot; the boot id in the signed body does the
    job it can no longer do: the same signed bytes, resent after the reboot, are refused."""
    first = Quick("disk.wipe")
    agent, frames = world.agent({"disk.wipe": first}, boot_id="boot-A")
    captured = world.command("w-once", "disk.wipe")
    accepted(agent.submit(captured))
    assert frames.result("w-once").status == session_pb2.SUCCEEDED
    agent.stop()
    (world.state / "journal").unlink()  # the reboot: /run is gone with what it remembered
    again = Quick("disk.wipe")
    agent, _ = world.agent({"disk.wipe": again, "inventory.refresh": Quick("inventory.refresh")},
                           boot_id="boot-B")
    answer = agent.submit(captured)
    assert isinstance(answer, session_pb2.Reject) and answer.reason == "wrong_boot", answer
    assert "boot-A" in answer.message and "boot-B" in answer.message
    assert first.calls == ["w-once"] and again.calls == []
    # A non-destructive command without a boot id still runs (older control planes).
    accepted(agent.submit(world.command("inv", "inventory.refresh")))


def test_a_destructive_command_captured_before_a_lost_journal_is_refused_in_the_same_boot(
    world: World,
) -> None:
    """The journal lost within one boot (its tmpfs directory removed, no reboot): the boot id
    still matches, but the agent's state is new, announced in the Hello, and the captured
    command, bound to the old state, is refused before it runs again."""
    first = Quick("disk.wipe")
    agent, frames = world.agent({"disk.wipe": first}, boot_id="boot-A")
    old_state = agent.hello().state_id
    assert old_state and old_state == agent.state_id
    captured = world.command("w-state", "disk.wipe")
    assert session_pb2.CommandBody.FromString(captured.body).state_id == old_state
    accepted(agent.submit(captured))
    assert frames.result("w-state").status == session_pb2.SUCCEEDED
    agent.stop()
    # A restart that keeps the journal keeps the state: the id is known, not run again.
    agent, _ = world.agent({"disk.wipe": first}, boot_id="boot-A")
    assert agent.hello().state_id == old_state
    assert isinstance(agent.submit(captured), session_pb2.Accept)
    agent.stop()
    shutil.rmtree(world.state)                # /run/bettercompute-agent removed, same boot
    again = Quick("disk.wipe")
    agent, _ = world.agent({"disk.wipe": again}, boot_id="boot-A")
    assert agent.hello().state_id not in ("", old_state)
    answer = agent.submit(captured)
    assert isinstance(answer, session_pb2.Reject) and answer.reason == "wrong_state", answer
    assert old_state in answer.message
    unbound = session_pb2.CommandBody.FromString(captured.body)
    unbound.command_id, unbound.state_id = "w-unbound", ""
    answer = agent.submit(world.cp.sign_command(unbound))
    assert isinstance(answer, session_pb2.Reject) and answer.reason == "wrong_state", answer
    assert first.calls == ["w-state"] and again.calls == []
    # Bound to the new state (what the gateway does at delivery), it runs.
    accepted(agent.submit(world.command("w-new", "disk.wipe")))


def test_logs_collect_outside_its_allow_list_is_refused_at_admission(world: World) -> None:
    """Refused before it is accepted (nothing journaled, nothing queued), not failed when it runs."""
    from agent.commands.bulk.logs import LogsCollect

    agent, _ = world.agent({"logs.collect": LogsCollect()})
    for cid, path in (("l-etc", "/etc/shadow"), ("l-up", "/var/log/../../etc/passwd"),
                      ("l-key", str(world.state / "node.key"))):
        payload = agent_pb2.LogsCollectRequest(paths=[path])
        answer = agent.submit(world.command(cid, "logs.collect", payload))
        assert isinstance(answer, session_pb2.Reject), (path, answer)
        assert answer.reason == "invalid_parameters"
        assert agent.journal.lookup(cid) is None
    inside = agent_pb2.LogsCollectRequest(paths=["/var/log/no-such-file.log"])  # it exists or not at run time
    accepted(agent.submit(world.command("l-ok", "logs.collect", inside)))


def test_bad_input_is_refused_with_invalid_parameters(world: World) -> None:
    agent, _ = world.agent({"disk.wipe": Picky("disk.wipe"), "inventory.refresh": Quick("inventory.refresh")})
    assert rejected(agent.submit(session_pb2.SignedCommand(body=b"\xff\xff\xff"))) == "invalid_parameters"
    no_id = session_pb2.CommandBody(kind="inventory.refresh")
    assert rejected(agent.submit(session_pb2.SignedCommand(body=no_id.SerializeToString()))) \
        == "invalid_parameters"
    limit = catalog.KINDS["inventory.refresh"].timeout_seconds
    assert rejected(agent.submit(world.command("x1", "inventory.refresh", timeout=limit + 1))) \
        == "invalid_parameters"
    assert rejected(agent.submit(world.command("x2", "disk.wipe"))) == "invalid_parameters"  # parse() refuses
    bad = session_pb2.CommandBody(command_id="x3", kind="inventory.refresh", payload=b"\xff\xff")
    assert rejected(agent.submit(session_pb2.SignedCommand(body=bad.SerializeToString()))) \
        == "invalid_parameters"
    # none of them ran, none is remembered
    assert accepted(agent.submit(world.command("x1", "inventory.refresh", timeout=limit)))


def test_no_handler_is_unsupported_and_not_in_hello(world: World) -> None:
    agent, _ = world.agent({"inventory.refresh": Quick("inventory.refresh")})
    assert rejected(agent.submit(world.command("d1", "diag.nvml"))) == "unsupported"
    hello = agent.hello()
    assert list(hello.kinds) == ["inventory.refresh"]


def test_a_full_lane_refuses_busy_at_admission_with_nothing_journaled(world: World) -> None:
    """lane_max_queued: past the bound a command is refused ``busy`` before it is journaled,
    and the same command sent again once there is room runs (the control plane's retry)."""
    wipe = Blocking("disk.wipe")
    agent, frames = world.agent({"disk.wipe": wipe, "inventory.refresh": Quick("inventory.refresh")},
                                workers={Lane.CONTROL: 1, Lane.PROVISION: 1, Lane.BULK: 1},
                                settings={"lane_max_queued": 2})
    accepted(agent.submit(world.command("w1", "disk.wipe")))
    assert wipe.started.wait(WAIT)                      # w1 holds the provision lane's worker
    accepted(agent.submit(world.command("w2", "disk.wipe")))
    accepted(agent.submit(world.command("w3", "disk.wipe")))   # two queued: the bound
    late = world.command("w4", "disk.wipe")
    answer = agent.submit(late)
    assert rejected(answer) == "busy" and "lane_max_queued" in answer.message
    assert agent.journal.lookup("w4") is None
    accepted(agent.submit(world.command("i1", "inventory.refresh")))  # the control lane has room
    assert frames.result("i1").status == session_pb2.SUCCEEDED
    wipe.release.set()
    for cid in ("w1", "w2", "w3"):
        assert frames.result(cid).status == session_pb2.SUCCEEDED
    accepted(agent.submit(late))                         # the same command, sent again, runs
    assert frames.result("w4").status == session_pb2.SUCCEEDED


def test_drain_refuses_new_commands_after_finishing(world: World) -> None:
    wipe = Blocking("disk.wipe")
    agent, frames = world.agent({"disk.wipe": wipe, "inventory.refresh": Quick("inventory.refresh")})
    accepted(agent.submit(world.command("w1", "disk.wipe")))
    assert wipe.started.wait(WAIT)
    drained = threading.Thread(target=agent.drain)
    drained.start()
    wait_until(
        lambda: rejected_or_none(agent.submit(world.command(f"late-{time.monotonic()}", "inventory.refresh")))
        == "draining", WAIT, "the agent to refuse new commands while draining",
    )
    assert drained.is_alive()  # still waiting for w1
    wipe.release.set()
    drained.join(WAIT)
    assert not drained.is_alive()
    # drain returned only once the result was handed to the subscribers (no waiting here)
    (result,) = frames.of("result", "w1")
    assert session_pb2.ResultBody.FromString(result.body).status == session_pb2.SUCCEEDED


class NotingThread(Blocking):
    """Blocking, noting the worker threads it runs on (to wait for them to end)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.threads: list[threading.Thread] = []

    def run(self, ctx: Context, params: Message) -> Message:
        self.threads.append(threading.current_thread())
        return super().run(ctx, params)


class NotingContention(ResourceLocks):
    """The agent's resource locks, setting ``contended`` when a hold finds its lock taken."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = threading.Event()

    def _lock(self, name: str) -> Any:
        return _NotedLock(super()._lock(name), self.contended)


class _NotedLock:
    def __init__(self, lock: threading.Lock, contended: threading.Event) -> None:
        self.lock, self.contended = lock, contended

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self.lock.acquire(blocking, timeout)
        if not got:
            self.contended.set()
        return got

    def release(self) -> None:
        self.lock.release()


def rejected_or_none(answer: Any) -> str | None:
    return answer.reason if isinstance(answer, session_pb2.Reject) else None


def test_accept_only_after_the_journal_has_it(world: World) -> None:
    wipe = Blocking("disk.wipe")
    agent, _ = world.agent({"disk.wipe": wipe})
    accepted(agent.submit(world.command("j1", "disk.wipe")))
    # another reader of the file sees the record as soon as submit returned
    reader = Journal(world.state / "journal")
    reader.open()
    assert "j1" in reader.entries
    reader.close()


# -- known ids ------------------------------------------------------------------------------------


def test_same_bytes_return_state_and_result_different_bytes_replayed(world: World) -> None:
    inv = Quick("inventory.refresh")
    agent, frames = world.agent({"inventory.refresh": inv, "disk.wipe": Quick("disk.wipe")})
    cmd = world.command("k1", "inventory.refresh")
    accepted(agent.submit(cmd))
    frames.result("k1")
    again = accepted(agent.submit(cmd))
    assert again.state == session_pb2.FINISHED and len(frames.of("result", "k1")) == 2
    assert inv.calls == ["k1"]
    other = world.command("k1", "inventory.refresh", payload=agent_pb2.InventoryRefreshRequest())
    other_body = session_pb2.CommandBody.FromString(other.body)
    other_body.issued_at_unix_ms += 1
    different = session_pb2.SignedCommand(body=other_body.SerializeToString())
    assert rejected(agent.submit(different)) == "replayed"
    agent.ack("k1")
    assert accepted(agent.submit(cmd)).state == session_pb2.ACKNOWLEDGED
    assert rejected(agent.submit(world.command("k1", "disk.wipe"))) == "replayed"
    assert inv.calls == ["k1"]


def test_concurrent_submits_of_one_id_run_it_once(world: World) -> None:
    inv = Quick("inventory.refresh")
    agent, frames = world.agent({"inventory.refresh": inv})
    cmd = world.command("once", "inventory.refresh")
    answers: list[Any] = []
    threads = [threading.Thread(target=lambda: answers.append(agent.submit(cmd))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(answers) == 8 and all(isinstance(a, session_pb2.Accept) for a in answers)
    frames.result("once")
    assert agent.wait_idle(WAIT)
    assert inv.calls == ["once"]


# -- crash and replay -----------------------------------------------------------------------------


def test_retry_safe_command_runs_again_after_a_crash(world: World) -> None:
    dcgm = NotingThread("diag.dcgm")
    first, _ = world.agent({"diag.dcgm": dcgm})
    accepted(first.submit(world.command("r1", "diag.dcgm")))
    assert dcgm.started.wait(WAIT)
    first.stop(timeout=0.2)  # the "crash": nothing more of this agent reaches the journal

    again = Quick("diag.dcgm")
    second, frames = world.agent({"diag.dcgm": again})
    body = frames.result("r1")
    assert body.status == session_pb2.SUCCEEDED and again.calls == ["r1"]
    entry = second.journal.entries["r1"]
    assert entry.attempts == 2
    # attested: signed by the node key, which survived the restart
    signed = second.unacked_results()[0]
    assert verify_result(signed, first.node_key.public_raw).command_id == "r1"
    dcgm.release.set()  # the old handler returns into a closed journal: nothing changes
    (old_worker,) = dcgm.threads
    old_worker.join(WAIT)  # its worker has handed on the outcome and exited
    assert not old_worker.is_alive()
    assert [session_pb2.ResultBody.FromString(r.body).command_id for r in second.unacked_results()] == ["r1"]


def test_a_destructive_command_of_an_earlier_boot_is_not_rerun_from_a_surviving_journal(world: World) -> None:
    """Node role, the journal on disk: a retry-safe gpu.reset under way when the node rebooted
    is not run again in the new boot (it was issued for the old one); it fails wrong_boot."""
    reset = Blocking("gpu.reset")
    first, _ = world.agent({"gpu.reset": reset}, role=Role.NODE, boot_id="boot-A")
    accepted(first.submit(world.command("g1", "gpu.reset")))
    assert reset.started.wait(WAIT)
    first.stop(timeout=0.2)
    again = Quick("gpu.reset")
    _, frames = world.agent({"gpu.reset": again}, role=Role.NODE, boot_id="boot-B")
    body = frames.result("g1")
    assert (body.status, body.reason) == (session_pb2.FAILED, "wrong_boot") and again.calls == []
    reset.release.set()


def test_non_retry_safe_command_is_interrupted_and_not_run_again(world: World) -> None:
    wipe = Blocking("disk.wipe")
    first, _ = world.agent({"disk.wipe": wipe}, workers={Lane.CONTROL: 1, Lane.PROVISION: 1, Lane.BULK: 1})
    n1 = world.command("n1", "disk.wipe")
    accepted(first.submit(n1))
    assert wipe.started.wait(WAIT)
    accepted(first.submit(world.command("n2", "disk.wipe")))  # queued behind n1, never started
    first.stop(timeout=0.2)

    again = Quick("disk.wipe")
    second, frames = world.agent({"disk.wipe": again})
    hello = second.hello()
    interrupted = [session_pb2.ResultBody.FromString(r.body) for r in hello.unacked_results]
    assert [(b.command_id, b.status, b.reason) for b in interrupted][:1] == [
        ("n1", session_pb2.INTERRUPTED, "interrupted")
    ]
    assert frames.result("n2").status == session_pb2.SUCCEEDED
    assert frames.of("result", "n1") == []  # decided while starting: it travels in the Hello only
    assert again.calls == ["n2"] and wipe.calls == ["n1"]
    assert len(again.interrupted) == 1  # n1's handler undid what it left half done, once
    # a resend of n1 returns its state, it does not run it
    assert accepted(second.submit(n1)).state == session_pb2.FINISHED
    assert again.calls == ["n2"]


def test_unacked_results_are_kept_and_resent(world: World) -> None:
    inv = Quick("inventory.refresh")
    first, frames = world.agent({"inventory.refresh": inv})
    cmds = {cid: world.command(cid, "inventory.refresh") for cid in ("u1", "u2")}
    for cid, cmd in cmds.items():
        accepted(first.submit(cmd))
        frames.result(cid)
    first.ack("u1")
    first.stop()
    second, _ = world.agent({"inventory.refresh": inv})
    ids = [session_pb2.ResultBody.FromString(r.body).command_id for r in second.hello().unacked_results]
    assert ids == ["u2"]
    second.ack("u2")
    second.stop()
    third, _ = world.agent({"inventory.refresh": inv})
    assert list(third.hello().unacked_results) == []
    assert accepted(third.submit(cmds["u1"])).state == session_pb2.ACKNOWLEDGED
    assert inv.calls == ["u1", "u2"]


# -- frames ----------------------------------------------------------------------------------------


def test_progress_and_logs_are_rate_bounded_last_progress_kept(world: World) -> None:
    def chatty(ctx: Context) -> Message:
        for i in range(1, 201):
            ctx.progress(done=i, total=200)
        for i in range(500):
            ctx.log.info("line %d", i)
        return agent_pb2.InventoryRefreshResult()

    agent, frames = world.agent({"inventory.refresh": Quick("inventory.refresh", chatty)})
    accepted(agent.submit(world.command("p1", "inventory.refresh")))
    frames.result("p1")
    with frames.cond:
        kinds = [f.WhichOneof("msg") for f in frames.frames]
    progress = frames.of("progress", "p1")
    assert 1 <= len(progress) < 200
    assert progress[-1].done == 200  # the last one is always delivered...
    last_progress = max(i for i, k in enumerate(kinds) if k == "progress")
    assert kinds.index("result") > last_progress  # ...before the result
    logs = frames.of("log", "p1")
    assert 1 <= len(logs) < 500
    assert logs[0].message == "line 0"
    assert len(logs) + sum(line.dropped_before for line in logs) <= 500


def test_hello_describes_the_agent(world: World, tmp_path: Path) -> None:
    agent, _ = world.agent({"inventory.refresh": Quick("x"), "gpu.reset": Quick("y")})
    hello = agent.hello()
    assert hello.node_id == NODE and hello.role == "ramdisk" and hello.boot_id == "boot-A"
    assert list(hello.kinds) == ["inventory.refresh"]  # gpu.reset is not a ramdisk kind
    on_disk = SigningKey.load(world.state / "node.key").public_raw
    assert hello.public_key == agent.node_key.public_raw == on_disk
    real = Agent(Config(state_dir=tmp_path / "other", node_id=NODE), handlers={}, cmdline="")
    assert real.boot_id == read_boot_id() and len(real.boot_id) == 36


def test_rejoin_marker_parsing() -> None:
    assert rejoin_markers("a bc.rejoin=node.reboot:c1:b1 bc.rejoin=x:y bc.rejoin= b") == [
        ("node.reboot", "c1", "b1")
    ]


def test_a_retry_safe_command_that_keeps_killing_the_agent_stops_being_retried(world: World) -> None:
    from agent.runtime.core import MAX_ATTEMPTS

    cmd = world.command("poison", "diag.dcgm")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        dcgm = Blocking("diag.dcgm")
        agent, _ = world.agent({"diag.dcgm": dcgm})
        if attempt == 1:
            accepted(agent.submit(cmd))
        assert dcgm.started.wait(WAIT)
        assert agent.journal.entries["poison"].attempts == attempt
        agent.stop(timeout=0.2)
    last = Quick("diag.dcgm")
    agent, _ = world.agent({"diag.dcgm": last})
    (result,) = agent.unacked_results()
    body = verify_result(result, agent.node_key.public_raw)
    assert body.status == session_pb2.INTERRUPTED and str(MAX_ATTEMPTS) in body.message
    assert last.calls == []


def test_log_lines_of_other_modules_reach_the_gateway_with_the_command(world: World) -> None:
    import logging

    def body(ctx: Context) -> Message:
        logging.getLogger("agent.hw.example").warning("disk %s is busy", "sda")
        return agent_pb2.InventoryRefreshResult()

    agent, frames = world.agent({"inventory.refresh": Quick("inventory.refresh", body)})
    accepted(agent.submit(world.command("l1", "inventory.refresh")))
    frames.result("l1")
    lines = [(line.level, line.message) for line in frames.of("log", "l1")]
    assert lines == [("warning", "disk sda is busy")]


def test_many_commands_with_a_small_journal_bound_survive_restart(world: World) -> None:
    inv = Quick("inventory.refresh")
    agent, _ = world.agent({"inventory.refresh": inv}, journal_compact_bytes=8 * 1024)
    for i in range(150):
        accepted(agent.submit(world.command(f"m{i}", "inventory.refresh")))
    assert agent.wait_idle(WAIT)
    for i in range(0, 150, 2):
        agent.ack(f"m{i}")
    assert agent.journal.compactions > 0
    size = (world.state / "journal").stat().st_size
    agent.stop()
    again, _ = world.agent({"inventory.refresh": inv}, journal_compact_bytes=8 * 1024)
    ids = sorted(session_pb2.ResultBody.FromString(r.body).command_id for r in again.unacked_results())
    assert ids == sorted(f"m{i}" for i in range(1, 150, 2))
    assert again.state_of("m0") == session_pb2.ACKNOWLEDGED
    assert size < 200 * 1024


def test_hello_carries_unacked_results_up_to_a_budget_and_the_rest_follow(world: World) -> None:
    inv = Quick("inventory.refresh")
    agent, frames = world.agent({"inventory.refresh": inv})
    for i in range(20):
        accepted(agent.submit(world.command(f"h{i:02d}", "inventory.refresh")))
    assert agent.wait_idle(WAIT)
    agent.stop()
    again, frames = world.agent({"inventory.refresh": inv})
    one = again.unacked_results()[0].ByteSize()
    hello = again.hello(results_bytes=5 * (one + 8))
    in_hello = [session_pb2.ResultBody.FromString(r.body).command_id for r in hello.unacked_results]
    following = [session_pb2.ResultBody.FromString(r.body).command_id for r in frames.of("result")]
    assert in_hello == [f"h{i:02d}" for i in range(5)]
    assert following == [f"h{i:02d}" for i in range(5, 20)]


def test_the_site_role_serves_only_the_kinds_it_has_handlers_for(tmp_path: Path) -> None:
    agent = Agent(Config(state_dir=tmp_path, node_id=NODE, role=Role.SITE),
                  handlers={"inventory.refresh": Quick("inventory.refresh"),
                            "deploy.image": Quick("deploy.image")},
                  boot_id="b", cmdline="")
    assert agent.served_kinds() == ["inventory.refresh"]


def test_a_command_whose_acceptance_cannot_be_journaled_is_rejected_and_never_runs(world: World) -> None:
    wipe = Quick("disk.wipe")
    agent, _ = world.agent({"disk.wipe": wipe})

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    agent.journal._fsync = broken_fsync  # the tmpfs is full
    assert rejected(agent.submit(world.command("f1", "disk.wipe"))) == "internal"
    agent.stop()
    again, _ = world.agent({"disk.wipe": wipe})
    assert again.state_of("f1") == session_pb2.COMMAND_STATE_UNSPECIFIED
    assert again.wait_idle(WAIT) and wipe.calls == []


def test_resource_locks_serialize_commands_across_lanes(world: World) -> None:
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def wipe_body(ctx: Context) -> Message:
        with ctx.hold("disk:S-1"):
            order.append("wipe in")
            inside.set()
            while not release.wait(0.02):
                ctx.check()
            order.append("wipe out")
        return agent_pb2.WipeResult()

    def inventory_body(ctx: Context) -> Message:
        with ctx.hold("disk:S-1"):
            order.append("inventory in")
        return agent_pb2.InventoryRefreshResult()

    world.releases.append(release)
    agent, frames = world.agent({"disk.wipe": Quick("disk.wipe", wipe_body),
                                 "inventory.refresh": Quick("inventory.refresh", inventory_body)})
    agent.locks = locks = NotingContention()
    accepted(agent.submit(world.command("w", "disk.wipe")))
    assert inside.wait(WAIT)
    accepted(agent.submit(world.command("i", "inventory.refresh")))
    assert locks.contended.wait(WAIT)  # inventory asked for disk:S-1 and found it taken
    assert order == ["wipe in"]  # the control command waits for the disk, not for the lane
    release.set()
    frames.result("i")
    assert order == ["wipe in", "wipe out", "inventory in"]


def test_stop_kills_the_children_of_running_commands_and_leaves_them_to_the_journal(world: World) -> None:
    groups: list[int] = []
    started = threading.Event()

    def body(ctx: Context) -> Message:
        with ctx.running(["sleep", "300"]) as child:
            groups.append(child.popen.pid)
            started.set()
            ctx.run(["sleep", "300"])
        return agent_pb2.DiagDcgmResult()

    agent, frames = world.agent({"diag.dcgm": Quick("diag.dcgm", body)})
    accepted(agent.submit(world.command("s1", "diag.dcgm")))
    assert started.wait(WAIT)
    agent.stop(timeout=10)
    try:
        assert wait_group_gone(groups[0], 5) == []
    finally:
        kill_leftovers(groups[0])
    assert frames.of("result", "s1") == []
    after, _ = world.agent({"diag.dcgm": Quick("diag.dcgm")})
    assert after.wait_idle(WAIT)
    (result,) = after.unacked_results()
    assert session_pb2.ResultBody.FromString(result.body).status == session_pb2.SUCCEEDED  # re-run


def test_a_release_report_is_signed_by_the_node_key_whatever_the_kind(world: World) -> None:
    """inventory.refresh is not attested, but its release report is evidence the control plane
    returns a node to the pool on: that result is signed; one without a report is not."""
    report = agent_pb2.InventoryRefreshResult(release=agent_pb2.ReleaseReport(pool_ready=True))
    agent, frames = world.agent({"inventory.refresh": Quick("inventory.refresh", lambda ctx: report),
                                 "logs.collect": Quick("logs.collect",
                                                       lambda ctx: agent_pb2.InventoryRefreshResult())})
    accepted(agent.submit(world.command("r1", "inventory.refresh")))
    accepted(agent.submit(world.command("r2", "logs.collect")))
    frames.result("r1")
    frames.result("r2")
    signed = {session_pb2.ResultBody.FromString(r.body).command_id: r for r in agent.unacked_results()}
    assert verify_result(signed["r1"], agent.node_key.public_raw).command_id == "r1"
    assert signed["r2"].signature == b""
