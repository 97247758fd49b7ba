"""Redfish end to end: RedfishClient -> sushy-emulator (fake driver) -> its notification hook
-> a real QEMU node (qemu/powered.py). A boot override to PXE and a power-on really boot the
guest from the network; a reset really re-boots it; an off really stops QEMU."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.site.bmc import BootDevice, BootSetting, PowerAction, PowerState
from agent.site.redfish import RedfishClient
from qemu.harness import qemu_available
from qemu.powered import NodeSpec, PoweredNode, default_boot_files
from tests.runtime.harness import wait_until
from tests.site.sushy import NodeHook, SushyEmulator, fast_call

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

PASSWORD = "qemu-Emu-Secret-88"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[PoweredNode]:
    reason = qemu_available()
    files = default_boot_files()
    if reason or files is None:
        pytest.skip(reason or "no kernel and initrd to boot (initramfs/out/ or /boot)")
    kernel, initrd = files
    n = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel=str(kernel), initrd=str(initrd), append="console=ttyS0 panic=-1",
                 owner_pid=os.getpid())
    )
    try:
        yield n
    finally:
        n.stop(force=True)


def test_redfish_drives_a_qemu_node(node: PoweredNode, tmp_path: Path) -> None:
    with NodeHook(node) as hook, SushyEmulator(tmp_path / "emu", password=PASSWORD,
                                               notify_url=hook.url) as emu:
        client = RedfishClient(emu.target(), fast_call(seconds=300))

        def settled(want: PowerState) -> float:
            start = time.monotonic()
            wait_until(lambda: client.power_state() is want, 60, f"Redfish PowerState {want}", interval=0.5)
            hook.settle()
            return time.monotonic() - start

        client.set_boot_device(BootSetting(BootDevice.PXE, persistent=True))
        hook.settle()
        assert node.boot_device() == "pxe"

        client.set_power(PowerAction.ON, graceful_timeout=10)
        settled(PowerState.ON)
        assert node.status() == "on"
        wait_until(lambda: any(b.how == "pxe-fetch" for b in node.boots()), 120, "the guest's PXE fetch")

        client.set_boot_device(BootSetting(BootDevice.DISK, persistent=True))
        client.set_power(PowerAction.RESET, graceful_timeout=10)
        settled(PowerState.ON)
        assert node.status() == "on" and [b.how for b in node.boots()].count("reset") == 1

        client.set_power(PowerAction.OFF, graceful_timeout=15)
        settled(PowerState.OFF)
        wait_until(lambda: node.status() == "off", 30, "QEMU to stop")
        client.close()
        assert not hook.errors, hook.errors
        assert hook.events[:2] == ["boot pxe", "start"]
        assert "reset" in hook.events and hook.events[-1] == "power pulled"
