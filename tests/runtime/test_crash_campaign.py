"""Crash campaign: SIGKILL the agent at random points across 120 mixed commands, restart it.

At the end: no result is lost (every command settled with a result), no command that is not
retry-safe ran twice, every retry-safe command completed. The counts are printed.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import pytest

from agent import catalog
from agent.gateway import Gateway, State
from agent.proto import session_pb2
from tests.runtime.harness import AgentProcess

COMMANDS = 120
KINDS = ("disk.wipe", "deploy.image", "driver.invoke", "inventory.refresh", "diag.nvml",
         "diag.dcgm", "logs.collect")
WIPE = {"disks": [{"serial": "S-1"}]}


@pytest.mark.slow
def test_sigkill_campaign(agent_proc: AgentProcess, gateway: Gateway) -> None:
    rng = random.Random(20261129)
    agent_proc.start()
    gateway.wait_node("node-1", 60)
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        while not stop.wait(rng.uniform(0.3, 1.5)):
            agent_proc.kill()
            kills += 1
            if stop.wait(rng.uniform(0.0, 0.3)):  # sometimes the gateway sees the drop first
                break
            agent_proc.start()
        if not agent_proc.alive:
            agent_proc.start()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    ids: dict[str, str] = {}
    try:
        for i in range(COMMANDS):
            kind = KINDS[i % len(KINDS)]
            cid = agent_proc.spec(f"k{i:03d}", sleep=rng.choice((0.0, 0.05, 0.2, 0.5)), progress=2)
            gateway.send("node-1", kind, WIPE if kind == "disk.wipe" else {}, command_id=cid)
            ids[cid] = kind
            time.sleep(rng.uniform(0.0, 0.05))
        # Let the killing go on for a while as the work finishes, then let it settle.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(gateway.commands[c].state.final for c in ids):
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
    if not agent_proc.alive:
        agent_proc.start()
    for cid in ids:
        gateway.wait(cid, 120)

    runs = agent_proc.executions()
    statuses: collections.Counter[str] = collections.Counter()
    twice, lost, retry_incomplete = [], [], []
    for cid, kind_name in ids.items():
        kind = catalog.KINDS[kind_name]
        rec = gateway.commands[cid]
        if rec.state is not State.FINISHED or rec.result is None:
            lost.append((cid, str(rec.state), rec.reject_reason))
            continue
        status = session_pb2.Status.Name(rec.result.status)
        statuses[f"{'retry-safe' if kind.retry_safe else 'not-retry-safe'} {status}"] += 1
        if not kind.retry_safe and runs[cid] > 1:
            twice.append((cid, runs[cid]))
        if kind.retry_safe and rec.result.status != session_pb2.SUCCEEDED:
            retry_incomplete.append((cid, status, rec.result.reason))
        if not kind.retry_safe and rec.result.status not in (session_pb2.SUCCEEDED, session_pb2.INTERRUPTED):
            retry_incomplete.append((cid, status, rec.result.reason))
    reruns = sum(1 for cid, k in ids.items() if catalog.KINDS[k].retry_safe and runs[cid] > 1)
    print(
        f"\ncrash campaign: {len(ids)} commands, {kills} SIGKILLs, {agent_proc.starts} agent starts; "
        f"results {sum(statuses.values())}, lost {len(lost)}, not-retry-safe run twice {len(twice)}, "
        f"retry-safe re-run after a kill {reruns}; statuses {dict(sorted(statuses.items()))}"
    )
    assert kills >= 5
    assert lost == []
    assert twice == []
    assert retry_incomplete == []
