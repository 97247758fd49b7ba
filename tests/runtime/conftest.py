"""Fixtures of the runtime tests: a dev PKI, an in-process gateway, the agent as a subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from tests.runtime.harness import AgentProcess, start_gateway


@pytest.fixture
def gateway(pki: DevPki) -> Iterator[Gateway]:
    gw = start_gateway(pki)
    yield gw
    gw.stop()


@pytest.fixture
def agent_proc(pki: DevPki, gateway: Gateway, tmp_path: Path) -> Iterator[AgentProcess]:
    """An agent subprocess (not yet started: call .start()); killed at the end of the test."""
    proc = AgentProcess(pki, gateway, tmp_path / "agent")
    yield proc
    proc.kill()
