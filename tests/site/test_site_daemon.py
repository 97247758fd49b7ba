"""`agent run --role site` as a real process against the reference gateway: the daemon starts
its HTTP service from its settings, serves boot.prepareRamdisk, site.httpProxy and
boot.cleanUp through the gateway, keeps its entries across a restart, and frees its port
when it stops. (No dnsmasq here: no site_interface; tests/site/boot/test_boot_network.py has it.)"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.gateway import Gateway
from agent.proto import site_pb2
from tests.conftest import free_port
from tests.loopback_http import LoopbackServer
from tests.runtime.harness import AgentProcess, make_pki, start_gateway

pytestmark = pytest.mark.slow

NODE = "site-1"
TIMEOUT = 60



@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Any, Gateway]]:
    pki = make_pki(tmp_path / "pki", nodes=(NODE,))
    gw = start_gateway(pki)
    try:
        yield pki, gw
    finally:
        gw.stop()


def run(gw: Gateway, kind: str, payload: dict[str, Any]) -> Any:
    cid = gw.send(NODE, kind, payload)
    body, result = gw.wait_result(cid, TIMEOUT)
    assert result is not None, body
    return result


def test_site_daemon_serves_boot_entries_and_routes(gateway: tuple[Any, Gateway], tmp_path: Path) -> None:
    pki, gw = gateway
    port = free_port()
    state = tmp_path / "state"
    agent = AgentProcess(pki, gw, tmp_path / "agent", node_id=NODE, role="site", state_dir=state,
                         extra_args=("--site-address", "127.0.0.1", "--site-http-port", str(port),
                                     "--site-upstream", "127.0.0.1"))
    agent.start()
    try:
        gw.wait_node(NODE, TIMEOUT)
        entry = run(gw, "boot.prepareRamdisk", {
            "node_id": "n1", "mac_address": "52:54:00:aa:bb:cc", "boot_file": "ipxe.efi",
            "ipxe_script_url": "http://10.0.0.1/ramdisk.ipxe", "ttl_seconds": 600})
        assert isinstance(entry, site_pb2.ProxyDhcpResult) and entry.entry_id
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/pxe/52-54-00-aa-bb-cc.ipxe",
                                    timeout=10) as resp:
            assert b"chain http://10.0.0.1/ramdisk.ipxe" in resp.read()
        with LoopbackServer() as upstream:
            upstream.add("/image", b"0123456789" * 1000)
            route = run(gw, "site.httpProxy", {"node_id": "n1", "upstream_url": upstream.url("/image")})
            assert route.proxy_url.startswith(f"http://127.0.0.1:{port}/r/")
            with urllib.request.urlopen(route.proxy_url, timeout=10) as resp:
                assert resp.read() == b"0123456789" * 1000
        assert agent.terminate() == 0
        # Restarted: the entry is still there (state on disk), and clean-up removes it.
        agent.start()
        gw.wait_node(NODE, TIMEOUT, sessions=2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/pxe/52-54-00-aa-bb-cc.ipxe",
                                    timeout=10) as resp:
            assert resp.status == 200
        removed = run(gw, "boot.cleanUp", {"node_id": "n1"})
        assert "entry 52:54:00:aa:bb:cc" in removed.removed
        assert any(r.startswith("route ") for r in removed.removed)
        assert run(gw, "boot.cleanUp", {"node_id": "n1"}).removed == []
    finally:
        agent.terminate()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
