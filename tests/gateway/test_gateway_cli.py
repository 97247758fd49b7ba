"""The gateway CLI as an operator uses it: `agent gateway send` against a real agent subprocess."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.gateway.certs import DevPki
from tests.conftest import free_port
from tests.runtime.harness import ROOT, AgentProcess


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
    port = free_port()
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


def test_gateway_serve_console(pki: DevPki, tmp_path: Path) -> None:
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "agent.gateway", "serve", "--pki", str(pki.dir),
         "--listen", f"127.0.0.1:{port}", "--heartbeat", "1"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1,
    )
    assert serve.stdin is not None and serve.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = serve.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()

    def expect(predicate: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if predicate(line):
                return line
        raise AssertionError(f"serve never printed {what}")

    address = types.SimpleNamespace(address=f"127.0.0.1:{port}")
    agent = AgentProcess(pki, address, tmp_path / "agent")  # type: ignore[arg-type]
    try:
        expect(lambda line: "listening on" in line, "its banner")
        agent.start()
        expect(lambda line: "connected node-1" in line, "the connection")
        serve.stdin.write("nodes\n")
        expect(lambda line: line.startswith("node-1 connected ramdisk"), "the node list")
        serve.stdin.write("send node-1 inventory.refresh '{}'\n")
        cid = expect(lambda line: line.startswith("inventory.refresh-"), "the command id").strip()
        serve.stdin.write(f"wait {cid} 60\n")
        expect(lambda line: '"state": "finished"' in line, "the result")
        serve.stdin.write("quit\n")
        assert serve.wait(30) == 0
    finally:
        agent.kill()
        if serve.poll() is None:
            serve.kill()
