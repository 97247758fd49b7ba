"""The one helper every tool call goes through.

``run()`` starts the child in its own process group (so a timeout or a cancel kills the
whole tree), stdin from /dev/null unless input is given, a clean C locale, logs the command
line as ``+ shlex.join(argv)``, and turns a missing tool, a signal or a failing exit into an
AgentError with a readable message. Never a shell string: argv is always a list.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent.errors import Cancelled, CommandTimeout, ToolFailed, ToolMissing

log = logging.getLogger(__name__)

# Grace between SIGTERM and SIGKILL of a process group.
KILL_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    dropped: int = 0   # bytes of output beyond ``max_output`` that were read and not kept

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG"))}
    env["LC_ALL"] = "C.UTF-8"
    if extra:
        env.update(extra)
    return env


def kill_group(proc: subprocess.Popen[bytes], grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after ``grace``."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure nothing else of the group lingers.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is neither a zombie nor dead: a zombie has
    exited, holds nothing but its exit status and will never run again, and it is not
    always ours to reap (kill(pid, 0) still succeeds on it)."""
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] not in (["Z"], ["X"])


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode == 127:
        return "exit 127 (command not found)"
    return f"exit {returncode}"


def spawn(
    argv: Sequence[str],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group; for streaming use. Raises ToolMissing."""
    argv = [os.fspath(a) for a in argv]
    log.debug("+ %s", shlex.join(argv))
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env if env is not None else clean_env(),
            cwd=cwd,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ToolMissing(f"{argv[0]}: not installed on this machine", tool=argv[0]) from exc
    except PermissionError as exc:
        raise ToolMissing(f"{argv[0]}: not executable ({exc.strerror})", tool=argv[0]) from exc
    if on_spawn is not None:
        on_spawn(proc)
    return proc


def _bounded_communicate(
    proc: subprocess.Popen[bytes], input: bytes | None, cap: int
) -> tuple[bytes, bytes, int]:
    """Like ``communicate``, keeping at most ``cap`` bytes of each stream (and counting the rest)."""
    kept = {"out": bytearray(), "err": bytearray()}
    over = {"out": 0, "err": 0}

    def pump(name: str, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        buf = kept[name]
        with stream:
            while chunk := stream.read(1 << 16):
                room = cap - len(buf)
                if room > 0:
                    buf += chunk[:room]
                over[name] += max(0, len(chunk) - max(room, 0))

    def feed() -> None:
        if proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, OSError), proc.stdin:
            if input:
                proc.stdin.write(input)

    threads = [threading.Thread(target=pump, args=("out", proc.stdout), daemon=True),
               threading.Thread(target=pump, args=("err", proc.stderr), daemon=True),
               threading.Thread(target=feed, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proc.wait()
    return bytes(kept["out"]), bytes(kept["err"]), over["out"] + over["err"]


def run(
    argv: Sequence[str],
    *,
    input: bytes | None = None,
    check: bool = True,
    timeout: float | None = None,
    cancel: threading.Event | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
    max_output: int | None = None,
) -> Completed:
    """Run ``argv`` to completion, capturing output.

    ``max_output`` bounds what is held in memory: only the first that many bytes of each
    stream are kept, the rest is read and dropped (counted in ``Completed.dropped``), so a
    tool that prints gigabytes costs no more than the cap.

    ``timeout`` (seconds) and ``cancel`` both kill the whole process group and raise
    CommandTimeout or Cancelled. ``check`` turns a non-zero exit into ToolFailed with the
    tail of stderr in the message.
    """
    proc = spawn(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        on_spawn=on_spawn,
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    result: dict[str, bytes] = {}

    dropped = [0]

    def communicate() -> None:
        if max_output is None:
            out, err = proc.communicate(input)
            result["out"], result["err"] = out or b"", err or b""
            return
        result["out"], result["err"], dropped[0] = _bounded_communicate(proc, input, max_output)

    reader = threading.Thread(target=communicate, daemon=True)
    reader.start()
    try:
        while reader.is_alive():
            step = 0.05
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    kill_group(proc)
                    reader.join(5)
                    raise CommandTimeout(
                        f"{argv[0]}: still running after {timeout:g}s, killed", tool=argv[0]
                    )
                step = min(step, left)
            if cancel is not None and cancel.wait(step):
                kill_group(proc)
                reader.join(5)
                raise Cancelled(f"{argv[0]}: cancelled, killed", tool=argv[0])
            reader.join(step if cancel is None else 0)
    except BaseException:
        if proc.poll() is None:
            kill_group(proc)
        raise
    done = Completed(tuple(str(a) for a in argv), proc.returncode, result["out"], result["err"], dropped[0])
    if check and proc.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ToolFailed(
            f"{argv[0]} failed ({describe_exit(proc.returncode)})"
            + (": " + " / ".join(tail) if tail else ""),
            tool=argv[0],
            returncode=proc.returncode,
        )
    return done
