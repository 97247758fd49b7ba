"""The BMC's configuration over Redfish, read whole for the release gate's golden state.

``read(s)`` gives three sources of flat ``path -> value`` items (agent/policy/release/golden.py):

  bmc       AccountService (its LDAP / ActiveDirectory included) with every account by slot
            (``AccountService/Accounts/<Id>/UserName``) and every role; EventService with every
            subscription (``EventService/Subscriptions/<Id>/Destination``); the Manager's
            NetworkProtocol (every service: ``NetworkProtocol/VNC/ProtocolEnabled``), its
            GraphicalConsole, SerialConsole and CommandShell, its HostInterfaces; every
            certificate the CertificateService locates (``Certificates/<its path>/...``); every
            VirtualMedia slot (``VirtualMedia/<Id>/Inserted``); the System's Boot (the override:
            ``Boot/BootSourceOverrideTarget``) and its SecureBoot resource.
  bios      every BIOS attribute, current (``Attributes/<name>``) and pending in the settings
            object (``Pending/<name>``).
  firmware  every FirmwareInventory component's version (``<Id>/Version``), as bmc.query and the
            firmware sets read them (firmware.inventory).

A resource is flattened whole: each scalar under its path, ``/`` between keys (a ``/`` inside a
key written ``%2F``), a list by index, a link (an object with only ``@odata.id``) as the path it
names; the OData and Redfish annotations (``@odata.*``, ``@Redfish.*``, ``*@odata.count``) and
``Actions`` are left out (what the service offers, not its configuration). A value is text:
strings as given, ``true``/``false``, ``null``, numbers as JSON; one longer than the golden's
MAX_TEXT is ``sha256:<hex>``. Bounded: MAX_MEMBERS of a collection, MAX_LIST of a list, MAX_ITEMS
of a source, MAX_DEPTH of nesting; every answer already bounded by the session (limits.loads_json).

A resource the BMC does not have (not linked, or 404) gives no items: the diff sees what
disappeared. Any other failure (a refusal, a timeout, an unreachable BMC) makes its whole source
unreadable with why: a finding, never a pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from agent.errors import AgentError, Cancelled, Unsupported
from agent.policy.release.golden import MAX_TEXT
from agent.site.bmc.redfish import firmware
from agent.site.bmc.redfish.session import Doc, RedfishSession, dicts, link, text

MAX_MEMBERS = 256             # of one collection, read
MAX_LIST = 64                 # of one list inside a resource
MAX_ITEMS = 50_000            # of one source
MAX_DEPTH = 12                # objects inside each other, flattened
MAX_CERTIFICATES = 64
SOURCES = ("bmc", "bios", "firmware")

Items = dict[str, str]


class _Full(AgentError):
    """A source past MAX_ITEMS: unreadable, never cut silently."""


def value_text(value: Any) -> str:
    """A scalar as the golden state spells it."""
    if isinstance(value, str):
        out = value
    elif isinstance(value, bool):
        out = "true" if value else "false"
    elif value is None:
        out = "null"
    else:
        out = json.dumps(value)
    if len(out) > MAX_TEXT:
        return "sha256:" + hashlib.sha256(out.encode()).hexdigest()
    return out


def _key(name: str) -> str:
    return name.replace("/", "%2F")


def _skipped(key: str) -> bool:
    return key.startswith(("@odata.", "@Redfish.", "@Message.")) or "@odata." in key \
        or "@Redfish." in key or key == "Actions"


def flatten(prefix: str, value: Any, out: Items, depth: int = 0) -> None:
    """``value``'s scalars into ``out`` under ``prefix``; see the module docstring."""
    if len(out) >= MAX_ITEMS:
        raise _Full(f"more than {MAX_ITEMS} items")
    if isinstance(value, dict):
        if set(value) == {"@odata.id"}:
            out[prefix] = value_text(value["@odata.id"])
            return
        kept = [k for k in value if not _skipped(k)]
        if not kept or depth >= MAX_DEPTH:
            out[prefix] = "{}" if not kept else "sha256:" + hashlib.sha256(
                json.dumps(value, sort_keys=True).encode()).hexdigest()
            return
        for k in kept:
            flatten(f"{prefix}/{_key(k)}" if prefix else _key(k), value[k], out, depth + 1)
    elif isinstance(value, list):
        if not value:
            out[prefix] = "[]"
        for i, v in enumerate(value[:MAX_LIST]):
            flatten(f"{prefix}/{i}", v, out, depth + 1)
        if len(value) > MAX_LIST:
            out[f"{prefix}/..."] = f"{len(value)} entries"
    else:
        out[prefix] = value_text(value)


def _get(s: RedfishSession, ref: str) -> Doc | None:
    """The resource at ``ref``; None where the BMC has none (404)."""
    if not ref:
        return None
    answer = s.send("GET", ref, ok=(404,))
    return answer.doc if answer.status == 200 else None


def _member_id(ref: str, doc: Doc) -> str:
    return _key(text(doc.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1])


