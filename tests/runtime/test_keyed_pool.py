"""The scheduler's keyed pool (the site's BMC operations), on real threads: one job at a time
per key in order of arrival, the cap, "queued" progress, deadlines while queued, cancel, and
threads that stay bounded however many jobs wait and however many keys were ever seen."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent import catalog
from agent.catalog import Lane
from agent.commands.base import Context
from agent.errors import AgentError, Busy, CommandTimeout, Reason
from agent.proto import session_pb2
from agent.runtime.scheduler import Job, Scheduler
from tests.runtime.harness import wait_until
from tests.runtime.test_scheduler import WAIT, Outcomes


def keyed(cid: str, key: str, body: Callable[[Context], Any], outcomes: Outcomes, *,
          timeout: float = 60, progress: list[session_pb2.Progress] | None = None) -> Job:
    ctx = Context.local("bmc.power", command_id=cid,
                        progress_sink=progress.append if progress is not None else None)
    return Job(id=cid, kind=catalog.KINDS["bmc.power"], ctx=ctx, timeout=timeout, body=body,
               on_done=outcomes, key=key)


def plain(cid: str, outcomes: Outcomes) -> Job:
    ctx = Context.local("inventory.refresh", command_id=cid)
    return Job(id=cid, kind=catalog.KINDS["inventory.refresh"], ctx=ctx, timeout=60,
               body=lambda c: "ok", on_done=outcomes)


@pytest.fixture
def pool() -> Iterator[Scheduler]:
    s = Scheduler({Lane.CONTROL: 1, Lane.PROVISION: 1, Lane.BULK: 1},
                  keyed_cap=4, keyed_idle_seconds=0.5)
    s.start()
    yield s
    s.stop(timeout=5)


def blocker(release: threading.Event, started: list[str]) -> Callable[[Context], Any]:
    def body(ctx: Context) -> str:
        started.append(ctx.command_id)
        while not release.wait(0.02):
            ctx.check()
        return ctx.command_id
    return body


def test_keyed_jobs_hold_no_lane_worker_and_keep_their_order_per_key(pool: Scheduler) -> None:
    out, release, started = Outcomes(), threading.Event(), []
    for i in range(3):
        pool.submit(keyed(f"a{i}", "bmc:a", blocker(release, started), out))
    pool.submit(keyed("b0", "bmc:b", blocker(release, started), out))
    wait_until(lambda: sorted(started) == ["a0", "b0"], WAIT, "a0 and b0 to start")
    # The control lane has one worker, and it is free: a plain job runs at once.
    pool.submit(plain("inv", out))
    assert out.wait("inv", 5) == ("ok", None)
    time.sleep(0.2)
    assert sorted(started) == ["a0", "b0"], "a second job of key a started while a0 ran"
    release.set()
    for cid in ("a0", "a1", "a2", "b0"):
        assert out.wait(cid)[1] is None
    assert [c for c in started if c.startswith("a")] == ["a0", "a1", "a2"]
    assert pool.keyed.succeeded == 4 and pool.keyed.in_flight == 0 and pool.keyed.queued == 0


def test_past_the_cap_jobs_are_queued_and_told_so(pool: Scheduler) -> None:
    out, release, started = Outcomes(), threading.Event(), []
    progress: list[session_pb2.Progress] = []
    for i in range(4):  # each started before the next comes: none of these four ever queues
        pool.submit(keyed(f"k{i}", f"bmc:{i}", blocker(release, started), out))
        wait_until(lambda n=i + 1: len(started) == n, WAIT, f"job {i} to start")
    pool.submit(keyed("k4", "bmc:4", blocker(release, started), out, progress=progress))
    pool.submit(keyed("k0b", "bmc:0", blocker(release, started), out, progress=progress))
    assert [p.message for p in progress] == [
        "queued: 4 BMC operations in flight (the site's cap is 4); 0 queued before it",
        "queued: 1 operation(s) ahead on bmc:0 (one at a time per BMC)",
    ]
    assert pool.keyed.in_flight == 4 and pool.keyed.queued == 2 and pool.keyed.workers == 4
    time.sleep(0.2)
    assert len(started) == 4
    release.set()
    for cid in ("k0", "k1", "k2", "k3", "k4", "k0b"):
        assert out.wait(cid)[1] is None
    assert pool.keyed.peak_in_flight == 4 and pool.keyed.peak_queued == 2


def test_a_queued_job_ends_at_its_deadline_and_a_cancelled_one_never_runs(pool: Scheduler) -> None:
    out, release, started = Outcomes(), threading.Event(), []
    pool.submit(keyed("first", "bmc:x", blocker(release, started), out))
    wait_until(lambda: started == ["first"], WAIT, "the first job to start")
    pool.submit(keyed("late", "bmc:x", blocker(release, started), out, timeout=0.5))
    pool.submit(keyed("gone", "bmc:x", blocker(release, started), out))
    assert pool.cancel("gone")
    _, error = out.wait("late", 5)
    assert isinstance(error, CommandTimeout) and "while queued for bmc:x" in error.message
    assert out.wait("gone", 5)[1] is not None
    release.set()
    assert out.wait("first")[1] is None
    assert started == ["first"]
    assert pool.keyed.expired_queued == 1
    assert pool.keyed.failed == {str(Reason.TIMEOUT): 1, str(Reason.CANCELLED): 1}
    assert pool.keyed.queued == 0 and pool.keyed.keys_waiting == 0


def test_a_wait_for_a_slot_under_the_cap_does_not_count_against_the_deadline(pool: Scheduler) -> None:
    out, release, started = Outcomes(), threading.Event(), []
    for i in range(4):
        pool.submit(keyed(f"k{i}", f"bmc:{i}", blocker(release, started), out))
    wait_until(lambda: len(started) == 4, WAIT, "four jobs to start")
    # Its BMC is free, the pool full: it waits past its 0.5 s without timing out ...
    pool.submit(keyed("patient", "bmc:free", lambda c: "ran", out, timeout=0.5))
    time.sleep(1.0)
    assert "patient" not in out.done
    release.set()
    # ... and gets its 0.5 s from when it starts.
    assert out.wait("patient", 5) == ("ran", None)


def test_a_stuck_handler_gives_its_key_up_at_its_deadline(pool: Scheduler) -> None:
    """A handler that ignores its cancel (a BMC client blocked in a read): its job is reported
    at the deadline, and the next job of the same key starts then, not when it returns."""
    out, never = Outcomes(), threading.Event()
    started: list[str] = []
    pool.submit(keyed("stuck", "bmc:s", lambda c: never.wait(30), out, timeout=0.5))
    pool.submit(keyed("next", "bmc:s", blocker(threading.Event(), started), out, timeout=2))
    _, error = out.wait("stuck", 5)
    assert isinstance(error, CommandTimeout)
    wait_until(lambda: started == ["next"], 2, "the next job of the key to start")
    never.set()
    assert isinstance(out.wait("next", 5)[1], CommandTimeout)
    assert pool.abandoned_workers >= 1


def test_threads_stay_bounded_with_thousands_queued_and_end_when_idle(pool: Scheduler) -> None:
    out, release, started = Outcomes(), threading.Event(), []
    before = threading.active_count()
    for i in range(2000):
        pool.submit(keyed(f"j{i}", f"bmc:{i % 500}", blocker(release, started), out))
    assert pool.keyed.workers == 4 and pool.keyed.queued == 1996
    assert threading.active_count() <= before + 4
    release.set()
    wait_until(lambda: len(out.done) == 2000, 120, "every job to finish")
    assert all(error is None for _, error in out.done.values())
    # Every one of the 500 keys seen is forgotten, and the idle workers end.
    assert pool.keyed.keys_waiting == 0 and not pool._keyed_waiting and not pool._keyed_running
    wait_until(lambda: pool.keyed.workers == 0, WAIT, "the idle workers to end")
    wait_until(lambda: threading.active_count() <= before, WAIT, "their threads to end")


def test_an_error_is_counted_by_its_reason(pool: Scheduler) -> None:
    out = Outcomes()

    def fails(ctx: Context) -> None:
        raise AgentError("no", reason=Reason.UNREACHABLE)

    pool.submit(keyed("f", "bmc:f", fails, out))
    assert out.wait("f")[1] is not None
    assert pool.keyed.failed == {str(Reason.UNREACHABLE): 1}


def test_the_pools_queue_past_its_bound_refuses_busy() -> None:
    s = Scheduler({Lane.CONTROL: 1, Lane.PROVISION: 1, Lane.BULK: 1},
                  keyed_cap=1, keyed_max_queued=2)
    s.start()
    try:
        release, started, out = threading.Event(), [], Outcomes()
        s.submit(keyed("k0", "bmc:a", blocker(release, started), out))
        wait_until(lambda: s.keyed.in_flight == 1, WAIT, "the first job to run")
        s.submit(keyed("k1", "bmc:b", blocker(release, started), out))   # past the cap: queued
        s.submit(keyed("k2", "bmc:a", blocker(release, started), out))   # behind its key
        assert s.keyed.queued == 2
        with pytest.raises(Busy) as refused:
            s.room(Lane.CONTROL, "bmc:c")
        assert refused.value.reason is Reason.BUSY and "bmc_max_queued" in refused.value.message
        assert refused.value.details == {"queue": "keyed", "queued": "2", "bound": "2"}
        with pytest.raises(Busy):
            s.submit(keyed("k3", "bmc:c", blocker(release, started), out))
        assert s.get("k3") is None
        s.submit(plain("lane", out))                   # the lanes' queues are their own
        assert out.wait("lane") == ("ok", None)
        release.set()
        for cid in ("k0", "k1", "k2"):
            assert out.wait(cid) == (cid, None)
        s.room(Lane.CONTROL, "bmc:c")
        assert "k3" not in out.done and s.keyed.queued == 0
    finally:
        s.stop(timeout=5)
