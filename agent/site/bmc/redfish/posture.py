"""The Manager's network protocols over Redfish (ManagerNetworkProtocol): read, and put back.

``read``: the protocols of agent/site/bmc/posture.py from the NetworkProtocol resource of the
Manager that manages the System (not a satellite's: the HGX HMC of a GH200 or DGX lists its own).
``put_back``: one PATCH of ``{"<Protocol>": {"ProtocolEnabled": bool}}`` for every drifted
protocol the vendor's row does not name as refused (``Vendor.posture_fixed``), with If-Match
(the session's ETag rules), sent once; an ambiguous answer is read back, never resent. What the
BMC refused, ignored or is known not to take comes back by protocol, for the gate's findings.
"""

from __future__ import annotations

import logging

from agent.errors import BmcRefused, Unsupported
from agent.site.bmc.client import Unconfirmed
from agent.site.bmc.posture import PROTOCOLS, ProtocolState, drifted
from agent.site.bmc.redfish.session import RedfishSession, count, link

log = logging.getLogger(__name__)


def _ref(s: RedfishSession) -> str:
    ref = link(s.manager(), "NetworkProtocol")
    if not ref:
        raise Unsupported(f"Redfish BMC {s.target.address}: its Manager has no NetworkProtocol")
    return ref


def read(s: RedfishSession) -> list[ProtocolState]:
    """Each of PROTOCOLS as the Manager's NetworkProtocol lists it (``listed`` False where it
    does not, or gives no ProtocolEnabled)."""
    doc = s.get(_ref(s))
    out: list[ProtocolState] = []
    for protocol in PROTOCOLS:
        entry = doc.get(protocol)
        enabled = entry.get("ProtocolEnabled") if isinstance(entry, dict) else None
        if not isinstance(enabled, bool):
            out.append(ProtocolState(protocol, listed=False))
            continue
        port = count(entry.get("Port")) if isinstance(entry, dict) else 0
        out.append(ProtocolState(protocol, listed=True, enabled=enabled, port=min(port, 65535)))
    return out


def put_back(s: RedfishSession, expected: dict[str, bool],
             before: list[ProtocolState]) -> tuple[list[ProtocolState], dict[str, str]]:
    """Put the drifted protocols back in one PATCH, sent once, and read back. (the states read
    after, or ``before`` where nothing was sent; protocol -> why it was not put back)."""
    wanted = drifted(expected, before)
    if not wanted:
        return before, {}
    row = s.vendor()
    why: dict[str, str] = {p: f"not sent: {row.posture_fixed_why}" for p in wanted if p in row.posture_fixed}
    body = {p: {"ProtocolEnabled": on} for p, on in wanted.items() if p not in why}
    if not body:
        return before, why
    ref = _ref(s)

    def taken() -> bool:
        return not set(drifted(expected, read(s))) & set(body)

    try:
        s.write("PATCH", ref, body, etag=True, taken=taken)
    except Unconfirmed as exc:
        why.update({p: f"answered ambiguously ({exc.message}); not sent again" for p in body})
    except BmcRefused as exc:
        said = exc.details.get("bmc_message") or exc.message
        why.update({p: f"the BMC refused the PATCH: {said}" for p in body})
    after = read(s)
    still = drifted(expected, after)
    for p in body:
        if p in still and p not in why:
            why[p] = "the BMC accepted the PATCH and reads back unchanged (ignored)"
    log.info("Redfish %s: posture put back: %s; not: %s", s.target.address,
             ", ".join(sorted(set(body) - set(still))) or "none", ", ".join(sorted(why)) or "none")
    return after, why


def set_service(s: RedfishSession, protocol: str, enabled: bool) -> bool:
    """One service of the NetworkProtocol (any it lists: VNC, KVMIP, SSH, SNMP, ...) turned on or
    off: one PATCH with If-Match, sent once (an ambiguous answer read back), read back; whether
    a write was needed. Unsupported where the resource does not list it; BmcRefused where it
    reads back otherwise."""
    where = f"Redfish BMC {s.target.address}"
    ref = _ref(s)

    def now() -> object:
        entry = s.get(ref).get(protocol)
        return entry.get("ProtocolEnabled") if isinstance(entry, dict) else None

    entry = s.get(ref).get(protocol)
    if not isinstance(entry, dict) or not isinstance(entry.get("ProtocolEnabled"), bool):
        raise Unsupported(f"{where}: its NetworkProtocol lists no {protocol} with ProtocolEnabled")
    if entry["ProtocolEnabled"] is enabled:
        return False
    s.write("PATCH", ref, {protocol: {"ProtocolEnabled": enabled}}, etag=True, taken=lambda: now() is enabled)
    if now() is not enabled:
        raise BmcRefused(f"{where} accepted turning {protocol} {'on' if enabled else 'off'} but reads it "
                         "back unchanged", bmc_message="read back unchanged")
    log.info("%s: %s turned %s", where, protocol, "on" if enabled else "off")
    return True