def _collection(s: RedfishSession, prefix: str, ref: str, out: Items) -> None:
    """Every member of the collection at ``ref``, each under ``prefix/<its Id>``."""
    doc = _get(s, ref)
    if doc is None:
        return
    refs = [text(m.get("@odata.id")) for m in dicts(doc.get("Members"))]
    for member in [r for r in refs if r][:MAX_MEMBERS]:
        got = _get(s, member)
        if got is not None:
            flatten(f"{prefix}/{_member_id(member, got)}", got, out)
    if len(refs) > MAX_MEMBERS:
        out[f"{prefix}/..."] = f"{len(refs)} members"


def _service(s: RedfishSession, name: str, collections: tuple[str, ...], out: Items) -> None:
    """A service of the root (AccountService, EventService): its own properties, and each of
    ``collections`` it links, member by member."""
    doc = _get(s, link(s.root(), name))
    if doc is None:
        return
    flatten(name, {k: v for k, v in doc.items() if k not in collections}, out)
    for c in collections:
        _collection(s, f"{name}/{c}", link(doc, c), out)


def _certificates(s: RedfishSession, https: str, out: Items) -> None:
    """Every certificate the CertificateService locates, and those of the Manager's HTTPS
    (``https``, its collection), each under its path on the BMC."""
    listed = _get(s, https)
    refs = [text(c.get("@odata.id")) for c in dicts(listed.get("Members"))] if listed is not None else []
    locations = _get(s, link(_get(s, link(s.root(), "CertificateService")) or {}, "CertificateLocations"))
    if locations is not None:
        linked = locations.get("Links")
        refs += [text(c.get("@odata.id")) for c in dicts(linked.get("Certificates"))] \
            if isinstance(linked, dict) else []
    for ref in list(dict.fromkeys(r.rstrip("/") for r in refs if r))[:MAX_CERTIFICATES]:
        doc = _get(s, ref)
        if doc is not None:
            flatten("Certificates/" + _key(ref.removeprefix("/redfish/v1/")), doc, out)


def _bmc(s: RedfishSession) -> Items:
    out: Items = {}
    _service(s, "AccountService", ("Accounts", "Roles"), out)
    _service(s, "EventService", ("Subscriptions",), out)
    manager = s.manager()
    protocol = _get(s, link(manager, "NetworkProtocol"))
    https: Doc = {}
    if protocol is not None:
        flatten("NetworkProtocol", protocol, out)
        https = protocol["HTTPS"] if isinstance(protocol.get("HTTPS"), dict) else {}
    for name in ("GraphicalConsole", "SerialConsole", "CommandShell"):
        if isinstance(manager.get(name), dict):
            flatten(f"Manager/{name}", manager[name], out)
    _collection(s, "HostInterfaces", link(manager, "HostInterfaces"), out)
    system = s.system()
    _collection(s, "VirtualMedia", link(system, "VirtualMedia") or link(manager, "VirtualMedia"), out)
    boot = system.get("Boot")
    if isinstance(boot, dict):
        flatten("Boot", boot, out)
    secure = _get(s, link(system, "SecureBoot"))
    if secure is not None:
        flatten("SecureBoot", secure, out)
    _certificates(s, link(https, "Certificates"), out)
    return out


def _bios(s: RedfishSession) -> Items:
    out: Items = {}
    ref = link(s.system(), "Bios")
    bios = _get(s, ref)
    if bios is None:
        raise Unsupported("the System has no Bios")
    attributes = bios.get("Attributes")
    if not isinstance(attributes, dict):
        raise Unsupported("the Bios lists no Attributes")
    for name, value in attributes.items():
        flatten(f"Attributes/{_key(name)}", value, out)
    settings = bios.get("@Redfish.Settings")
    settings_ref = link(settings, "SettingsObject") if isinstance(settings, dict) else ""
    if settings_ref and settings_ref.rstrip("/") != ref.rstrip("/"):
        pending = _get(s, settings_ref)
        waiting = pending.get("Attributes") if pending is not None else None
        for name, value in (waiting.items() if isinstance(waiting, dict) else ()):
            flatten(f"Pending/{_key(name)}", value, out)
    return out


def _firmware(s: RedfishSession) -> Items:
    out: Items = {}
    for c in firmware.inventory(s):
        out[f"{_key(c.id or c.uri or c.name)}/Version"] = value_text(c.version)
    return out


READERS: dict[str, Callable[[RedfishSession], Items]] = {"bmc": _bmc, "bios": _bios, "firmware": _firmware}


def read(s: RedfishSession, sources: tuple[str, ...] = SOURCES) -> tuple[dict[str, Items], dict[str, str]]:
    """Each of ``sources`` read whole, and those that could not be read (source -> why)."""
    got: dict[str, Items] = {}
    unreadable: dict[str, str] = {}
    for source in sources:
        try:
            got[source] = READERS[source](s)
        except Cancelled:
            raise
        except AgentError as exc:
            unreadable[source] = exc.message
    return got, unreadable
