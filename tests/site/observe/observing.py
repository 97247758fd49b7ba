"""What the console tests ask of a site's Observer, one copy for every transport's tests
(test_console.py's SOL, test_sshconsole.py's SSH): waiting for a state, the calls a bmc.power
on makes, and reading back the timeline and the kept console."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agent.site.observe.console import Bmc
from agent.site.observe.observer import Observer
from agent.site.observe.timeline import Step


def wait_for(what: str, check: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def power_on(obs: Observer, node_id: str, bmc: Bmc) -> None:
    """What the bmc.power handler tells the observer around a power on (agent/commands/bmc.py)."""
    obs.before_power(node_id, bmc)
    obs.power_requested(node_id, "on")
    obs.bmc_done(node_id, bmc, "bmc.power", "on")


def steps(obs: Observer, node_id: str = "n1") -> list[str]:
    a = obs.timelines.last(node_id)
    return [e.step for e in a.events] if a else []


def consoles_of(obs: Observer, node_id: str = "n1") -> list[str]:
    """What the node's last attempt says of its console (attached, busy, dropped ...)."""
    a = obs.timelines.last(node_id)
    return [e.detail for e in a.events if e.step == Step.CONSOLE] if a else []


def kept(obs: Observer, node_id: str = "n1") -> list[str]:
    """The node's console lines the site keeps, oldest first, without their times."""
    return [text for _, text in obs.consoles.read(node_id)]
