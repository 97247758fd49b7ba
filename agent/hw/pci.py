"""PCI Express devices as sysfs has them: each one's link (current and maximum speed and
width), the port above it, and its AER error counts since boot.

``read_pci_devices(root)`` reads ``root/sys/bus/pci/devices/*``: every device that has a
``max_link_width`` attribute (conventional PCI devices have none and are left out). The
speeds are sysfs' text ("16.0 GT/s PCIe"); ``gts()`` turns one into a number to compare.
AER counts are the ``TOTAL_ERR_COR``, ``TOTAL_ERR_NONFATAL`` and ``TOTAL_ERR_FATAL`` lines of
``aer_dev_correctable``, ``aer_dev_nonfatal`` and ``aer_dev_fatal`` (Linux 4.19 and later);
a device without them (no AER capability, or a kernel without CONFIG_PCIEAER) has ``aer=None``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.hw import sysfs
from agent.hw.system import PCI_ADDRESS, ROOT, driver_of, pci_device_names

_SPEED = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*GT/s")


@dataclass(frozen=True)
class Aer:
    correctable: int
    nonfatal: int
    fatal: int


@dataclass(frozen=True)
class PciDevice:
    address: str                  # "0000:18:00.0"
    vendor_id: str                # "10de"
    device_id: str                # "2330"
    class_code: str               # "0x030200"
    driver: str
    link_speed: str               # "16.0 GT/s PCIe"; "" where the link is down or unknown
    link_width: int
    max_link_speed: str
    max_link_width: int
    upstream: str                 # the address of the port above it, "" at the root
    aer: Aer | None
    name: str = ""

    def is_class(self, prefix: str) -> bool:
        """True when the class code starts with ``prefix`` ("0x0302", "0x02", "0108")."""
        want = prefix.lower().removeprefix("0x")
        return self.class_code.lower().removeprefix("0x").startswith(want)


def gts(speed: str) -> float:
    """GT/s of a sysfs link speed ("8.0 GT/s PCIe" -> 8.0); 0.0 for "Unknown" or ""."""
    m = _SPEED.search(speed)
    return float(m.group(1)) if m else 0.0


def _width(path: Path) -> int:
    text = sysfs.read(path)
    return int(text) if text.isdigit() else 0   # "255" reads as such; "" / "Unknown" as 0


def parse_aer(text: str, total: str) -> int | None:
    """The ``total`` line's count ("TOTAL_ERR_COR 3") of an aer_dev_* file; None without one."""
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == total and value.strip().isdigit():
            return int(value)
    return None


def read_aer(device: Path) -> Aer | None:
    counts = []
    for name, total in (("aer_dev_correctable", "TOTAL_ERR_COR"), ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
                        ("aer_dev_fatal", "TOTAL_ERR_FATAL")):
        text = sysfs.read(device / name)
        counts.append(parse_aer(text, total) if text else None)
    if all(c is None for c in counts):
        return None
    correctable, nonfatal, fatal = (c or 0 for c in counts)
    return Aer(correctable=correctable, nonfatal=nonfatal, fatal=fatal)


def _upstream(device: Path) -> str:
    """The PCI address of the bridge the device sits under ("" below a host bridge), from the
    one symlink /sys/bus/pci/devices/X is ("../../../devices/pci0000:00/0000:00:02.0/X")."""
    try:
        target = Path(os.readlink(device))
    except OSError:               # not a link (a fake tree's plain directory)
        return ""
    parent = target.parent.name
    return parent.lower() if PCI_ADDRESS.fullmatch(parent) else ""


def read_pci_devices(root: Path = ROOT) -> list[PciDevice]:
    """Every PCIe device (one with a link), sorted by address."""
    base = root / "sys/bus/pci/devices"
    found: list[PciDevice] = []
    try:
        addresses = sorted(os.listdir(base))
    except OSError:
        return found
    for address in addresses:
        d = base / address
        if not (d / "max_link_width").exists():
            continue
        found.append(
            PciDevice(
                address=address.lower(),
                vendor_id=sysfs.read(d / "vendor").lower().removeprefix("0x"),
                device_id=sysfs.read(d / "device").lower().removeprefix("0x"),
                class_code=sysfs.read(d / "class").lower(),
                driver=driver_of(d),
                link_speed=sysfs.read(d / "current_link_speed"),
                link_width=_width(d / "current_link_width"),
                max_link_speed=sysfs.read(d / "max_link_speed"),
                max_link_width=_width(d / "max_link_width"),
                upstream=_upstream(d),
                aer=read_aer(d),
            )
        )
    return _named(found)


def _named(devices: list[PciDevice]) -> list[PciDevice]:
    """The devices with their pci.ids names, where the database is installed."""
    by_vendor: dict[str, set[str]] = {}
    for dev in devices:
        by_vendor.setdefault(dev.vendor_id, set()).add(dev.device_id)
    names = {v: pci_device_names(v, ids) for v, ids in by_vendor.items()}
    return [
        PciDevice(**{**dev.__dict__, "name": names.get(dev.vendor_id, {}).get(dev.device_id, "")})
        for dev in devices
    ]
