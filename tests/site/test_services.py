"""How the site daemon starts and stops its services, from its settings."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from agent.catalog import Role
from agent.cli import settings
from agent.commands.base import Context
from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.site import services
from tests.conftest import free_port


def test_no_site_address_no_services() -> None:
    assert services.start(Config(role=Role.SITE)) is None
    with pytest.raises(Unsupported, match="--site-address"):
        Context.local("site.httpProxy").site()  # what a handler gets: no services


def test_started_from_settings_and_stopped(tmp_path: Path) -> None:
    port = free_port()
    loaded = settings.load({"role": "site", "site_address": "127.0.0.1",
                            "site_http_port": str(port), "state_dir": str(tmp_path)})
    running = services.start(loaded.config)
    assert running is not None
    try:
        assert Context.local("site.httpProxy", site=running).site() is running
        assert running.base_url == f"http://127.0.0.1:{port}"
        assert running.dnsmasq is None  # no site_interface: the HTTP service alone
        with urllib.request.urlopen(f"{running.base_url}/boot.ipxe", timeout=5) as resp:
            assert resp.read().startswith(b"#!ipxe\n")
        assert (tmp_path / "site" / "boot" / "entries").is_dir()
        with pytest.raises(OSError, match="in use"):  # a second daemon on its port is refused
            services.start(loaded.config)
        with urllib.request.urlopen(f"{running.base_url}/boot.ipxe", timeout=5) as resp:
            assert resp.status == 200  # and the first still serves
    finally:
        running.stop()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # no listener left on the port
        s.listen()


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_bad_port_refused(port: str) -> None:
    with pytest.raises(InvalidParameters, match="site_http_port"):
        settings.load({"site_http_port": port})


def test_kernel_command_line_sets_them() -> None:
    loaded = settings.load({}, cmdline_text="bc.site_address=10.0.0.2 bc.site_interface=eth1")
    assert loaded.config.site_address == "10.0.0.2" and loaded.config.site_interface == "eth1"


def test_site_address_must_be_an_address(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameters, match="site_address"):
        services.start(Config(role=Role.SITE, site_address="10.0.0.2\ndhcp-range=x",
                              state_dir=tmp_path))
