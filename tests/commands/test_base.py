"""What a handler is given (agent/commands/base.py): its children, its progress meter, what
commands keep for each other (Kept)."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from agent import proc
from agent.commands.base import Context, Kept
from agent.errors import Cancelled
from agent.proto import session_pb2


def test_running_is_tracked_and_a_cancel_is_raised_as_such() -> None:
    ctx = Context.local("logs.collect")
    threading.Timer(0.3, ctx.cancel_event.set).start()
    threading.Timer(0.4, ctx.kill_children).start()  # as the runtime does on a cancel
    with pytest.raises(Cancelled), ctx.running(["sleep", "300"], stdout=subprocess.DEVNULL) as child:
        assert ctx._children == {child.popen}
        child.popen.wait()  # killed by kill_children: the exit check fails, the cancel says why
    assert child.returncode is not None and not proc.alive(child.pid)
    assert ctx._children == set()


def test_meter_reports_rate_and_eta_at_most_once_a_second() -> None:
    frames: list[session_pb2.Progress] = []
    ctx = Context.local("logs.collect", progress_sink=frames.append)
    meter = ctx.meter(total=1000, subject="sda", every=0.5)
    assert meter.update(100, message="first")       # the first always goes
    assert not meter.update(200, message="too soon")
    assert meter.update(300, message="forced", force=True)
    time.sleep(0.55)
    assert meter.due() and meter.update(400, message="due again")
    assert [f.message for f in frames] == ["first", "forced", "due again"]
    last = frames[-1]
    assert (last.done, last.total, last.subject) == (400, 1000, "sda")
    assert last.rate > 0 and last.eta_seconds == pytest.approx((1000 - 400) / last.rate)
    meter.update(2, total=4, force=True)
    assert (frames[-1].done, frames[-1].total) == (2, 4)


class Held:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def close(self) -> None:
        self.closed = True


def test_kept_is_bounded_one_takers_and_closes_what_it_drops() -> None:
    kept = Kept(limit=2, idle=60)
    a, b, c = Held("a"), Held("b"), Held("c")
    kept.put("a", a)
    kept.put("b", b)
    assert kept.take("a", Held) is a and kept.take("a", Held) is None   # the taker's alone
    kept.put("a", a)          # back: now the most recently used
    kept.put("c", c)          # past the limit: the least recently used (b) is closed
    assert b.closed and not a.closed and len(kept) == 2
    replaced = Held("a2")
    kept.put("a", replaced)   # a second entry under a key closes the first
    assert a.closed and kept.take("a", Held) is replaced
    assert kept.take("c", Kept) is None and c.closed   # another type: closed, not handed out
    kept.put("x", Held("x"))
    kept.close()
    assert len(kept) == 0
    late = Held("late")
    kept.put("late", late)    # after close nothing is kept
    assert late.closed and len(kept) == 0


def test_kept_closes_an_entry_unused_for_its_idle_time_and_its_sweeper_ends() -> None:
    kept = Kept(limit=8, idle=0.2)
    old = Held("old")
    kept.put("old", old)
    deadline = time.monotonic() + 10
    while not old.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert old.closed and len(kept) == 0
    while kept.sweeping and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kept.sweeping, "no thread stays behind once nothing is kept"


def test_a_local_context_keeps_nothing() -> None:
    ctx = Context.local("bmc.power")
    held = Held("h")
    ctx.kept.put("bmc:x", held)
    assert held.closed and len(ctx.kept) == 0
