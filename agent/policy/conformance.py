"""The acceptance gate: a node's inventory compared with the build (SKU) it must be.

``Expected.from_proto`` checks an ``ExpectedBuild`` once, at the edge (InvalidParameters
for what cannot be meant); ``check(expected, inventory)`` returns every ``Mismatch``. A
field left zero or empty is not checked. Checks and their stable names:

  cpu.model cpu.sockets cpu.threads memory.total
  gpu.count gpu.model gpu.memory gpu.vbios gpu.nvlinks_up
  nic.count nic.model nic.firmware nic.speed
  nvme.count nvme.model nvme.capacity nvme.firmware
  pcie.link_speed pcie.link_width   a device of a ``full_link_classes`` class below its own
                                    maximum (the message names the port above it when that
                                    port's maximum is what holds it back)
  pcie.slot_speed pcie.slot_width   the port above a device of a ``slots`` class offers less
                                    than the build needs (a riser, a bifurcation setting)

With ``expect.state`` (ramdisk and node roles) the same Conformance carries the release
gate's findings too, checked by agent.policy.release (whose docstring lists them, each with
its remedy):

  uefi.unreadable uefi.boot_entry uefi.boot_order uefi.secure_boot uefi.setup_mode
  uefi.pk uefi.kek uefi.db uefi.dbx uefi.memory_overwrite
  gpu.unreadable gpu.mig_mode gpu.persistence_mode gpu.power_limit gpu.app_clocks
  gpu.retired_pending gpu.remap_pending gpu.remap_failure gpu.ecc_volatile
  nic.unreadable nic.config nic.firmware_version
  nvme.unreadable nvme.namespaces nvme.capacity nvme.lba_size

Versions are compared part by part (``version_key``): "96.00.A5.00.01" > "96.00.74.00.01",
"2.10" > "2.9", "MPK7525Q" < "MPK7526Q".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import InvalidParameters
from agent.hw import pci
from agent.proto import agent_pb2

DEFAULT_MEMORY_TOLERANCE = 5         # percent: firmware, the kernel and crash kernels keep some
_CLASS = re.compile(r"(0x)?[0-9a-fA-F]{2}([0-9a-fA-F]{2}([0-9a-fA-F]{2})?)?")
_VERSION = re.compile(r"[0-9A-Za-z]+")


def version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """A sort key: each alphanumeric run as a decimal number, else as hex, else as text."""
    key = []
    for part in _VERSION.findall(version):
        if part.isdigit():
            key.append((1, int(part), ""))
        elif re.fullmatch(r"[0-9A-Fa-f]+", part):
            key.append((1, int(part, 16), ""))
        else:
            key.append((0, 0, part.lower()))
    return tuple(key)


def at_least(found: str, minimum: str) -> bool:
    return version_key(found) >= version_key(minimum)


@dataclass(frozen=True)
class Slot:
    class_code: str
    min_speed_gts: float
    min_width: int


@dataclass(frozen=True)
class Expected:
    cpu_model: str = ""
    cpu_sockets: int = 0
    cpu_threads: int = 0
    memory_bytes: int = 0
    memory_tolerance_percent: int = DEFAULT_MEMORY_TOLERANCE
    gpu_count: int = 0
    gpu_model: str = ""
    gpu_min_memory_bytes: int = 0
    gpu_min_vbios: str = ""
    gpu_nvlinks_up: int = 0
    nic_count: int = 0
    nic_model: str = ""
    nic_min_firmware: str = ""
    nic_speed_mbps: int = 0
    nvme_count: int = 0
    nvme_model: str = ""
    nvme_min_capacity_bytes: int = 0
    nvme_min_firmware: str = ""
    full_link_classes: tuple[str, ...] = ()
    slots: tuple[Slot, ...] = ()

    @classmethod
    def from_proto(cls, msg: agent_pb2.ExpectedBuild) -> Expected:
        texts = {"cpu_model": msg.cpu_model, "gpus.model": msg.gpus.model,
                 "gpus.min_vbios": msg.gpus.min_vbios, "nics.model": msg.nics.model,
                 "nics.min_firmware": msg.nics.min_firmware,
                 "nvme.model": msg.nvme.model, "nvme.min_firmware": msg.nvme.min_firmware}
        for name, value in texts.items():
            if len(value) > 128 or not value.isprintable():
                raise InvalidParameters(f"expect.{name} must be printable and at most 128 characters")
        if msg.memory_tolerance_percent > 50:
            raise InvalidParameters("expect.memory_tolerance_percent is at most 50")
        counts = (("cpu_sockets", msg.cpu_sockets, 64), ("cpu_threads", msg.cpu_threads, 1 << 16),
                  ("gpus.count", msg.gpus.count, 64), ("gpus.nvlinks_up", msg.gpus.nvlinks_up, 64),
                  ("nics.count", msg.nics.count, 256), ("nvme.count", msg.nvme.count, 256))
        for name, count, top in counts:
            if count > top:
                raise InvalidParameters(f"expect.{name} {count} is more than {top}")
        if len(msg.full_link_classes) > 32 or len(msg.slots) > 32:
            raise InvalidParameters("expect.full_link_classes, expect.slots: at most 32 classes each")
        for klass in (*msg.full_link_classes, *(s.class_code for s in msg.slots)):
            if not _CLASS.fullmatch(klass):
                raise InvalidParameters(f"expect: {klass!r} is not a PCI class code "
                                        "(2, 4 or 6 hex digits, e.g. 0x0302)")
        for slot in msg.slots:
            if not 0 <= slot.min_speed_gts <= 128 or slot.min_width not in (0, 1, 2, 4, 8, 12, 16, 32):
                raise InvalidParameters(f"expect.slots {slot.class_code}: a speed of 0-128 GT/s and a "
                                        "PCIe link width (1, 2, 4, 8, 12, 16, 32)")
        return cls(
            cpu_model=msg.cpu_model.strip(), cpu_sockets=msg.cpu_sockets, cpu_threads=msg.cpu_threads,
            memory_bytes=msg.memory_bytes,
            memory_tolerance_percent=msg.memory_tolerance_percent or DEFAULT_MEMORY_TOLERANCE,
            gpu_count=msg.gpus.count, gpu_model=msg.gpus.model.strip(),
            gpu_min_memory_bytes=msg.gpus.min_memory_bytes, gpu_min_vbios=msg.gpus.min_vbios.strip(),
            gpu_nvlinks_up=msg.gpus.nvlinks_up,
            nic_count=msg.nics.count, nic_model=msg.nics.model.strip(),
            nic_min_firmware=msg.nics.min_firmware.strip(), nic_speed_mbps=msg.nics.speed_mbps,
            nvme_count=msg.nvme.count, nvme_model=msg.nvme.model.strip(),
            nvme_min_capacity_bytes=msg.nvme.min_capacity_bytes,
            nvme_min_firmware=msg.nvme.min_firmware.strip(),
            full_link_classes=tuple(c.lower() for c in msg.full_link_classes),
            slots=tuple(Slot(s.class_code.lower(), s.min_speed_gts, s.min_width) for s in msg.slots),
        )  # fmt: skip

    @property
    def wants_gpus(self) -> bool:
        return bool(self.gpu_count or self.gpu_model or self.gpu_min_memory_bytes or self.gpu_min_vbios
                    or self.gpu_nvlinks_up)


class _Found:
    def __init__(self) -> None:
        self.mismatches: list[agent_pb2.Mismatch] = []

    def add(self, check: str, expected: object, found: object, where: str, message: str) -> None:
        self.mismatches.append(agent_pb2.Mismatch(check=check, expected=str(expected), found=str(found),
                                                  where=where, message=message))


def _contains(text: str, part: str) -> bool:
    return part.lower() in text.lower()


def check(e: Expected, inv: agent_pb2.Inventory) -> list[agent_pb2.Mismatch]:
    """Every way ``inv`` differs from ``e``."""
    out = _Found()
    _cpu_memory(e, inv, out)
    _gpus(e, inv, out)
    _nics(e, inv, out)
    _nvme(e, inv, out)
    _links(e, inv, out)
    return out.mismatches


def _cpu_memory(e: Expected, inv: agent_pb2.Inventory, out: _Found) -> None:
    if e.cpu_model and not _contains(inv.cpu.model, e.cpu_model):
        out.add("cpu.model", e.cpu_model, inv.cpu.model, "",
                f"CPU is {inv.cpu.model!r}, expected {e.cpu_model!r}")
    if e.cpu_sockets and inv.cpu.sockets != e.cpu_sockets:
        out.add("cpu.sockets", e.cpu_sockets, inv.cpu.sockets, "",
                f"{inv.cpu.sockets} CPU socket(s), expected {e.cpu_sockets}")
    if e.cpu_threads and inv.cpu.threads != e.cpu_threads:
        out.add("cpu.threads", e.cpu_threads, inv.cpu.threads, "",
                f"{inv.cpu.threads} CPU thread(s), expected {e.cpu_threads}")
    if e.memory_bytes:
        low = e.memory_bytes * (100 - e.memory_tolerance_percent) // 100
        high = e.memory_bytes * (100 + e.memory_tolerance_percent) // 100
        total = inv.memory.total_bytes
        if not low <= total <= high:
            out.add("memory.total", e.memory_bytes, total, "",
                    f"{total / 2**30:.1f} GiB of memory, expected {e.memory_bytes / 2**30:.1f} GiB "
                    f"(within {e.memory_tolerance_percent}%)")


def _gpus(e: Expected, inv: agent_pb2.Inventory, out: _Found) -> None:
    if e.gpu_count and len(inv.gpus) != e.gpu_count:
        out.add("gpu.count", e.gpu_count, len(inv.gpus), "",
                f"{len(inv.gpus)} GPU(s), expected {e.gpu_count}")
    for g in inv.gpus:
        where = g.pci_address or str(g.index)
        if e.gpu_model and not _contains(g.name, e.gpu_model):
            out.add("gpu.model", e.gpu_model, g.name, where,
                    f"GPU {where} is {g.name!r}, expected {e.gpu_model!r}")
        if e.gpu_min_memory_bytes and g.memory_bytes < e.gpu_min_memory_bytes:
            out.add("gpu.memory", e.gpu_min_memory_bytes, g.memory_bytes, where,
                    f"GPU {where} has {g.memory_bytes} bytes of memory"
                    f", expected at least {e.gpu_min_memory_bytes}")
        if e.gpu_min_vbios and not (g.vbios_version and at_least(g.vbios_version, e.gpu_min_vbios)):
            out.add("gpu.vbios", e.gpu_min_vbios, g.vbios_version, where,
                    f"GPU {where} runs VBIOS {g.vbios_version or '(unknown)'}"
                    f", expected {e.gpu_min_vbios} or newer")
        if e.gpu_nvlinks_up and g.nvlinks_up < e.gpu_nvlinks_up:
            out.add("gpu.nvlinks_up", e.gpu_nvlinks_up, g.nvlinks_up, where,
                    f"GPU {where} has {g.nvlinks_up} of {g.nvlinks} NVLink link(s) up"
                    f", expected {e.gpu_nvlinks_up}")


def _nics(e: Expected, inv: agent_pb2.Inventory, out: _Found) -> None:
    if e.nic_count and len(inv.nics) != e.nic_count:
        out.add("nic.count", e.nic_count, len(inv.nics), "",
                f"{len(inv.nics)} NIC(s), expected {e.nic_count}")
    ids = {d.address: f"{d.vendor_id}:{d.device_id}" for d in inv.pci_devices}
    for n in inv.nics:
        model_ok = _contains(n.model, e.nic_model) or ids.get(n.pci_address) == e.nic_model.lower()
        if e.nic_model and not model_ok:
            out.add("nic.model", e.nic_model, n.model, n.name,
                    f"NIC {n.name} is {n.model!r}, expected {e.nic_model!r}")
        firmware_ok = bool(n.firmware_version) and at_least(n.firmware_version, e.nic_min_firmware)
        if e.nic_min_firmware and not firmware_ok:
            out.add("nic.firmware", e.nic_min_firmware, n.firmware_version, n.name,
                    f"NIC {n.name} runs firmware {n.firmware_version or '(unknown)'}, expected "
                    f"{e.nic_min_firmware} or newer")
        if e.nic_speed_mbps and n.speed_mbps < e.nic_speed_mbps:
            state = f"{n.speed_mbps} Mb/s" if n.link else "no link"
            out.add("nic.speed", e.nic_speed_mbps, n.speed_mbps, n.name,
                    f"NIC {n.name}: {state}, expected {e.nic_speed_mbps} Mb/s")


def _nvme(e: Expected, inv: agent_pb2.Inventory, out: _Found) -> None:
    drives = [d.identity for d in inv.disks if d.identity.transport == "nvme"]
    if e.nvme_count and len(drives) != e.nvme_count:
        out.add("nvme.count", e.nvme_count, len(drives), "",
                f"{len(drives)} NVMe drive(s), expected {e.nvme_count}")
    for d in drives:
        if e.nvme_model and not _contains(d.model, e.nvme_model):
            out.add("nvme.model", e.nvme_model, d.model, d.name,
                    f"{d.name} is {d.model!r}, expected {e.nvme_model!r}")
        if e.nvme_min_capacity_bytes and d.size_bytes < e.nvme_min_capacity_bytes:
            out.add("nvme.capacity", e.nvme_min_capacity_bytes, d.size_bytes, d.name,
                    f"{d.name} holds {d.size_bytes} bytes, expected at least {e.nvme_min_capacity_bytes}")
        if e.nvme_min_firmware and not (d.firmware and at_least(d.firmware, e.nvme_min_firmware)):
            out.add("nvme.firmware", e.nvme_min_firmware, d.firmware, d.name,
                    f"{d.name} runs firmware {d.firmware or '(unknown)'}"
                    f", expected {e.nvme_min_firmware} or newer")


def _of(class_code: str, prefix: str) -> bool:
    return class_code.lower().removeprefix("0x").startswith(prefix.lower().removeprefix("0x"))


def _listed(e: Expected, class_code: str) -> bool:
    return any(_of(class_code, c) for c in e.full_link_classes)


def _slots(e: Expected, inv: agent_pb2.Inventory, out: _Found) -> None:
    ports = {d.address: d for d in inv.pci_devices}
    for slot in e.slots:
        for d in inv.pci_devices:
            port = ports.get(d.upstream)
            if not _of(d.class_code, slot.class_code) or port is None:
                continue
            offered = pci.gts(port.max_link_speed)
            if slot.min_speed_gts and offered < slot.min_speed_gts:
                out.add("pcie.slot_speed", f"{slot.min_speed_gts:g} GT/s", port.max_link_speed, d.address,
                        f"{d.address} sits below {port.address}, which can do only {port.max_link_speed}; "
                        f"the build needs {slot.min_speed_gts:g} GT/s")
            if slot.min_width and port.max_link_width < slot.min_width:
                out.add("pcie.slot_width", f"x{slot.min_width}", f"x{port.max_link_width}", d.address,
                        f"{d.address} sits below {port.address}, which is only x{port.max_link_width}; "
                        f"the build needs x{slot.min_width}")


def _links(e: Expected, inv: agent_pb2.Inventory, out: _Found) -> None:
    _slots(e, inv, out)
    if not e.full_link_classes:
        return
    ports = {d.address: d for d in inv.pci_devices}
    width_failed: set[str] = set()      # one mismatch per device, sysfs' or NVML's
    for d in inv.pci_devices:
        if not _listed(e, d.class_code):
            continue
        port = ports.get(d.upstream)
        speed, max_speed = pci.gts(d.link_speed), pci.gts(d.max_link_speed)
        # A GPU (class 0x03) lowers its link speed while idle: only its width is judged here.
        if max_speed and speed < max_speed and not d.class_code.removeprefix("0x").startswith("03"):
            held = (f"; the port above it ({port.address}) can do only {port.max_link_speed}"
                    if port is not None and 0 < pci.gts(port.max_link_speed) < max_speed else "")
            out.add("pcie.link_speed", d.max_link_speed, d.link_speed or "down", d.address,
                    f"{d.address} trains at {d.link_speed or 'no link'}, it can do {d.max_link_speed}{held}")
        if d.max_link_width and d.link_width < d.max_link_width:
            width_failed.add(d.address)
            held = (f"; the port above it ({port.address}) is only x{port.max_link_width}"
                    if port is not None and 0 < port.max_link_width < d.max_link_width else "")
            out.add("pcie.link_width", f"x{d.max_link_width}", f"x{d.link_width}", d.address,
                    f"{d.address} trains at x{d.link_width}, it can do x{d.max_link_width}{held}")
    # GPUs through NVML too: what it says of a GPU whose sysfs link looked right.
    for g in inv.gpus:
        if g.pci_address in width_failed or not g.pcie_width_max or not _listed(e, "0x0302"):
            continue
        if g.pcie_width < g.pcie_width_max:
            out.add("pcie.link_width", f"x{g.pcie_width_max}", f"x{g.pcie_width}", g.pci_address,
                    f"GPU {g.pci_address} trains at x{g.pcie_width}, it can do x{g.pcie_width_max} (NVML)")


def conformance(e: Expected, inv: agent_pb2.Inventory) -> agent_pb2.Conformance:
    found = check(e, inv)
    return agent_pb2.Conformance(passed=not found, mismatches=found)
