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


def insert_media(s: RedfishSession, image_url: str, *, media_type: str = "CD",
                 alternates: tuple[str, ...] = ()) -> site_pb2.BmcVirtualMedia:
    """Insert ``image_url`` (or the first of ``alternates``, the same image at other URLs,
    where the vendor does not mount the first's scheme) into the first slot that takes
    ``media_type`` (among those the vendor mounts network images in), with the InsertMedia
    properties the vendor takes; the slot as read back afterwards (the caller checks that it
    holds the image). An image whose scheme the vendor's virtual media does not take is
    refused before anything is written."""
    for url in (image_url, *alternates):
        http.check_url(url)
    where = f"Redfish BMC {s.target.address}"
    vendor = s.vendor()
    chosen = _mountable(vendor.media_schemes, (image_url, *alternates))
    if not chosen:
        scheme = image_url.split(":", 1)[0].lower()
        raise Unsupported(f"{where} ({vendor.name}) mounts {', '.join(vendor.media_schemes)} images only,"
                          f" not {scheme}://; to serve the site's media over https, configure its TLS:"
                          f" site_https_port, site_tls_cert and site_tls_key"
                          f" (docs/site.md, \"Virtual media over https\")")
    image_url = chosen
    for ref in _media_refs(s):
        doc = s.get(ref)
        slot = text(doc.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1]
        if media_type not in doc.get("MediaTypes", []):
            continue
        if vendor.media_slot_prefixes and not slot.startswith(vendor.media_slot_prefixes):
            continue
        if _holds(doc):
            _eject(s, ref, doc)

        def taken(ref: str = ref) -> bool:
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
    raise Unsupported(f"{where} has no virtual {media_type} drive"
                      + (f" among its {'/'.join(vendor.media_slot_prefixes)} slots"
                         if vendor.media_slot_prefixes else ""))


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

