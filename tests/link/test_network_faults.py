"""Network faults: the gateway cuts the connection mid-command and mid-result, and restarts.

Nothing is lost (every command gets its result) and nothing runs twice (the test handlers record
every execution).
"""

from __future__ import annotations

import threading

from agent.gateway import Gateway, State
from agent.proto import session_pb2
from tests.runtime.harness import AgentProcess, wait_until

TIMEOUT = 60.0
WIPE = {"disks": [{"serial": "S-1"}]}


def test_connection_dropped_while_commands_run(agent_proc: AgentProcess, gateway: Gateway) -> None:
    agent_proc.start()
    gateway.wait_node("node-1", TIMEOUT)
    ids = []
    for i, kind in enumerate(["disk.wipe", "deploy.image", "inventory.refresh", "logs.collect"]):
        cid = agent_proc.spec(f"mid-{i}", hold="go-mid")
        ids.append(gateway.send("node-1", kind, WIPE if kind == "disk.wipe" else {}, command_id=cid))
    wait_until(lambda: all(agent_proc.executions()[c] for c in ids), TIMEOUT, "all to start")
    gateway.drop("node-1")
    agent_proc.release("go-mid")  # they finish while the agent is (maybe) offline
    gateway.wait_node("node-1", TIMEOUT, sessions=2)
    for cid in ids:
        body, _ = gateway.wait_result(cid, TIMEOUT)
        assert body.status == session_pb2.SUCCEEDED
    runs = agent_proc.executions()
    assert [runs[c] for c in ids] == [1, 1, 1, 1]


def test_connection_dropped_when_the_result_arrives(agent_proc: AgentProcess, gateway: Gateway) -> None:
    """The first result frame never reaches the gateway's logic; the reconnect Hello carries it."""
    cut = threading.Event()

    def drop_first_result(node_id: str, frame: session_pb2.Frame) -> str | None:
        if frame.WhichOneof("msg") == "result" and not cut.is_set():
            cut.set()
            return "drop"
        return None

    gateway.fault_hook = drop_first_result
    agent_proc.start()
    gateway.wait_node("node-1", TIMEOUT)
    cid = gateway.send("node-1", "disk.wipe", WIPE, command_id="mid-result")
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert cut.is_set()
    assert body.status == session_pb2.SUCCEEDED
    assert gateway.nodes["node-1"].sessions >= 2
    assert agent_proc.executions()[cid] == 1
    assert gateway.commands[cid].results_received == 1  # the dropped copy was never recorded


def test_command_sent_while_the_connection_drops_is_delivered_once(
    agent_proc: AgentProcess, gateway: Gateway
) -> None:
    """Cut right after the Accept: the gateway resends nothing accepted; the result still comes."""
    cut = threading.Event()

    def drop_at_accept(node_id: str, frame: session_pb2.Frame) -> str | None:
        if frame.WhichOneof("msg") == "accept" and not cut.is_set():
            cut.set()
            return "drop"
        return None

    gateway.fault_hook = drop_at_accept
    agent_proc.start()
    gateway.wait_node("node-1", TIMEOUT)
    cid = agent_proc.spec("at-accept", sleep=0.5)
    gateway.send("node-1", "deploy.image", {}, command_id=cid)
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED
    assert agent_proc.executions()[cid] == 1


def test_gateway_restart_loses_nothing(agent_proc: AgentProcess, gateway: Gateway) -> None:
    agent_proc.start()
    gateway.wait_node("node-1", TIMEOUT)
    running = gateway.send("node-1", "driver.invoke", {}, command_id=agent_proc.spec("r-run", hold="go-r"))
    wait_until(lambda: agent_proc.executions()[running], TIMEOUT, "the command to start")
    gateway.stop()
    agent_proc.release("go-r")  # finishes while there is no gateway at all
    wait_until(lambda: running in agent_proc.ended(), TIMEOUT, "the command to end")
    queued = gateway.send("node-1", "disk.wipe", WIPE, command_id="r-queued")  # queued: node offline
    assert gateway.commands[queued].state is State.PENDING
    gateway.start()
    gateway.wait_node("node-1", TIMEOUT, sessions=2)
    for cid in (running, queued):
        body, _ = gateway.wait_result(cid, TIMEOUT)
        assert body.status == session_pb2.SUCCEEDED
        assert agent_proc.executions()[cid] == 1


def test_repeated_drops_during_a_stream_of_commands(agent_proc: AgentProcess, gateway: Gateway) -> None:
    agent_proc.start()
    gateway.wait_node("node-1", TIMEOUT)
    kinds = ["disk.wipe", "inventory.refresh", "deploy.image", "diag.nvml", "logs.collect"]
    ids = []
    for i in range(30):
        kind = kinds[i % len(kinds)]
        cid = agent_proc.spec(f"s-{i}", sleep=0.05 * (i % 4))
        ids.append(gateway.send("node-1", kind, WIPE if kind == "disk.wipe" else {}, command_id=cid))
        if i % 6 == 5:
            gateway.drop("node-1")
    for cid in ids:
        body, _ = gateway.wait_result(cid, TIMEOUT)
        assert body.status == session_pb2.SUCCEEDED, (cid, body)
    runs = agent_proc.executions()
    assert {cid: runs[cid] for cid in ids} == dict.fromkeys(ids, 1)
