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

Where the node runs a Secure Boot firmware on pflash with its own variable store file (OVMF's
Secure Boot build, or AAVMF, with a fleet's keys: qemu/secureboot.py, NodeSpec.secure_boot), the
machine's ``variables`` is that store (``NodeVariables``) and the BMC's SecureBoot resource is it
(``RedfishEmulator.attach``; redfish_emulator/secureboot.py ``SecureBootKeys.attach_store``):
read from the file, and each write the BMC takes staged for the firmware's next boot as a real
BMC stages it: written to the file at once while the node is off, else at its next power-on,
before QEMU starts (a restart then starts QEMU again), never while QEMU holds the file.

The emulator calls it inside the request, holding its state's lock: a start returns once QEMU's
monitor answers (seconds), so the BMC's answer to the Reset comes after the node is on. It must
run in the namespace where the node's tap device is: the emulator's server thread is started
there (qemu/sitelab.py ``in_lan``), and each request's thread is born from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qemu import secureboot
from qemu.powered import PoweredNode

RESTARTS = ("ForceRestart", "GracefulRestart", "PowerCycle")


class NodeVariables:
    """A node's own UEFI variable store file as its BMC reads and writes it (the emulator's
    VariableStore): read while the node is off (or as last seen), written only while it is off."""

    def __init__(self, node: PoweredNode, path: Path, events: list[str]) -> None:
        self.node, self.path, self.events = node, path, events
        self.staged: secureboot.StoreKeys | None = None   # written at the next power-on
        self._seen: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns

    def read(self) -> secureboot.StoreKeys:
        if self.staged is not None:
            return self.staged
        self._seen = self._stat()
        return secureboot.read_store(self.path)

    def changed(self) -> bool:
        return self.staged is None and self.node.status() == "off" and self._stat() != self._seen

    def stage(self, keys: secureboot.StoreKeys) -> bool:
        if self.node.status() == "on":
            self.staged = keys
            self.events.append("variables staged for the next power-on")
            return False
        self._write(keys)
        return True

    def flush(self) -> None:
        """What waits for the next power-on written; the node is off (QEMU holds no file)."""
        if self.staged is not None:
            self._write(self.staged)
            self.staged = None

    def _write(self, keys: secureboot.StoreKeys) -> None:
        changed = secureboot.write_store(self.path, keys)
        self._seen = self._stat()
        if changed:
            self.events.append(f"variables written: {', '.join(changed)}")


class PoweredMachine:
    def __init__(self, node: PoweredNode) -> None:
        self.node = node
        self.events: list[str] = []       # what the BMC did to the node, in order
        spec = node.spec()
        self.variables = NodeVariables(node, Path(spec.pflash_vars), self.events) \
            if spec.secure_boot and spec.pflash_vars else None

    def _start(self) -> None:
        if self.variables is not None:
            self.variables.flush()
        self.node.start()

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
            self._start()
            self.events.append("start")
        elif reset_type == "ForceOff":
            self.node.stop(force=True)
            self.events.append("power pulled")
        elif reset_type in ("GracefulShutdown", "PushPowerButton"):
            self.node.stop(force=False)
            self.events.append("power button")
        elif reset_type in RESTARTS and self.node.boot_device() != self.node.boot_device_of_running():
            self.node.stop(force=True)
            self._start()
            self.events.append("restart (a new boot device)")
        elif reset_type in RESTARTS and self.variables is not None and self.variables.staged is not None:
            self.node.stop(force=True)
            self._start()
            self.events.append("restart (variables staged)")
        elif reset_type in RESTARTS:
            self.node.reset()
            self.events.append("reset")
