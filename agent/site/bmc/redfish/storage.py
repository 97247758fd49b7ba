"""Storage over Redfish: the System's Storage (controllers, drives, volumes) or SimpleStorage,
and volumes created and deleted.

Functions over a ``RedfishSession`` (agent/site/bmc/redfish/session.py).
"""

from __future__ import annotations

from agent.errors import BmcRefused, Unsupported
from agent.proto import site_pb2
from agent.site.bmc.redfish import tasks
from agent.site.bmc.redfish.session import Doc, RedfishSession, count, dicts, link, text


def _storage_refs(s: RedfishSession) -> list[str]:
    system = s.system()
    ref = link(system, "Storage")
    if not ref:
        only = " (only SimpleStorage, which has no volumes)" if link(system, "SimpleStorage") else ""
        raise Unsupported(f"Redfish BMC {s.target.address}: the System has no Storage{only}")
    return s.members(ref)


def controllers(s: RedfishSession) -> list[site_pb2.BmcStorageController]:
    """The System's Storage (controllers, drives, volumes); where it has none, or lists none
    (DGX H100's AMI BMC), its SimpleStorage (older BMCs, and DMTF's public-rackmount1 mockup):
    each controller with the devices present in its bays, no volumes."""
    system = s.system()
    simple = link(system, "SimpleStorage")
    refs = s.members(link(system, "Storage")) if link(system, "Storage") else []
    if not refs and simple:
        return [_simple_storage(s.get(ref)) for ref in s.members(simple)]
    out: list[site_pb2.BmcStorageController] = []
    for ref in refs or _storage_refs(s):
        doc = s.get(ref)
        ctl = site_pb2.BmcStorageController(id=text(doc.get("Id")), name=text(doc.get("Name")))
        for drive_ref in [text(d.get("@odata.id")) for d in dicts(doc.get("Drives"))]:
            drive = s.get(drive_ref)
            ctl.drives.add(
                id=text(drive.get("Id")), model=text(drive.get("Model")),
                serial=text(drive.get("SerialNumber")), capacity_bytes=count(drive.get("CapacityBytes")),
                media_type=text(drive.get("MediaType")), protocol=text(drive.get("Protocol")),
                health=text(drive.get("Status", {}).get("Health")),
            )
        volumes = link(doc, "Volumes")
        for vol_ref in s.members(volumes) if volumes else []:
            ctl.volumes.append(_volume(s.get(vol_ref)))
        out.append(ctl)
    return out


def _simple_storage(doc: Doc) -> site_pb2.BmcStorageController:
    """A SimpleStorage resource: its Devices (no Id of their own: named by their bay), an
    Absent bay left out."""
    ctl = site_pb2.BmcStorageController(id=text(doc.get("Id")), name=text(doc.get("Name")))
    for number, device in enumerate(dicts(doc.get("Devices")), 1):
        status = device.get("Status")
        status = status if isinstance(status, dict) else {}
        if status.get("State") == "Absent":
            continue
        ctl.drives.add(id=text(device.get("Name")) or f"device-{number}", model=text(device.get("Model")),
                       capacity_bytes=count(device.get("CapacityBytes")),
                       health=text(status.get("Health")))
    return ctl


def _volume(doc: Doc) -> site_pb2.BmcVolume:
    drives = [text(d.get("@odata.id")).rstrip("/").rsplit("/", 1)[-1]
              for d in dicts(doc.get("Links", {}).get("Drives"))]
    return site_pb2.BmcVolume(
        id=text(doc.get("Id")), name=text(doc.get("Name")),
        capacity_bytes=count(doc.get("CapacityBytes")),
        raid_type=text(doc.get("RAIDType") or doc.get("VolumeType")), drives=drives,
    )


def _controller(s: RedfishSession, controller_id: str) -> Doc:
    for ref in _storage_refs(s):
        doc = s.get(ref)
        if doc.get("Id") == controller_id:
            return doc
    raise BmcRefused(f"Redfish BMC {s.target.address} has no storage controller {controller_id!r}")


def create_volume(
    s: RedfishSession, controller_id: str, *, name: str, raid_type: str, drives: list[str],
    capacity_bytes: int,
) -> site_pb2.BmcVolume:
    ctl = _controller(s, controller_id)
    volumes = link(ctl, "Volumes")
    if not volumes:
        raise Unsupported(f"Redfish BMC {s.target.address}: controller {controller_id} has no Volumes")
    collection = s.send("GET", volumes)
    allow = collection.headers.get("allow", "")
    if allow and "POST" not in allow.upper():
        raise Unsupported(f"Redfish BMC {s.target.address} does not create volumes (Allow: {allow})")
    by_id = {text(d.get("@odata.id")).rstrip("/").rsplit("/", 1)[-1]: text(d.get("@odata.id"))
             for d in dicts(ctl.get("Drives"))}
    missing = [d for d in drives if d not in by_id]
    if missing:
        raise BmcRefused(f"Redfish BMC {s.target.address}: no drive {missing} on {controller_id}")
    body: Doc = {"Name": name}
    if raid_type:
        body["RAIDType"] = raid_type
    if capacity_bytes:
        body["CapacityBytes"] = capacity_bytes
    if drives:
        body["Links"] = {"Drives": [{"@odata.id": by_id[d]} for d in drives]}
    answer = s.send("POST", volumes, json_body=body, ok=(405, 501))
    if answer.status in (405, 501):
        raise Unsupported(
            f"Redfish BMC {s.target.address} does not create volumes (HTTP {answer.status})"
        )
    location = answer.headers.get("location", "")
    if answer.status == 202 and location:
        task = tasks.follow(s, location, None)
        if task.state != "Completed":
            raise BmcRefused(f"volume creation ended {task.state}: {'; '.join(task.messages)}")
        location = ""
    if answer.doc.get("Id"):
        return _volume(answer.doc)
    if location:
        return _volume(s.get(location))
    for ref in s.members(volumes):
        doc = s.get(ref)
        if doc.get("Name") == name:
            return _volume(doc)
    raise BmcRefused(f"Redfish BMC {s.target.address} accepted the volume but does not list it")


def delete_volume(s: RedfishSession, volume_id: str) -> None:
    for ref in _storage_refs(s):
        volumes = link(s.get(ref), "Volumes")
        for vol_ref in s.members(volumes) if volumes else []:
            if vol_ref.rstrip("/").rsplit("/", 1)[-1] == volume_id:
                answer = s.send("DELETE", vol_ref, ok=(405, 501))
                if answer.status in (405, 501):
                    raise Unsupported(f"Redfish BMC {s.target.address} does not delete"
                                      f" volumes (HTTP {answer.status})")
                return
    raise BmcRefused(f"Redfish BMC {s.target.address} has no volume {volume_id!r}")
