"""The release gate's golden state: everything each source can enumerate, as data, and the diff.

A checklist is always one item short of a root tenant, so the gate also works the other way
round: each source (UEFI variables, the TPM, the BMC, IPMI, the BIOS, NICs, NVMe, firmware,
GPUs) is read whole into flat ``path -> value`` items, a node known clean is captured once per
hardware profile (``Capture``, stored as JSON), and a node at release is diffed against it:
anything added, removed or changed is a finding by default, named by source and path.

What is expected to vary (counters, timestamps, monotonic variables) is the profile's data
(``Rules``: per source, ``fnmatch`` patterns of paths), never code. A source the gate could not
read is a finding too (``<source>.unreadable``), never a pass.

Paths and values are text, canonical per source: the collector of each source says how it
spells them (agent/commands/inventory/golden.py on the node, agent/site/bmc/golden.py at the
site). A value that is bytes is its SHA-256 in hex.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from agent.errors import InvalidParameters
from agent.limits import loads_json
from agent.proto import agent_pb2

FORMAT = 1
NODE_SOURCES = ("uefi", "tpm", "nic", "nvme", "gpu")     # read by the node; the rest at the site
MAX_ITEMS = 200_000                     # all sources together: a DGX's BMC lists ~20,000
MAX_TEXT = 4096                         # a path or a value
_SOURCE = re.compile(r"[a-z][a-z0-9_]{0,31}")

Kind = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class Capture:
    """Every item of every source read, and the sources that could not be read (with why)."""

    sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {"format": FORMAT,
               "sources": {s: dict(sorted(items.items())) for s, items in sorted(self.sources.items())},
               "unreadable": dict(sorted(self.unreadable.items()))}
        return json.dumps(doc, indent=1, sort_keys=False).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes | str, *, what: str = "golden state") -> Capture:
        doc = loads_json(data, what=what, max_bytes=64 * 1024 * 1024)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise InvalidParameters(f"{what}: not a golden state of format {FORMAT}")
        sources = doc.get("sources", {})
        unreadable = doc.get("unreadable", {})
        if not isinstance(sources, dict) or not isinstance(unreadable, dict):
            raise InvalidParameters(f"{what}: sources and unreadable must be objects")
        count = 0
        out: dict[str, dict[str, str]] = {}
        for source, items in sources.items():
            _check_source(source, what)
            if not isinstance(items, dict):
                raise InvalidParameters(f"{what}: source {source!r} is not an object")
            for path, value in items.items():
                if not isinstance(value, str) or len(path) > MAX_TEXT or len(value) > MAX_TEXT:
                    raise InvalidParameters(f"{what}: {source} {path[:80]!r}: a value is text "
                                            f"of at most {MAX_TEXT} characters")
            count += len(items)
            if count > MAX_ITEMS:
                raise InvalidParameters(f"{what}: more than {MAX_ITEMS} items")
            out[source] = dict(items)
        for source, why in unreadable.items():
            _check_source(source, what)
            if not isinstance(why, str):
                raise InvalidParameters(f"{what}: unreadable {source!r}: the reason is text")
        return cls(sources=out, unreadable={s: str(w) for s, w in unreadable.items()})


@dataclass(frozen=True)
class Rules:
    """The profile's paths expected to vary, per source (``fnmatch`` patterns), and why each
    varies (``{"vary": {source: [pattern]}, "why": {source: {pattern: reason}}}``: the reasons
    are the review's record, optional, each naming a pattern of ``vary``)."""

    vary: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    why: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def varies(self, source: str, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, p) for p in self.vary.get(source, ()))

    @classmethod
    def from_json(cls, data: bytes | str, *, what: str = "golden rules") -> Rules:
        doc = loads_json(data, what=what)
        vary = doc.get("vary", {}) if isinstance(doc, dict) else None
        if not isinstance(vary, dict):
            raise InvalidParameters(f'{what}: expected {{"vary": {{source: [pattern, ...]}}}}')
        out: dict[str, tuple[str, ...]] = {}
        for source, patterns in vary.items():
            _check_source(source, what)
            if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
                raise InvalidParameters(f"{what}: vary[{source!r}] is a list of patterns")
            out[source] = tuple(patterns)
        why = doc.get("why", {})
        if not isinstance(why, dict) or not all(
                isinstance(reasons, dict) and all(isinstance(r, str) and p in out.get(source, ())
                                                  for p, r in reasons.items())
                for source, reasons in why.items()):
            raise InvalidParameters(f'{what}: "why" is {{source: {{pattern: reason}}}}, each pattern '
                                    "one of vary's")
        return cls(vary=out, why={source: dict(reasons) for source, reasons in why.items()})


