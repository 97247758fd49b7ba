"""The one way the agent starts a child process and lives with it.

Every child starts in its own process group (so a timeout, a cancel or an error kills the
whole tree), stdin from /dev/null unless asked otherwise, a clean C locale, the command line
logged as ``+ shlex.join(argv)``, and a missing tool, a signal or a failing exit turned into
an AgentError with a readable message (``describe_exit``). Never a shell string: argv is
always a list.

- ``run()``: run a tool to completion, its output captured (bounded with ``max_output``),
  with a timeout and a cancel event.
- ``running()``: a context manager for a child that streams, as mkosi's ``spawn``: the body
  feeds its stdin (``Child.feed``) and reads its stdout (``Child.chunks``, ``readinto``);
  its stderr is kept (the tail) or logged line by line by a thread of its own. When the
  body raises, the process group is killed; when it leaves, the exit is checked (at the end
  of the output already, so that a consumer sees the failure before the last byte).
- ``kill_group()`` / ``kill_pid_group()``: SIGTERM, a grace, SIGKILL, for a child of ours
  or for a process group left by an earlier agent.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
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

    def gone(wait: float) -> bool:
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return False
        return True

    _kill(pgid, grace, gone)


def kill_pid_group(pid: int, grace: float = KILL_GRACE_SECONDS,
                   gone: Callable[[], bool] | None = None) -> None:
    """SIGTERM process group ``pid`` that is not our child (left by an earlier agent: it
    cannot be waited for), then SIGKILL it when ``gone()`` (default: the pid no longer
    ``alive``) is still false after ``grace``."""
    check = gone if gone is not None else (lambda: not alive(pid))

    def poll(wait: float) -> bool:
        end = time.monotonic() + wait
        while not check():
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

    _kill(pid, grace, poll)


def _kill(pgid: int, grace: float, gone: Callable[[float], bool]) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        if not gone(wait):
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
    """Start ``argv`` in a new process group and return the bare Popen; raises ToolMissing.

    For a harness that holds a child across calls (qemu/, the tests). The agent's own code
    runs a child with ``run()`` or ``running()``, which kill it and check its exit."""
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
        raise Exited(done.argv, proc.returncode, done.stderr).error()
    return done


# -- a child that streams --------------------------------------------------------------------

# How much of a child's stderr ``running`` keeps for the error message (the end of it).
STDERR_KEEP = 64 * 1024


@dataclass(frozen=True)
class Exited:
    """How a child ended: what ``running``'s ``failure`` is given to build its error."""

    argv: tuple[str, ...]
    returncode: int
    stderr: bytes            # its last STDERR_KEEP bytes ("" when not captured)

    @property
    def description(self) -> str:
        return describe_exit(self.returncode)

    def tail(self, lines: int = 3) -> str:
        """The last ``lines`` lines of stderr, joined with " / "."""
        return " / ".join(self.stderr.decode("utf-8", "replace").strip().splitlines()[-lines:])

    def message(self, what: str = "", lines: int = 3) -> str:
        """``"zstd failed (exit 1): the last lines of stderr"``."""
        tail = self.tail(lines)
        return f"{what or self.argv[0]} failed ({self.description})" + (f": {tail}" if tail else "")

    def error(self) -> ToolFailed:
        return ToolFailed(self.message(), tool=self.argv[0], returncode=self.returncode)


