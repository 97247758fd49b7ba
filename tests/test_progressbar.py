"""The progress display: plain lines when not a terminal, a redrawn bar on one."""

from __future__ import annotations

import io

from agent.progressbar import ProgressBar
from agent.proto import session_pb2


def _p(done: int, total: int, message: str = "") -> session_pb2.Progress:
    return session_pb2.Progress(command_id="c", fraction=done / total, done=done, total=total,
                                message=message, eta_seconds=-1)


def test_plain_lines_at_each_tenth_and_message_change() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, label="disk.wipe", tty=False)
    for i in range(101):
        bar.update(_p(i * 1024 * 1024, 100 * 1024 * 1024, "writing"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # 0 %, 10 %, ..., 100 %
    assert lines[0] == "disk.wipe   0.0% 0 B/100.0 MiB writing"
    assert lines[-1] == "disk.wipe 100.0% 100.0 MiB/100.0 MiB writing"
    assert "\r" not in out.getvalue()


def test_terminal_bar_is_redrawn_in_place() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, label="deploy", tty=True)
    bar.update(_p(1, 4))
    bar.update(_p(4, 4, "done"))
    bar.finish("ok")
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\nok\n")
    assert "[" + "#" * 10 in text and "100.0%" in text and "done" in text


def test_no_percentage_where_the_command_knows_none() -> None:
    out = io.StringIO()
    ProgressBar(out, label="boot.kexec", tty=False).update(
        session_pb2.Progress(fraction=-1, done=5 << 20, subject="kernel", message="fetching the kernel",
                             eta_seconds=-1))
    assert out.getvalue() == "boot.kexec kernel 5.0 MiB fetching the kernel\n"
