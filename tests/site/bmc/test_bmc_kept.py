"""What a Redfish BMC's command leaves for the next one on it (agent/commands/base.py Kept,
agent/site/bmc/redfish/session.py Discovered): the service root and System path are discovered once and
the kept-alive connection carries the BMC's next commands (a POST only when fresh and open);
a kept path the BMC no longer has is discovered again; a client of another address or TLS
setting does not take what another kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import Config
from agent.proto import session_pb2, site_pb2
from agent.site.bmc.client import CallContext, Credentials, Target
from agent.site.bmc.redfish.client import RedfishClient
from agent.site.bmc.redfish.session import Discovered
from qemu.bmcfleet import ROOT, SYSTEM, SYSTEMS, Behaviour, Bmc, RedfishFleet
from tests.runtime.core_harness import World, accepted
from tests.site.bmc.test_bmc_scheduling import redfish, site_agent
from tests.site.conftest import PASSWORD, USERNAME

STEPS = (("bmc.power", "status", {}), ("bmc.power", "on", {}),
         ("bmc.boot", "set_boot_device", {"device": "pxe"}), ("bmc.power", "status", {}))


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[Bmc]:
    """One emulated Redfish BMC that answers at once."""
    with RedfishFleet([Behaviour.OK], username=USERNAME, password=PASSWORD,
                      workdir=tmp_path / "fleet") as fleet:
        yield fleet.bmcs[0]


def test_a_bmcs_commands_share_its_discovery_and_one_connection(
        site_config: Config, world: World, bmc: Bmc) -> None:
    agent, frames = site_agent(world, site_config)
    for step, (kind, operation, parameters) in enumerate(STEPS):
        accepted(agent.submit(redfish(world, f"k{step}", kind, bmc.address, operation, **parameters)))
        result = frames.result(f"k{step}", timeout=60)
        assert result.status == session_pb2.SUCCEEDED, (result.reason, result.message)
    assert [site_pb2.BmcOperationResult.FromString(frames.result(f"k{s}").payload).state
            for s in range(len(STEPS))] == ["off", "on", "pxe", "on"]
    asked = [(r.method, r.path) for r in bmc.log]
    # The root and Systems once for the four commands; then the System alone.
    assert asked.count(("GET", ROOT)) == 1 and asked.count(("GET", SYSTEMS)) == 1, asked
    # status 1, on: the state, the Reset, the settled state; boot: the System (its ETag
    # too), the PATCH, the read-back; status 1.
    assert len(asked) == 2 + 1 + 3 + 3 + 1, asked
    assert bmc.connections == 1, "one TLS connection for all four commands"
    assert bmc.changes() == ["Reset On", "Boot Pxe/Once"]
    assert len(agent.kept) == 1


def test_a_kept_path_the_bmc_no_longer_has_is_discovered_again(
        site_config: Config, world: World, bmc: Bmc) -> None:
    agent, frames = site_agent(world, site_config)
    # What an earlier command learnt, before the BMC was reset and renumbered its Systems.
    gone = "/redfish/v1/Systems/Old-1"
    agent.kept.put(f"bmc:{bmc.address}", Discovered(
        f"https://{bmc.address}", False, "", {"Systems": {"@odata.id": SYSTEMS}}, {"system": gone}))
    accepted(agent.submit(redfish(world, "s", "bmc.power", bmc.address, "status")))
    result = frames.result("s", timeout=60)
    assert result.status == session_pb2.SUCCEEDED, (result.reason, result.message)
    asked = [(r.method, r.path) for r in bmc.log]
    assert asked == [("GET", gone), ("GET", ROOT), ("GET", SYSTEMS), ("GET", SYSTEM)], asked
    kept = agent.kept.take(f"bmc:{bmc.address}", Discovered)
    assert kept is not None and kept.paths == {"system": SYSTEM}
    kept.close()


def test_another_address_or_tls_setting_does_not_take_what_was_kept() -> None:
    """A Discovered is only for a client of the same base URL and TLS settings."""
    call = CallContext(cancel=threading.Event(), deadline=time.monotonic() + 30)
    known = Discovered("https://127.0.0.1:1", True, "", {"Systems": {"@odata.id": SYSTEMS}},
                       {"system": SYSTEM})
    other = RedfishClient(Target("127.0.0.1:1", Credentials("u", "p"), verify_tls=False), call, known)
    assert other._root is None and other._paths == {}
    same = RedfishClient(Target("127.0.0.1:1", Credentials("u", "p"), verify_tls=True), call,
                         Discovered("https://127.0.0.1:1", True, "", {"a": 1}, {"system": SYSTEM}))
    assert same._root == {"a": 1} and same.system_ref() == SYSTEM
