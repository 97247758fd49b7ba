"""The site daemon (an Agent in role site, its real bmc.* handlers) against a fleet of 64
emulated BMCs (qemu/bmcfleet.py; ipmi_sim for IPMI): every command of every healthy BMC
completes, in its order of arrival, one at a time per BMC; hung, refusing, busy and slow BMCs
end as they must without delaying the others; and a command for a healthy BMC (or any other
control-lane command) starts within a second while 64 BMCs hang."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from agent.config import Config
from agent.proto import session_pb2, site_pb2
from qemu.bmcfleet import Behaviour, RedfishFleet
from qemu.ipmisim import free_udp_ports, start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from tests.runtime.core_harness import Quick, World, accepted
from tests.runtime.harness import wait_until
from tests.site.bmc.test_bmc_scheduling import redfish, site_agent
from tests.site.conftest import PASSWORD, REF, USERNAME, _skip_without_tools

pytestmark = pytest.mark.slow

N = 64
# Each BMC's commands, sent all at once: (kind, operation, parameters).
SEQUENCE: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("bmc.power", "status", {}),
    ("bmc.power", "on", {}),
    ("bmc.boot", "set_boot_device", {"device": "pxe"}),
    ("bmc.boot", "get_boot_device", {}),
    ("bmc.power", "off", {"graceful_timeout_seconds": "0"}),
)


def payload_of(result: session_pb2.ResultBody) -> site_pb2.BmcOperationResult:
    return site_pb2.BmcOperationResult.FromString(result.payload)


def test_64_redfish_bmcs_power_and_boot_in_order(site_config: Config, world: World,
                                                 tmp_path: Path) -> None:
    behaviours = ([Behaviour.OK] * 52 + [Behaviour.HANG] * 4 + [Behaviour.BUSY] * 4
                  + [Behaviour.SLOW] * 2 + [Behaviour.REFUSE] * 2)
    assert len(behaviours) == N
    with RedfishFleet(behaviours, username=USERNAME, password=PASSWORD, workdir=tmp_path / "fleet",
                      slow_seconds=0.2) as fleet:
        agent, frames = site_agent(world, site_config)
        sent = time.monotonic()
        for bmc in fleet.bmcs:
            # The dead ones get a short deadline (the test waits for it), the others a long one
            # (a loaded 2-core machine).
            timeout = 15 if bmc.behaviour in (Behaviour.HANG, Behaviour.REFUSE) else 120
            for step, (kind, operation, parameters) in enumerate(SEQUENCE):
                accepted(agent.submit(redfish(world, f"b{bmc.index}-{step}", kind, bmc.address,
                                              operation, timeout=timeout, **parameters)))
        results = {(bmc.index, step): frames.result(f"b{bmc.index}-{step}", timeout=150)
                   for bmc in fleet.bmcs for step in range(len(SEQUENCE))}
        took = time.monotonic() - sent
        for bmc in fleet.bmcs:
            mine = [results[bmc.index, step] for step in range(len(SEQUENCE))]
            if bmc.behaviour in (Behaviour.HANG, Behaviour.REFUSE):
                assert all(r.status == session_pb2.TIMED_OUT or r.reason == "unreachable" for r in mine), \
                    [(r.status, r.reason, r.message) for r in mine]
                assert bmc.log == []
                continue
            assert [r.status for r in mine] == [session_pb2.SUCCEEDED] * len(SEQUENCE), \
                (bmc.behaviour, [(r.reason, r.message) for r in mine])
            states = [payload_of(r).state for r in mine]
            assert states == ["off", "on", "pxe", "pxe", "off"], (bmc.index, states)
            assert bmc.changes() == ["Reset On", "Boot Pxe/Once", "Reset GracefulShutdown"]
            assert bmc.max_concurrent == 1, f"BMC {bmc.index} had two requests in hand at once"
            # In their order of arrival: each command started after the one before it ended.
            for before, after in itertools.pairwise(mine):
                assert after.started_at_unix_ms >= before.finished_at_unix_ms - 1
        counters = agent.scheduler.keyed
        assert counters.succeeded == 58 * len(SEQUENCE) and counters.in_flight == 0
        assert counters.peak_in_flight <= N
    assert took < 130, took


def test_a_healthy_bmc_and_other_commands_start_within_a_second_while_64_hang(
        site_config: Config, world: World, tmp_path: Path) -> None:
    with RedfishFleet([Behaviour.HANG] * N + [Behaviour.OK], username=USERNAME, password=PASSWORD,
                      workdir=tmp_path / "fleet") as fleet:
        agent, frames = site_agent(world, site_config, extra_handlers={
            "boot.prepareRamdisk": Quick("boot.prepareRamdisk"), "site.httpProxy": Quick("site.httpProxy")})
        hung, healthy = fleet.bmcs[:N], fleet.bmcs[N]
        for bmc in hung:
            accepted(agent.submit(redfish(world, f"h{bmc.index}", "bmc.power", bmc.address, "status",
                                          timeout=30)))
        wait_until(lambda: agent.scheduler.keyed.in_flight == N, 30, "every hung operation to be in flight")
        time.sleep(0.5)
        waits: dict[str, float] = {}
        for cid, cmd in (
            ("ok", redfish(world, "ok", "bmc.power", healthy.address, "status")),
            ("inv", world.command("inv", "inventory.refresh")),
            ("pxe", world.command("pxe", "boot.prepareRamdisk")),
            ("route", world.command("route", "site.httpProxy")),
        ):
            sent_ms = time.time() * 1000
            accepted(agent.submit(cmd))
            result = frames.result(cid, timeout=20)
            assert result.status == session_pb2.SUCCEEDED, result
            waits[cid] = (result.started_at_unix_ms - sent_ms) / 1000
        assert max(waits.values()) < 1.0, waits
        assert payload_of(frames.result("ok")).state == "off"


def test_64_ipmi_sim_bmcs_power_and_boot_in_order(site_config: Config, world: World,
                                                  tmp_path: Path) -> None:
    """IPMI: 64 ipmi_sim BMCs (each its own process and node), every command at once."""
    _skip_without_tools()
    sims = []
    try:
        # Machineless nodes: their chassis_control is a shell script (qemu/powered.py), so an
        # emulator answers in milliseconds, not after a Python start. All 64 started at once.
        for i, port in enumerate(free_udp_ports(N)):
            node = PoweredNode(tmp_path / f"node{i}").configure(NodeSpec(
                kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid(),
                machine=False))
            sims.append(start_ipmi_sim(tmp_path / f"ipmi{i}", node, USERNAME, PASSWORD, port=port,
                                       wait=False))
        for sim in sims:
            sim.wait_ready()
        agent, frames = site_agent(world, site_config, ipmi_max_sessions=16)
        for i, sim in enumerate(sims):
            for step, (kind, operation, parameters) in enumerate(SEQUENCE):
                payload = site_pb2.BmcOperationRequest(
                    node_id=f"n{i}", bmc_address=sim.address, protocol="ipmi", operation=operation,
                    credentials_ref=REF, parameters=parameters)
                # Each kind's whole timeout (bmc.power 300 s, bmc.boot 120 s): a BMC's later
                # commands wait behind its earlier ones, and the wait counts.
                accepted(agent.submit(world.command(f"i{i}-{step}", kind, payload)))
        for i, sim in enumerate(sims):
            mine = [frames.result(f"i{i}-{step}", timeout=400) for step in range(len(SEQUENCE))]
            assert [r.status for r in mine] == [session_pb2.SUCCEEDED] * len(SEQUENCE), \
                [(r.reason, r.message) for r in mine]
            assert [payload_of(r).state for r in mine] == ["off", "on", "pxe", "pxe", "off"]
            for before, after in itertools.pairwise(mine):
                assert after.started_at_unix_ms >= before.finished_at_unix_ms - 1
            # What the BMC did: one power-on, off again, the override left at pxe.
            assert [b.how for b in sim.node.boots()] == ["start"]
            assert sim.node.status() == "off" and sim.node.boot_device() == "pxe"
        assert agent.scheduler.keyed.succeeded == N * len(SEQUENCE)
    finally:
        for sim in sims:
            sim.stop()

