"""The agent's launcher: runs the zipapp, and brings the previous build back when a new one fails.

    python3 launcher.py /usr/lib/bettercompute/agent.pyz run --config /etc/bettercompute/agent.json

Standard library only, and importable on its own: ``agent install`` copies this file beside
the archive, and the systemd unit starts it, so a new agent build that cannot even be
imported can never stop it from working. It is the "A/B" half of daemon.upgrade:

1. The running agent (old version A) downloads and verifies the new build B as
   ``agent.pyz.new``, keeps A as ``agent.pyz.prev`` (a hard link), and then, as its very last
   steps, writes the trial marker ``agent.pyz.upgrade.json`` (state "trial", a deadline), renames
   ``agent.pyz.new`` over ``agent.pyz`` and re-executes itself (same process, same argv).
2. B starts, reads the journal, reports the upgrade complete and, once the gateway has welcomed
   it, marks the trial "confirmed" (``confirm_trial``, called by the agent's core at every join).
3. This launcher supervises the agent process the whole time. While a trial is pending it
   restarts B when B exits (at most ``max_starts`` starts in all) and, when B has exited too
   often or the deadline passes unconfirmed, it kills B and puts A back: state
   "rolling_back" (with the reason), ``agent.pyz.prev`` renamed over ``agent.pyz``, state
   "rolled_back". A starts again, finds its journal record and the marker, and reports the
   upgrade FAILED with that reason.

Every file write is atomic (a temporary sibling, fsync, rename, fsync of the directory), so a
crash or power loss at any step leaves a complete archive in place, and the launcher's next
start finishes or undoes what the marker says was in progress.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

log = logging.getLogger("agent.launcher")

LAUNCHER_ENV = "BC_AGENT_LAUNCHER"   # set for the agent: the path of the launcher running it
MARKER_SUFFIX = ".upgrade.json"
PREV_SUFFIX = ".prev"
NEW_SUFFIX = ".new"
MAX_STARTS = 3                        # starts of a new build before it is rolled back
POLL_SECONDS = 0.25
STOP_GRACE_SECONDS = 10.0

TRIAL, CONFIRMED, ROLLING_BACK, ROLLED_BACK = "trial", "confirmed", "rolling_back", "rolled_back"
# Reason codes (the same strings as agent.errors.Reason).
BAD_IMAGE, TIMEOUT, INTERRUPTED, INTERNAL = "bad_image", "timeout", "interrupted", "internal"


# -- files ------------------------------------------------------------------------------------


# The launcher's own copy of agent/atomicfile.py (it runs with the standard library alone,
# when the agent package cannot be imported): the agent's modules import that one.


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all: a temporary sibling, fsync, rename, fsync of the
    directory."""
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(target)


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def marker_path(archive: str) -> str:
    return archive + MARKER_SUFFIX


