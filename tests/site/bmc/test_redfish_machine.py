"""The project's Redfish emulator with a machine behind its System (redfish_emulator/machine.py,
what tests/e2e/test_site_ipmi_off.py drives a QEMU node with): the real RedfishClient against the
recorded iLO 5, the machine a qemu/powered.py node without a guest (``machine=False``: its power
a file, each start recorded), so no QEMU runs here."""

from __future__ import annotations

from pathlib import Path

from agent.site.bmc.client import BootDevice, BootSetting, PowerAction, PowerState
from qemu.powered import NodeSpec, PoweredNode
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.machine import PoweredMachine
from tests.site.bmc.test_redfish_vendors import client_of


def test_an_attached_machine_follows_the_systems_resets_and_boot_overrides(tmp_path: Path) -> None:
    node = PoweredNode(tmp_path / "node").configure(NodeSpec(kernel="", initrd="", machine=False, name="n1"))
    machine = PoweredMachine(node)
    with RedfishEmulator.of("hpe_dl385", tmp_path / "trees") as bmc:
        assert bmc.doc("/redfish/v1/Systems/1")["PowerState"] == "On"      # as recorded
        assert bmc.attach(machine) == "/redfish/v1/Systems/1"
        with client_of(bmc) as client:
            assert client.power_state() is PowerState.OFF                  # the node's own
            client.set_boot_device(BootSetting(BootDevice.PXE, persistent=True))
            assert node.boot_device() == "pxe"
            client.set_power(PowerAction.ON, graceful_timeout=5)
            assert node.status() == "on" and client.power_state() is PowerState.ON
            client.set_boot_device(BootSetting(BootDevice.DISK, persistent=True))
            client.set_power(PowerAction.CYCLE, graceful_timeout=5)       # iLO: ForceOff, then On
            assert node.status() == "on"
            node.stop(force=True)                                          # the host goes off by itself
            assert client.power_state() is PowerState.OFF
    assert machine.events == ["boot pxe", "start", "boot disk", "power pulled", "start"]
    assert [(b.device, b.how) for b in node.boots()] == [("pxe", "start"), ("disk", "start")]
    assert [body["ResetType"] for _, _, body in bmc.writes("POST", "ComputerSystem.Reset")] == \
        ["On", "ForceOff", "On"]
