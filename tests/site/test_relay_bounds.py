"""The relay's bounds (issue 27, items 4 and 6): its buffers' memory goes back when a body
ends, and small answers are not held back by Nagle's algorithm."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Eight relays at once, three times over, each filling a 16 MiB buffer out of a 64 MiB budget
# (four get 16 MiB, four 1 MiB): afterwards the process holds what it held before, give or
# take. With bytearrays from malloc it kept about 77 MiB (malloc's raised mmap threshold and
# per-thread arenas): the 440 MiB of 48 downloads at once in issue 27.
_BUFFERS = textwrap.dedent("""
    import threading
    from pathlib import Path
    from agent.site import web

    def rss():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    budget = web.BufferBudget(total=64 << 20)
    ONE = b"\\x01" * (16 << 20)
    barrier = threading.Barrier(8)
    sizes = []

    def work():
        for _ in range(3):
            barrier.wait()
            with budget.buffer(16 << 20) as buf:
                buf[:] = ONE[:len(buf)]
                sizes.append(len(buf))
                barrier.wait()

    before = rss()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(rss() - before, sorted(set(sizes)), budget.left == budget.total)
""")


def test_relay_buffers_go_back_to_the_system_when_a_body_ends() -> None:
    out = subprocess.run([sys.executable, "-c", _BUFFERS], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120).stdout.split(maxsplit=1)
    kept, rest = int(out[0]), out[1].strip()
    assert rest == f"[{1 << 20}, {16 << 20}] True"
    assert kept < 16 << 20, f"{kept >> 20} MiB kept after every buffer was given back"
