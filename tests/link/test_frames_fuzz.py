"""Bad input at a live agent: malformed, truncated, oversized and random frames (hypothesis).

The agent (a real subprocess) must never crash; it answers with a clear ProtocolError and
resets the session, or rejects the command, and a good command right after works.
"""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.gateway import Gateway
from agent.link import wire
from agent.proto import session_pb2
from tests.runtime.harness import AgentProcess

TIMEOUT = 60.0


def _frame_bytes(frame: session_pb2.Frame) -> bytes:
    return wire.encode(frame)


oversized = st.integers(min_value=wire.MAX_FRAME_BYTES + 1, max_value=2**32 - 1).map(
    lambda n: ("frame_too_large", struct.pack(">I", n) + b"\0" * 16)
)
malformed = st.sampled_from([b"\xff\xff\xff\xff", b"\x0a\x10short", b"", b"\x08\x01", b"\x7a\x00"]).map(
    lambda body: ("malformed_frame", struct.pack(">I", len(body)) + body)
)
unexpected = st.sampled_from([
    session_pb2.Frame(hello=session_pb2.Hello(node_id="x")),
    session_pb2.Frame(welcome=session_pb2.Welcome(gateway_id="again")),
    session_pb2.Frame(accept=session_pb2.Accept(command_id="c")),
    session_pb2.Frame(progress=session_pb2.Progress(command_id="c")),
]).map(lambda f: ("unexpected_frame", _frame_bytes(f)))
bad_command = st.binary(max_size=64).map(
    lambda body: ("reject", _frame_bytes(session_pb2.Frame(command=session_pb2.SignedCommand(body=body))))
)
truncated = st.integers(min_value=1, max_value=20).map(
    lambda k: ("truncated", _frame_bytes(session_pb2.Frame(ack=session_pb2.Ack(command_id="x" * 30)))[:-k])
)
random_bytes = st.binary(min_size=1, max_size=300).map(lambda b: ("random", b))
cases = st.one_of(oversized, malformed, unexpected, bad_command, truncated, random_bytes)


def _errors(gw: Gateway) -> list[str]:
    return [e.detail for e in gw.events if e.what == "protocol_error"]


@pytest.mark.slow
def test_bad_frames_never_crash_the_agent(agent_proc: AgentProcess, gateway: Gateway) -> None:
    agent_proc.start()
    gateway.wait_node("node-1", TIMEOUT)
    seen: dict[str, int] = {}

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(cases)
    def one(case: tuple[str, bytes]) -> None:
        expect, data = case
        node = gateway.wait_node("node-1", TIMEOUT)
        sessions, errors = node.sessions, len(_errors(gateway))
        rejects = len([e for e in gateway.events if e.what == "rejected"])
        assert gateway.send_raw("node-1", data)
        if expect in ("frame_too_large", "malformed_frame", "unexpected_frame"):
            gateway.wait_for(lambda: len(_errors(gateway)) > errors, TIMEOUT, f"a {expect} error")
            assert _errors(gateway)[-1].startswith(expect), _errors(gateway)[-1]
            gateway.wait_node("node-1", TIMEOUT, sessions=sessions + 1)  # reset, then back
        elif expect == "reject":
            def rejected() -> bool:
                return len([e for e in gateway.events if e.what == "rejected"]) > rejects

            gateway.wait_for(rejected, TIMEOUT, "a reject")
        else:
            # Random or truncated bytes: an error and a reset, a reject, or the agent still
            # waiting for the rest of a frame. Cut the session so the next example starts clean.
            time.sleep(0.2)
            if gateway.nodes["node-1"].sessions == sessions:
                gateway.drop("node-1")
            gateway.wait_node("node-1", TIMEOUT, sessions=sessions + 1)
        seen[expect] = seen.get(expect, 0) + 1
        assert agent_proc.alive, agent_proc.logs()[-2000:]
        # And it keeps serving: a good command works.
        cid = gateway.send("node-1", "inventory.refresh", {})
        body, _ = gateway.wait_result(cid, TIMEOUT)
        assert body.status == session_pb2.SUCCEEDED

    one()
    print(f"\nbad frames sent, by kind: {seen}; protocol errors answered: {len(_errors(gateway))}")
    assert agent_proc.alive
