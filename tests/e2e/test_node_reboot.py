"""node.reboot from the node role: a machine boots the installed node image (the kernel and
initramfs of its disk, ``bc.root=LABEL=bcroot``, as firmware booting the installed OS would),
its agent joins as a node with its state on the disk; the gateway sends node.reboot; the guest
reboots through /init (busybox reboot -> SIGTERM to PID 1), comes back, and the agent rejoins
with a new boot id and the completion, read from its journal on the disk.
"""

from __future__ import annotations

import shutil

import pytest

from agent.gateway import State
from qemu.harness import Disk
from qemu.lab import Lab
from qemu.nodeimage import build_node_image, node_cmdline
from tests.e2e.conftest import COMMAND_TIMEOUT, JOIN_TIMEOUT

pytestmark = [pytest.mark.qemu, pytest.mark.slow, pytest.mark.root]

NODE = "node-7"


def test_node_reboot_from_the_node_role_completes_after_rejoin(lab: Lab) -> None:
    image = build_node_image(lab, NODE, lab.workdir / "node-image")
    disk_file = lab.workdir / "node7-nvme0.img"
    shutil.copyfile(image.raw, disk_file)
    disk = Disk(disk_file, "NVMENODE7A", "nvme", disk_file.stat().st_size)
    machine = lab.boot(NODE, disks=[disk], kernel=image.kernel, initrd=image.initrd, append=node_cmdline())
    lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
    first = lab.gateway.nodes[NODE]
    assert first.hello.role == "node"
    old_boot = first.boot_id
    machine.wait_console(r"node root .* mounted on /sysroot", 30)

    cid = lab.gateway.send(NODE, "node.reboot", {"mode": "GRACEFUL"})
    try:
        rec = lab.gateway.wait(cid, COMMAND_TIMEOUT)
    except TimeoutError:
        raise machine.fail("node.reboot did not complete") from None
    assert rec.state is State.COMPLETED, \
        f"{rec.state}: {lab.gateway.events_for(cid)}\n{machine.console_tail()}"
    assert rec.completion is not None and rec.completion.ok
    again = lab.gateway.nodes[NODE]
    assert again.sessions >= 2
    assert again.hello.role == "node"
    assert again.boot_id and again.boot_id != old_boot
    assert rec.completion.old_boot_id == old_boot and rec.completion.new_boot_id == again.boot_id
    # It went through /init's shutdown path, and the same node key (on the disk) came back.
    assert "reboot requested: stopping the agent" in machine.console()
    assert again.public_key == first.public_key
    machine.stop()
