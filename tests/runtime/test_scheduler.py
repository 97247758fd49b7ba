"""Lanes, deadlines and cancellation, on real threads and real child processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agent import catalog
from agent.catalog import Lane
from agent.commands.base import Context
from agent.errors import AgentError, Busy, Cancelled, CommandTimeout, Reason
from agent.runtime.scheduler import Job, JobState, Scheduler
from tests.runtime.harness import wait_until
from tests.runtime.procs import kill_leftovers, wait_group_gone

WAIT = 30.0  # generous bound for anything that should happen "at once" on a slow CI machine


class Outcomes:
    def __init__(self) -> None:
        self.done: dict[str, tuple[Any, AgentError | None]] = {}
        self.order: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, job: Job, value: Any, error: AgentError | None) -> None:
        with self.cond:
            assert job.id not in self.done, "on_done called twice"
            self.done[job.id] = (value, error)
            self.order.append(job.id)
            self.cond.notify_all()

    def wait(self, cid: str, timeout: float = WAIT) -> tuple[Any, AgentError | None]:
        with self.cond:
            assert self.cond.wait_for(lambda: cid in self.done, timeout), f"{cid} did not finish"
            return self.done[cid]


def job(cid: str, kind: str, body: Callable[[Context], Any], outcomes: Outcomes, timeout: float = 60) -> Job:
    ctx = Context.local(kind, command_id=cid)
    return Job(id=cid, kind=catalog.KINDS[kind], ctx=ctx, timeout=timeout, body=body, on_done=outcomes)


@pytest.fixture
def sched() -> Any:
    s = Scheduler({Lane.CONTROL: 2, Lane.PROVISION: 2, Lane.BULK: 1})
    s.start()
    yield s
    s.stop(timeout=5)


def test_control_is_not_delayed_by_busy_provision_and_bulk(sched: Scheduler) -> None:
    release = threading.Event()
    out = Outcomes()
    blockers = [
        job("wipe-1", "disk.wipe", lambda c: release.wait(WAIT) and "wiped", out),
        job("wipe-2", "disk.wipe", lambda c: release.wait(WAIT) and "wiped", out),
        job("wipe-3", "disk.wipe", lambda c: release.wait(WAIT) and "wiped", out),  # queued behind
        job("logs", "logs.collect", lambda c: release.wait(WAIT) and "uploaded", out),
    ]
    for b in blockers:
        sched.submit(b)
    sched.submit(job("inv", "inventory.refresh", lambda c: "inventory", out))
    assert out.wait("inv") == ("inventory", None)
    assert not release.is_set() and out.order == ["inv"]
    release.set()
    for b in blockers:
        assert out.wait(b.id)[1] is None


def test_timeout_kills_the_whole_group_of_children(sched: Scheduler) -> None:
    out = Outcomes()
    groups: list[int] = []

    def body(ctx: Context) -> str:
        # a shell with a grandchild, all in one new process group
        with ctx.running(["sh", "-c", "sleep 300 & sleep 300; wait"]) as child:
            groups.append(child.popen.pid)
            ctx.run(["sleep", "300"])
        return "never"

    j = job("slow", "inventory.refresh", body, out, timeout=1.0)
    sched.submit(j)
    value, error = out.wait("slow")
    try:
        assert value is None and isinstance(error, CommandTimeout)
        assert error.reason is Reason.TIMEOUT and "deadline of 1s" in error.message
        assert j.ctx.cancel_event.is_set() and j.ctx.timed_out.is_set()
        assert groups
        for pgid in groups:
            assert wait_group_gone(pgid, timeout=5) == []
    finally:
        for pgid in groups:
            kill_leftovers(pgid)


def test_cancel_running_kills_children_and_reports_cancelled(sched: Scheduler) -> None:
    out = Outcomes()
    started = threading.Event()
    groups: list[int] = []

    def body(ctx: Context) -> str:
        with ctx.running(["sleep", "300"]) as child:
            groups.append(child.popen.pid)
            started.set()
            child.popen.wait()         # until the runtime kills it
            ctx.check()
        return "never"

    sched.submit(job("c1", "disk.wipe", body, out))
    assert started.wait(WAIT)
    assert sched.cancel("c1", "operator said so")
    _, error = out.wait("c1")
    try:
        assert isinstance(error, Cancelled) and "operator said so" in error.message
        assert wait_group_gone(groups[0], timeout=5) == []
    finally:
        kill_leftovers(groups[0])
    assert not sched.cancel("c1")  # finished: nothing to cancel


def test_cancel_queued_job_never_runs(sched: Scheduler) -> None:
    out = Outcomes()
    release = threading.Event()
    ran: list[str] = []
    sched.submit(job("b1", "logs.collect", lambda c: release.wait(WAIT) and "ok", out))
    sched.submit(job("b2", "logs.collect", lambda c: ran.append("b2") or "ok", out))
    assert sched.cancel("b2")
    assert isinstance(out.wait("b2")[1], Cancelled)
    release.set()
    out.wait("b1")
    assert ran == []


def test_stuck_handler_is_abandoned_and_its_lane_keeps_working(sched: Scheduler) -> None:
    out = Outcomes()
    stuck = threading.Event()
    returned = threading.Event()
    workers: list[threading.Thread] = []

    def ignores_cancel(ctx: Context) -> str:
        workers.append(threading.current_thread())
        stuck.wait(WAIT)  # does not look at ctx.cancel_event
        returned.set()
        return "late"

    # fill both control workers with handlers that ignore their deadline
    sched.submit(job("stuck-1", "inventory.refresh", ignores_cancel, out, timeout=0.5))
    sched.submit(job("stuck-2", "inventory.refresh", ignores_cancel, out, timeout=0.5))
    assert isinstance(out.wait("stuck-1")[1], CommandTimeout)
    assert isinstance(out.wait("stuck-2")[1], CommandTimeout)
    # the lane still has two workers that take new work
    sched.submit(job("next-1", "inventory.refresh", lambda c: "ok", out))
    sched.submit(job("next-2", "inventory.refresh", lambda c: "ok", out))
    assert out.wait("next-1") == ("ok", None) and out.wait("next-2") == ("ok", None)
    assert sched.abandoned_workers == 2
    stuck.set()
    assert returned.wait(WAIT)
    # an abandoned worker exits once it has handed on what its handler returned
    for worker in workers:
        worker.join(WAIT)
        assert not worker.is_alive()
    # whatever the abandoned handler returned later was dropped: still the timeout
    assert isinstance(out.done["stuck-1"][1], CommandTimeout)


def test_handler_errors_become_outcomes(sched: Scheduler) -> None:
    out = Outcomes()

    def fails(ctx: Context) -> str:
        raise AgentError("no such disk", reason=Reason.NOT_FOUND)

    def crashes(ctx: Context) -> str:
        raise RuntimeError("bug")

    sched.submit(job("f", "disk.wipe", fails, out))
    sched.submit(job("g", "disk.wipe", crashes, out))
    assert out.wait("f")[1].reason is Reason.NOT_FOUND  # type: ignore[union-attr]
    err = out.wait("g")[1]
    assert err is not None and err.reason is Reason.INTERNAL and "bug" in err.message


def test_wait_idle_and_duplicate_ids(sched: Scheduler) -> None:
    out = Outcomes()
    release = threading.Event()
    sched.submit(job("w", "disk.wipe", lambda c: release.wait(WAIT) and "ok", out))
    with pytest.raises(AgentError) as info:
        sched.submit(job("w", "disk.wipe", lambda c: "dup", out))
    assert info.value.reason is Reason.REPLAYED
    busy = sched.wait_idle(except_id=None, deadline=time.monotonic() + 0.2)
    assert busy == ["w"]
    assert sched.wait_idle(except_id="w", deadline=time.monotonic() + 0.2) == []
    release.set()
    assert sched.wait_idle(except_id=None, deadline=time.monotonic() + WAIT) == []


def test_deadline_counts_from_start_not_from_queueing(sched: Scheduler) -> None:
    out = Outcomes()
    release = threading.Event()
    sched.submit(job("bulk-1", "logs.collect", lambda c: release.wait(WAIT) and "ok", out))
    bulk2 = job("bulk-2", "logs.collect", lambda c: c.sleep(0.1) or "ok", out, timeout=1.0)
    sched.submit(bulk2)
    # bulk-2 waits in the queue (the lane's one worker is busy) longer than its timeout, plus
    # and then some: it is still queued, not timed out
    wait_until(lambda: time.monotonic() - bulk2.queued_at > bulk2.timeout + 0.25, WAIT,
               "bulk-2 to be queued longer than its timeout")
    assert bulk2.state is JobState.QUEUED and "bulk-2" not in out.done
    release.set()
    assert out.wait("bulk-2") == ("ok", None)
    assert bulk2.ctx.deadline == bulk2.started_at + bulk2.timeout


def test_a_job_counts_as_busy_until_its_outcome_is_reported(sched: Scheduler) -> None:
    reported: list[str] = []

    def slow_report(j: Job, value: Any, error: AgentError | None) -> None:
        time.sleep(0.3)
        reported.append(j.id)

    ctx = Context.local("inventory.refresh", command_id="r")
    sched.submit(Job(id="r", kind=catalog.KINDS["inventory.refresh"], ctx=ctx, timeout=60,
                     body=lambda c: "ok", on_done=slow_report))
    assert sched.wait_idle(except_id=None, deadline=time.monotonic() + WAIT) == []
    assert reported == ["r"]


def test_a_lane_queue_past_its_bound_refuses_busy() -> None:
    s = Scheduler({Lane.CONTROL: 1, Lane.PROVISION: 1, Lane.BULK: 1},
                  max_queued=2)
    s.start()
    try:
        release, started, out = threading.Event(), threading.Event(), Outcomes()

        def hold(c: Context) -> str:
            started.set()
            return "ok" if release.wait(WAIT) else "late"

        s.submit(job("run", "disk.wipe", hold, out))
        assert started.wait(WAIT)                       # the one provision worker is taken
        s.submit(job("q1", "disk.wipe", hold, out))
        s.room(Lane.PROVISION)                          # one place left
        s.submit(job("q2", "disk.wipe", hold, out))
        with pytest.raises(Busy) as refused:
            s.room(Lane.PROVISION)
        assert refused.value.reason is Reason.BUSY
        assert refused.value.details == {"queue": "provision", "queued": "2", "bound": "2"}
        with pytest.raises(Busy):
            s.submit(job("q3", "disk.wipe", hold, out))
        assert s.get("q3") is None
        s.room(Lane.CONTROL)                            # another lane's queue is its own
        s.submit(job("inv", "inventory.refresh", lambda c: "inventory", out))
        assert out.wait("inv") == ("inventory", None)
        release.set()
        for cid in ("run", "q1", "q2"):
            assert out.wait(cid) == ("ok", None)
        s.room(Lane.PROVISION)
        assert "q3" not in out.done
    finally:
        s.stop(timeout=5)
