"""The BMC's user accounts over Redfish (AccountService Accounts), for the release's check.

``accounts`` lists every account that has a UserName (iDRAC lists its 16 slots, the empty
ones without one) with its RoleId and Enabled; an account without ``Enabled`` (a service that
cannot disable one: the iLO 5 recording's) logs in, and is read as enabled; ``disable`` refuses
it (Unsupported) before any write. ``disable`` PATCHes ``Enabled: false`` to each
account of that name once (with If-Match) and reads it back: an account still enabled after
the write is a BmcRefused, not a success.
"""

from __future__ import annotations

import logging

from agent.errors import BmcRefused, InvalidParameters, Unsupported
from agent.policy.release.state import Account
from agent.site.bmc.redfish.session import Doc, RedfishSession, link, text

log = logging.getLogger(__name__)

MAX_ACCOUNTS = 256            # of a collection's members, read


def _collection(s: RedfishSession) -> str:
    service = link(s.root(), "AccountService")
    accounts = link(s.get(service), "Accounts") if service else ""
    if not accounts:
        raise Unsupported(f"Redfish BMC {s.target.address} has no AccountService Accounts")
    return accounts


def _account(ref: str, doc: Doc) -> Account:
    return Account(text(doc.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1], text(doc.get("UserName")),
                   text(doc.get("RoleId")), doc.get("Enabled") is not False)


def _listed(s: RedfishSession) -> list[tuple[str, Account]]:
    out = []
    for ref in s.members(_collection(s))[:MAX_ACCOUNTS]:
        account = _account(ref, s.get(ref))
        if account.user_name:
            out.append((ref, account))
    return out


def accounts(s: RedfishSession) -> list[Account]:
    return [a for _, a in _listed(s)]


def disable(s: RedfishSession, username: str) -> list[Account]:
    """Disable every enabled account named ``username``; the accounts of that name as read back
    (BmcRefused when there is none, or one is still enabled after its write)."""
    where = f"Redfish BMC {s.target.address}"
    named = [(ref, a) for ref, a in _listed(s) if a.user_name == username]
    if not named:
        raise BmcRefused(f"{where} has no account {username!r}", bmc_message="no such account")
    back = []
    for ref, account in named:
        if account.enabled and "Enabled" not in s.get(ref):
            raise Unsupported(f"{where}: account {username!r} has no Enabled property: this BMC cannot "
                              "disable it over Redfish; remove it, or its login privilege, by hand")
    for ref, account in named:
        if account.enabled:
            def off(ref: str = ref) -> bool:
                return s.get(ref).get("Enabled") is False
            s.write("PATCH", ref, {"Enabled": False}, etag=True, taken=off)
            log.info("%s: account %r (id %s) disabled", where, username, account.id)
        now = _account(ref, s.get(ref))
        if now.enabled:
            raise BmcRefused(f"{where} accepted disabling account {username!r} but reads it back enabled",
                             bmc_message="read back Enabled true")
        back.append(now)
    return back


def reset_slot(s: RedfishSession, slot: str, user_name: str, role: str, enabled: bool | None,
               site_user: str) -> Account:
    """The account in slot ``slot`` (its Id) put back to ``user_name`` (and ``role``, ``enabled``
    where given): one PATCH of what differs, with If-Match, sent once (an ambiguous answer read
    back), then read back; BmcRefused where it reads back otherwise. The site's own account is
    never renamed nor disabled (InvalidParameters)."""
    where = f"Redfish BMC {s.target.address}"
    ref = next((r for r in s.members(_collection(s))[:MAX_ACCOUNTS]
                if r.rstrip("/").rsplit("/", 1)[-1] == slot), "")
    doc = s.get(ref) if ref else {}
    if not ref or text(doc.get("Id") or slot) != slot:
        raise BmcRefused(f"{where} has no account slot {slot!r}", bmc_message="no such account")
    wanted: Doc = {"UserName": user_name}
    if role:
        wanted["RoleId"] = role
    if enabled is not None:
        wanted["Enabled"] = enabled
    now = _account(ref, doc)
    if now.user_name == site_user and (user_name != site_user or enabled is False):
        raise InvalidParameters(f"{where}: slot {slot} holds the site's own account {site_user!r}; "
                                "it is not reset")
    body = {k: v for k, v in wanted.items() if doc.get(k) != v}
    if body:
        def taken() -> bool:
            got = s.get(ref)
            return all(got.get(k) == v for k, v in body.items())
        s.write("PATCH", ref, body, etag=True, taken=taken)
        log.info("%s: account slot %s reset (%s)", where, slot, ", ".join(sorted(body)))
    back = s.get(ref)
    if any(back.get(k) != v for k, v in wanted.items()):
        raise BmcRefused(f"{where} accepted resetting account slot {slot} but reads back "
                         f"{ {k: back.get(k) for k in wanted} }", bmc_message="read back differs")
    return _account(ref, back)
