"""nvme-cli: NVMe controller identity, health and firmware logs, feature values."""

from __future__ import annotations

from agent.drivers.base import Arg, ArgType, Driver, Operation, register

CONTROLLER = Arg(
    "device",
    ArgType.STRING,
    "NVMe controller or namespace, e.g. /dev/nvme0",
    pattern=r"/dev/nvme[0-9]{1,3}(n[0-9]{1,4})?",
)
JSON = ["--output-format=json"]


def _device_query(name: str, help: str, subcommand: str) -> Operation:
    return Operation(name, help, build=lambda v: [subcommand, str(v["device"]), *JSON], args=(CONTROLLER,))


DRIVER = register(
    Driver(
        name="nvme",
        tool="nvme",
        description="NVMe controllers through nvme-cli: identify, SMART and firmware logs, features",
        install_hint="apt install nvme-cli",
        operations={
            op.name: op
            for op in (
                Operation("list", "all NVMe namespaces (nvme list)", build=lambda v: ["list", *JSON]),
                Operation("version", "nvme-cli and libnvme versions", build=lambda v: ["version"]),
                _device_query("id_ctrl", "identify controller: model, serial, firmware", "id-ctrl"),
                _device_query("smart_log", "SMART / health log", "smart-log"),
                _device_query("fw_log", "firmware slot log: which firmware is in which slot", "fw-log"),
                _device_query("error_log", "error information log", "error-log"),
                Operation(
                    "list_ns",
                    "a controller's namespaces: every allocated one (--all, the default), or the attached",
                    build=lambda v: ["list-ns", str(v["device"]), *(["--all"] if v["all"] else []), *JSON],
                    args=(CONTROLLER, Arg("all", ArgType.BOOL, "allocated, attached or not (namespace "
                                          "management)", required=False, default=True)),
                ),
                _device_query("id_ns", "identify namespace: size, capacity, LBA formats (a namespace device)",
                              "id-ns"),
                Operation(
                    "get_feature",
                    "read one feature's value (nvme get-feature -f ID -s SEL)",
                    build=lambda v: [
                        "get-feature", str(v["device"]), f"--feature-id={v['feature_id']}",
                        f"--sel={('current', 'default', 'saved', 'supported').index(str(v['selector']))}",
                        "--human-readable",
                    ],
                    args=(
                        CONTROLLER,
                        Arg("feature_id", ArgType.INT, "feature identifier", minimum=1, maximum=255),
                        Arg("selector", ArgType.STRING, "which value", required=False, default="current",
                            choices=("current", "default", "saved", "supported")),
                    ),
                ),
            )
        },
    )
)
