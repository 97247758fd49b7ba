"""Every part a Redfish BMC lists, with its serial number and firmware version, for break-fix
(bmc.query's ``parts``; docs/site.md "Inventory for break-fix").

Read, one GET each, from what the service root links: every Chassis (the chassis itself, its
baseboards, GPU and NVSwitch modules, risers, ERoTs: ``kind`` from its Id and ChassisType),
each one's NetworkAdapters and Drives; every ComputerSystem (a DGX or GB200 lists its HGX
baseboard as a second one), its Processors (``kind`` cpu, gpu, fpga, ... from ProcessorType)
and its Storage controllers' Drives (each drive once). A link the BMC answers 404 or refuses
(a recording that pruned it, a BMC that lists what it does not serve) is skipped and named in
``partial``: the rest of the query is not lost to one part. At most MAX_PARTS parts.
"""

from __future__ import annotations

from agent.errors import BmcRefused
from agent.proto import site_pb2
from agent.site.bmc.redfish.session import Doc, RedfishSession, dicts, link, text

MAX_PARTS = 512
_NOT_A_VALUE = {"", "n/a", "na", "none", "null", "not available", "unknown", "0"}


def parts(s: RedfishSession, partial: list[str] | None = None) -> list[site_pb2.BmcPart]:
    """Every part, in the order the BMC lists them (see the module docstring)."""
    out: list[site_pb2.BmcPart] = []
    skipped: list[str] = []

    def read(ref: str) -> Doc | None:
        if len(out) >= MAX_PARTS:
            return None
        try:
            answer = s.send("GET", ref, ok=(404,))
        except BmcRefused:
            answer = None
        if answer is None or answer.status == 404:
            skipped.append(ref)
            return None
        return answer.doc

    def members(ref: str) -> list[str]:
        doc = read(ref) if ref else None
        refs = [m.get("@odata.id") for m in dicts(doc.get("Members"))] if doc else []
        return [r for r in refs if isinstance(r, str) and r]

    drives: set[str] = set()

    def drive(ref: str) -> None:
        """A Drive, once: a BMC may list it under its Chassis and its System's Storage, at two
        paths (GB200: Chassis/StorageBackplane_0/Drives/200 and Systems/System_0/Storage/1/
        Drives/200), the same serial number at both."""
        if ref.rstrip("/") in drives or (doc := read(ref)) is None:
            return
        found = part(doc, "drive", text(doc.get("Revision")))
        drives.add(ref.rstrip("/"))
        if found.serial and f"serial:{found.serial}" in drives:
            return
        drives.add(f"serial:{found.serial}")
        out.append(found)

    root = s.root()
    for ref in members(link(root, "Chassis")):
        if (chassis := read(ref)) is None:
            continue
        out.append(part(chassis, chassis_kind(chassis)))
        for nic_ref in members(link(chassis, "NetworkAdapters")):
            if (nic := read(nic_ref)) is not None:
                out.append(part(nic, "nic", _nic_firmware(nic)))
        for drive_ref in members(link(chassis, "Drives")):     # GB200's backplanes list theirs here
            drive(drive_ref)
    for ref in members(link(root, "Systems")):
        if (system := read(ref)) is None:
            continue
        out.append(part(system, "system", text(system.get("BiosVersion"))))
        for proc_ref in members(link(system, "Processors")):
            if (proc := read(proc_ref)) is not None:
                out.append(part(proc, text(proc.get("ProcessorType")).lower() or "processor"))
        for storage_ref in members(link(system, "Storage")):
            if (storage := read(storage_ref)) is None:
                continue
            for listed in dicts(storage.get("Drives")):
                if isinstance(listed_ref := listed.get("@odata.id"), str) and listed_ref:
                    drive(listed_ref)
    if partial is not None and skipped:
        partial.append(f"parts: {len(skipped)} linked resource(s) answered 404 or refused, e.g. {skipped[0]}")
    if partial is not None and len(out) >= MAX_PARTS:
        partial.append(f"parts: the first {MAX_PARTS} only")
    return out[:MAX_PARTS]


def chassis_kind(doc: Doc) -> str:
    """chassis, baseboard, gpu, nvswitch, cpu, erot, ... from a Chassis's Id and ChassisType."""
    ident = text(doc.get("Id")).lower()
    for hint, kind in (("erot", "erot"), ("irot", "irot"), ("nvswitch", "nvswitch"), ("gpu", "gpu"),
                       ("baseboard", "baseboard"), ("cpu", "cpu"), ("fpga", "fpga")):
        if hint in ident:
            return kind
    kind = text(doc.get("ChassisType")).lower()
    return "chassis" if kind in ("", "rackmount", "enclosure", "zone", "sled", "blade", "stand-alone") \
        else kind


def part(doc: Doc, kind: str, firmware: str = "") -> site_pb2.BmcPart:
    return site_pb2.BmcPart(
        kind=kind, id=text(doc.get("Id")), uri=text(doc.get("@odata.id")),
        manufacturer=_value(doc.get("Manufacturer")), model=_value(doc.get("Model")),
        part_number=_value(doc.get("PartNumber")), serial=_value(doc.get("SerialNumber")),
        firmware_version=firmware or _value(doc.get("FirmwareVersion")))


def _nic_firmware(doc: Doc) -> str:
    for controller in dicts(doc.get("Controllers")):
        version = _value(controller.get("FirmwarePackageVersion"))
        if version:
            return version
    return ""


def _value(value: object) -> str:
    """A string the BMC gave, "" for its placeholders ("N/A", "Unknown", "0")."""
    out = text(value) if isinstance(value, str) else ""
    return "" if out.lower() in _NOT_A_VALUE else out
