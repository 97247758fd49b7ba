"""inventory.refresh: the hardware as the control plane needs it to place and check a node.

Read from sysfs and procfs (agent.hw.system, agent.hw.block), GPUs through NVML where the
driver is there (agent.hw.gpu) and by PCI id from sysfs otherwise, the BMC address through
``ipmitool`` where an IPMI device exists, LLDP neighbours when asked (up to 30 s of
listening), every PCIe device's link and AER counts (agent.hw.pci), each NIC's driver and
firmware versions (the kernel's ETHTOOL_GDRVINFO) and the GPU Xid events in the kernel log
since boot (agent.policy.xid). The slow parts (NVML, ipmitool, LLDP, disks, PCI, the kernel log) run
in parallel.

With ``expect`` (an ExpectedBuild) the result gains ``conformance``: the inventory checked
against the build by agent.policy.conformance. ``gate()`` is the same check for a command that is
about to change the node (deploy.image's ``gate``): NotConforming when the node is not the build.
With ``expect.state`` (ramdisk and node roles) the gate covers what a tenant could change too
(agent.commands.inventory.release reads it, agent.policy.release judges it), and the result gains the
``release`` report: each finding with the driver.invoke that puts it back, or named as one that
cannot be put back.

Each inventory is compared with the previous one this agent stored (``inventory.pb`` in the
state directory) and the differences are reported as ``changes``, one per changed leaf
("disks[nvme1n1].serial") or per device that appeared or went away ("gpus[0000:18:00.0]").
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from agent import launcher
from agent.catalog import Role
from agent.commands.base import Context, Handler
from agent.commands.inventory import golden, release
from agent.errors import AgentError, InvalidParameters, NotConforming
from agent.hw import block, gpu, lldp, pci, sysfs, system
from agent.policy import conformance, xid
from agent.policy.release import gate as release_gate
from agent.policy.release.findings import Found
from agent.policy.release.golden_check import check_golden
from agent.policy.release.state import ExpectedState
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

STATE_FILE = "inventory.pb"
LLDP_SECONDS = 30.0                          # switches announce every 30 s by default
DEADLINE_MARGIN = 15.0                       # what LLDP leaves of the 2-minute limit
NOT_COMPARED = frozenset({"cpu.max_mhz",      # moves with the clock on machines without cpufreq
                          "xid_events"})      # events, not hardware: reported each time as found

T = TypeVar("T")


@dataclass(frozen=True)
class InventoryParams:
    include_lldp: bool
    skip_gpus: bool
    expect: conformance.Expected | None = None
    state: ExpectedState | None = None


# --------------------------------------------------------------------------- readers


def disks(root: Path = system.ROOT) -> list[agent_pb2.DiskInfo]:
    """Every disk but loop devices, with the flags and holders sysfs shows."""
    found = []
    for disk in block.list_disks(root / "sys", root / "dev"):
        if disk.transport == "loop":
            continue
        sysdir = root / "sys/block" / disk.name
        holders: list[str] = []
        with contextlib.suppress(OSError):
            holders = sorted(os.listdir(sysdir / "holders"))
        found.append(
            agent_pb2.DiskInfo(
                identity=disk.identity(),
                removable=sysfs.read(sysdir / "removable") == "1",
                read_only=sysfs.read(sysdir / "ro") == "1",
                holder=",".join(holders),
            )
        )
    return found


def gpus(root: Path = system.ROOT, library: str | None = None) -> list[agent_pb2.GpuInfo]:
    """Through NVML when the driver answers, else NVIDIA devices on the PCI bus."""
    try:
        summaries = gpu.list_gpus(library)
    except AgentError as exc:  # no driver, no pynvml, NVML refusing to start
        log.info("inventory: GPUs from sysfs (%s)", exc)
    else:
        return [
            agent_pb2.GpuInfo(
                index=g.index,
                pci_address=gpu.pci_address(g.pci_bus_id),
                vendor_id=g.vendor_id,
                device_id=g.device_id,
                name=g.name,
                uuid=g.uuid,
                serial=g.serial,
                memory_bytes=g.memory_total_bytes,
                source="nvml",
                vbios_version=g.vbios_version,
                pcie_generation=g.pcie_generation,
                pcie_generation_max=g.pcie_generation_max,
                pcie_width=g.pcie_width,
                pcie_width_max=g.pcie_width_max,
                nvlinks_up=sum(1 for _, up in g.nvlinks if up),
                nvlinks=len(g.nvlinks),
            )
            for g in summaries
        ]
    return [
        agent_pb2.GpuInfo(
            index=i, pci_address=g.pci_address, vendor_id=g.vendor_id, device_id=g.device_id,
            name=g.name, source="sysfs",
        )
        for i, g in enumerate(system.read_pci_gpus(root))
    ]  # fmt: skip


def pci_message(d: pci.PciDevice) -> agent_pb2.PciDevice:
    msg = agent_pb2.PciDevice(
        address=d.address, vendor_id=d.vendor_id, device_id=d.device_id, class_code=d.class_code,
        driver=d.driver, link_speed=d.link_speed, link_width=d.link_width,
        max_link_speed=d.max_link_speed, max_link_width=d.max_link_width, upstream=d.upstream,
        name=d.name,
    )  # fmt: skip
    if d.aer is not None:
        msg.aer.CopyFrom(agent_pb2.AerCounts(correctable=d.aer.correctable, nonfatal=d.aer.nonfatal,
                                             fatal=d.aer.fatal))
    return msg


def machine_message(m: system.Machine) -> agent_pb2.Inventory:
    inv = agent_pb2.Inventory(
        system=agent_pb2.SystemInfo(
            vendor=m.dmi.vendor,
            product=m.dmi.product,
            serial=m.dmi.serial,
            uuid=m.dmi.uuid,
            firmware_vendor=m.dmi.firmware_vendor,
            firmware_version=m.dmi.firmware_version,
            firmware_date=m.dmi.firmware_date,
            board_vendor=m.dmi.board_vendor,
            board_product=m.dmi.board_product,
            boot_mode=m.boot_mode,
            kernel=m.kernel,
            hostname=m.hostname,
        ),
        cpu=agent_pb2.CpuInfo(
            model=m.cpu.model,
            sockets=m.cpu.sockets,
            cores=m.cpu.cores,
            threads=m.cpu.threads,
            architecture=m.cpu.architecture,
            flags=m.cpu.flags,
            max_mhz=m.cpu.max_mhz,
        ),
        memory=agent_pb2.MemoryInfo(
            total_bytes=m.memory.total_bytes,
            numa_nodes=m.memory.numa_nodes,
            dimms=[
                agent_pb2.MemoryDimm(
                    locator=d.locator, size_bytes=d.size_bytes, type=d.type, speed_mts=d.speed_mts,
                    manufacturer=d.manufacturer, serial=d.serial,
                )
                for d in m.memory.dimms
            ],
        ),
        nics=[
            agent_pb2.NicInfo(
                name=n.name, mac=n.mac, driver=n.driver, speed_mbps=n.speed_mbps, link=n.link,
                pci_address=n.pci_address, mtu=n.mtu, addresses=n.addresses,
                firmware_version=n.firmware_version, driver_version=n.driver_version,
            )
            for n in m.nics
        ],
        infiniband=[
            agent_pb2.InfinibandPort(
                device=p.device, port=p.port, state=p.state, rate=p.rate, guid=p.guid, link_layer=p.link_layer
            )
            for p in m.infiniband
        ],
    )  # fmt: skip
    return inv


def collect(
    root: Path = system.ROOT,
    *,
    include_lldp: bool = False,
    skip_gpus: bool = False,
    lldp_seconds: float = LLDP_SECONDS,
    nvml_library: str | None = None,
    run_tool: system.Runner | None = None,
    cancel: Any = None,
    kernel_log: Callable[[], list[xid.XidEvent] | None] | None = None,
) -> agent_pb2.Inventory:
    """The whole inventory of the machine under ``root`` (tests and benchmarks use a fake
    tree). ``run_tool(argv) -> stdout`` runs ipmitool; None skips the BMC address.
    ``kernel_log()`` gives the Xid events (default: this machine's kernel log, for ``/`` only)."""
    if kernel_log is None and root == system.ROOT:
        kernel_log = xid.since_boot
    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="inventory") as pool:

        def start(fn: Callable[..., T], *args: Any) -> Future[T]:
            return pool.submit(fn, *args)

        gpu_future = None if skip_gpus else start(gpus, root, nvml_library)
        disk_future = start(disks, root)
        pci_future = start(pci.read_pci_devices, root)
        xid_future = start(kernel_log) if kernel_log is not None else None
        bmc_future = start(system.bmc_address, run_tool) if run_tool is not None else None
        machine = system.read_machine(root)
        lldp_future = None
        if include_lldp:
            names = [n.name for n in machine.nics if n.link]
            lldp_future = start(lldp.listen, names, lldp_seconds, cancel)
        inv = machine_message(machine)
        inv.disks.extend(disk_future.result())
        inv.pci_devices.extend(pci_message(d) for d in pci_future.result())
        models = {d.address: d.name or f"{d.vendor_id}:{d.device_id}" for d in inv.pci_devices}
        for nic in inv.nics:
            nic.model = models.get(nic.pci_address, "")
        events = xid_future.result() if xid_future is not None else None
        inv.xid_events.extend(e.to_proto() for e in events or ())
        if gpu_future is not None:
            inv.gpus.extend(gpu_future.result())
        if bmc_future is not None:
            inv.system.bmc_address = bmc_future.result()
        if lldp_future is not None:
            neighbours = lldp_future.result()
            for nic in inv.nics:
                seen = neighbours.get(nic.name)
                if seen is not None:
                    nic.lldp_chassis_id = seen.chassis_id
                    nic.lldp_port_id = seen.port_id
                    nic.lldp_system_name = seen.system_name
    return inv


