"""agent/proc.py with real children: run(), the running() context manager and the group kills."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.errors import SourceFailed, ToolFailed, ToolMissing


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while proc.alive(pid):
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)
    return True


def test_run_failure_names_the_exit_and_the_stderr_tail() -> None:
    with pytest.raises(ToolFailed, match=r"sh failed \(exit 3\): two / three / four") as info:
        proc.run(["sh", "-c", "echo one >&2; echo two >&2; echo three >&2; echo four >&2; exit 3"])
    assert info.value.details["returncode"] == "3"
    done = proc.run(["sh", "-c", "echo out; exit 4"], check=False)
    assert (done.returncode, done.text) == (4, "out\n")


def test_running_streams_stdout_and_feeds_stdin() -> None:
    data = [bytes([i]) * 70000 for i in range(8)]
    with proc.running(["cat"], stdin=subprocess.PIPE) as child:
        child.feed(iter(data))
        out = b"".join(child.chunks(1 << 16))
    assert out == b"".join(data)
    assert child.returncode == 0


def test_running_checks_the_exit_before_the_last_byte_reaches_the_reader() -> None:
    seen = bytearray()
    with (pytest.raises(ToolFailed, match=r"sh failed \(exit 5\): broken"),
          proc.running(["sh", "-c", "printf data; echo broken >&2; exit 5"]) as child):
        for chunk in child.chunks():
            seen += chunk
        pytest.fail("the end of the output came without the failure")
    assert seen == b"data"


def test_running_names_a_signal_and_takes_the_callers_error() -> None:
    def failure(exited: proc.Exited) -> SourceFailed:
        return SourceFailed(f"the filter died ({exited.description})")

    with (pytest.raises(SourceFailed, match=r"the filter died \(killed by SIGKILL\)"),
          proc.running(["sh", "-c", "kill -9 $$"], failure=failure) as child):
        assert list(child.chunks()) == []


def test_the_feeders_own_error_comes_first() -> None:
    def source() -> Iterator[bytes]:
        yield b"x" * 1000
        raise SourceFailed("download cut short")

    with (pytest.raises(SourceFailed, match="download cut short"),
          proc.running(["cat"], stdin=subprocess.PIPE) as child):
        child.feed(source())
        for _ in child.chunks():
            pass


def test_a_raising_body_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    with (pytest.raises(RuntimeError, match="body failed"),
          proc.running(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], grace=0.5) as child):
        end = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < end, "the grandchild never started"
            time.sleep(0.02)
        raise RuntimeError("body failed")
    assert child.returncode is not None
    assert wait_gone(int(pidfile.read_text()))


def test_stop_and_check_false_leave_the_exit_unchecked() -> None:
    with proc.running(["sleep", "300"], stdout=subprocess.DEVNULL) as child:
        child.stop(grace=0.5)
    assert child.returncode == -signal.SIGTERM
    with proc.running(["sh", "-c", "exit 7"], check=False) as child:
        assert list(child.chunks()) == []
    assert child.returncode == 7


def test_stderr_lines_reach_the_callback_and_the_tail_is_kept() -> None:
    lines: list[str] = []
    with proc.running(["sh", "-c", "echo first >&2; echo second >&2"], stdout=subprocess.DEVNULL,
                      on_stderr_line=lines.append) as child:
        pass
    assert lines == ["first", "second"]
    assert child.stderr_text() == "first\nsecond"


def test_a_missing_tool_is_tool_missing(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing, match="not installed"), proc.running([str(tmp_path / "absent")]):
        pytest.fail("the body ran")


def test_kill_pid_group_ends_a_group_that_ignores_sigterm() -> None:
    popen = proc.spawn(["sh", "-c", "trap '' TERM; sleep 300"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)  # let the shell set its trap
        started = time.monotonic()
        proc.kill_pid_group(popen.pid, grace=0.5)  # as for a child of an earlier agent
        assert time.monotonic() - started >= 0.5, "SIGKILL came before the grace"
        assert popen.wait(5) == -signal.SIGKILL
    finally:
        proc.kill_group(popen, grace=0.1)
