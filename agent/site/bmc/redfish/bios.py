"""BIOS settings over Redfish, checked against the BMC's own AttributeRegistry.

``read`` gives the System's Bios attributes (the current values) and what is pending in its
settings object. ``set_attributes`` checks every asked attribute against the registry the Bios
names (``AttributeRegistry``, found in the service's ``Registries`` and read through its
``Location``): it must exist, be neither ReadOnly nor Immutable, and have a value of its type
(an Enumeration's ValueName, an Integer within its bounds and increment, a String within its
lengths and ValueExpression, a Boolean); one that is not refuses the whole set before any
write. The set goes to the settings object the Bios names in ``@Redfish.Settings`` (else the
Bios itself) in one PATCH with If-Match, with ``@Redfish.SettingsApplyTime`` OnReset where the
BMC lists it; it is applied at the node's next reset, and ``read`` after it shows the values.
``baseline`` reads the release's expected attributes the same way (bmc.query baseline).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from agent.errors import BmcRefused, InvalidParameters, Unsupported
from agent.policy.release.state import BiosValue
from agent.site.bmc.redfish.session import Doc, RedfishSession, dicts, link, text

log = logging.getLogger(__name__)

MAX_REGISTRIES = 8            # of the Registries members named like a BIOS registry, read
REGISTRY_PREFIX = "BiosAttributeRegistry"


def _bios(s: RedfishSession) -> tuple[str, Doc]:
    ref = link(s.system(), "Bios")
    if not ref:
        raise Unsupported(f"Redfish BMC {s.target.address}: the System has no Bios")
    return ref, s.get(ref)


def _settings_ref(bios: Doc) -> str:
    settings = bios.get("@Redfish.Settings")
    return link(settings, "SettingsObject") if isinstance(settings, dict) else ""


def registry(s: RedfishSession, bios: Doc) -> dict[str, Doc]:
    """The registry's attributes by name. Unsupported where the BMC publishes none: nothing
    could be checked, so nothing is set."""
    where = f"Redfish BMC {s.target.address}"
    named = text(bios.get("AttributeRegistry"))
    collection = link(s.root(), "Registries")
    listed = s.send("GET", collection, ok=(404,)) if collection else None
    refs = [text(m.get("@odata.id")) for m in dicts(listed.doc.get("Members"))] \
        if listed is not None and listed.status == 200 else []
    wanted = [r for r in refs if r.rstrip("/").rsplit("/", 1)[-1].startswith(REGISTRY_PREFIX)]
    wanted.sort(key=lambda r: r.rstrip("/").rsplit("/", 1)[-1] != named)   # the named one first
    for ref in wanted[:MAX_REGISTRIES]:
        entry = s.send("GET", ref, ok=(404,))
        locations = [text(loc.get("Uri")) for loc in dicts(entry.doc.get("Location"))
                     if text(loc.get("Language")) in ("", "en") and loc.get("Uri")]
        for uri in locations:
            answer = s.send("GET", uri, ok=(404,))
            entries = answer.doc.get("RegistryEntries")
            attributes = entries.get("Attributes") if isinstance(entries, dict) else None
            if answer.status == 200 and isinstance(attributes, list):
                return {text(a.get("AttributeName")): a for a in dicts(attributes) if a.get("AttributeName")}
    raise Unsupported(f"{where} publishes no BIOS AttributeRegistry ({named or 'none named'}):"
                      " attributes cannot be checked, so none are set")


def check(attributes: dict[str, Any], entries: dict[str, Doc]) -> dict[str, Any]:
    """``attributes`` (values as given: strings from the request) typed by the registry;
    InvalidParameters naming every one that is unknown, read-only or out of its range."""
    typed: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in attributes.items():
        entry = entries.get(name)
        if entry is None:
            problems.append(f"{name}: not in the BMC's AttributeRegistry")
            continue
        if entry.get("ReadOnly") is True or entry.get("Immutable") is True:
            problems.append(f"{name}: read-only")
            continue
        try:
            typed[name] = _typed(entry, value)
        except ValueError as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        raise InvalidParameters("BIOS attributes refused before any write: " + "; ".join(problems))
    return typed


def _typed(entry: Doc, value: Any) -> Any:
    kind = text(entry.get("Type"))
    raw = value if not isinstance(value, str) else value.strip()
    if kind == "Enumeration":
        allowed = [text(v.get("ValueName")) for v in dicts(entry.get("Value"))]
        if str(raw) not in allowed:
            raise ValueError(f"{raw!r} is not one of {allowed}")
        return str(raw)
    if kind == "Integer":
        try:
            number = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{raw!r} is not an integer") from None
        low, high = entry.get("LowerBound"), entry.get("UpperBound")
        if (isinstance(low, int) and number < low) or (isinstance(high, int) and number > high):
            raise ValueError(f"{number} is outside {low}..{high}")
        step = entry.get("ScalarIncrement")
        if isinstance(step, int) and step > 0 and (number - (low if isinstance(low, int) else 0)) % step:
            raise ValueError(f"{number} is not a step of {step}")
        return number
    if kind == "Boolean":
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("true", "false"):
            return str(raw).lower() == "true"
        raise ValueError(f"{raw!r} is not true or false")
    if kind in ("String", "Password"):
        word = str(raw)
        low, high = entry.get("MinLength"), entry.get("MaxLength")
        if (isinstance(low, int) and len(word) < low) or (isinstance(high, int) and len(word) > high):
            raise ValueError(f"a length of {len(word)} is outside {low}..{high}")
        pattern = entry.get("ValueExpression")
        if isinstance(pattern, str) and pattern and not re.fullmatch(pattern, word):
            raise ValueError("does not match the registry's ValueExpression")
        return word
    raise ValueError(f"of type {kind or 'unknown'}, which this client does not set")


def set_attributes(s: RedfishSession, attributes: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Check ``attributes`` against the registry, then PATCH them to the settings object once.
    The values read back from where they were written, and whether they wait for a reset."""
    where = f"Redfish BMC {s.target.address}"
    bios_ref, bios = _bios(s)
    typed = check(attributes, registry(s, bios))
    target = _settings_ref(bios) or bios_ref
    body: Doc = {"Attributes": typed}
    settings = bios.get("@Redfish.Settings")
    times = settings.get("SupportedApplyTimes") if isinstance(settings, dict) else None
    if isinstance(times, list) and "OnReset" in times:
        body["@Redfish.SettingsApplyTime"] = {"ApplyTime": "OnReset"}

    def read_back() -> dict[str, Any]:
        got = s.get(target).get("Attributes")
        return {k: got.get(k) for k in typed} if isinstance(got, dict) else {}

    s.write("PATCH", target, body, etag=True, taken=lambda: read_back() == typed)
    back = read_back()
    if back != typed:
        raise BmcRefused(f"{where} accepted the BIOS attributes but reads back {back}",
                         bmc_message=f"read back {back}")
    pending = target != bios_ref
    log.info("%s: BIOS attributes %s set%s", where, ", ".join(sorted(typed)),
             " (applied at the next reset)" if pending else "")
    return back, pending


