"""What a handler is given (agent/commands/base.py): its children, its progress meter."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from agent import proc
from agent.commands.base import Context
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