class Child:
    """A child started by ``running``. Read its output through ``chunks`` or ``readinto``,
    feed its input through ``feed``; ``stop`` ends it early on purpose (its exit is then not
    checked)."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        argv: tuple[str, ...],
        *,
        check: bool,
        failure: Callable[[Exited], BaseException] | None,
        on_stderr_line: Callable[[str], None] | None,
    ) -> None:
        self.popen = popen
        self.argv = argv
        self._check = check
        self._failure = failure
        self._stopped = False
        self._finished = False
        self._feed_error: BaseException | None = None
        self._feeder: threading.Thread | None = None
        self._stderr = bytearray()
        self._stderr_thread: threading.Thread | None = None
        if popen.stderr is not None:
            self._stderr_thread = threading.Thread(
                target=self._drain_stderr, args=(popen.stderr, on_stderr_line),
                name=f"{os.path.basename(argv[0])}-stderr", daemon=True)
            self._stderr_thread.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the child itself (e.g. SIGHUP to reload), when it still runs."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def stop(self, grace: float = KILL_GRACE_SECONDS) -> None:
        """Kill the child's process group on purpose: its exit is not checked."""
        self._stopped = True
        if self.popen.poll() is None:
            kill_group(self.popen, grace)

    # -- its streams ------------------------------------------------------------------------

    def _drain_stderr(self, stream: IO[bytes], on_line: Callable[[str], None] | None) -> None:
        with contextlib.suppress(OSError, ValueError):
            while raw := stream.readline(STDERR_KEEP):
                self._stderr += raw
                if len(self._stderr) > 2 * STDERR_KEEP:
                    del self._stderr[:-STDERR_KEEP]
                if on_line is not None and (line := raw.decode("utf-8", "replace").rstrip()):
                    on_line(line)

    def feed(self, chunks: Iterable[bytes]) -> None:
        """Write ``chunks`` to the child's stdin from a thread, then close it. An error of
        ``chunks`` itself is raised where the exit is checked; a broken pipe is the child's
        exit to tell."""
        stdin = self.popen.stdin
        if stdin is None:
            raise ValueError(f"{self.argv[0]}: started without stdin=PIPE")

        def write() -> None:
            try:
                for chunk in chunks:
                    try:
                        stdin.write(chunk)
                    except OSError:  # the child is gone: its exit says why
                        return
            except BaseException as exc:  # handed to the caller where the exit is checked
                self._feed_error = exc
            finally:
                with contextlib.suppress(OSError):
                    stdin.close()

        self._feeder = threading.Thread(target=write, name=f"{os.path.basename(self.argv[0])}-feed",
                                        daemon=True)
        self._feeder.start()

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        """The child's stdout, in pieces of at most ``size`` bytes as they come; at its end
        the exit is checked (so a failure reaches the consumer before the last byte does)."""
        fd = self._stdout_fd()
        while data := os.read(fd, size):
            yield data
        self.finish()

    def readinto(self, view: memoryview) -> int:
        """Read the child's stdout into ``view``; 0 at its end, once the exit is checked."""
        n = os.readv(self._stdout_fd(), [view])
        if n == 0:
            self.finish()
        return n

    def _stdout_fd(self) -> int:
        if self.popen.stdout is None:
            raise ValueError(f"{self.argv[0]}: started without stdout=PIPE")
        return self.popen.stdout.fileno()

    def stderr_text(self) -> str:
        """What the child wrote on stderr so far (its last STDERR_KEEP bytes); all of it
        once the child has exited."""
        if self._stderr_thread is not None and self.popen.poll() is not None:
            self._stderr_thread.join(5)
        return bytes(self._stderr).decode("utf-8", "replace").strip()

    # -- its end ----------------------------------------------------------------------------

    def finish(self) -> int:
        """Wait for the child's exit and check it, once: the feeder's own error first, then
        a failing exit (unless stopped on purpose or started with ``check=False``)."""
        if self._finished:
            return self.popen.wait()
        self._finished = True
        if self.popen.stdin is not None and self._feeder is None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        returncode = self.popen.wait()
        if self._feeder is not None:  # stopped: it may wait on its own source; not forever
            self._feeder.join(10 if self._stopped else None)
        if self._stderr_thread is not None:
            self._stderr_thread.join(5)
        if self._feed_error is not None:
            raise self._feed_error
        if returncode != 0 and self._check and not self._stopped:
            exited = Exited(self.argv, returncode, bytes(self._stderr[-STDERR_KEEP:]))
            raise self._failure(exited) if self._failure is not None else exited.error()
        return returncode

    def _close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
    check: bool = True,
    failure: Callable[[Exited], BaseException] | None = None,
    on_stderr_line: Callable[[str], None] | None = None,
    grace: float = KILL_GRACE_SECONDS,
) -> Iterator[Child]:
    """Start ``argv`` in its own process group for the body of a ``with``.

    The body feeds stdin (``stdin=subprocess.PIPE``, ``Child.feed``) and reads stdout to its
    end (``Child.chunks`` / ``readinto``), or ends the child with ``Child.stop``. stderr
    (a pipe by default) is read by a thread: its tail goes into the failure's message, and
    each line to ``on_stderr_line`` when given.

    When the body raises, the whole process group is killed (SIGTERM, ``grace``, SIGKILL)
    and the exception goes on. When it leaves, the exit is waited for and checked: a
    non-zero one raises ``failure(exited)`` (default: ToolFailed with ``describe_exit`` and
    the last lines of stderr), unless ``check`` is false or the child was stopped.
    Raises ToolMissing when the tool is not there.
    """
    popen = spawn(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
                  on_spawn=on_spawn)
    child = Child(popen, tuple(os.fspath(a) for a in argv), check=check, failure=failure,
                  on_stderr_line=on_stderr_line)
    try:
        yield child
    except BaseException:
        child.stop(grace)
        with contextlib.suppress(BaseException):
            child.finish()
        raise
    finally:
        if not child._finished:
            try:
                child.finish()
            finally:
                child._close()
        else:
            child._close()
