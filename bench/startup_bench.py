"""Start-up of the zipapp on this host (issue 28, item 3: at most 0.15 s from exec to the
command's start for `agent exec`): the default build (protobuf's native build, upb, carried
for x86_64 and aarch64 as cryptography's wheels are, and every module's bytecode) against a
build without either and with one of the two (``--arch none``: the pure-Python protobuf, what
a machine with no fitting wheel runs; ``--no-bytecode``).

Each round runs, in alternating order, for each archive: ``agent exec inventory.refresh``
(the time from just before the exec to the "accepted" line the agent logs when the command
starts, read from its log's timestamp; the CPU seconds the process had used by then, read
from /proc as the line arrives, which a loaded machine moves far less than the wall time;
and the whole process's CPU seconds), ``agent version``
(wall and CPU) and, beside them, a bare ``python3 -c pass`` (what no agent can beat). Medians
of the rounds. The native cache is unpacked once per build before the clock, as on a machine
after its first start.

Usage: python bench/startup_bench.py [--runs 15]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(out: Path, *extra: str) -> Path:
    subprocess.run([sys.executable, str(ROOT / "build" / "zipapp.py"), "--out", str(out), *extra],
                   check=True, capture_output=True, timeout=600)
    return out


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], env: dict[str, str],
          cpu_at: list[float] | None = None) -> tuple[float, float, float, str]:
    """(start time, wall seconds, CPU seconds, stderr) of one run; with ``cpu_at``, the CPU
    seconds the process had used when it logged that a command was accepted go into it."""
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if cpu_at is not None and b" INFO agent.runtime.core: accepted " in line:
            cpu_at.append(_cpu(proc.pid))
    err = b"".join(lines)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return t0, wall, usage.ru_utime + usage.ru_stime, err.decode(errors="replace")


def accepted_after(t0: float, log: str) -> float:
    """Seconds from ``t0`` to the agent's "accepted" line (its logging timestamp, ms)."""
    for line in log.splitlines():
        if " INFO agent.runtime.core: accepted " in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp() - t0
    raise SystemExit(f"no 'accepted' line in the agent's log:\n{log[-2000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=15, help="rounds (default 15)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmpdir:
        tmp = Path(tmpdir)
        archives = {"default build (upb, bytecode)": build(tmp / "native.pyz"),
                    "pure-Python protobuf (--arch none)": build(tmp / "pure.pyz", "--arch", "none"),
                    "no bytecode (--no-bytecode)": build(tmp / "nopyc.pyz", "--no-bytecode"),
                    "neither (the build before)": build(tmp / "before.pyz", "--arch", "none",
                                                        "--no-bytecode")}
        # As the service runs it (agent/data/bettercompute-agent.service): no bytecode written
        # by imports, so whatever is not compiled ahead is compiled at every start.
        env = {"PATH": "/usr/bin:/bin", "BC_AGENT_CACHE": str(tmp / "cache"), "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        python = "/usr/bin/python3"
        for archive in archives.values():  # the native cache unpacked, as after a machine's first start
            timed([python, str(archive), "version", "--deps"], env)
        results: dict[str, list[float]] = {}

        def note(key: str, value: float) -> None:
            results.setdefault(key, []).append(value)

        for i in range(a.runs):
            names = list(archives) if i % 2 == 0 else list(reversed(archives))
            _t0, wall, cpu, _ = timed([python, "-c", "pass"], env)
            note("python3 -c pass: wall", wall)
            note("python3 -c pass: CPU", cpu)
            for name in names:
                pyz = str(archives[name])
                at: list[float] = []
                t0, wall, cpu, log = timed([python, pyz, "exec", "inventory.refresh",
                                            "--payload", "{}"], env, at)
                note(f"{name}: exec to the command's start", accepted_after(t0, log))
                note(f"{name}: exec to the command's start, CPU", at[0])
                note(f"{name}: exec, whole process CPU", cpu)
                _t0, wall, cpu, _ = timed([python, pyz, "version"], env)
                note(f"{name}: version wall", wall)
                note(f"{name}: version CPU", cpu)
        print(f"{a.runs} rounds; load average before the summary: {os.getloadavg()[0]:.2f}")
        print("| what | median (s) | min (s) | max (s) |")
        print("|---|---|---|---|")
        for key, values in results.items():
            print(f"| {key} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
