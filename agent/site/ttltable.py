"""An on-disk table of records with a time to live: the site's one way to keep state that
must outlive a restart of the daemon and end on its own (boot entries, proxy routes, media
sets: agent/site/boot/pxe.py, agent/site/serve/routes.py, agent/site/boot/vmedia.py).

Each record is one JSON file, ``<name>.json`` in the table's folder (mode 0700, each file
0600), written whole or not at all (agent/atomicfile.py) and carrying its ``expires_at``
(time.time()). The table does what every use needs of its files:

    table = TtlTable(folder, "boot entry", name=lambda e: e.mac_hex, parse=BootEntry.from_json,
                     dump=BootEntry.to_json)
    loaded = table.load(check=...)     # at start: live records, and those dropped
    table.save(record)                 # a new or changed record, atomically
    table.remove(record)               # its file
    table.due(records, now)            # those past their time to live (the timer's)

``load`` is the reconcile at start: a half-written temporary file of a write the daemon did
not finish is removed; a file that does not parse is removed and logged; a record past its
time to live, or in a file not named after it (copied or renamed by hand), is removed and
returned as dropped; so is a live one that ``check`` refuses (returns False; one whose check
raises is removed as unreadable). What
the records mean in memory (their indexes, their lock, the files beside them) stays with
each use.

A record's own side of it is here too: ``Expiring`` (``expired()``, mixed into every record:
routes, boot entries, media sets) and ``MacRecord`` (the records kept under a node's MAC,
boot entries and media sets: ``mac_hex``, the name of their file, and ``to_json``, their
fields as JSON).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from agent.atomicfile import write_atomic
from agent.errors import AgentError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)


class Record(Protocol):
    @property
    def expires_at(self) -> float: ...


R = TypeVar("R", bound=Record)


def expired(record: Record, now: float | None = None) -> bool:
    """Whether ``record`` is past its time to live at ``now`` (time.time() when None)."""
    return (time.time() if now is None else now) >= record.expires_at


class Expiring:
    """Mixed into a record's dataclass that has an ``expires_at`` field (time.time())."""

    expires_at: float

    def expired(self, now: float | None = None) -> bool:
        return expired(self, now)


class MacRecord(Expiring):
    """Mixed into a frozen record's dataclass kept under its node's MAC (a ``mac`` field, as
    parse_mac writes it): its file is ``<mac hex>.json``, its text its fields as JSON."""

    mac: str

    @property
    def mac_hex(self) -> str:
        return self.mac.replace(":", "")

    def to_json(self: DataclassInstance) -> str:
        return json.dumps(asdict(self), sort_keys=True)


UNREADABLE = (OSError, ValueError, TypeError, KeyError, AgentError)  # what a bad file raises


@dataclass
class Loaded(Generic[R]):
    live: list[R] = field(default_factory=list)      # in the order of their file names
    dropped: list[R] = field(default_factory=list)   # expired, misnamed or refused by check


class TtlTable(Generic[R]):
    """Records of one kind, a JSON file each in ``folder`` (see the module's docstring)."""

    def __init__(self, folder: Path, what: str, *, name: Callable[[R], str],
                 parse: Callable[[str], R], dump: Callable[[R], str]) -> None:
        self.folder, self.what = folder, what
        self.name, self.parse, self.dump = name, parse, dump

    def path(self, record: R) -> Path:
        return self.folder / f"{self.name(record)}.json"

    def due(self, records: Iterable[R], now: float | None = None) -> list[R]:
        """The records of ``records`` past their time to live at ``now``."""
        now = time.time() if now is None else now
        return [r for r in records if expired(r, now)]

    def load(self, now: float | None = None, check: Callable[[R], bool] | None = None) -> Loaded[R]:
        """Every record on disk, at start (see the module's docstring for what is dropped)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        for leftover in self.folder.glob(".*.tmp"):
            log.info("%s: a write that did not finish removed (%s)", self.what, leftover.name)
            leftover.unlink(missing_ok=True)
        now = time.time() if now is None else now
        loaded: Loaded[R] = Loaded()
        for path in sorted(self.folder.glob("*.json")):
            try:
                record = self.parse(path.read_text())
                stale = expired(record, now) or path.name != self.path(record).name
                keep = not stale and (check is None or check(record))
            except UNREADABLE as exc:
                log.warning("%s %s unreadable, dropped: %s", self.what, path.name,
                            exc.message if isinstance(exc, AgentError) else exc)
                path.unlink(missing_ok=True)
                continue
            if not keep:
                log.info("%s %s %s while the daemon was away; dropped", self.what, path.name,
                         "expired" if expired(record, now) else "no longer valid")
                path.unlink(missing_ok=True)
                loaded.dropped.append(record)
                continue
            loaded.live.append(record)
        return loaded

    def save(self, record: R, text: str | None = None) -> None:
        """Write ``record`` (as ``text`` when given, else its dump) whole or not at all."""
        write_atomic(self.path(record), (self.dump(record) if text is None else text).encode(), 0o600)

    def remove(self, record: R) -> None:
        self.path(record).unlink(missing_ok=True)
