"""Per-command progress and log frames: rate bounded, the last progress never lost."""

from __future__ import annotations

import threading
import time

import pytest

from agent.proto import session_pb2
from agent.runtime import streams
from agent.runtime.streams import LOG_BURST, CommandStream
from tests.runtime.harness import wait_until


class Collected:
    def __init__(self) -> None:
        self.frames: list[session_pb2.Frame] = []
        self.lock = threading.Lock()

    def __call__(self, frame: session_pb2.Frame) -> None:
        with self.lock:
            self.frames.append(frame)

    def progress(self) -> list[session_pb2.Progress]:
        with self.lock:
            return [f.progress for f in self.frames if f.WhichOneof("msg") == "progress"]

    def logs(self) -> list[session_pb2.LogLine]:
        with self.lock:
            return [f.log for f in self.frames if f.WhichOneof("msg") == "log"]


def test_a_burst_of_progress_is_one_frame_now_and_the_newest_later() -> None:
    out = Collected()
    markers: list[int] = []
    stream = CommandStream("c", out, lambda cid, p: markers.append(p.done))
    for i in range(1, 1001):
        stream.progress(session_pb2.Progress(command_id="c", done=i, total=1000))
    first = out.progress()
    assert first[0].done == 1 and len(first) < 100
    # the held one follows after the interval
    wait_until(lambda: out.progress()[-1].done == 1000, 30, "the held progress report")
    assert markers == []  # a journal marker only once the command has run an interval
    stream.close()
    assert out.progress()[-1].done == 1000
    stream.progress(session_pb2.Progress(command_id="c", done=5))  # after close: dropped
    assert out.progress()[-1].done == 1000


def test_a_journal_marker_once_an_interval_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "PROGRESS_MARKER_INTERVAL", 0.2)
    markers: list[int] = []
    stream = CommandStream("c", Collected(), lambda cid, p: markers.append(p.done))
    stream.progress(session_pb2.Progress(command_id="c", done=1))   # a command's first report
    time.sleep(0.25)
    stream.progress(session_pb2.Progress(command_id="c", done=2))
    stream.progress(session_pb2.Progress(command_id="c", done=3))   # within the next interval
    assert markers == [2]
    stream.close()


def test_close_sends_the_held_progress_at_once() -> None:
    out = Collected()
    stream = CommandStream("c", out)
    stream.progress(session_pb2.Progress(command_id="c", done=1))
    stream.progress(session_pb2.Progress(command_id="c", done=2))
    stream.close()
    assert [p.done for p in out.progress()] == [1, 2]


def test_log_lines_beyond_the_bucket_are_counted_not_sent() -> None:
    out = Collected()
    stream = CommandStream("c", out)
    for i in range(int(LOG_BURST) * 4):
        stream.log("info", f"line {i}")
    sent = out.logs()
    assert int(LOG_BURST) <= len(sent) < int(LOG_BURST) * 4
    time.sleep(0.2)  # the bucket refills
    stream.log("warning", "after the pause")
    last = out.logs()[-1]
    assert last.message == "after the pause" and last.level == "warning"
    accounted = len(out.logs()) + last.dropped_before + sum(x.dropped_before for x in sent)
    assert accounted == int(LOG_BURST) * 4 + 1
    assert last.dropped_before > 0
