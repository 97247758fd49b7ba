"""Fixtures of the site role's boot service and proxy routes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.site import services
from agent.site.services import ServiceSettings, SiteServices
from tests.site.netns import Net, need, wait_listening


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteServices]:
    """The site's HTTP service on loopback (no dnsmasq), installed as the process's."""
    running = services.install(SiteServices(ServiceSettings(
        address="127.0.0.1", port=0, root=tmp_path / "site")))
    try:
        yield running
    finally:
        services.stop()


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    """The network, with the plain DHCP server running (its log: tmp_path/plain-dhcp.log)."""
    need()
    n = Net()
    plain: subprocess.Popen[bytes] | None = None
    log = os.open(tmp_path / "plain-dhcp.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        n.up()
        # --no-ping: dnsmasq would otherwise ping an address for 3 s before offering it.
        plain = proc.spawn([*n.exec(n.dhcp), "dnsmasq", "--keep-in-foreground",
                            "--conf-file=/dev/null", "--port=0", "--interface=eth0",
                            "--bind-interfaces", "--pid-file=", "--no-ping", "--user=root",
                            "--dhcp-range=10.99.0.100,10.99.0.200,1h",
                            f"--dhcp-leasefile={tmp_path / 'leases'}", "--log-dhcp",
                            "--log-facility=-"],
                           stdout=subprocess.DEVNULL, stderr=log)
        wait_listening(n, n.dhcp)
        yield n
    finally:
        if plain is not None:
            proc.kill_group(plain)
        os.close(log)
        n.down()


