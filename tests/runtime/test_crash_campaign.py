"""Crash campaign: SIGKILL the agent at random points across 120 mixed commands, restart it.

At the end: no result is lost (every command settled with a result), no command that is not
retry-safe ran twice, every retry-safe command completed. The counts are printed.
"""

from __future__ import annotations

import collections
import random
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
    kills = 0
    ids: dict[str, str] = {}
    next_kill, restart_after, sessions = rng.randint(4, 10), -1, 0
    for i in range(COMMANDS):
        kind = KINDS[i % len(KINDS)]
        cid = agent_proc.spec(f"k{i:03d}", sleep=rng.choice((0.0, 0.05, 0.2, 0.5)), progress=2)
        gateway.send("node-1", kind, WIPE if kind == "disk.wipe" else {}, command_id=cid)
        ids[cid] = kind
        time.sleep(rng.uniform(0.0, 0.05))
        if i == next_kill:
            # At a random point of whatever is in flight: being accepted, running, journaling a
            # result, sending it.
            time.sleep(rng.uniform(0.0, 0.4))
            sessions = gateway.nodes["node-1"].sessions
            agent_proc.kill()
            kills += 1
            restart_after = i + rng.randint(0, 2)  # commands sent meanwhile wait at the gateway
        if restart_after == i:
            agent_proc.start()
            # Every life lasts until it has reached the gateway, and long enough for what it
            # re-runs to finish (the longest command takes 0.5 s): a retry-safe command killed
            # in each of several short lives is given up on by design (core's MAX_ATTEMPTS),
            # which is not what this campaign is about.
            gateway.wait_node("node-1", 60, sessions=sessions + 1)
            time.sleep(0.6)
            next_kill = i + rng.randint(4, 10)
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
            retry_incomplete.append((cid, status, rec.result.reason, rec.result.message))
        if not kind.retry_safe and rec.result.status not in (session_pb2.SUCCEEDED, session_pb2.INTERRUPTED):
            retry_incomplete.append((cid, status, rec.result.reason))
    reruns = sum(1 for cid, k in ids.items() if catalog.KINDS[k].retry_safe and runs[cid] > 1)
    print(
        f"\ncrash campaign: {len(ids)} commands, {kills} SIGKILLs, {agent_proc.starts} agent starts; "
        f"results {sum(statuses.values())}, lost {len(lost)}, not-retry-safe run twice {len(twice)}, "
        f"retry-safe re-run after a kill {reruns}; statuses {dict(sorted(statuses.items()))}"
    )
    assert kills >= 10
    assert lost == []
    assert twice == []
    assert retry_incomplete == []
