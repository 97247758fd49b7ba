"""mlxconfig (NVIDIA MFT) and mstconfig (mstflint, its open-source twin with the same command
line): NIC firmware configuration (SR-IOV, link type, ...).

``parse_query`` reads ``query -e``'s table: each parameter's default, current and next-boot
value (what the release checks against a profile, agent.policy.release).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.drivers.base import Arg, ArgType, Driver, Operation, register

# An MST device (/dev/mst/mt4123_pciconf0) or a PCI address (0000:3b:00.0 or 3b:00.0).
DEVICE = Arg(
    "device",
    ArgType.STRING,
    "MST device or PCI address of the adapter",
    pattern=r"/dev/mst/[A-Za-z0-9_.]{1,64}|(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]",
)
PARAMETER = Arg(
    "parameter", ArgType.STRING, "firmware parameter name, e.g. SRIOV_EN (some are lower case)",
    pattern=r"[A-Za-z][A-Za-z0-9_]{0,63}"
)

OPERATIONS = {
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
}


@dataclass(frozen=True)
class Setting:
    default: str
    current: str
    next_boot: str


# A parameter's name: upper case for most, lower case for some (what the firmware's TLV calls it),
# an array's element with its index.
_ROW = re.compile(r"^\*?\s+([A-Za-z][A-Za-z0-9_]*(?:\[\d+\])?)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")


def parse_query(text: str) -> dict[str, Setting]:
    """``mlxconfig -d DEV -e query``: parameter -> (default, current, next boot); a row marked
    "*" differs from its default. Rows of other shapes (no -e, notes) are left out."""
    found: dict[str, Setting] = {}
    table = False
    for line in text.splitlines():
        if line.startswith("Configurations:"):
            table = True
            continue
        match = _ROW.match(line) if table else None
        if match is not None:
            found[match.group(1)] = Setting(match.group(2), match.group(3), match.group(4))
    return found


def _driver(name: str, hint: str) -> Driver:
    return Driver(
        name=name,
        tool=name,
        description=f"NVIDIA ConnectX firmware configuration through {name}",
        install_hint=hint,
        operations=OPERATIONS,
    )


DRIVER = register(_driver("mlxconfig", "install NVIDIA MFT (mft package) which ships mlxconfig"))
MSTCONFIG = register(_driver("mstconfig", "apt install mstflint"))
