"""Redfish end to end: RedfishClient -> sushy-emulator (fake driver) -> its notification hook
-> a real QEMU node (qemu/powered.py). A boot override to PXE and a power-on really boot the
guest from the network; a reset really re-boots it; an off really stops QEMU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.site.bmc.client import BootDevice, BootSetting, PowerAction, PowerState
from agent.site.bmc.redfish.client import RedfishClient
from qemu.powered import PoweredNode
from tests.runtime.harness import wait_until
from tests.site.bmc.sushy import NodeHook, SushyEmulator, fast_call

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

PASSWORD = "qemu-Emu-Secret-88"


@pytest.fixture
def node(powered_node: PoweredNode) -> PoweredNode:
    return powered_node


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
