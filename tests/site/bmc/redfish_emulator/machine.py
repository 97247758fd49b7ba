"""A QEMU node (qemu/powered.py) behind an emulated BMC's System: what ComputerSystem.Reset and a
Boot override do to a server, done to the node, and the PowerState the BMC reads from it.

    with RedfishEmulator.of("hpe_dl385", workdir) as bmc:
        bmc.attach(PoweredMachine(node))       # the first System now drives ``node``

- On, ForceOn (PushPowerButton while off): QEMU starts, booting the node's boot device;
- ForceOff: the power pulled (QEMU quits); GracefulShutdown (PushPowerButton while on): the ACPI
  power button, the guest decides;
- ForceRestart, GracefulRestart, PowerCycle: the guest re-boots (QMP system_reset); where the
  boot device changed since QEMU started (an override set while it ran), QEMU is started again
  instead, since a QEMU process boots what it was started with and a server's reset honours the
  override; a node that is off is started;
- Nmi: nothing;
- the override's target: Pxe boots by PXE, Cd the virtual CD, anything else (None, Hdd, Disabled)
  the first disk. A "Once" override stays the node's boot device until the next override (a
  server's BMC would revert it after one boot: the lab's tests set what each boot needs).

The emulator calls it inside the request, holding its state's lock: a start returns once QEMU's
monitor answers (seconds), so the BMC's answer to the Reset comes after the node is on. It must
run in the namespace where the node's tap device is: the emulator's server thread is started
there (qemu/sitelab.py ``in_lan``), and each request's thread is born from it.
"""

from __future__ import annotations

from typing import Any

from qemu.powered import PoweredNode

RESTARTS = ("ForceRestart", "GracefulRestart", "PowerCycle")


class PoweredMachine:
    def __init__(self, node: PoweredNode) -> None:
        self.node = node
        self.events: list[str] = []       # what the BMC did to the node, in order

    def power_state(self) -> str:
        return "On" if self.node.status() == "on" else "Off"

    def boot(self, boot: dict[str, Any]) -> None:
        target = "None" if boot.get("BootSourceOverrideEnabled") == "Disabled" \
            else str(boot.get("BootSourceOverrideTarget", "None"))
        device = {"Pxe": "pxe", "Cd": "cdrom"}.get(target, "disk")
        if device != self.node.boot_device():
            self.node.set_boot(device)
            self.events.append(f"boot {device}")

    def reset(self, reset_type: str) -> None:
        on = self.node.status() == "on"
        if reset_type in ("On", "ForceOn") or (reset_type == "PushPowerButton" and not on) \
                or (reset_type in RESTARTS and not on):
            self.node.start()
            self.events.append("start")
        elif reset_type == "ForceOff":
            self.node.stop(force=True)
            self.events.append("power pulled")
        elif reset_type in ("GracefulShutdown", "PushPowerButton"):
            self.node.stop(force=False)
            self.events.append("power button")
        elif reset_type in RESTARTS and self.node.boot_device() != self.node.boot_device_of_running():
            self.node.stop(force=True)
            self.node.start()
            self.events.append("restart (a new boot device)")
        elif reset_type in RESTARTS:
            self.node.reset()
            self.events.append("reset")
