"""nvme-cli: NVMe controller identity, health and firmware logs, feature values, and a drive's
namespaces put back to its factory layout.

``factory_layout`` (destructive: every namespace of the controller and its data is gone) is the
release's remedy for a drive a tenant carved up (docs/lifecycle.md, "Release"), sent before
disk.wipe: it refuses a controller whose namespaces are in use (mounted, swap, held by RAID/LVM)
or that has no namespace management (OACS bit 3), then with nvme-cli detaches and deletes every
allocated namespace, creates ``namespaces`` equal ones over the whole capacity (tnvmcap) in the
LBA format of ``lba_data_size`` bytes without metadata, attaches each to this controller and
rescans. Each step is one nvme-cli run through the one way to run a child (agent/proc.py); the
first that fails stops the rest, and the report says what was done.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agent import proc
from agent.drivers.base import Arg, ArgType, Driver, Operation, Settings, Values, register
from agent.errors import AgentError, InvalidParameters, Reason, Unsupported
from agent.hw import block

CONTROLLER = Arg(
    "device",
    ArgType.STRING,
    "NVMe controller or namespace, e.g. /dev/nvme0",
    pattern=r"/dev/nvme[0-9]{1,3}(n[0-9]{1,4})?",
)
JSON = ["--output-format=json"]
STEP_SECONDS = 120.0               # one nvme-cli admin command (a create-ns can take a while)
OACS_NS_MANAGEMENT = 1 << 3
ALL_NAMESPACES = 0xFFFFFFFF
CREATED = re.compile(r"created nsid:\s*(\d+)")


def _nvme(*argv: str) -> str:
    return proc.run(["nvme", *argv], timeout=STEP_SECONDS).text


def _json(*argv: str) -> dict[str, Any]:
    try:
        value = json.loads(_nvme(*argv, *JSON))
    except ValueError as exc:
        raise AgentError(f"nvme {argv[0]}: the output is not JSON ({exc})",
                         reason=Reason.TOOL_FAILED) from exc
    if not isinstance(value, dict):
        raise AgentError(f"nvme {argv[0]}: the output is not a JSON object", reason=Reason.TOOL_FAILED)
    return value


def _refuse_in_use(name: str, root: Path) -> list[str]:
    """The controller's namespaces with a block device (attached here); ProtectedDevice for one
    in use."""
    attached = []
    for sysdir in sorted((root / "sys/block").glob(f"{name}n*")):
        if not re.fullmatch(rf"{name}n\d+", sysdir.name):
            continue
        attached.append(sysdir.name)
        disk = block.read_disk(sysdir.name, root / "sys", root / "dev")
        if disk is not None:
            block.check_safe(disk, root / "sys", root / "proc")
    return attached


def _lba_format(device: str, size: int) -> int:
    common = _json("id-ns", device, f"--namespace-id={ALL_NAMESPACES:#x}")
    for index, fmt in enumerate(common.get("lbafs", [])):
        if 1 << int(fmt.get("ds", 0)) == size and int(fmt.get("ms", 0)) == 0:
            return index
    raise Unsupported(f"{device} offers no LBA format of {size}-byte blocks without metadata")


def _factory_layout(values: Values, root: Path, _settings: Settings) -> str:
    device, count, size = str(values["device"]), int(values["namespaces"]), int(values["lba_data_size"])
    name = device.removeprefix("/dev/")
    if size not in (512, 4096):
        raise InvalidParameters("lba_data_size: 512 or 4096", argument="lba_data_size")
    attached = _refuse_in_use(name, root)
    ctrl = _json("id-ctrl", device)
    if not int(ctrl.get("oacs", 0)) & OACS_NS_MANAGEMENT:
        raise Unsupported(f"{device} has no namespace management (OACS bit 3): its layout cannot be "
                          "changed from the OS")
    cntlid, capacity = int(ctrl["cntlid"]), int(ctrl["tnvmcap"])
    if capacity <= 0:
        raise Unsupported(f"{device} reports no total capacity (tnvmcap) to carve namespaces from")
    lbaf = _lba_format(device, size)
    blocks = capacity // size // count
    if blocks == 0:
        raise InvalidParameters(f"{device}: {count} namespaces do not fit {capacity} bytes",
                                argument="namespaces")
    done: list[str] = []
    try:
        for nsid in sorted(int(n["nsid"]) for n in _json("list-ns", device, "--all").get("nsid_list", [])):
            if f"{name}n{nsid}" in attached:
                _nvme("detach-ns", device, f"--namespace-id={nsid}", f"--controllers={cntlid}")
                done.append(f"detached {nsid}")
            else:                      # no block device here: detached, or attached without one
                try:
                    _nvme("detach-ns", device, f"--namespace-id={nsid}", f"--controllers={cntlid}")
                    done.append(f"detached {nsid}")
                except AgentError:
                    done.append(f"{nsid} not attached here")
            _nvme("delete-ns", device, f"--namespace-id={nsid}")
            done.append(f"deleted {nsid}")
        for _ in range(count):
            out = _nvme("create-ns", device, f"--nsze={blocks}", f"--ncap={blocks}", f"--flbas={lbaf}")
            found = CREATED.search(out)
            if found is None:
                raise AgentError(f"nvme create-ns: no nsid in its answer {out.strip()[:200]!r}",
                                 reason=Reason.TOOL_FAILED)
            nsid = int(found.group(1))
            done.append(f"created {nsid} ({blocks} blocks of {size} bytes)")
            _nvme("attach-ns", device, f"--namespace-id={nsid}", f"--controllers={cntlid}")
            done.append(f"attached {nsid} to controller {cntlid}")
        _nvme("ns-rescan", device)
    except AgentError as exc:
        raise AgentError(f"{device}: the factory layout stopped ({exc.message}); done before: "
                         f"{', '.join(done) or 'nothing'}", reason=exc.reason) from exc
    return f"{device}: " + ", ".join(done) + "; rescanned\n"


# TCG Storage Level 0 Discovery (TCG Storage Architecture Core Spec, 3.3.6): security protocol 1,
# ComID 1, through NVMe Security Receive; the Locking feature's (0x0002) first byte, bit by bit.
LEVEL0 = ["--secp=1", "--spsp=1", "--size=2048", "--al=2048", "--raw-binary"]
LOCKING_FEATURE = 0x0002
LOCKING_BITS = ("supported", "enabled", "locked", "media_encryption", "mbr_enabled", "mbr_done")


def parse_level0(data: bytes) -> dict[str, str]:
    """A Level 0 Discovery answer: the feature codes it lists and the Locking feature's bits
    ({"features": "0x0001,0x0002,0x0203", "locking": "supported=1;enabled=0;..."})."""
    if len(data) < 48:
        raise AgentError(f"TCG Level 0 Discovery: {len(data)} bytes, not even its header",
                         reason=Reason.TOOL_FAILED)
    end = min(len(data), 4 + int.from_bytes(data[:4], "big"))
    features, locking, pos = [], "absent", 48
    while pos + 4 <= end:
        code, length = int.from_bytes(data[pos:pos + 2], "big"), data[pos + 3]
        body = data[pos + 4:pos + 4 + length]
        features.append(f"{code:#06x}")
        if code == LOCKING_FEATURE and body:
            locking = ";".join(f"{name}={body[0] >> bit & 1}" for bit, name in enumerate(LOCKING_BITS))
        pos += 4 + length
    return {"features": ",".join(features), "locking": locking}


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
                Operation("security_discovery", "TCG Storage Level 0 Discovery (Opal, locking): raw bytes",
                          build=lambda v: ["security-recv", str(v["device"]), *LEVEL0], args=(CONTROLLER,)),
                _device_query("id_ns", "identify namespace: size, capacity, LBA formats (a namespace device)",
                              "id-ns"),
                Operation(
                    "factory_layout",
                    "every namespace deleted, then N equal ones over the whole capacity, attached "
                    "(destroys data)",
                    build=lambda v: ["factory_layout", str(v["device"]), str(v["namespaces"]),
                                     str(v["lba_data_size"])],
                    args=(
                        Arg("device", ArgType.STRING, "NVMe controller, e.g. /dev/nvme0",
                            pattern=r"/dev/nvme[0-9]{1,3}"),
                        Arg("namespaces", ArgType.INT, "how many namespaces (factory: 1)", minimum=1,
                            maximum=1024),
                        Arg("lba_data_size", ArgType.INT, "bytes per block: 512 or 4096", minimum=512,
                            maximum=4096),
                    ),
                    changes_state=True, local=_factory_layout,
                ),
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
