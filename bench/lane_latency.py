"""Added control-lane latency while the provision lane is busy (issue 3 target: < 50 ms).

Runs the agent as a real subprocess (`python -m agent run`, test-only handlers) against the
in-process reference gateway over TLS on 127.0.0.1, and times control commands
(inventory.refresh, no work) from Gateway.send to the verified result at the gateway:

    idle          nothing else runs
    held          4 provision commands (disk.wipe, deploy.image) wait on an event
    burning       4 provision commands each run a CPU-bound child (sha256sum /dev/zero)
    spinning      2 provision commands spin in Python in the agent's own process (GIL contention,
                  the worst case for an in-process scheduler)

Usage: python bench/lane_latency.py [--runs 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.gateway.server import Gateway  # noqa: E402
from tests.runtime.harness import AgentProcess, make_pki, start_gateway, wait_until  # noqa: E402

WIPE = {"disks": [{"serial": "S-1"}]}


def measure(gw: Gateway, agent: AgentProcess, runs: int, tag: str) -> list[float]:
    out = []
    for i in range(runs):
        cid = agent.spec(f"{tag}-{i}", sleep=0)
        t0 = time.perf_counter()
        gw.send("node-1", "inventory.refresh", {}, command_id=cid)
        gw.wait_result(cid, 60)
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.02)
    return out


def busy(gw: Gateway, agent: AgentProcess, tag: str, n: int, **behaviour: object) -> list[str]:
    ids = []
    for i in range(n):
        kind = "disk.wipe" if i % 2 == 0 else "deploy.image"
        cid = agent.spec(f"{tag}-p{i}", hold=f"release-{tag}", **behaviour)
        ids.append(gw.send("node-1", kind, WIPE if kind == "disk.wipe" else {}, command_id=cid))
    wait_until(lambda: all(agent.executions()[c] for c in ids), 60, "provision commands to start")
    return ids


def summary(name: str, ms: list[float], base: float | None) -> str:
    ms = sorted(ms)
    med = statistics.median(ms)
    p95 = ms[int(0.95 * (len(ms) - 1))]
    added = "" if base is None else f"{med - base:+.1f}"
    return f"| {name} | {len(ms)} | {med:.1f} | {p95:.1f} | {ms[-1]:.1f} | {added} |"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    # Journal and test records live on tmpfs, as the journal does in the ramdisk (/run/...).
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        state = Path(tmp) / "state"
        pki = make_pki(Path(tmp) / "pki")
        gw = start_gateway(pki, heartbeat_seconds=2.0)
        agent = AgentProcess(pki, gw, Path(tmp) / "agent", state_dir=state).start()
        try:
            gw.wait_node("node-1", 60)
            measure(gw, agent, 10, "warm")
            rows = []
            idle = measure(gw, agent, args.runs, "idle")
            base = statistics.median(idle)
            rows.append(summary("idle", idle, None))
            for tag, n, behaviour in (("held", 4, {}), ("burning", 4, {"burn": True}),
                                      ("spinning", 2, {"spin": 3600})):
                ids = busy(gw, agent, tag, n, **behaviour)
                rows.append(summary(f"provision {tag} ({n})", measure(gw, agent, args.runs, tag), base))
                if tag == "spinning":
                    for cid in ids:
                        gw.cancel(cid, "bench done")
                agent.release(f"release-{tag}")
                for cid in ids:
                    gw.wait(cid, 60)
        finally:
            agent.terminate()
            gw.stop()
    print("| provision lane | runs | median (ms) | p95 (ms) | max (ms) | added median (ms) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
