"""Fixtures of the site role's tests: the boot service and proxy routes (``site``); OpenIPMI's
ipmi_sim on 127.0.0.1 (a free UDP port, its state in tmp), whose chassis_control program
drives a qemu/powered.py node, and the site's secret store holding the emulator's credentials.

Tests that only talk to the emulator run without QEMU (chassis_control answers power and
boot queries from the node directory without starting anything); those that power the node
on boot a real guest and are marked ``qemu``. Everything skips (not fails) where ipmi_sim,
ipmitool or QEMU is missing: ./dev installs them (Debian openipmi, ipmitool, qemu-system-x86).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent import proc
from agent.catalog import Role
from agent.config import Config
from agent.site import services
from agent.site.bmc import Credentials
from agent.site.secrets import SecretStore
from agent.site.services import ServiceSettings, SiteServices
from qemu.harness import qemu_available
from qemu.powered import NodeSpec, PoweredNode, default_boot_files

ROOT = Path(__file__).resolve().parents[2]
USERNAME = "bcadmin"
PASSWORD = "Sim-Pass-4fq9Zx"          # the emulator's first password; grepped for in outputs
REF = "rack1-n01"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class IpmiSim:
    port: int
    node: PoweredNode
    workdir: Path
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ipmitool(self, *args: str, password: str = PASSWORD) -> proc.Completed:
        """ipmitool straight at the emulator (the test's own check, not the client's)."""
        return proc.run(["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(self.port),
                         "-U", USERNAME, "-E", "-N", "1", "-R", "1", *args],
                        check=False, timeout=20, env=proc.clean_env({"IPMI_PASSWORD": password}))

    def stop(self) -> None:
        if self.process.poll() is None:
            proc.kill_group(self.process, grace=2.0)
        self.node.stop(force=True)


def start_ipmi_sim(workdir: Path, node: PoweredNode) -> IpmiSim:
    workdir.mkdir(parents=True, exist_ok=True)
    control = workdir / "chassis-control"
    control.write_text(
        "#!/bin/sh\n"
        f"cd {ROOT} || exit 1\n"
        f"exec {sys.executable} -m qemu.powered {node.dir} chassis-control \"$@\"\n"
    )
    control.chmod(0o700)
    port = free_udp_port()
    (workdir / "lan.conf").write_text(f"""\
name "bcsim"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback md5 straight
    allowed_auths_user md5 straight
    allowed_auths_operator md5 straight
    allowed_auths_admin md5 straight
    guid a6c1e0d0b2c34f8e9d7a1b2c3d4e5f60
  endlan
  chassis_control "{control} 0x20"
  user 2 true "{USERNAME}" "{PASSWORD}" admin 10 md5 straight
""")
    os.chmod(workdir / "lan.conf", 0o600)
    (workdir / "sim.emu").write_text(
        "mc_setbmc 0x20\n"
        "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n"
        "sel_enable 0x20 1000 0x0a\n"
        "mc_enable 0x20\n"
    )
    state = workdir / "state"
    state.mkdir(exist_ok=True)
    log = (workdir / "ipmi_sim.log").open("wb")
    process = proc.spawn(["ipmi_sim", "-n", "-c", str(workdir / "lan.conf"), "-f",
                          str(workdir / "sim.emu"), "-s", str(state)],
                         stdout=log, stderr=subprocess.STDOUT)
    log.close()
    sim = IpmiSim(port, node, workdir, process)
    deadline = time.monotonic() + 20
    while True:
        if sim.ipmitool("chassis", "power", "status").returncode == 0:
            return sim
        if process.poll() is not None or time.monotonic() > deadline:
            sim.stop()
            raise RuntimeError(f"ipmi_sim did not answer; see {workdir / 'ipmi_sim.log'}:\n"
                               + (workdir / "ipmi_sim.log").read_text(errors="replace")[-2000:])
        time.sleep(0.3)


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
    s = start_ipmi_sim(tmp_path / "ipmi", node)
    yield s
    s.stop()


@pytest.fixture
def powered_sim(tmp_path: Path) -> Iterator[IpmiSim]:
    """ipmi_sim driving a real QEMU node (booted by PXE when asked)."""
    _skip_without_tools()
    reason = qemu_available()
    files = default_boot_files()
    if reason or files is None:
        pytest.skip(reason or "no kernel and initrd to boot (initramfs/out/ or /boot)")
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel=str(files[0]), initrd=str(files[1]), append="console=ttyS0 panic=-1",
                 owner_pid=os.getpid()))
    s = start_ipmi_sim(tmp_path / "ipmi", node)
    yield s
    s.stop()


@pytest.fixture
def site_config(tmp_path: Path) -> Config:
    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(USERNAME, PASSWORD))
    return Config(role=Role.SITE, node_id="site-1", state_dir=tmp_path / "state",
                  secrets_dir=store.root)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteServices]:
    """The site's HTTP service on loopback (no dnsmasq), installed as the process's."""
    running = services.install(SiteServices(ServiceSettings(
        address="127.0.0.1", port=0, root=tmp_path / "site")))
    try:
        yield running
    finally:
        services.stop()