@dataclass(frozen=True)
class Golden:
    """ExpectedState.golden, checked at the edge: the profile's capture and what varies."""

    profile: str
    capture: Capture
    rules: Rules = field(default_factory=Rules)

    @property
    def node_sources(self) -> list[str]:
        """The node's sources this golden state names (the rest are the site's)."""
        named = set(self.capture.sources) | set(self.capture.unreadable)
        return [s for s in NODE_SOURCES if s in named]

    @classmethod
    def from_proto(cls, msg: agent_pb2.GoldenState, *, what: str = "expect.state.golden") -> Golden:
        """The request's golden state read once, at the edge (the ramdisk's and the site's)."""
        profile, capture, rules = msg.profile, msg.capture, msg.rules
        if not capture:
            raise InvalidParameters(f"{what}: capture is required (golden.Capture as JSON)")
        if not profile or len(profile) > 128 or not profile.isprintable():
            raise InvalidParameters(f"{what}.profile: the hardware profile's name, printable, "
                                    "at most 128 characters")
        return cls(profile, Capture.from_json(capture, what=f"{what}.capture"),
                   Rules.from_json(rules, what=f"{what}.rules") if rules else Rules())


@dataclass(frozen=True)
class Change:
    source: str
    path: str
    kind: Kind
    golden: str = ""                    # "" when added
    found: str = ""                     # "" when removed

    @property
    def check(self) -> str:
        return f"{self.source}.{self.kind}"


@dataclass(frozen=True)
class Diff:
    changes: tuple[Change, ...]
    compared: Mapping[str, int]         # source -> items compared (the golden's, less what varies)
    unreadable: Mapping[str, str]       # source -> why: each a finding, never a pass
    varied: Mapping[str, int]           # source -> items left alone by the profile's rules

    def counts(self) -> list[agent_pb2.SourceCount]:
        """ReleaseReport.compared: per source the items compared, those left alone, why unread."""
        return [agent_pb2.SourceCount(source=s, compared=self.compared.get(s, 0),
                                      varied=self.varied.get(s, 0), unreadable=self.unreadable.get(s, ""))
                for s in sorted(set(self.compared) | set(self.unreadable))]


def diff(golden: Capture, seen: Capture, rules: Rules = Rules()) -> Diff:
    """Every item added, removed or changed in ``seen`` against ``golden``, source by source.

    A source the golden state has and ``seen`` lacks is unreadable (the collector did not run
    or failed), as is one ``seen`` names unreadable; a source only ``seen`` has is compared
    against nothing, so each of its items is added."""
    changes: list[Change] = []
    compared: dict[str, int] = {}
    varied: dict[str, int] = {}
    unreadable = dict(seen.unreadable)
    for source in sorted(set(golden.sources) | set(seen.sources)):
        if source in unreadable:
            continue
        if source not in seen.sources:
            unreadable[source] = "not read (the golden state has it)"
            continue
        old = golden.sources.get(source, {})
        new = seen.sources[source]
        n = skipped = 0
        for path in sorted(set(old) | set(new)):
            if rules.varies(source, path):
                skipped += 1
                continue
            n += 1
            if path not in new:
                changes.append(Change(source, path, "removed", golden=old[path]))
            elif path not in old:
                changes.append(Change(source, path, "added", found=new[path]))
            elif old[path] != new[path]:
                changes.append(Change(source, path, "changed", golden=old[path], found=new[path]))
        compared[source] = n
        varied[source] = skipped
    return Diff(tuple(changes), compared, unreadable, varied)


def _check_source(source: object, what: str) -> None:
    if not isinstance(source, str) or not _SOURCE.fullmatch(source):
        raise InvalidParameters(f"{what}: {str(source)[:40]!r} is not a source name "
                                f"({_SOURCE.pattern})")
