"""What keeping N consoles over SSH costs the site, and how many liveness questions it sends
(issue 53, item 3): the figure to beat is SOL's, one ipmitool session per quiet console every
LIVENESS_SILENCE seconds (agent/site/observe/console.py: about 17 a second at 256).

The site's side is the real one: an Observer (agent/site/observe/observer.py) told of each
node's BMC by a bmc.query (its first contact), keeping every console with OpenSSH's ssh
(sshconsole.py). The BMCs' side is the test lab's: Debian's sshd in a mount namespace of its
own (tests/site/observe/sshbmc.py, the OpenBMC personality, its session count raised to N) with
each session bridged to one scripted serial port (root needed, as for those tests). Each
console is a node of its own (its own BMC address, so its own pinned host key).

Counted, over a quiet window (``--quiet`` seconds, the node silent): the processes the site
started (a liveness question that costs a session or a process shows here), the keepalive
requests the BMC received (``keepalive@openssh.com`` in sshd's DEBUG1 log: ssh's
ServerAliveInterval, the SSH console's only liveness question) and the TCP segments the site's
ssh processes sent (``ss -ti``'s segs_out). Measured: the daemon's threads and descriptors, the
ssh processes' proportional memory (PSS) and their CPU time and the daemon's (user + system)
over the window, then over a window where the node writes ``--rate`` lines a second.

Usage: python bench/console_liveness.py [--consoles 256] [--quiet 60] [--speaking 20] [--rate 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.site.bmc.client import Credentials  # noqa: E402
from agent.site.bmc.redfish.vendors import GENERIC  # noqa: E402
from agent.site.bmc.secrets import SecretStore  # noqa: E402
from agent.site.observe import console  # noqa: E402
from agent.site.observe.console import Bmc  # noqa: E402
from agent.site.observe.observer import Observer, ObserverSettings  # noqa: E402
from agent.site.observe.sshconsole import KEEPALIVE_SECONDS, choose  # noqa: E402
from tests.site.observe.sshbmc import PERSONALITIES, Node, SshBmc  # noqa: E402

PASSWORD, REF = "Bench-Pass-9tQ4xW2m", "bench-bmc"
SYSTEM = {"SerialConsole": {"SSH": {"ServiceEnabled": True, "Port": 2200,
                                    "HotKeySequenceDisplay": "Press ~. to exit console"}}}
BATCH = 32     # consoles attached at once (sshd's MaxStartups drops unauthenticated ones past it)


LAB: set[int] = set()    # the lab's own processes (its sshd), not the site's
SAMPLING = [0.0]         # CPU seconds the bench's own thread spent (reading /proc, the node's
                         # lines): subtracted from the process's, which is the site's


def children(pid: int) -> set[int]:
    """The site's child processes now (the lab's sshd left out)."""
    began = time.thread_time()
    try:
        return _children(pid)
    finally:
        SAMPLING[0] += time.thread_time() - began


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
    return found - LAB


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pss_kib(pid: int) -> int:
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    match = re.search(r"^Pss:\s+(\d+)", rollup, re.M)
    return int(match.group(1)) if match else 0


def segs_out(port: int) -> int:
    """TCP segments sent so far by the site's side of every connection to the BMCs' sshd."""
    out = subprocess.run(["ss", "-Htin", "dst", f"127.0.0.1:{port}"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return sum(int(m) for m in re.findall(r"\bsegs_out:(\d+)", out))


def keepalives(log: Path) -> int:
    return log.read_text(errors="replace").count("keepalive@openssh.com")


def window(seconds: float, site: int, port: int, log: Path,
           speak: Callable[[str], object] | None = None, rate: float = 0.0) -> dict[str, float]:
    """One window: what the site started, sent and spent in it."""
    before_kids = children(site)
    seen = set(before_kids)
    cpu0 = {p: cpu_seconds(p) for p in before_kids}
    own0 = os.times()
    segs0, alive0 = segs_out(port), keepalives(log)
    sampled0 = SAMPLING[0]
    start = time.monotonic()
    lines = 0
    while time.monotonic() - start < seconds:
        if speak is not None and rate:
            began = time.thread_time()
            speak(f"bench line {lines:06d} " + "x" * 60)   # the lab's node: not the site's cost
            SAMPLING[0] += time.thread_time() - began
            lines += 1
            time.sleep(1.0 / rate)
        else:
            time.sleep(0.5)
        seen |= children(site)
    took = time.monotonic() - start
    own1 = os.times()
    after = children(site)
    return {
        "seconds": round(took, 1),
        "processes_started": len(seen - before_kids),
        "keepalive_requests": keepalives(log) - alive0,
        "tcp_segments_sent": segs_out(port) - segs0,
        "ssh_cpu_s": round(sum(cpu_seconds(p) - cpu0.get(p, 0.0) for p in after), 2),
        # the whole process's CPU less the bench's own sampling of /proc
        "daemon_cpu_s": round((own1.user - own0.user) + (own1.system - own0.system)
                              - (SAMPLING[0] - sampled0), 2),
        "bench_own_cpu_s": round(SAMPLING[0] - sampled0, 2),
        "lines_said": lines,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consoles", type=int, default=256)
    parser.add_argument("--quiet", type=float, default=60.0, help="seconds of the quiet window")
    parser.add_argument("--speaking", type=float, default=20.0, help="seconds of the speaking window")
    parser.add_argument("--rate", type=float, default=1.0, help="lines a second, to every console")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the BMCs' sshd runs in a mount namespace of its own")
    n = args.consoles
    work = Path(args.dir or tempfile.mkdtemp(prefix="bc-liveness-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    node = Node(work / "serial.sock")
    lab = SshBmc(work / "bmc", dataclasses.replace(PERSONALITIES["openbmc"], sessions=n + 8),
                 node.path, PASSWORD)
    config = lab.folder / "sshd_config"      # DEBUG1: each keepalive request is logged, counted
    config.write_text(config.read_text().replace("LogLevel VERBOSE", "LogLevel DEBUG1")
                      .replace("MaxStartups 64", f"MaxStartups {BATCH * 2}"))
    lab.start()
    assert lab.child is not None
    LAB.add(lab.child.pid)
    store = SecretStore(work / "secrets")
    store.put(REF, Credentials("root", PASSWORD))
    ring = 64 << 10
    obs = Observer(ObserverSettings(work / "observe", store.root, console_ring_bytes=ring,
                                    console_budget_bytes=n * ring))
    obs.start()
    plan = choose(SYSTEM, GENERIC)
    assert plan is not None
    plan = dataclasses.replace(plan, port=lab.port)
    me = os.getpid()
    threads0, fds0 = threading.active_count(), len(os.listdir("/proc/self/fd"))
    report: dict[str, object] = {"consoles": n, "liveness_silence_sol": console.LIVENESS_SILENCE,
                                 "keepalive_interval_ssh": KEEPALIVE_SECONDS}
    try:
        started = time.monotonic()
        for first in range(0, n, BATCH):
            for i in range(first, min(first + BATCH, n)):
                # its own Redfish address: its own pinned host key file, as n BMCs have
                bmc = Bmc(f"127.0.0.1:{20000 + i}", "redfish", REF, plan.encode())
                obs.bmc_done(f"n{i:03d}", bmc, "bmc.query", "inventory")
            deadline = time.monotonic() + 300
            while len(node.conns) < min(first + BATCH, n):
                if time.monotonic() > deadline:
                    sys.exit(f"only {len(node.conns)} consoles up after 300 s")
                time.sleep(0.2)
        report["attach_seconds"] = round(time.monotonic() - started, 1)
        states = [obs.consoles.state(f"n{i:03d}") for i in range(n)]
        report["attached"] = states.count("attached")
        time.sleep(2.0)
        kids = children(me)
        report["site_processes"] = len(kids)
        report["daemon_threads_added"] = threading.active_count() - threads0
        # the site's: ssh's three pipes a console; the lab node's end of each serial
        # connection (a socket in this process) left out
        report["daemon_fds_added"] = len(os.listdir("/proc/self/fd")) - fds0 - len(node.conns)
        report["ssh_pss_mib"] = round(sum(pss_kib(p) for p in kids) / 1024, 1)
        report["quiet"] = window(args.quiet, me, lab.port, lab.folder / "sshd.log")
        report["speaking"] = window(args.speaking, me, lab.port, lab.folder / "sshd.log",
                                    speak=node.say, rate=args.rate)
        quiet = report["quiet"]
        assert isinstance(quiet, dict)
        report["keepalive_requests_per_s"] = round(quiet["keepalive_requests"] / quiet["seconds"], 2)
        report["processes_started_per_s"] = round(quiet["processes_started"] / quiet["seconds"], 3)
        report["sol_ipmitool_sessions_per_s_at_this_count"] = round(n / console.LIVENESS_SILENCE, 1)
        time.sleep(1.0)
        heard = sum(1 for i in range(n) if any(t.startswith("bench line 000000")
                                              for _, t in obs.consoles.read(f"n{i:03d}")))
        report["consoles_that_kept_the_first_line"] = heard
    finally:
        obs.stop()
        lab.stop()
        node.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
