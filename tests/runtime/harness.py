"""The agent as a real subprocess (`agent run`) against an in-process Gateway.

Used by the runtime tests and bench/lane_latency.py. The agent runs through the test entry
point tests/runtime/agent_main.py, which registers the test-only handlers
(tests/runtime/agent_test_handlers.py), and gets a test directory
($BC_TEST_DIR) where each command's behaviour is described and each execution recorded.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.gateway import Gateway
from agent.gateway.certs import DevPki, make_dev_pki

ROOT = Path(__file__).resolve().parents[2]
AGENT_MAIN = Path(__file__).with_name("agent_main.py")  # `agent` with the test handlers


def make_pki(path: Path, nodes: tuple[str, ...] = ("node-1",)) -> DevPki:
    return make_dev_pki(path, nodes=nodes)


def start_gateway(pki: DevPki, **kwargs: Any) -> Gateway:
    kwargs.setdefault("heartbeat_seconds", 1.0)
    return Gateway(cert=pki.gateway_cert, key=pki.gateway_key, client_ca=pki.ca,
                   signing_key=pki.signing_key, **kwargs).start()


class AgentProcess:
    """One agent: start, SIGKILL, restart with the same state directory."""

    entry: tuple[str, ...] = (str(AGENT_MAIN),)   # with the test handlers; ("-m", "agent"): the real ones

    def __init__(
        self,
        pki: DevPki,
        gateway: Gateway,
        test_dir: Path,
        *,
        node_id: str = "node-1",
        role: str = "ramdisk",
        token: str | None = None,
        extra_args: tuple[str, ...] = (),
        cmdline: str = "",
        state_dir: Path | None = None,
    ) -> None:
        self.pki, self.gateway, self.dir = pki, gateway, test_dir
        self.node_id, self.role, self.token = node_id, role, token
        self.extra_args = extra_args
        (self.dir / "spec").mkdir(parents=True, exist_ok=True)
        self.state_dir = state_dir or self.dir / "state"
        self.cmdline_file = self.dir / "cmdline"
        self.cmdline_file.write_text(cmdline)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        args = [
            sys.executable, *self.entry, "run",
            "--gateway", self.gateway.address, "--node", self.node_id, "--role", self.role,
            "--ca", str(self.pki.ca), "--state-dir", str(self.state_dir),
            "--trusted-key", str(self.pki.signing_pub), "--cmdline-file", str(self.cmdline_file),
            "--reconnect-min", "0.05", "--reconnect-max", "0.5",
        ]
        if self.token is None:
            args += ["--cert", str(self.pki.client_cert(self.node_id)),
                     "--key", str(self.pki.client_key(self.node_id))]
        else:
            args += ["--token", self.token]
        return args + list(self.extra_args)

    def start(self) -> AgentProcess:
        env = dict(os.environ, BC_TEST_DIR=str(self.dir),
                   PYTHONPATH=str(ROOT))
        self.starts += 1
        log = open(self.dir / f"agent-{self.starts}.log", "wb")  # noqa: SIM115 (kept by the child)
        self.proc = subprocess.Popen(self.argv(), env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        return self

    def kill(self) -> None:
        """SIGKILL, no warning (crash campaign)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- the test directory -------------------------------------------------------------------

    def spec(self, command_id: str, **behaviour: Any) -> str:
        (self.dir / "spec" / f"{command_id}.json").write_text(json.dumps(behaviour))
        return command_id

    def release(self, name: str) -> None:
        (self.dir / name).write_text("go")

    def executions(self) -> collections.Counter[str]:
        """How many times each command id STARTED running."""
        path = self.dir / "executions.log"
        counts: collections.Counter[str] = collections.Counter()
        if path.exists():
            for line in path.read_text().splitlines():
                words = line.split()
                if len(words) >= 2 and words[0] == "start":
                    counts[words[1]] += 1
        return counts

    def ended(self) -> set[str]:
        path = self.dir / "executions.log"
        if not path.exists():
            return set()
        return {w[1] for w in (line.split() for line in path.read_text().splitlines()) if w[:1] == ["end"]}

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("agent-*.log")))


def wait_until(predicate: Any, timeout: float, what: str, *, interval: float = 0.05) -> Any:
    """The predicate's first true value, asked every ``interval`` seconds until ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
