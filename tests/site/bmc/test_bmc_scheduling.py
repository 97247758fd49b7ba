"""How the site daemon schedules BMC work (agent/runtime/scheduler.py's BMC pool): no command waits
behind BMC operations that wait on BMCs; one operation at a time per BMC, in order of arrival;
a BMC that hangs or drips ends at its deadline and never keeps its BMC from the next command."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from agent.commands.base import Handler
from agent.config import Config
from agent.proto import session_pb2, site_pb2
from agent.runtime.core import Agent
from qemu.bmcfleet import Behaviour, RedfishFleet
from tests.runtime.core_harness import Frames, Quick, World, accepted
from tests.runtime.harness import wait_until
from tests.site.conftest import PASSWORD, REF, USERNAME
from tests.site.test_site_agent import site_agent as site_agent_of


class HungBmc:
    """A BMC that accepts TCP connections (the kernel's backlog) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"  # https: its handshake hangs

    def close(self) -> None:
        self.sock.close()


def site_agent(world: World, config: Config, *, extra_handlers: dict[str, Handler[Any, Any]] | None = None,
               **settings: Any) -> tuple[Agent, Frames]:
    """The site Agent of tests/site/test_site_agent.py with bmc.power, bmc.query, bmc.boot and a
    no-work inventory.refresh (a control-lane command that is not a BMC operation)."""
    return site_agent_of(world, config, kinds=("bmc.power", "bmc.query", "bmc.boot"),
                         extra_handlers={"inventory.refresh": Quick("inventory.refresh"),
                                         **(extra_handlers or {})}, **settings)


def redfish(world: World, cid: str, kind: str, address: str, operation: str, *, timeout: int = 0,
            **parameters: str) -> session_pb2.SignedCommand:
    payload = site_pb2.BmcOperationRequest(node_id=cid, bmc_address=address, protocol="redfish",
                                           operation=operation, credentials_ref=REF,
                                           parameters=parameters, verify_tls=False)
    return world.command(cid, kind, payload, timeout=timeout)


def test_hung_redfish_bmcs_do_not_hold_the_control_lane(site_config: Config, world: World) -> None:
    """Eight bmc.query on BMCs that never answer (twice the control lane's workers): an
    inventory.refresh sent after them starts and ends at once (it waited for a BMC's deadline)."""
    hung = [HungBmc() for _ in range(8)]
    try:
        agent, frames = site_agent(world, site_config)
        for i, bmc in enumerate(hung):
            accepted(agent.submit(redfish(world, f"q{i}", "bmc.query", bmc.address, "query", timeout=20)))
        time.sleep(0.5)
        sent = time.monotonic()
        accepted(agent.submit(world.command("inv", "inventory.refresh")))
        result = frames.result("inv", timeout=25)
        took = time.monotonic() - sent
        assert result.status == session_pb2.SUCCEEDED
        assert took < 1.0, f"inventory.refresh waited {took:.1f} s behind hung BMC operations"
    finally:
        for bmc in hung:
            bmc.close()


def test_a_dripping_bmc_ends_at_the_deadline_and_the_next_command_reaches_it(
        site_config: Config, world: World, tmp_path: Path) -> None:
    """A BMC that sends its answer one byte a second: the command ends at its deadline, and
    the next command to the same BMC (queued behind it) starts then and reaches the BMC,
    where it used to wait on the BMC's lock, still held by the abandoned handler, until its own
    deadline."""
    with RedfishFleet([Behaviour.DRIP], username=USERNAME, password=PASSWORD,
                      workdir=tmp_path / "fleet") as fleet:
        drip = fleet.bmcs[0]
        agent, frames = site_agent(world, site_config)
        sent = time.monotonic()
        accepted(agent.submit(redfish(world, "d1", "bmc.power", drip.address, "status", timeout=4)))
        accepted(agent.submit(redfish(world, "d2", "bmc.power", drip.address, "status", timeout=9)))
        first = frames.result("d1", timeout=10)
        first_took = time.monotonic() - sent
        # At the deadline: the watchdog's timeout, or the client's own "no complete answer before
        # the deadline" (unreachable) when the cut request returns first.
        assert first.status == session_pb2.TIMED_OUT or first.reason == "unreachable", first
        assert first_took < 5.5, f"the first command ended {first_took:.1f} s after it was sent"
        second = frames.result("d2", timeout=15)
        assert second.status == session_pb2.TIMED_OUT or second.reason == "unreachable", second
        assert "waiting for" not in second.message and "queued" not in second.message, second.message
        assert drip.connections == 2, "the second command never reached the BMC"
        # While it waited, the gateway was told so.
        queued = [p.message for p in frames.of("progress", "d2")]
        assert f"queued: 1 operation(s) ahead on bmc:{drip.address} (one at a time per BMC)" in queued, queued

        # And no handler is left reading from the BMC: its requests were cut at the deadline.
        def abandoned() -> int:
            keyed = [t for t in threading.enumerate() if t.name.startswith("keyed-")]
            return len(keyed) - agent.scheduler.keyed.workers

        wait_until(lambda: abandoned() == 0, 3, "the abandoned handlers to return")
