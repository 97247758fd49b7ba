"""Firmware sets: per hardware profile, the version each BMC inventory component must run, and
how the site brings it there (bmc.firmware plan and apply, the release gate's comparison).

One JSON file an operator edits (the setting ``site_firmware_sets``; its schema in
docs/site.md, "Firmware sets"), read by ``load`` with a named error for every bad field and
nothing kept from a file that has one:

    {"profiles": {"dgx-h100": [
        {"match": {"id": "HGX_FW_BMC_0"}, "version": "HGX-22.10-1", "order": 10,
         "image": {"sha256": "<64 hex>", "url": "https://upstream/fw.tar"},
         "method": "multipart", "apply_time": "Immediate", "after": "none", "settle_seconds": 0},
        ...]}}

A component is matched by the BMC's ``Id``, or by ``software_id`` / ``manufacturer`` / ``name``
(every one given must equal the inventory's) and ``id_pattern`` (a regular expression the whole
Id matches: Dell's Ids carry the version and list the previous image too). A rule may match
several components, e.g. eight GPUs of one SoftwareId, updated by one image. ``plan``
compares an inventory with a set: the entries whose components differ, in ``order`` (then as
listed), each with what it needs after its push (``after``: none, reboot, ac_cycle;
``settle_seconds``), and the entries that match no component (``missing``: the set names
hardware this node does not report).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agent.errors import InvalidParameters
from agent.proto import site_pb2
from agent.site.bmc.redfish.firmware import Method

MAX_PROFILES = 256
MAX_ENTRIES = 256            # per profile; a DGX H100 lists 66 components
MAX_FILE_BYTES = 4 << 20
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TEXT_MAX = 256
E = TypeVar("E", bound=enum.StrEnum)


class After(enum.StrEnum):
    """What a component needs after its push before its new version runs."""

    NONE = "none"
    REBOOT = "reboot"          # the host reset (ComputerSystem.Reset)
    AC_CYCLE = "ac_cycle"      # power removed and restored (a PowerCycle of the system)


class ApplyTime(enum.StrEnum):
    """@Redfish.OperationApplyTime of the push (GB200's multipart takes Immediate only)."""

    IMMEDIATE = "Immediate"
    ON_RESET = "OnReset"


@dataclass(frozen=True)
class Match:
    """Which inventory components an entry is for: every field given must be equal."""

    id: str = ""
    software_id: str = ""
    manufacturer: str = ""
    name: str = ""
    id_pattern: str = ""     # a regular expression the whole Id matches (Dell: "Installed-159-.*")

    def takes(self, c: site_pb2.BmcFirmwareComponent) -> bool:
        return all(not want or want == got for want, got in (
            (self.id, c.id), (self.software_id, c.software_id),
            (self.manufacturer, c.manufacturer), (self.name, c.name))) \
            and (not self.id_pattern or re.fullmatch(self.id_pattern, c.id) is not None)

    def __str__(self) -> str:
        fields = (("id", self.id), ("software_id", self.software_id), ("manufacturer", self.manufacturer),
                  ("name", self.name), ("id_pattern", self.id_pattern))
        return ", ".join(f"{k}={v}" for k, v in fields if v)


@dataclass(frozen=True)
class Image:
    """An image by its digest: in the site's content store, or fetched into it from ``url``
    (an HTTP upstream, or an OCI registry's blob URL); a SimpleUpdate hands ``url`` to the BMC."""

    sha256: str
    url: str = ""


@dataclass(frozen=True)
class Entry:
    match: Match
    version: str
    image: Image
    method: Method | None = None       # None: what the BMC offers that fits (firmware.choose)
    order: int = 100
    apply_time: ApplyTime = ApplyTime.IMMEDIATE
    after: After = After.NONE
    settle_seconds: float = 0.0


@dataclass(frozen=True)
class FirmwareSet:
    profile: str
    entries: tuple[Entry, ...]


class FirmwareSetError(InvalidParameters):
    """A firmware-set file with a bad field: named by its place in the file."""


def load(path: Path) -> dict[str, FirmwareSet]:
    """Every profile of the file at ``path``; FirmwareSetError naming the first bad field."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FirmwareSetError(f"firmware sets {path}: cannot read it: {exc.strerror}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise FirmwareSetError(f"firmware sets {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise FirmwareSetError(f"firmware sets {path}: not JSON: {exc}") from None
    return parse(doc, str(path))


def parse(doc: Any, where: str = "firmware sets") -> dict[str, FirmwareSet]:
    if not isinstance(doc, dict) or set(doc) != {"profiles"} or not isinstance(doc["profiles"], dict):
        raise FirmwareSetError(f"{where}: an object with one key, \"profiles\" (profile -> its entries)")
    profiles = doc["profiles"]
    if not profiles or len(profiles) > MAX_PROFILES:
        raise FirmwareSetError(f"{where}: profiles: 1 to {MAX_PROFILES} profiles")
    out = {}
    for name, entries in profiles.items():
        if not _PROFILE.fullmatch(name):
            raise FirmwareSetError(f"{where}: profile {name[:64]!r}: letters, digits, '.', '_', '-';"
                                   " 64 at most")
        at = f"{where}: profiles.{name}"
        if not isinstance(entries, list) or not entries or len(entries) > MAX_ENTRIES:
            raise FirmwareSetError(f"{at}: a list of 1 to {MAX_ENTRIES} entries")
        parsed = tuple(_entry(e, f"{at}[{i}]") for i, e in enumerate(entries))
        ids = [e.match.id for e in parsed if e.match.id]
        if len(ids) != len(set(ids)):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise FirmwareSetError(f"{at}: component id {twice[0]} named by two entries")
        out[name] = FirmwareSet(name, parsed)
    return out


_ENTRY_KEYS = {"match", "version", "image", "method", "order", "apply_time", "after", "settle_seconds"}


def _entry(e: Any, at: str) -> Entry:
    if not isinstance(e, dict):
        raise FirmwareSetError(f"{at}: an object")
    unknown = sorted(set(e) - _ENTRY_KEYS)
    if unknown:
        raise FirmwareSetError(f"{at}: unknown field {unknown[0]!r};"
                               f" an entry takes {', '.join(sorted(_ENTRY_KEYS))}")
    for key in ("match", "version", "image"):
        if key not in e:
            raise FirmwareSetError(f"{at}: {key} is required")
    match = _match(e["match"], f"{at}.match")
    version = _text(e["version"], f"{at}.version")
    image = _image(e["image"], f"{at}.image")
    method = _choice(Method, e.get("method", ""), f"{at}.method") if e.get("method", "") != "" else None
    apply_time = _choice(ApplyTime, e.get("apply_time", "Immediate"), f"{at}.apply_time")
    after = _choice(After, e.get("after", "none"), f"{at}.after")
    order = e.get("order", 100)
    if not isinstance(order, int) or isinstance(order, bool) or not 0 <= order <= 10000:
        raise FirmwareSetError(f"{at}.order: a whole number from 0 to 10000 (lower goes first)")
    settle = e.get("settle_seconds", 0)
    if not isinstance(settle, int | float) or isinstance(settle, bool) or not 0 <= settle <= 3600:
        raise FirmwareSetError(f"{at}.settle_seconds: a number of seconds from 0 to 3600")
    if method is Method.SIMPLE_UPDATE and not image.url:
        raise FirmwareSetError(f"{at}: method simple_update has the BMC fetch the image:"
                               " image.url is required")
    return Entry(match, version, image, method, order, apply_time, after, float(settle))


def _match(m: Any, at: str) -> Match:
    keys = ("id", "software_id", "manufacturer", "name", "id_pattern")
    if not isinstance(m, dict) or not m or set(m) - set(keys):
        raise FirmwareSetError(f"{at}: an object of {', '.join(keys)} (at least one)")
    values = {k: _text(v, f"{at}.{k}") for k, v in m.items()}
    if "id" in values and len(values) > 1:
        raise FirmwareSetError(f"{at}: id names one component: give it alone")
    if "id_pattern" in values:
        try:
            re.compile(values["id_pattern"])
        except re.error as exc:
            raise FirmwareSetError(f"{at}.id_pattern: not a regular expression: {exc}") from None
    return Match(**values)


def _image(i: Any, at: str) -> Image:
    if not isinstance(i, dict) or "sha256" not in i or set(i) - {"sha256", "url"}:
        raise FirmwareSetError(f"{at}: an object with sha256 (64 lower-case hex digits) and, optionally, url")
    digest = i["sha256"]
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise FirmwareSetError(f"{at}.sha256: 64 lower-case hex digits")
    url = i.get("url", "")
    if not isinstance(url, str) or (url and not url.startswith(("http://", "https://"))) or len(url) > 2048:
        raise FirmwareSetError(f"{at}.url: an http:// or https:// URL (2048 characters at most)")
    return Image(digest, url)


def _text(v: Any, at: str) -> str:
    if not isinstance(v, str) or not v or len(v) > _TEXT_MAX or not v.isprintable():
        raise FirmwareSetError(f"{at}: a non-empty printable string, {_TEXT_MAX} characters at most")
    return v


def _choice(kind: type[E], v: Any, at: str) -> E:
    try:
        return kind(v)
    except ValueError:
        raise FirmwareSetError(f"{at}: one of {', '.join(kind)}, not {str(v)[:40]!r}") from None


# -- the comparison ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One entry whose components differ from the set: what to push and what it needs."""

    entry: Entry
    components: tuple[site_pb2.BmcFirmwareComponent, ...]     # those not at entry.version


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    missing: tuple[Entry, ...]                      # entries no component matched
    # every matched component, (entry, component), in inventory order: the release report's list
    matched: tuple[tuple[Entry, site_pb2.BmcFirmwareComponent], ...]


def plan(fwset: FirmwareSet, inventory: Sequence[site_pb2.BmcFirmwareComponent]) -> Plan:
    """What differs between ``inventory`` and ``fwset``, in order. A component two rules
    match is judged by the first in the file (an ``id`` rule first)."""
    owner: dict[int, Entry] = {}
    by_id = {e.match.id: e for e in fwset.entries if e.match.id}
    rules = [e for e in fwset.entries if not e.match.id]
    for n, c in enumerate(inventory):
        entry = by_id.get(c.id) or next((e for e in rules if e.match.takes(c)), None)
        if entry is not None:
            owner[n] = entry
    matched = tuple((owner[n], inventory[n]) for n in sorted(owner))
    steps, missing = [], []
    for entry in sorted(fwset.entries, key=lambda e: e.order):     # stable: ties as listed
        mine = [c for e, c in matched if e is entry]
        if not mine:
            missing.append(entry)
            continue
        behind = tuple(c for c in mine if c.version != entry.version)
        if behind:
            steps.append(Step(entry, behind))
    return Plan(tuple(steps), tuple(missing), matched)


def step_message(s: Step, offered: str = "") -> site_pb2.BmcFirmwareStep:
    e = s.entry
    return site_pb2.BmcFirmwareStep(
        match=str(e.match), component_ids=[c.id for c in s.components],
        found=sorted({c.version for c in s.components}), expected=e.version,
        sha256=e.image.sha256, method=str(e.method or offered), apply_time=str(e.apply_time),
        after=str(e.after), settle_seconds=e.settle_seconds, order=e.order, state="planned")
