"""Pieces of agent/link/session.py that need no network: addresses, backoff, Hello size, dialing
before the network is up."""

from __future__ import annotations

import errno
import itertools
import random
import socket
import threading
import time
from pathlib import Path

import pytest

from agent.config import Config
from agent.errors import InvalidParameters
from agent.link import session as session_module
from agent.link.session import Session, SessionOptions, parse_address
from tests.runtime.harness import make_pki


def test_parse_address() -> None:
    assert parse_address("gw.example:7443") == ("gw.example", 7443)
    assert parse_address("[fd00::1]:7443") == ("fd00::1", 7443)
    for bad in ("gw", "gw:", ":7443", "gw:port"):
        with pytest.raises(InvalidParameters):
            parse_address(bad)


def test_backoff_is_full_jitter_exponential_and_capped(tmp_path: Path) -> None:
    rng = random.Random(1)
    options = SessionOptions(reconnect_min_seconds=0.5, reconnect_max_seconds=30.0)
    config = Config(node_id="n1", gateway="gw:443", ca_bundle=make_pki(tmp_path).ca)
    session = Session(_QuietAgent(), config, options)  # type: ignore[arg-type]  # a stand-in agent
    redial = session.redial.backoff
    for attempt in range(12):
        ceiling = min(30.0, 0.5 * 2**attempt)
        samples = [redial.delay(attempt + 1, rng) for _ in range(200)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > 0.8 * ceiling  # spread over the whole range (full jitter)
        assert min(samples) < 0.2 * ceiling
    assert redial.delay(1001) <= 30.0


class _QuietAgent:
    def subscribe(self, sink: object) -> None:
        pass

    def add_exit_hook(self, fn: object) -> None:
        pass


def test_no_route_yet_is_retried_at_the_minimum_delay_without_backing_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ramdisk starts the agent while DHCP runs: dials that fail for want of a route do not
    grow the backoff (which would leave the agent asleep long after the network came up)."""
    pki = make_pki(tmp_path / "pki")
    config = Config(node_id="n1", gateway="10.0.2.100:443", ca_bundle=pki.ca)
    options = SessionOptions(reconnect_min_seconds=0.05, reconnect_max_seconds=60.0)
    s = Session(_QuietAgent(), config, options)  # type: ignore[arg-type]
    dials: list[tuple[float, int]] = []

    def dial(address: tuple[str, int], timeout: float) -> object:
        dials.append((time.monotonic(), s.attempt))
        if len(dials) <= 5:
            raise OSError(errno.ENETUNREACH, "Network is unreachable")
        if len(dials) == 7:
            s.stop()
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setattr(session_module.socket, "create_connection", dial)
    t = threading.Thread(target=s.run)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert [attempt for _, attempt in dials] == [0, 0, 0, 0, 0, 0, 1]  # refused: backoff starts
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(dials[:6])]
    assert all(0.04 <= g < 1.0 for g in gaps), gaps
    assert session_module.network_not_up(OSError(errno.ENETUNREACH, "x"))
    assert session_module.network_not_up(socket.gaierror(socket.EAI_AGAIN, "x"))
    assert not session_module.network_not_up(socket.gaierror(socket.EAI_NONAME, "x"))
    assert not session_module.network_not_up(ConnectionRefusedError(errno.ECONNREFUSED, "x"))


def test_the_session_reaches_the_runtime_only_through_agentlike() -> None:
    """Every call the session makes on the agent is a member of the typed AgentLike protocol
    (mypy checks the runtime's Agent against it where the session is built): no by-name lookup."""
    import ast
    import inspect

    from agent.link.session import AgentLike
    from agent.runtime.core import Agent

    link = Path(session_module.__file__).parent
    by_name = [f"{p.name}:{n.lineno}" for p in sorted(link.glob("*.py"))
               for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id in {"getattr", "hasattr"}]
    assert not by_name, f"by-name lookups in agent/link/: {by_name}"
    used = {n.attr for n in ast.walk(ast.parse(Path(session_module.__file__).read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
            and n.value.attr == "agent"}
    contract = {name for name in vars(AgentLike) if not name.startswith("_")}
    assert used <= contract, f"the session calls {sorted(used - contract)} outside AgentLike"
    assert {"joined", "attest", "unacked_results"} <= contract
    for name in contract:
        assert inspect.signature(getattr(AgentLike, name)).parameters.keys() \
            <= inspect.signature(getattr(Agent, name)).parameters.keys(), name