# ------------------------------------------------------------------------------ diff

# How an element of each repeated field is named in a change path.
_KEYS: dict[str, Callable[[dict[str, Any]], str]] = {
    "disks": lambda d: str(d.get("identity", {}).get("name", "")),
    "nics": lambda n: str(n.get("name", "")),
    "gpus": lambda g: str(g.get("pci_address") or g.get("index", 0)),
    "infiniband": lambda p: f"{p.get('device', '')}/{p.get('port', 0)}",
    "dimms": lambda d: str(d.get("locator", "")),
    "pci_devices": lambda d: str(d.get("address", "")),
}


def flatten(value: Any, path: str = "", out: dict[str, str] | None = None) -> dict[str, str]:
    """Leaf path -> value as text; keyed lists become name[key], lists of scalars one leaf."""
    out = {} if out is None else out
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{path}.{key}" if path else key, out)
    elif isinstance(value, list):
        field = path.rsplit(".", 1)[-1]
        if field in _KEYS and all(isinstance(v, dict) for v in value):
            for item in value:
                flatten(item, f"{path}[{_KEYS[field](item)}]", out)
        else:
            out[path] = ",".join(str(v) for v in value)
    else:
        out[path] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _items(flat: dict[str, str]) -> set[str]:
    """The keyed elements ("disks[sda]") present in a flattened inventory."""
    found = set()
    for path in flat:
        for part in range(len(path)):
            if path[part] == "]":
                found.add(path[: part + 1])
    return found