def read_marker(archive: str) -> dict[str, Any] | None:
    try:
        with open(marker_path(archive), "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("launcher: unreadable upgrade marker %s: %s", marker_path(archive), exc)
        return None
    return data if isinstance(data, dict) else None


def write_marker(archive: str, marker: dict[str, Any]) -> None:
    write_atomic(marker_path(archive), json.dumps(marker, indent=1, sort_keys=True).encode() + b"\n")


def confirm_trial(archive: str | None, running_version: str) -> bool:
    """The agent reached its gateway: a pending trial of the version it runs is confirmed (the
    old build must never confirm the new one). False when there was nothing to confirm."""
    if not archive:
        return False
    marker = read_marker(archive)
    if marker is None or marker.get("state") != TRIAL or marker.get("new_version") != running_version:
        return False
    marker.update(state=CONFIRMED, confirmed_unix=time.time())
    write_marker(archive, marker)
    log.info("daemon.upgrade: version %s confirmed (reached the gateway)", running_version)
    return True


def link_atomic(src: str, dst: str) -> None:
    """``dst`` becomes the same file as ``src`` (hard link, or a copy), atomically."""
    tmp = f"{dst}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        with open(src, "rb") as s, open(tmp, "wb") as d:
            while chunk := s.read(1 << 20):
                d.write(chunk)
            d.flush()
            os.fsync(d.fileno())
        os.chmod(tmp, os.stat(src).st_mode & 0o777)
    os.replace(tmp, dst)
    fsync_dir(dst)


# -- trial bookkeeping ------------------------------------------------------------------------


def rollback(archive: str, marker: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """Put the previous build back; idempotent (a crash half-way is finished by the next call)."""
    if marker.get("state") != ROLLING_BACK:
        marker.update(state=ROLLING_BACK, reason=reason, message=message)
        write_marker(archive, marker)
    log.warning("launcher: rolling back to %s: %s", marker.get("old_version"), marker.get("message"))
    prev = archive + PREV_SUFFIX
    current = sha256_file(archive) if os.path.exists(archive) else ""
    if current != marker.get("old_sha256"):
        if not os.path.exists(prev) or sha256_file(prev) != marker.get("old_sha256"):
            marker.update(state=ROLLED_BACK, reason=INTERNAL,
                          message=f"{marker.get('message')}; and the previous build {prev} is missing or "
                                  "changed: cannot roll back, keeping the new one")
            write_marker(archive, marker)
            return marker
        link_atomic(prev, archive)
    marker.update(state=ROLLED_BACK, rolled_back_unix=time.time())
    write_marker(archive, marker)
    return marker


def settle(archive: str, now: float | None = None) -> dict[str, Any] | None:
    """Decide, before a start, what a pending marker means; roll back when the trial failed."""
    marker = read_marker(archive)
    if marker is None or marker.get("state") in (CONFIRMED, ROLLED_BACK):
        return marker
    now = time.time() if now is None else now
    if marker.get("state") == ROLLING_BACK:
        return rollback(archive, marker, str(marker.get("reason", "")), str(marker.get("message", "")))
    current = sha256_file(archive) if os.path.exists(archive) else ""
    if current != marker.get("new_sha256"):
        # The marker was written but the new build never replaced the archive (a crash in
        # between): nothing to undo, A is still in place.
        if current == marker.get("old_sha256"):
            marker.update(state=ROLLED_BACK, reason=INTERRUPTED,
                          message="the upgrade was interrupted before the new build was installed")
            write_marker(archive, marker)
            return marker
        return rollback(archive, marker, INTERNAL, "the archive is neither the old nor the new build")
    starts = int(marker.get("starts", 0))
    if starts >= int(marker.get("max_starts", MAX_STARTS)):
        return rollback(archive, marker, BAD_IMAGE,
                        f"new version {marker.get('new_version')} did not stay up: started {starts} "
                        f"times, last {marker.get('last_exit', 'exit unknown')}")
    if now > float(marker.get("deadline_unix", 0)):
        return rollback(archive, marker, TIMEOUT,
                        f"new version {marker.get('new_version')} did not reach the gateway within "
                        f"{marker.get('rejoin_timeout', '?')}s")
    return marker


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


# -- supervision ------------------------------------------------------------------------------


class Launcher:
    def __init__(self, archive: str, args: list[str], python: str = sys.executable) -> None:
        self.archive = os.path.abspath(archive)
        self.args = args
        self.python = python
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def _signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def _stop_child(self) -> int:
        assert self.child is not None
        self.child.terminate()
        try:
            return self.child.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.child.kill()
            return self.child.wait()

    def start_child(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env[LAUNCHER_ENV] = os.path.abspath(__file__)
        self.child = subprocess.Popen([self.python, self.archive, *self.args], env=env)
        return self.child

    def supervise(self) -> tuple[int, bool]:
        """Wait for the agent; enforce a pending trial's deadline.

        (the agent's exit status, whether the trial was rolled back here).
        """
        assert self.child is not None
        while True:
            try:
                return self.child.wait(POLL_SECONDS), False
            except subprocess.TimeoutExpired:
                pass
            marker = read_marker(self.archive)
            if (marker is not None and marker.get("state") == TRIAL
                    and time.time() > float(marker.get("deadline_unix", 0))
                    and not self.stopping):
                log.warning("launcher: new version %s not confirmed by its deadline; stopping it",
                            marker.get("new_version"))
                rc = self._stop_child()
                marker = read_marker(self.archive) or marker
                if marker.get("state") != TRIAL:  # it confirmed while being stopped
                    return rc, False
                rollback(self.archive, marker, TIMEOUT,
                         f"new version {marker.get('new_version')} did not reach the gateway "
                         f"within {marker.get('rejoin_timeout', '?')}s")
                return rc, True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        signal.signal(signal.SIGHUP, self._signal)
        while True:
            marker = settle(self.archive)
            if marker is not None and marker.get("state") == TRIAL:
                marker["starts"] = int(marker.get("starts", 0)) + 1
                write_marker(self.archive, marker)
            self.start_child()
            rc, rolled_back = self.supervise()
            if self.stopping:
                return rc if rc >= 0 else 128 - rc
            marker = read_marker(self.archive)
            state = marker.get("state") if marker else None
            if state == TRIAL:
                assert marker is not None
                marker["last_exit"] = describe_exit(rc)
                write_marker(self.archive, marker)
                log.warning("launcher: new version %s ended (%s) during its trial",
                            marker.get("new_version"), describe_exit(rc))
                time.sleep(1.0)
                continue
            if rolled_back:
                continue  # start the previous build, which reports the failure
            # No trial: the agent ended by itself; the service manager decides what is next.
            return rc if rc >= 0 else 128 - rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write("usage: launcher.py ARCHIVE [AGENT ARGUMENTS...]\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Launcher(argv[0], argv[1:]).run()


if __name__ == "__main__":
    sys.exit(main())
