"""A real node's console, kept by the site from power-on: QEMU's first serial port on a line to
the BMC (qemu/serialrelay.py, qemu/harness.py ``serial_port``), ipmi_sim serving it as SOL
(qemu/ipmisim.py ``sol``),
the site's ipmitool session started by the real bmc.power handler. The node boots the host's
kernel with a bad command line (``rdinit=`` naming nothing, no root): the kernel panics, and
the site names the attempt ``kernel_panic`` with the console's lines that show it, the kernel's
whole boot log (no ``quiet``) kept from its first line. A disk without a boot entry is the fault
matrix's case (test_faults_qemu.py), with the same checks."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from agent.catalog import Role
from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.proto import site_pb2
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.services import ServiceSettings, SiteServices
from qemu.ipmisim import start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from qemu.serialrelay import SerialRelay

USERNAME, PASSWORD, REF = "bcadmin", "Sol-Pass-7hq2Wm", "rack1-n01"


def _host_kernel() -> tuple[Path, Path]:
    for kernel in sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"), reverse=True):
        initrd = kernel.with_name(kernel.name.replace("vmlinuz-", "initrd.img-"))
        if initrd.is_file():
            return kernel, initrd
    pytest.skip("no /boot/vmlinuz-*-cloud-amd64 with its initrd (apt-get install linux-image-cloud-amd64)")


@pytest.mark.qemu
@pytest.mark.slow
def test_a_kernel_panic_from_a_bad_command_line_is_named_with_its_console_lines(tmp_path: Path) -> None:
    for tool in ("ipmi_sim", "ipmitool", "qemu-system-x86_64"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    kernel, initrd = _host_kernel()
    relay = SerialRelay().start()
    node = PoweredNode(tmp_path / "node").configure(NodeSpec(
        kernel=str(kernel), initrd=str(initrd), owner_pid=os.getpid(), serial_port=relay.node_port,
        append="console=ttyS0,115200 rdinit=/bc-nonexistent"))
    node.set_boot("disk")
    sim = start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD, sol=relay.sol)
    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(USERNAME, PASSWORD))
    config = Config(role=Role.SITE, node_id="site-1", state_dir=tmp_path / "state", secrets_dir=store.root)
    site = SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                        secrets_dir=store.root))
    site.start()
    try:
        handler = handler_for("bmc.power")
        assert handler is not None
        params = handler.parse(site_pb2.BmcOperationRequest(
            node_id="n1", bmc_address=sim.address, protocol="ipmi", operation="on", credentials_ref=REF))
        handler.run(Context.local("bmc.power", config, site=site), params)
        deadline = time.monotonic() + 240
        while True:
            a = site.observe.timelines.last("n1")
            if a is not None and a.cause:
                break
            assert time.monotonic() < deadline, (a, node.dir)
            time.sleep(1)
        assert a.cause == "kernel_panic", a
        assert a.method == "disk" and a.trigger == "bmc.power on"
        steps = [e.step for e in a.events]
        assert steps[:2] == ["console", "power_on"], steps         # SOL up before power on
        assert steps.index("power_on") < steps.index("kernel_started") < steps.index("panic"), steps
        kept = [text for _, text in site.observe.consoles.read("n1")]
        assert any("Kernel panic - not syncing" in line for line in kept), kept[-20:]
        assert any("Linux version" in line for line in kept)
        boot = site.observe.node_boot("n1")
        assert boot is not None and any("Kernel panic" in line for line in boot.last_lines)
    finally:
        site.stop()
        sim.stop()
        relay.stop()
