"""A BMC's event log since a given time, for bmc.query's ``events`` operation.

Redfish: every LogService of the node's Manager and System, read by
agent/site/bmc/redfish/events.py; IPMI: the SEL through ``ipmitool -c sel elist``
(agent/site/bmc/ipmi.py parses it). What both share is here: ``since`` parsed, an entry
kept or not, at most ``MAX_ENTRIES`` (the newest ones).

``since`` is seconds since 1970 or an ISO 8601 time ("2026-12-01T20:00:00Z"); an entry is kept
when it was created at or after it. An entry without an absolute time (an IPMI record stamped
before the BMC's clock was set, "Pre-Init") is kept: nothing says it is older.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from agent.errors import InvalidParameters
from agent.proto import site_pb2

log = logging.getLogger(__name__)

MAX_ENTRIES = 1000           # per command: the newest ones


def parse_since(text: str) -> int:
    """Seconds since 1970 from "1764619200" or "2026-12-01T20:00:00Z"; InvalidParameters else."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    unix = iso_to_unix(text)
    if unix is None:
        raise InvalidParameters(f"parameter since: seconds since 1970 or an ISO 8601 time, not {text!r}")
    return unix


def iso_to_unix(text: str) -> int | None:
    """An ISO 8601 time as seconds since 1970 (UTC when it names no offset); None if it is none."""
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp())


def keep(entries: list[site_pb2.BmcLogEntry], since: int) -> list[site_pb2.BmcLogEntry]:
    """The entries created at or after ``since`` (and those without a time), newest last, bounded."""
    kept = [e for e in entries if not since or not e.created_unix or e.created_unix >= since]
    kept.sort(key=lambda e: e.created_unix)
    return kept[-MAX_ENTRIES:]


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else "" if value is None else str(value)


def entry(doc: dict[str, Any], log_id: str) -> site_pb2.BmcLogEntry:
    """One Redfish LogEntry."""
    created = _text(doc.get("Created"))
    return site_pb2.BmcLogEntry(
        id=_text(doc.get("Id")), created=created, created_unix=iso_to_unix(created) or 0 if created else 0,
        severity=_text(doc.get("Severity")), message=_text(doc.get("Message"))[:1024],
        sensor=_text(doc.get("SensorType") or doc.get("EntryType")), log=log_id,
    )
