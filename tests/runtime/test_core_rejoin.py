"""Self-terminating commands in process: waiting for idle lanes, the interim result, the exit
hooks, and completion after the rejoin (new boot id, new version, kernel command line)."""

from __future__ import annotations

import time
from pathlib import Path

from agent.catalog import Role
from agent.proto import agent_pb2, session_pb2
from agent.runtime.core import Agent
from agent.runtime.journal import State
from tests.runtime.core_harness import (
    WAIT,
    Blocking,
    Quick,
    Terminating,
    World,
    accepted,
    rejected,
)
from tests.runtime.harness import wait_until


def phase_of(agent: Agent, cid: str) -> str:
    """What the command is doing, as its timeout message would say."""
    job = agent.scheduler.get(cid)
    phase = job.phase if job is not None else ""
    return phase() if callable(phase) else phase


# -- self-terminating ------------------------------------------------------------------------------


def test_self_terminating_waits_for_other_lanes_then_acts(world: World) -> None:
    wipe = Blocking("disk.wipe")
    kexec = Terminating("boot.kexec")
    agent, frames = world.agent({"disk.wipe": wipe, "boot.kexec": kexec, "inventory.refresh": Quick("x")})
    hooks: list[float] = []
    results_at_hook: list[int] = []

    def exit_hook() -> None:
        hooks.append(time.monotonic())
        results_at_hook.append(len(frames.of("result", "k1")))

    agent.add_exit_hook(exit_hook)
    accepted(agent.submit(world.command("w1", "disk.wipe")))
    assert wipe.started.wait(WAIT)
    accepted(agent.submit(world.command("k1", "boot.kexec")))
    wait_until(lambda: phase_of(agent, "k1") == "waiting for w1 to finish", WAIT, "k1 to wait for w1")
    assert kexec.calls == ["k1"] and kexec.actions == [] and hooks == []  # waiting for w1
    assert rejected(agent.submit(world.command("i1", "inventory.refresh"))) == "draining"
    released = time.monotonic()
    wipe.release.set()
    assert frames.result("w1").status == session_pb2.SUCCEEDED
    wait_until(lambda: kexec.actions, WAIT, "the kexec action")
    assert hooks and hooks[0] <= kexec.actions[0] and kexec.actions[0] >= released
    assert kexec.boot_ids == ["boot-A"]  # the core's boot id, for the handler's own rejoin marker
    # the handler's prepared result went out as the interim result, before the exit hooks ran
    (interim,) = frames.of("result", "k1")
    assert results_at_hook == [1]
    interim_body = session_pb2.ResultBody.FromString(interim.body)
    assert interim_body.status == session_pb2.SUCCEEDED
    assert interim_body.payload_type == "bettercompute.agent.v1.KexecResult"
    agent.ack("k1")  # the interim result's ack does not end the wait for the rejoin
    assert agent.journal.entries["k1"].state is State.AWAITING_REJOIN
    assert agent.journal.entries["k1"].proof == {"old_boot_id": "boot-A"}
    assert [s.state for s in agent.hello().in_flight if s.command_id == "k1"] == [session_pb2.AWAITING_REJOIN]
    agent.stop()

    # the next agent, in a new boot, reports the kexec complete
    rebooted, _ = world.agent({"boot.kexec": Terminating("boot.kexec")}, boot_id="boot-B")
    completions = list(rebooted.hello().completions)
    assert [(c.command_id, c.ok, c.old_boot_id, c.new_boot_id) for c in completions] == [
        ("k1", True, "boot-A", "boot-B")
    ]
    rebooted.ack("k1")
    assert list(rebooted.hello().completions) == []
    assert rejected(rebooted.submit(world.command("k1", "boot.kexec", payload=agent_pb2.KexecRequest(
        cmdline="other")))) == "replayed"


def test_self_terminating_in_the_same_boot_is_not_complete(world: World) -> None:
    kexec = Terminating("boot.kexec")
    agent, _ = world.agent({"boot.kexec": kexec})
    accepted(agent.submit(world.command("k2", "boot.kexec")))
    wait_until(lambda: kexec.actions, WAIT, "the kexec action")
    agent.stop()
    same, _ = world.agent({"boot.kexec": kexec}, boot_id="boot-A")
    (c,) = same.hello().completions
    assert c.command_id == "k2" and not c.ok and c.reason == "interrupted" and "same boot" in c.message


