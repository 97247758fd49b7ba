"""A crash in the middle of the upgrade's file swap, or of the launcher's rollback, at every step.

A child process runs the real code (agent.launcher and agent.commands.upgrade) and SIGKILLs
itself right before its N-th file-system mutation (write, fsync, link, rename, unlink); then,
as the launcher does on its next start, ``settle`` runs. Whatever N, a complete archive must be
in place, it must run, and it must be the build the marker says (the new one while a trial
is pending, the old one otherwise). N goes up until the child finishes without being killed.
Also the launcher itself: its trial supervision with small stand-in builds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import launcher

ROOT = Path(__file__).resolve().parents[2]

KILLER = textwrap.dedent('''
    import os, signal, sys
    sys.path.insert(0, {root!r})
    LIMIT = int(os.environ["KILL_AT"])
    count = 0
    def counted(fn):
        def wrapper(*args, **kwargs):
            global count
            count += 1
            if count == LIMIT:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapper
    for name in ("write", "fsync", "link", "replace", "rename", "unlink"):
        setattr(os, name, counted(getattr(os, name)))
''')

SWAP = KILLER + textwrap.dedent('''
    import json
    from agent import launcher
    from agent.commands import upgrade
    archive, new_bytes, trial = sys.argv[1], open(sys.argv[2], "rb").read(), json.loads(sys.argv[3])
    # run(): the download lands beside the archive, the running build is kept as .prev
    fd = os.open(archive + launcher.NEW_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
    os.write(fd, new_bytes)
    os.fsync(fd)
    os.close(fd)
    launcher.link_atomic(archive, archive + launcher.PREV_SUFFIX)
    # the action: marker, rename, re-exec (into the new build, which prints its version)
    sys.argv[1:] = []
    upgrade.switch_and_reexec(archive, archive + launcher.NEW_SUFFIX, trial)
''')

SETTLE = KILLER + textwrap.dedent('''
    from agent import launcher
    launcher.settle(sys.argv[1])
''')


def fake_build(path: Path, body: str) -> Path:
    """A zipapp whose __main__.py is ``body`` (python runs a zip file directly)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__main__.py", body)
    return path


def runs(archive: Path) -> str:
    out = subprocess.run([sys.executable, str(archive)], capture_output=True, timeout=60, check=True)
    return out.stdout.decode().strip()


def trial_for(old: Path, new: Path) -> dict[str, object]:
    return {"command_id": "c1", "state": launcher.TRIAL, "old_version": "A", "new_version": "B",
            "old_sha256": launcher.sha256_file(str(old)), "new_sha256": launcher.sha256_file(str(new)),
            "rejoin_timeout": 60, "max_starts": launcher.MAX_STARTS}


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return (fake_build(tmp_path / "A.pyz", 'print("A")'), fake_build(tmp_path / "B.pyz", 'print("B")'))


def kill_campaign(script: str, prepare: Callable[[Path], list[str]],
                  check: Callable[[Path, bool, str], None], tmp_path: Path) -> int:
    """Run ``script`` killed before its 1st, 2nd, ... mutation; ``check`` after each. Steps seen."""
    for n in range(1, 200):
        work = tmp_path / f"run{n}"
        work.mkdir()
        args = prepare(work)
        proc = subprocess.run([sys.executable, "-c", script.format(root=str(ROOT)), *args],
                              env=dict(os.environ, KILL_AT=str(n)), capture_output=True, timeout=120)
        killed = proc.returncode == -signal.SIGKILL
        assert killed or proc.returncode == 0, proc.stderr.decode()
        check(work, killed, proc.stdout.decode().strip())
        if not killed:
            return n
    raise AssertionError("the script never finished")


def test_crash_at_every_step_of_the_swap_leaves_a_runnable_agent(tmp_path: Path,
                                                                  pair: tuple[Path, Path]) -> None:
    old, new = pair
    outcomes: set[str] = set()

    def prepare(work: Path) -> list[str]:
        (work / "agent.pyz").write_bytes(old.read_bytes())
        return [str(work / "agent.pyz"), str(new), json.dumps(trial_for(old, new))]

    def check(work: Path, killed: bool, stdout: str) -> None:
        archive = work / "agent.pyz"
        if not killed:
            assert stdout == "B"  # re-executed into the new build
        marker = launcher.settle(str(archive))  # what the launcher does on its next start
        running = runs(archive)
        state = marker.get("state") if marker else None
        outcomes.add(f"{state}:{running}")
        if state == launcher.TRIAL:
            assert running == "B"      # the new build gets its trial
        else:
            assert running == "A", (state, marker)  # nothing happened, or it was undone
            assert state in (None, launcher.ROLLED_BACK)

    steps = kill_campaign(SWAP, prepare, check, tmp_path)
    print(f"swap: killed at each of {steps - 1} steps; outcomes {sorted(outcomes)}")
    assert steps >= 8
    assert {"None:A", "rolled_back:A", "trial:B"} <= outcomes, outcomes