def read(s: RedfishSession, names: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the current attributes, those pending in the settings object), ``names`` alone if given."""
    _, bios = _bios(s)
    got = bios.get("Attributes")
    current: dict[str, Any] = got if isinstance(got, dict) else {}
    pending: dict[str, Any] = {}
    settings = _settings_ref(bios)
    if settings:
        answer = s.send("GET", settings, ok=(404,))
        waiting = answer.doc.get("Attributes")
        pending = waiting if answer.status == 200 and isinstance(waiting, dict) else {}
    if names:
        current = {k: v for k, v in current.items() if k in names}
        pending = {k: v for k, v in pending.items() if k in names}
    return dict(current), dict(pending)


def baseline(s: RedfishSession, expected: dict[str, str]) -> list[BiosValue]:
    """Each of ``expected``'s attributes as the BMC has it: in its registry or not, the expected,
    current and pending values typed by the registry entry (a current or pending value that does
    not type is kept as the BMC gave it, and so differs)."""
    _, doc = _bios(s)
    entries = registry(s, doc)
    current, pending = read(s, list(expected))

    def typed(entry: Doc, value: Any) -> Any:
        try:
            return _typed(entry, value)
        except ValueError:
            return value

    out = []
    for name, value in sorted(expected.items()):
        entry = entries.get(name)
        if entry is None:
            out.append(BiosValue(name, registered=False))
            continue
        try:
            want, invalid = _typed(entry, value), ""
        except ValueError as exc:
            want, invalid = None, str(exc)
        out.append(BiosValue(name, True, want, invalid,
                             typed(entry, current[name]) if name in current else None,
                             typed(entry, pending[name]) if name in pending else None))
    return out