def test_self_terminating_fails_at_its_deadline_when_lanes_stay_busy(world: World) -> None:
    wipe = Blocking("disk.wipe")
    kexec = Terminating("boot.kexec")
    agent, frames = world.agent({"disk.wipe": wipe, "boot.kexec": kexec, "inventory.refresh": Quick("x")})
    accepted(agent.submit(world.command("w1", "disk.wipe")))
    assert wipe.started.wait(WAIT)
    accepted(agent.submit(world.command("k3", "boot.kexec", timeout=1)))
    body = frames.result("k3")
    assert body.status == session_pb2.TIMED_OUT and "w1" in body.message
    assert kexec.actions == []
    # the agent takes commands again
    assert accepted(agent.submit(world.command("i2", "inventory.refresh")))


def test_completion_from_kernel_command_line(world: World) -> None:
    agent, _ = world.agent(
        {"boot.kexec": Terminating("boot.kexec")}, boot_id="boot-new",
        cmdline="console=ttyS0 bc.rejoin=boot.kexec:k-9:boot-old bc.rejoin=bogus quiet",
    )
    (c,) = agent.hello().completions
    assert (c.command_id, c.kind, c.ok, c.old_boot_id, c.new_boot_id) == ("k-9", "boot.kexec", True,
                                                                          "boot-old", "boot-new")
    agent.ack("k-9")
    agent.stop()
    # the agent restarts in the same boot: the marker is still on the command line, but acked
    again, _ = world.agent({}, boot_id="boot-new", cmdline="bc.rejoin=boot.kexec:k-9:boot-old")
    assert list(again.hello().completions) == []


def test_upgrade_completion_by_version(world: World) -> None:
    up = Terminating("daemon.upgrade", proof={"old_version": "1.0", "new_version": "2.0"})
    agent, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="1.0")
    accepted(agent.submit(world.command("up1", "daemon.upgrade")))
    wait_until(lambda: up.actions, WAIT, "the upgrade action")
    agent.stop()
    new, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="2.0")
    (c,) = new.hello().completions
    assert c.ok and c.new_version == "2.0" and c.old_version == "1.0"


def test_upgrade_not_reached_is_a_failed_completion(world: World) -> None:
    up = Terminating("daemon.upgrade", proof={"old_version": "1.0", "new_version": "2.0"})
    agent, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="1.0")
    accepted(agent.submit(world.command("up3", "daemon.upgrade")))
    wait_until(lambda: up.actions, WAIT, "the upgrade action")
    agent.stop()
    old, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="1.0", boot_id="boot-Z")
    (c,) = old.hello().completions
    assert not c.ok and c.reason == "interrupted" and "2.0" in c.message


class RollbackAware(Terminating):
    """daemon.upgrade-like: its completion hook reports a rollback the launcher recorded."""

    def __init__(self, marker: Path) -> None:
        super().__init__("daemon.upgrade", proof={"old_version": "1.0", "new_version": "2.0"})
        self.marker = marker

    def completion(
        self, proof: dict[str, str], *, boot_id: str, version: str
    ) -> tuple[bool, str, str] | None:
        if version != proof["new_version"] and self.marker.exists():
            return False, "bad_image", f"rolled back to {version}: {self.marker.read_text()}"
        return None


def test_completion_is_judged_by_the_agent_that_reports_it(world: World) -> None:
    marker = world.tmp / "rolled-back"
    up = RollbackAware(marker)
    old, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="1.0")
    accepted(old.submit(world.command("up9", "daemon.upgrade")))
    wait_until(lambda: up.actions, WAIT, "the upgrade action")
    assert list(old.hello().completions) == []  # the agent that ends does not report itself
    old.stop()
    # the new version starts and would call it complete, but never reaches the gateway...
    trial, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="2.0")
    assert [c.ok for c in trial.hello().completions] == [True]
    trial.stop()
    # ...so the launcher rolls back; the old version reports what really happened
    marker.write_text("new version did not reach the gateway within 120 s")
    back, _ = world.agent({"daemon.upgrade": up}, role=Role.NODE, version_string="1.0")
    (c,) = back.hello().completions
    assert not c.ok and c.reason == "bad_image" and "did not reach the gateway" in c.message
    back.ack("up9")
    assert list(back.hello().completions) == []
    assert back.state_of("up9") == session_pb2.ACKNOWLEDGED
