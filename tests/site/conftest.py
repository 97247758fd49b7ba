"""Fixtures of the site role's boot service and proxy routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.site import services
from agent.site.services import ServiceSettings, SiteServices


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteServices]:
    """The site's HTTP service on loopback (no dnsmasq), installed as the process's."""
    running = services.install(SiteServices(ServiceSettings(
        address="127.0.0.1", port=0, root=tmp_path / "site")))
    try:
        yield running
    finally:
        services.stop()
