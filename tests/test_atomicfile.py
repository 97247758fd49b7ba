"""agent/atomicfile.py: a file replaced whole or not at all, proved by real child processes
killed with SIGKILL while they write (the page cache survives a killed process, so what a kill
leaves is what the file system shows; a power loss is fsync's business, not testable here)."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.atomicfile import replacing, sweep, write_atomic

ROOT = Path(__file__).resolve().parents[1]
OLD = b"O" * (4 << 20)
NEW = b"N" * (4 << 20)
CHUNK = 64 << 10

# The child: writes NEW over the target in chunks, through ``replacing`` (or, as the control
# that shows the check can fail, in place), saying where it is on stdout; it stops (blocked on
# stdin) at the stage named, to be killed there, and pauses ``pace`` seconds after each chunk.
CHILD = f"""
import sys, time
from agent.atomicfile import replacing
target, how, stop, pace = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
chunk, count = b"N" * {CHUNK}, {len(NEW) // CHUNK}

def body(f):
    for i in range(count):
        f.write(chunk)
        time.sleep(pace)
        if i == count // 2:
            f.flush()
            print("half", flush=True)
            if stop == "half":
                sys.stdin.readline()

print("start", flush=True)
if how == "atomic":
    with replacing(target) as f:
        body(f)
else:
    with open(target, "r+b") as f:
        body(f)
print("committed", flush=True)
if stop == "committed":
    sys.stdin.readline()
"""


def writer(target: Path, how: str, stop: str, pace: float = 0.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(target), how, stop, str(pace)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def wait_for(child: subprocess.Popen[bytes], line: bytes) -> None:
    assert child.stdout is not None
    while (got := child.stdout.readline()) != line + b"\n":
        assert got, f"the child ended before {line!r}"


def kill(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    assert child.returncode == -signal.SIGKILL
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()


def whole(target: Path) -> str:
    """"old" or "new" when the target holds one of them whole; what it holds otherwise."""
    data = target.read_bytes()
    if data == OLD:
        return "old"
    if data == NEW:
        return "new"
    return f"a mix: {len(data)} bytes, {data.count(b'N')} of them new"


def others(folder: Path, target: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p != target)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "secret.key"
    path.write_bytes(OLD)
    return path


def test_killed_mid_write_leaves_the_old_file_whole_and_its_temporary_apart(target: Path) -> None:
    child = writer(target, "atomic", "half")
    wait_for(child, b"half")
    kill(child)
    assert whole(target) == "old"
    left = others(target.parent, target)
    # The half-written bytes are on disk, under a name no reader takes for the real file.
    assert left == [n for n in left if n.startswith(".secret.key.") and n.endswith(".tmp")]
    assert len(left) == 1 and (target.parent / left[0]).stat().st_size >= len(NEW) // 2
    assert f".{child.pid}." in left[0]
    assert sweep(target) == 1                          # its writer is gone: removed
    assert others(target.parent, target) == []
    write_atomic(target, NEW)                          # and the next write goes through
    assert whole(target) == "new"


def test_killed_after_the_block_leaves_the_new_file_whole(target: Path) -> None:
    child = writer(target, "atomic", "committed")
    wait_for(child, b"committed")
    kill(child)
    assert whole(target) == "new"
    assert others(target.parent, target) == []


def test_killed_at_any_moment_leaves_one_file_whole(target: Path) -> None:
    rng = random.Random(5)
    for _ in range(12):     # the write takes about 40 ms: kills before, during and after it
        target.write_bytes(OLD)
        child = writer(target, "atomic", "committed", pace=0.0005)
        wait_for(child, b"start")
        time.sleep(rng.uniform(0, 0.08))
        kill(child)
        outcome = whole(target)
        assert outcome in ("old", "new"), outcome
        sweep(target)
        assert others(target.parent, target) == []


def test_the_check_sees_a_mix_from_a_writer_in_place(target: Path) -> None:
    """The control: the same kill of a writer that writes over the file in place leaves a mix,
    which ``whole`` names (the checks above can fail)."""
    child = writer(target, "in-place", "half")
    wait_for(child, b"half")
    kill(child)
    assert whole(target).startswith("a mix")


def test_a_block_that_raises_leaves_the_target_untouched_and_no_temporary(target: Path) -> None:
    with pytest.raises(RuntimeError), replacing(target) as f:
        f.write(NEW[:1000])
        raise RuntimeError("the source failed")
    assert whole(target) == "old"
    assert others(target.parent, target) == []


def test_the_mode_is_the_one_asked_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        with replacing(tmp_path / "public", 0o644) as f:
            for _ in range(4):
                f.write(b"x" * CHUNK)
        write_atomic(tmp_path / "private", b"y", 0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o644
    assert (tmp_path / "public").read_bytes() == b"x" * 4 * CHUNK
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_a_temporary_folder_apart_and_a_symlink_never_followed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    write_atomic(tmp_path / "entry", b"boot", tmp_dir=work)
    assert (tmp_path / "entry").read_bytes() == b"boot" and list(work.iterdir()) == []
    (tmp_path / "elsewhere").write_bytes(b"kept")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    write_atomic(tmp_path / "link", b"new")           # the link is replaced, not its target
    assert (tmp_path / "elsewhere").read_bytes() == b"kept"
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "link").read_bytes() == b"new"


def test_sweep_leaves_a_running_writers_temporary_and_other_files(target: Path) -> None:
    with replacing(target) as f:
        f.write(b"in progress")
        (target.parent / ".other.1.0123abcd.tmp").write_bytes(b"not ours")
        assert sweep(target) == 0                        # this process is running
        assert len(others(target.parent, target)) == 2
    assert target.read_bytes() == b"in progress"
    assert others(target.parent, target) == [".other.1.0123abcd.tmp"]
