"""The EventService's subscriptions over Redfish: one deleted, for the release gate's remedy.

A subscription is where the BMC sends its events (``Destination``): one the golden state does
not have forwards the node's alerts to whoever made it, whatever becomes of that account.
``delete`` finds it by Id in the EventService's Subscriptions, DELETEs it once and reads the
collection back: still listed is a BmcRefused; already gone is done (the remedy may be sent
again after an answer that was lost).
"""

from __future__ import annotations

import logging

from agent.errors import BmcRefused, Unsupported
from agent.site.bmc.redfish.session import RedfishSession, link

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS = 256


def _listed(s: RedfishSession) -> dict[str, str]:
    """Id -> path of each subscription."""
    service = link(s.root(), "EventService")
    collection = link(s.get(service), "Subscriptions") if service else ""
    if not collection:
        raise Unsupported(f"Redfish BMC {s.target.address} has no EventService Subscriptions")
    return {ref.rstrip("/").rsplit("/", 1)[-1]: ref for ref in s.members(collection)[:MAX_SUBSCRIPTIONS]}


def delete(s: RedfishSession, subscription: str) -> bool:
    """Delete subscription ``subscription`` (its Id); whether there was one to delete."""
    ref = _listed(s).get(subscription)
    if ref is None:
        return False
    s.send("DELETE", ref, ok=(404,))
    if subscription in _listed(s):
        raise BmcRefused(f"Redfish BMC {s.target.address} accepted deleting subscription {subscription} "
                         "but still lists it", bmc_message="read back listed")
    log.info("Redfish %s: event subscription %s deleted", s.target.address, subscription)
    return True
