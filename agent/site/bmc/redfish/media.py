"""Virtual media over Redfish: the System's (newer BMCs) or the Manager's VirtualMedia, an
image inserted and ejected.

Functions over a ``RedfishSession`` (agent/site/bmc/redfish/session.py).
"""

from __future__ import annotations

import logging

from agent.errors import Unsupported
from agent.images import http
from agent.proto import site_pb2
from agent.site.bmc.redfish.session import Doc, RedfishSession, link, text

log = logging.getLogger(__name__)

def _media_refs(s: RedfishSession) -> list[str]:
    """The System's VirtualMedia (newer BMCs), else the Manager's."""
    ref = link(s.system(), "VirtualMedia") or link(s.manager(), "VirtualMedia")
    if not ref:
        raise Unsupported(f"Redfish BMC {s.target.address} has no VirtualMedia")
    return s.members(ref)


def virtual_media(s: RedfishSession) -> list[site_pb2.BmcVirtualMedia]:
    out: list[site_pb2.BmcVirtualMedia] = []
    for ref in _media_refs(s):
        out.append(_media_of(s.get(ref)))
    return out


def insert_media(s: RedfishSession, image_url: str, *, media_type: str = "CD") -> site_pb2.BmcVirtualMedia:
    """Insert ``image_url`` into the first drive that takes ``media_type``; the drive as
    read back afterwards (the caller checks that it holds the image)."""
    http.check_url(image_url)
    for ref in _media_refs(s):
        doc = s.get(ref)
        if media_type not in doc.get("MediaTypes", []):
            continue
        if doc.get("Inserted") is True:
            _eject(s, ref, doc)
        action = doc.get("Actions", {}).get("#VirtualMedia.InsertMedia", {})
        if isinstance(action, dict) and action.get("target"):
            s.send("POST", action["target"],
                      json_body={"Image": image_url, "Inserted": True, "WriteProtected": True})
        else:
            s.patch(ref, {"Image": image_url, "Inserted": True})
        # The file's name alone: a path may hold a capability (the site's /vm/<token>/).
        log.info("Redfish %s: …/%s inserted into %s", s.target.address,
                 http.redact(image_url).rsplit("/", 1)[-1], doc.get("Id"))
        return _media_of(s.get(ref))
    raise Unsupported(f"Redfish BMC {s.target.address} has no virtual {media_type} drive")


def eject_media(s: RedfishSession) -> None:
    for ref in _media_refs(s):
        doc = s.get(ref)
        if doc.get("Inserted") is True or doc.get("Image"):
            _eject(s, ref, doc)


def _eject(s: RedfishSession, ref: str, doc: Doc) -> None:
    action = doc.get("Actions", {}).get("#VirtualMedia.EjectMedia", {})
    if isinstance(action, dict) and action.get("target"):
        s.send("POST", action["target"], json_body={})
    else:
        s.patch(ref, {"Image": None, "Inserted": False})




def _media_of(doc: Doc) -> site_pb2.BmcVirtualMedia:
    return site_pb2.BmcVirtualMedia(
        id=text(doc.get("Id")), image=text(doc.get("Image")), inserted=doc.get("Inserted") is True,
        media_types=[text(t) for t in doc.get("MediaTypes", []) if isinstance(t, str)],
    )

