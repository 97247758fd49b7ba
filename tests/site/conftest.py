"""Fixtures of the site role's tests: the boot service and proxy routes (``site``); OpenIPMI's
ipmi_sim on 127.0.0.1 (qemu/ipmisim.py: a free UDP port, its state in tmp), whose
chassis_control program drives a qemu/powered.py node, and the site's secret store holding the
emulator's credentials.

Tests that only talk to the emulator run without QEMU (chassis_control answers power and
boot queries from the node directory without starting anything); those that power the node
on boot a real guest and are marked ``qemu``. Everything skips (not fails) where ipmi_sim,
ipmitool or QEMU is missing: ./dev installs them (Debian openipmi, ipmitool, qemu-system-x86).

``world``: in-process Agents (tests/runtime/core_harness.py) for the site's handlers driven
through the runtime, their state beside the site's own.

The fixtures of the tests on the project's Redfish emulator (tests/site/bmc/redfish_emulator):
``trees``, a module's folder for the emulators' certificates (and a tree a test unpacks), and
``emulator_config``, the site's settings whose secret store holds the emulator's credentials,
the BMC polled every 50 to 100 ms.

And the fixtures of the boot service and proxy routes: the site's HTTP service on loopback,
and a provisioning network in namespaces with a plain DHCP server (tests/site/netns.py).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent import proc
from agent.catalog import Role
from agent.config import Config
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.boot.dnsmasq import DnsmasqSettings, ours
from agent.site.services import ServiceSettings, SiteServices
from qemu.ipmisim import IpmiSim, free_udp_port, start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from tests.site.netns import Net, need, wait_listening

if TYPE_CHECKING:
    from tests.runtime.core_harness import World

__all__ = ["IpmiSim", "free_udp_port"]

ROOT = Path(__file__).resolve().parents[2]
USERNAME = "bcadmin"
PASSWORD = "Sim-Pass-4fq9Zx"          # the emulator's first password; grepped for in outputs
REF = "rack1-n01"


def _skip_without_tools() -> None:
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openipmi ipmitool)")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[IpmiSim]:
    """ipmi_sim with a node that is never powered on in the test (no QEMU)."""
    _skip_without_tools()
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    s = start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD)
    yield s
    s.stop()


@pytest.fixture
def powered_sim(tmp_path: Path, powered_node: PoweredNode) -> Iterator[IpmiSim]:
    """ipmi_sim driving a real QEMU node (booted by PXE when asked)."""
    _skip_without_tools()
    node = powered_node
    s = start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD)
    yield s
    s.stop()


@pytest.fixture
def site_config(tmp_path: Path) -> Config:
    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(USERNAME, PASSWORD))
    return Config(role=Role.SITE, node_id="site-1", state_dir=tmp_path / "state",
                  secrets_dir=store.root)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """In-process Agents (tests/runtime/core_harness.py) under tmp_path/world, beside the site's
    own state and secrets in tmp_path (site_config), stopped afterwards."""
    from tests.runtime.core_harness import world_in

    (tmp_path / "world").mkdir()
    yield from world_in(tmp_path / "world", stop_timeout=5)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the module's emulators' certificates (RedfishEmulator.of's workdir) and the
    recorded trees a test unpacks."""
    return tmp_path_factory.mktemp("trees")


@pytest.fixture
def emulator_config(tmp_path: Path) -> Config:
    """The site's settings, its secret store holding the Redfish emulator's credentials under
    test_bmc_redfish's REF, as tests/site/bmc/redfish_emulator/handlers.py's run_kind names them;
    the BMC polled every 50 to 100 ms (bmc_poll_seconds, bmc_poll_max_seconds), as no real BMC
    would take: the emulator's state changes as it answers, so the waits prove nothing more
    when long."""
    from tests.site.bmc.redfish_emulator import PASSWORD as EMULATOR_PASSWORD
    from tests.site.bmc.redfish_emulator import USER
    from tests.site.bmc.test_bmc_redfish import config_with

    return dataclasses.replace(config_with(tmp_path, USER, EMULATOR_PASSWORD),
                               bmc_poll_seconds=0.05, bmc_poll_max_seconds=0.1)


def stray_children(settings: DnsmasqSettings, pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` still running a dnsmasq of these settings."""
    return [p for p in pids if ours(p, settings)]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteServices]:
    """The site's HTTP service on loopback (no dnsmasq), for a handler's Context.local(site=...);
    its routes may reach upstreams on 127.0.0.1 (refused by default: agent/site/serve/upstreams.py)."""
    with SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                      upstreams=("127.0.0.1",))) as running:
        yield running


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


