"""Virtual media over Redfish: the System's (newer BMCs) or the Manager's VirtualMedia, an
image inserted and ejected.

Functions over a ``RedfishSession`` (agent/site/bmc/redfish/session.py).
"""

from __future__ import annotations

import logging

from agent.errors import Unsupported
from agent.net import http
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


def _holds(doc: Doc) -> bool:
    """Whether a slot holds a medium: Inserted where the BMC says it (a Supermicro slot keeps
    its Image after EjectMedia, ansible-collections/community.general#12537), else an Image."""
    inserted = doc.get("Inserted")
    return inserted is True if isinstance(inserted, bool) else bool(doc.get("Image"))


# The VirtualMedia schema's TransferProtocolType values, as the schemes of image URLs.
_PROTOCOL_SCHEMES = {"HTTP": ("http",), "HTTPS": ("https",), "CIFS": ("smb", "cifs"), "NFS": ("nfs",),
                     "FTP": ("ftp",), "SFTP": ("sftp",), "SCP": ("scp",), "TFTP": ("tftp",)}


def _slots(s: RedfishSession, media_type: str) -> list[tuple[str, Doc]]:
    """The slots that take ``media_type`` (among those the vendor mounts network images in), in
    the BMC's order: (path, the slot as read now)."""
    vendor = s.vendor()
    out: list[tuple[str, Doc]] = []
    for ref in _media_refs(s):
        doc = s.get(ref)
        slot = text(doc.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1]
        if media_type not in doc.get("MediaTypes", []):
            continue
        if vendor.media_slot_prefixes and not slot.startswith(vendor.media_slot_prefixes):
            continue
        out.append((ref, doc))
    return out


def _no_slot(s: RedfishSession, media_type: str) -> Unsupported:
    prefixes = s.vendor().media_slot_prefixes
    return Unsupported(f"Redfish BMC {s.target.address} has no virtual {media_type} drive"
                       + (f" among its {'/'.join(prefixes)} slots" if prefixes else ""))


def _slot_schemes(s: RedfishSession, doc: Doc) -> tuple[str, ...]:
    """The image schemes a slot mounts: its TransferProtocolType allowable values (on the slot,
    on its InsertMedia action, or in that action's ActionInfo: the BMC's own word), else the
    vendor row's ``media_schemes``; () where neither says (any)."""
    listed = doc.get("TransferProtocolType@Redfish.AllowableValues")
    action = doc.get("Actions", {}).get("#VirtualMedia.InsertMedia", {})
    if listed is None and isinstance(action, dict):
        listed = action.get("TransferProtocolType@Redfish.AllowableValues")
        info = action.get("@Redfish.ActionInfo")
        if listed is None and isinstance(info, str) and info:
            for param in s.get(info).get("Parameters", []):
                if isinstance(param, dict) and param.get("Name") == "TransferProtocolType":
                    listed = param.get("AllowableValues")
    schemes = tuple(sch for value in listed if isinstance(value, str)
                    for sch in _PROTOCOL_SCHEMES.get(value.upper(), ())) if isinstance(listed, list) else ()
    return schemes or s.vendor().media_schemes     # the BMC's own word first, else the row's


def mountable_schemes(s: RedfishSession, media_type: str = "CD") -> tuple[str, ...]:
    """The image URL schemes the slot ``insert_media`` would use mounts (() for any): what
    boot.prepareRamdisk asks before it makes a node's media, to hand URLs the BMC takes."""
    slots = _slots(s, media_type)
    if not slots:
        raise _no_slot(s, media_type)
    return _slot_schemes(s, slots[0][1])


def insert_media(s: RedfishSession, image_url: str, *, media_type: str = "CD",
                 alternates: tuple[str, ...] = ()) -> site_pb2.BmcVirtualMedia:
    """Insert ``image_url`` (or the first of ``alternates``, the same image at other URLs,
    where the slot does not mount the first's scheme) into the first slot that takes
    ``media_type`` (among those the vendor mounts network images in), with the InsertMedia
    properties the vendor takes; the slot as read back afterwards (the caller checks that it
    holds the image). An image whose scheme the slot does not take (``_slot_schemes``) is
    refused before anything is written."""
    for url in (image_url, *alternates):
        http.check_url(url)
    where = f"Redfish BMC {s.target.address}"
    vendor = s.vendor()
    slots = _slots(s, media_type)
    if not slots:
        raise _no_slot(s, media_type)
    ref, doc = slots[0]
    slot = text(doc.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1]
    schemes = _slot_schemes(s, doc)
    chosen = _mountable(schemes, (image_url, *alternates))
    if not chosen:
        scheme = image_url.split(":", 1)[0].lower()
        raise Unsupported(f"{where} ({vendor.name}) mounts {', '.join(schemes)} images only,"
                          f" not {scheme}://; to serve the site's media over https, configure its TLS:"
                          f" site_https_port, site_tls_cert and site_tls_key"
                          f" (docs/site.md, \"Virtual media over https\")")
    image_url = chosen
    if _holds(doc):
        _eject(s, ref, doc)

    def taken() -> bool:
        back = s.get(ref)
        return _holds(back) and back.get("Image") == image_url

    action = doc.get("Actions", {}).get("#VirtualMedia.InsertMedia", {})
    if isinstance(action, dict) and action.get("target"):
        full = {"Image": image_url, "Inserted": True, "WriteProtected": True}
        body = {k: v for k, v in full.items() if k in vendor.insert_properties}
        s.write("POST", str(action["target"]), body, taken=taken)
    else:
        s.write("PATCH", ref, {"Image": image_url, "Inserted": True}, etag=True, taken=taken)
    # The file's name alone: a path may hold a capability (the site's /vm/<token>/).
    log.info("%s: …/%s inserted into %s", where, http.redact(image_url).rsplit("/", 1)[-1], slot)
    return _media_of(s.get(ref))


def _mountable(schemes: tuple[str, ...], urls: tuple[str, ...]) -> str:
    """The first of ``urls`` whose scheme is among ``schemes`` (any, where there are none); ""
    when none is."""
    for url in urls:
        if not schemes or url.split(":", 1)[0].lower() in schemes:
            return url
    return ""


def eject_media(s: RedfishSession) -> None:
    for ref in _media_refs(s):
        doc = s.get(ref)
        if _holds(doc):
            _eject(s, ref, doc)


def _eject(s: RedfishSession, ref: str, doc: Doc) -> None:
    def taken() -> bool:
        return not _holds(s.get(ref))

    action = doc.get("Actions", {}).get("#VirtualMedia.EjectMedia", {})
    if isinstance(action, dict) and action.get("target"):
        s.write("POST", str(action["target"]), {}, taken=taken)
    else:
        s.write("PATCH", ref, {"Image": None, "Inserted": False}, etag=True, taken=taken)


def _media_of(doc: Doc) -> site_pb2.BmcVirtualMedia:
    return site_pb2.BmcVirtualMedia(
        id=text(doc.get("Id")), image=text(doc.get("Image")), inserted=doc.get("Inserted") is True,
        media_types=[text(t) for t in doc.get("MediaTypes", []) if isinstance(t, str)],
    )

