"""The gateway CLI as an operator uses it: `agent gateway send` against a real agent subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from agent.gateway.certs import DevPki
from tests.runtime.harness import ROOT, AgentProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("kind", "payload", "code", "expect"),
    [
        ("disk.wipe", '{"disks": [{"serial": "S-1"}]}', 0, {"state": "finished", "status": "SUCCEEDED"}),
        ("gpu.reset", '{"gpu": "0"}', 2, {"state": "rejected", "reason": "wrong_role"}),
    ],
)
def test_gateway_send_one_command(
    pki: DevPki, tmp_path: Path, kind: str, payload: str, code: int, expect: dict[str, str]
) -> None:
    port = _free_port()
    send = subprocess.Popen(
        [sys.executable, "-m", "agent", "gateway", "send", "--pki", str(pki.dir),
         "--listen", f"127.0.0.1:{port}", "--node", "node-1", "--kind", kind, "--payload", payload,
         "--wait-node", "60", "--wait-result", "60", "--heartbeat", "1"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    address = types.SimpleNamespace(address=f"127.0.0.1:{port}")
    agent = AgentProcess(pki, address, tmp_path / "agent")  # type: ignore[arg-type]
    try:
        agent.start()
        out, err = send.communicate(timeout=120)
    finally:
        agent.kill()
        if send.poll() is None:
            send.kill()
    assert send.returncode == code, err
    result = json.loads(out)
    assert {k: result[k] for k in expect} == expect
    assert result["node_id"] == "node-1" and result["kind"] == kind
