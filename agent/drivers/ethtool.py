"""ethtool: NIC settings (link, driver, ring sizes, pause, offloads, transceiver module)."""

from __future__ import annotations

from agent.drivers.base import Arg, ArgType, Driver, Operation, Values, register
from agent.errors import InvalidParameters

IFACE = Arg("interface", ArgType.STRING, "network interface, e.g. eth0", pattern=r"[A-Za-z0-9_.:@-]{1,15}")


def _query(name: str, help: str, flag: str) -> Operation:
    def build(v: Values) -> list[str]:
        return [*([flag] if flag else []), str(v["interface"])]

    return Operation(name, help, build=build, args=(IFACE,))


def _set_ring(v: Values) -> list[str]:
    argv = ["-G", str(v["interface"])]
    for key in ("rx", "tx"):
        if key in v:
            argv += [key, str(v[key])]
    if len(argv) == 2:
        raise InvalidParameters("set_ring needs rx, tx or both")
    return argv


def _set_pause(v: Values) -> list[str]:
    argv = ["-A", str(v["interface"])]
    for key in ("autoneg", "rx", "tx"):
        if key in v:
            argv += [key, "on" if v[key] else "off"]
    if len(argv) == 2:
        raise InvalidParameters("set_pause needs autoneg, rx or tx")
    return argv


DRIVER = register(
    Driver(
        name="ethtool",
        tool="ethtool",
        description="NIC settings through ethtool: link, driver, rings, pause, offloads, module EEPROM",
        install_hint="apt install ethtool",
        operations={
            op.name: op
            for op in (
                _query("show", "link settings: speed, duplex, autonegotiation, link detected", ""),
                _query("driver_info", "driver, firmware version and bus address (ethtool -i)", "-i"),
                _query("show_ring", "ring buffer sizes (ethtool -g)", "-g"),
                _query("show_pause", "pause frame settings (ethtool -a)", "-a"),
                _query("show_features", "offload features (ethtool -k)", "-k"),
                _query("statistics", "NIC statistics (ethtool -S)", "-S"),
                _query("module_info", "transceiver module EEPROM, decoded (ethtool -m)", "-m"),
                Operation(
                    "set_ring",
                    "set RX/TX ring sizes (ethtool -G IFACE rx N tx N)",
                    build=_set_ring,
                    args=(
                        IFACE,
                        Arg("rx", ArgType.INT, "RX ring entries", required=False, minimum=1, maximum=1 << 20),
                        Arg("tx", ArgType.INT, "TX ring entries", required=False, minimum=1, maximum=1 << 20),
                    ),
                    changes_state=True,
                ),
                Operation(
                    "set_pause",
                    "set pause frame handling (ethtool -A IFACE autoneg|rx|tx on|off)",
                    build=_set_pause,
                    args=(
                        IFACE,
                        Arg("autoneg", ArgType.BOOL, required=False),
                        Arg("rx", ArgType.BOOL, required=False),
                        Arg("tx", ArgType.BOOL, required=False),
                    ),
                    changes_state=True,
                ),
            )
        },
    )
)