def test_crash_at_every_step_of_the_rollback_still_rolls_back(
        tmp_path: Path, pair: tuple[Path, Path]) -> None:
    old, new = pair

    def prepare(work: Path) -> list[str]:
        archive = work / "agent.pyz"
        archive.write_bytes(new.read_bytes())
        (work / "agent.pyz.prev").write_bytes(old.read_bytes())
        marker = trial_for(old, new) | {"starts": 1, "deadline_unix": time.time() - 1}  # deadline passed
        launcher.write_marker(str(archive), marker)
        return [str(archive)]

    def check(work: Path, killed: bool, stdout: str) -> None:
        marker = launcher.settle(str(work / "agent.pyz"))  # the next start finishes the job
        assert marker is not None and marker["state"] == launcher.ROLLED_BACK
        assert marker["reason"] == launcher.TIMEOUT, marker
        assert runs(work / "agent.pyz") == "A"

    assert kill_campaign(SETTLE, prepare, check, tmp_path) >= 4


# -- the launcher's supervision, with stand-in builds ------------------------------------------


CONFIRMING = textwrap.dedent('''
    import json, os, sys, time
    archive = os.path.abspath(sys.argv[0])
    path = archive + ".upgrade.json"
    m = json.load(open(path))
    if m["state"] == "trial":
        m["state"] = "confirmed"
        open(path + ".t", "w").write(json.dumps(m)); os.replace(path + ".t", path)
    open(os.path.join(os.path.dirname(archive), "ran"), "a").write("B\\n")
''')


def start_trial(work: Path, old: Path, new_body: str, rejoin: float = 60) -> Path:
    archive = work / "agent.pyz"
    new = fake_build(work / "new.pyz", new_body)
    archive.write_bytes(new.read_bytes())
    (work / "agent.pyz.prev").write_bytes(old.read_bytes())
    now = time.time()
    launcher.write_marker(str(archive), trial_for(old, new) | {"starts": 0, "deadline_unix": now + rejoin})
    return archive


def launch(archive: Path, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, str(ROOT / "agent" / "launcher.py"), str(archive)],
                          capture_output=True, timeout=timeout)


def test_launcher_keeps_a_confirmed_build(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    archive = start_trial(tmp_path, pair[0], CONFIRMING)
    out = launch(archive)
    assert out.returncode == 0, out.stderr.decode()
    assert (tmp_path / "ran").read_text() == "B\n"
    assert launcher.read_marker(str(archive))["state"] == launcher.CONFIRMED  # type: ignore[index]


def test_launcher_rolls_back_a_build_that_keeps_crashing(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    archive = start_trial(tmp_path, pair[0], 'raise SystemExit(3)')
    out = launch(archive)
    assert out.stdout.decode().strip() == "A"  # the previous build runs again
    marker = launcher.read_marker(str(archive))
    assert marker is not None and marker["state"] == launcher.ROLLED_BACK
    assert marker["reason"] == launcher.BAD_IMAGE and "exit 3" in str(marker["message"])
    assert marker["starts"] == launcher.MAX_STARTS
    assert launcher.sha256_file(str(archive)) == launcher.sha256_file(str(pair[0]))


def test_launcher_rolls_back_a_build_that_never_confirms(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    archive = start_trial(tmp_path, pair[0], 'import time\ntime.sleep(600)', rejoin=2)
    out = launch(archive)
    assert out.stdout.decode().strip() == "A"
    marker = launcher.read_marker(str(archive))
    assert marker is not None and marker["state"] == launcher.ROLLED_BACK
    assert marker["reason"] == launcher.TIMEOUT


def test_launcher_passes_exit_status_and_environment(tmp_path: Path) -> None:
    archive = fake_build(tmp_path / "agent.pyz", textwrap.dedent('''
        import os, sys
        print(os.environ.get("BC_AGENT_LAUNCHER"), *sys.argv[1:])
        raise SystemExit(7)
    '''))
    out = subprocess.run([sys.executable, str(ROOT / "agent" / "launcher.py"), str(archive), "run", "--x"],
                         capture_output=True, timeout=60)
    assert out.returncode == 7
    assert out.stdout.decode().split() == [str(ROOT / "agent" / "launcher.py"), "run", "--x"]
