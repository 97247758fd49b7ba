"""`agent run --role site` while one client holds about 1,100 idle connections to its HTTP
service (issue 27, item 4): with the 1,024 descriptors of a default RLIMIT_NOFILE, the daemon
keeps serving its gateway and other nodes' routes throughout, does not spin, and lets the
idle connections go at their head deadline. Loopback only; every wait is bounded."""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.gateway import Gateway
from agent.site.serve.conns import HEAD_SECONDS
from tests.loopback_http import LoopbackServer
from tests.runtime.harness import AgentProcess, wait_until
from tests.site.test_site_daemon import (  # noqa: F401  (gateway: a fixture)
    NODE,
    TIMEOUT,
    free_port,
    gateway,
    run,
)

pytestmark = pytest.mark.slow

DAEMON_FILES = 1024
HELD = 1100


class LimitedAgent(AgentProcess):
    """The real agent, its RLIMIT_NOFILE soft limit 1,024 (systemd's default without the
    unit's LimitNOFILE)."""

    entry = ("-c", "import resource, runpy; "
             f"resource.setrlimit(resource.RLIMIT_NOFILE, ({DAEMON_FILES}, "
             "resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
             "runpy.run_module('agent', run_name='__main__', alter_sys=True)")


@pytest.fixture
def many_files() -> Iterator[None]:
    """This process may hold the client's 1,100 connections and its own files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: the test needs {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fetch(url: str, source: str) -> bytes:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("GET", parts.path)
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        return resp.read()
    finally:
        conn.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_daemon_serves_on_while_one_client_holds_1100_connections(
        gateway: tuple[Any, Gateway], tmp_path: Path, many_files: None) -> None:  # noqa: F811
    pki, gw = gateway
    port = free_port()
    agent = LimitedAgent(pki, gw, tmp_path / "agent", node_id=NODE, role="site",
                         extra_args=("--site-address", "127.0.0.1", "--site-http-port", str(port),
                                     "--site-upstream", "127.0.0.1"))
    agent.start()
    held: list[socket.socket] = []
    try:
        gw.wait_node(NODE, TIMEOUT)
        assert agent.proc is not None
        pid = agent.proc.pid
        with LoopbackServer() as upstream:
            body = os.urandom(256 << 10)
            first = run(gw, "site.httpProxy", {"node_id": "n1", "upstream_url": upstream.add("/a", body)})
            assert fetch(first.proxy_url, "127.0.0.2") == body
            baseline = files(pid)
            # One client, one address: 1,100 connections, a byte each, then silence.
            for _ in range(HELD):
                s = socket.socket()
                s.settimeout(5)
                with contextlib.suppress(OSError):
                    s.connect(("127.0.0.1", port))
                    s.send(b"G")
                held.append(s)
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            # Meanwhile: other nodes' routes, and a command through the gateway (the journal,
            # a new route's file), each within its own bound.
            for i in range(3):
                assert fetch(first.proxy_url, f"127.0.0.{3 + i}") == body
            second = run(gw, "site.httpProxy", {"node_id": "n2", "upstream_url": upstream.url("/a")})
            assert fetch(second.proxy_url, "127.0.0.9") == body
            time.sleep(2)
            busy = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
            assert busy < 0.5, f"the daemon kept {busy:.2f} of a CPU busy while held"
            assert files(pid) < DAEMON_FILES - 128, files(pid)
            # The idle ones it took are let go at their head deadline, though the client holds on.
            wait_until(lambda: files(pid) <= baseline + 4, HEAD_SECONDS + 10,
                       "the idle connections closed by the daemon")
            assert fetch(second.proxy_url, "127.0.0.10") == body
        log = (tmp_path / "agent" / "agent-1.log").read_text(errors="replace")
        assert "Too many open files" not in log and "Traceback" not in log
        assert "connections refused past the caps" in log
    finally:
        for s in held:
            s.close()
        agent.terminate()