def diff(old: agent_pb2.Inventory, new: agent_pb2.Inventory) -> list[agent_pb2.InventoryChange]:
    def as_flat(inv: agent_pb2.Inventory) -> dict[str, str]:
        return flatten(
            json_format.MessageToDict(
                inv, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        )

    before, after = as_flat(old), as_flat(new)
    items_before, items_after = _items(before), _items(after)
    gone = items_before - items_after
    added = items_after - items_before
    changes = [agent_pb2.InventoryChange(path=p, old_value="present") for p in sorted(gone)]
    changes += [agent_pb2.InventoryChange(path=p, new_value="present") for p in sorted(added)]

    def inside(path: str, items: set[str]) -> bool:
        return any(path.startswith(item) for item in items)

    for path in sorted(set(before) | set(after)):
        if path in NOT_COMPARED or inside(path, gone | added):
            continue
        a, b = before.get(path, ""), after.get(path, "")
        if a != b:
            changes.append(agent_pb2.InventoryChange(path=path, old_value=a, new_value=b))
    return changes


def load_previous(state_dir: Path) -> agent_pb2.Inventory | None:
    try:
        data = (state_dir / STATE_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("inventory: previous inventory unreadable: %s", exc)
        return None
    inv = agent_pb2.Inventory()
    try:
        inv.ParseFromString(data)
    except DecodeError:
        log.warning("inventory: previous inventory in %s is corrupt, starting afresh", state_dir)
        return None
    return inv


def store(state_dir: Path, inv: agent_pb2.Inventory) -> None:
    """Write the inventory whole or not at all."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    launcher.write_atomic(state_dir / STATE_FILE, inv.SerializeToString(deterministic=True), 0o600)


def gate(ctx: Context, expected: conformance.Expected, root: Path = system.ROOT) -> agent_pb2.Inventory:
    """The acceptance gate before a command changes the node: its inventory (no LLDP, GPUs only
    when the build names them), or NotConforming with every mismatch."""
    inv = collect(root, skip_gpus=not expected.wants_gpus,
                  nvml_library=gpu.library_path(ctx.config.nvml_library),
                  cancel=ctx.cancel_event, kernel_log=lambda: None)
    found = conformance.check(expected, inv)
    if found:
        more = f"; and {len(found) - 8} more" if len(found) > 8 else ""
        listed = "; ".join(m.message for m in found[:8]) + more
        raise NotConforming(f"this node is not the expected build: {listed}",
                            mismatches=",".join(f"{m.check}@{m.where or 'node'}" for m in found))
    return inv


class InventoryRefresh(Handler[agent_pb2.InventoryRefreshRequest, InventoryParams], kind="inventory.refresh"):
    root: Path = system.ROOT                 # tests point it at a fake tree
    kernel_log: Callable[[], list[xid.XidEvent] | None] | None = None   # and at a kernel log

    def parse(self, payload: agent_pb2.InventoryRefreshRequest) -> InventoryParams:
        expect = conformance.Expected.from_proto(payload.expect) if payload.HasField("expect") else None
        if expect is not None and expect.wants_gpus and payload.skip_gpus:
            raise InvalidParameters("inventory.refresh: expect.gpus cannot be checked with skip_gpus")
        state = None
        if payload.HasField("expect") and payload.expect.HasField("state"):
            state = ExpectedState.from_proto(payload.expect.state)
        return InventoryParams(include_lldp=payload.include_lldp, skip_gpus=payload.skip_gpus, expect=expect,
                               state=state)

    def run(self, ctx: Context, params: InventoryParams) -> agent_pb2.InventoryRefreshResult:
        started = time.monotonic()
        if params.state is not None and ctx.config.role not in (Role.RAMDISK, Role.NODE):
            raise InvalidParameters("inventory.refresh: expect.state is checked in the ramdisk and node "
                                    "roles, by the agent on the node itself")

        def run_tool(argv: list[str]) -> str:
            return ctx.run(argv, timeout=min(15.0, ctx.remaining())).text

        inv = collect(
            self.root,
            include_lldp=params.include_lldp,
            skip_gpus=params.skip_gpus,
            lldp_seconds=max(0.0, min(LLDP_SECONDS, ctx.remaining() - DEADLINE_MARGIN)),
            nvml_library=gpu.library_path(ctx.config.nvml_library),
            run_tool=run_tool if self.root == system.ROOT else None,
            cancel=ctx.cancel_event,
            kernel_log=self.kernel_log,
        )
        ctx.check()
        previous = load_previous(ctx.config.state_dir)
        result = agent_pb2.InventoryRefreshResult(inventory=inv, first=previous is None)
        if previous is not None:
            result.changes.extend(diff(previous, inv))
        if params.expect is not None:
            result.conformance.CopyFrom(conformance.conformance(params.expect, inv))
            if params.state is not None:
                seen = release.observe(ctx, params.state, inv, self.root)
                result.conformance.mismatches.extend(release_gate.check(params.state, seen))
                compared = None
                if params.state.golden is not None and params.state.golden.node_sources:
                    # Round 2: the node's sources, each read whole, diffed against the golden state.
                    captured = golden.capture(ctx, inv, self.root, tuple(params.state.golden.node_sources))
                    found = Found()
                    compared = check_golden(params.state.golden, captured, golden.hints(self.root), found)
                    result.conformance.mismatches.extend(found.mismatches)
                result.conformance.passed = not result.conformance.mismatches
                result.release.CopyFrom(release.report(params.state, list(result.conformance.mismatches),
                                                       seen, ctx.boot_id, compared))
            for m in result.conformance.mismatches:
                ctx.log.info("gate: %s: %s", m.check, m.message)
        store(ctx.config.state_dir, inv)
        if ctx.site_services is not None:
            # Role site: each known node's last boot attempt and its cause (docs/site.md).
            result.node_boots.extend(ctx.site_services.observe.node_boots())
            # and each node's parts as its BMC gave them (serials, firmware versions: break-fix)
            ctx.site_services.parts.report(result)
        result.seconds = time.monotonic() - started
        return result
