"""ipmitool over the local BMC interface (/dev/ipmi0): BMC LAN, SEL, chassis, boot device.

Only the in-band interface: no -H/-U/-P, so no BMC credentials pass through the agent.
"""

from __future__ import annotations

from agent.drivers.base import Arg, ArgType, Driver, Operation, Values, register

CHANNEL = Arg("channel", ArgType.INT, "LAN channel", required=False, default=1, minimum=0, maximum=15)


def _bootdev(v: Values) -> list[str]:
    options = [name for name in ("persistent", "efiboot") if v.get(name)]
    return ["chassis", "bootdev", str(v["device"]), *([f"options={','.join(options)}"] if options else [])]


DRIVER = register(
    Driver(
        name="ipmitool",
        tool="ipmitool",
        description="The local BMC through ipmitool (in-band): LAN settings, event log, chassis, boot device",
        install_hint="apt install ipmitool (and load ipmi_si / ipmi_devintf)",
        operations={
            op.name: op
            for op in (
                Operation("lan_print", "BMC network settings of a channel",
                          build=lambda v: ["lan", "print", str(v["channel"])], args=(CHANNEL,)),
                Operation("mc_info", "BMC firmware and device id", build=lambda v: ["mc", "info"]),
                Operation("sel_list", "system event log, extended", build=lambda v: ["sel", "elist"]),
                Operation("sensor_list", "sensor readings", build=lambda v: ["sensor", "list"]),
                Operation("chassis_status", "power and chassis state", build=lambda v: ["chassis", "status"]),
                Operation(
                    "set_boot_device",
                    "next boot device (ipmitool chassis bootdev DEV [options=persistent,efiboot])",
                    build=_bootdev,
                    args=(
                        Arg("device", ArgType.STRING, choices=("pxe", "disk", "bios", "cdrom", "safe")),
                        Arg("persistent", ArgType.BOOL, required=False),
                        Arg("efiboot", ArgType.BOOL, required=False),
                    ),
                    changes_state=True,
                ),
                Operation("sel_clear", "clear the system event log", build=lambda v: ["sel", "clear"],
                          changes_state=True),
            )
        },
    )
)
