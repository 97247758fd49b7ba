"""mlxconfig (NVIDIA/Mellanox MFT): NIC firmware configuration (SR-IOV, link type, ...)."""

from __future__ import annotations

from agent.drivers.base import Arg, ArgType, Driver, Operation, register

# An MST device (/dev/mst/mt4123_pciconf0) or a PCI address (0000:3b:00.0 or 3b:00.0).
DEVICE = Arg(
    "device",
    ArgType.STRING,
    "MST device or PCI address of the adapter",
    pattern=r"/dev/mst/[A-Za-z0-9_.]{1,64}|(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]",
)
PARAMETER = Arg(
    "parameter", ArgType.STRING, "firmware parameter name, e.g. SRIOV_EN", pattern=r"[A-Z][A-Z0-9_]{0,63}"
)

DRIVER = register(
    Driver(
        name="mlxconfig",
        tool="mlxconfig",
        description="NVIDIA ConnectX firmware configuration through mlxconfig (MFT)",
        install_hint="install NVIDIA MFT (mft package) which ships mlxconfig",
        operations={
            op.name: op
            for op in (
                Operation("query", "current, default and next-boot values of every parameter",
                          build=lambda v: ["-d", str(v["device"]), "-e", "query"], args=(DEVICE,)),
                Operation(
                    "set",
                    "set one parameter for the next firmware boot (mlxconfig -y set NAME=VALUE)",
                    build=lambda v: ["-d", str(v["device"]), "-y", "set", f"{v['parameter']}={v['value']}"],
                    args=(
                        DEVICE,
                        PARAMETER,
                        Arg("value", ArgType.STRING, "new value: a number or a symbolic name",
                            pattern=r"[A-Za-z0-9_]{1,64}"),
                    ),
                    changes_state=True,
                ),
                Operation(
                    "reset",
                    "every parameter back to its default at the next firmware boot",
                    build=lambda v: ["-d", str(v["device"]), "-y", "reset"],
                    args=(DEVICE,),
                    changes_state=True,
                ),
            )
        },
    )
)
