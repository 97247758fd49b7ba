"""A Redfish BMC's event log, for bmc.query's ``events`` operation: every LogService of the
node's Manager and System (``LogServices`` -> each service's ``Entries``), read page by page
(``Members@odata.nextLink``) with the members as the BMC expands them (else one GET each), at
most ``events.MAX_ENTRIES`` kept: the newest ones. agent/site/bmc/events.py holds what the IPMI
side shares: ``since`` parsed, an entry kept or not.
"""

from __future__ import annotations

from agent.errors import BmcRefused, Unsupported
from agent.proto import site_pb2
from agent.site.bmc.events import entry, keep
from agent.site.bmc.redfish.session import RedfishSession, link, text

MAX_PAGES = 64               # of one Entries collection
MAX_SERVICES = 16


def entries(client: RedfishSession, since: int) -> list[site_pb2.BmcLogEntry]:
    """The entries of every LogService of the node's Manager and System since ``since``. A
    collection both link (Lenovo XCC's Manager links the System's own LogServices) is read
    once; a service or page that answers 404 is named in ``client.partial`` and the others
    are still read."""
    collections: list[str] = []
    for owner in (client.manager_ref(), client.system_ref()):
        ref = link(client.get(owner), "LogServices")
        if ref and ref.rstrip("/") not in collections:
            collections.append(ref.rstrip("/"))
    services: list[str] = []
    for ref in collections:
        for member in client.members(ref):
            if member.rstrip("/") not in {s.rstrip("/") for s in services}:
                services.append(member)
    if not services:
        raise Unsupported(f"Redfish BMC {client.target.address} has no LogServices")
    found: list[site_pb2.BmcLogEntry] = []
    for ref in services[:MAX_SERVICES]:
        try:
            found = keep(found + _service_entries(client, ref, since), since)
        except BmcRefused as exc:
            if exc.details.get("status") != "404":
                raise
            client.partial.append(f"events: {ref.rstrip('/').rsplit('/', 1)[-1]}: HTTP 404")
    return keep(found, since)


def _service_entries(client: RedfishSession, ref: str, since: int) -> list[site_pb2.BmcLogEntry]:
    service = client.get(ref)
    log_id = text(service.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1]
    page = link(service, "Entries")
    found: list[site_pb2.BmcLogEntry] = []
    for _ in range(MAX_PAGES):
        if not page:
            break
        doc = client.get(page)
        for member in doc.get("Members", []):
            if not isinstance(member, dict):
                continue
            if "Created" not in member and "Message" not in member and member.get("@odata.id"):
                member = client.get(str(member["@odata.id"]))   # not expanded: read it
            found.append(entry(member, log_id))
        found = keep(found, since)
        next_page = doc.get("Members@odata.nextLink")
        page = next_page if isinstance(next_page, str) else ""
    return found
