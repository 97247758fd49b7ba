"""The command journal: what the agent accepted, started, finished, and had acknowledged.

An append-only file (on tmpfs in the ramdisk) of checksummed records, each

    MAGIC (4 bytes "BCJ1") | length (4 bytes, big-endian) | CRC32 of length+payload (4 bytes) | payload

where the payload is one JSON object. Every record that the agent is about to acknowledge to
anybody (accepted, started, result, acknowledged, awaiting rejoin, completion) is written and
fsync'ed before the call returns (on tmpfs written only: fsync does nothing there). Progress
markers are written without fsync: losing one costs nothing.

Reading is forgiving: a torn or corrupt tail (the agent died mid-write) is detected by length and
CRC, ignored, and truncated away before anything is appended; a corrupt record in the middle is
skipped by scanning for the next valid record (its effect is lost, which errs on the safe side:
an unfinished command is re-run only when it is retry-safe, otherwise reported interrupted), and
the file is then rewritten. Nothing in a journal is ever fatal.

A journal has an id of its own, the agent's **state id**: 128 random bits written as the first
record of a new journal (and kept by compaction). It is new whenever the journal is new (its
directory lost within a boot, a new ramdisk, a journal whose state record was corrupted), so a
command bound to it (``CommandBody.state_id``, announced in the Hello) cannot run against a
journal that does not remember the ids already run.

The journal is compacted when it grows past a bound: the live state is written to a temporary
file, fsync'ed and renamed over the journal. Commands that are finished and acknowledged are
kept only as (id, kind, digest, final state) "known" records, bounded in number, so the agent
can refuse a replayed id long after the command ran without the file growing forever.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import json
import logging
import os
import secrets
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import atomicfile
from agent.hw import sysfs

log = logging.getLogger(__name__)

MAGIC = b"BCJ1"
_HEADER = struct.Struct(">4sII")  # magic, length, crc32(length + payload)
MAX_RECORD_BYTES = 64 * 1024 * 1024
DEFAULT_COMPACT_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_KNOWN = 20_000


class State(enum.StrEnum):
    ACCEPTED = "accepted"            # journaled, queued on its lane, not started
    STARTED = "started"              # the handler was (about to be) called
    FINISHED = "finished"            # result produced, not yet acknowledged
    AWAITING_REJOIN = "awaiting_rejoin"  # self-terminating: the agent is about to end
    COMPLETED = "completed"          # self-terminating, proven complete, not yet acknowledged
    ACKED = "acked"                  # the gateway acknowledged the result or completion




@dataclass
class Entry:
    """Everything the journal knows about one live command id."""

    id: str
    kind: str
    digest: str                      # sha256 hex of the command body bytes
    state: State
    command: bytes = b""             # the serialized SignedCommand, kept while it may run again
    accepted_ms: int = 0
    started_ms: int = 0
    started_boot_id: str = ""
    attempts: int = 0                # how many times it was started
    result: bytes = b""              # serialized SignedResult once finished
    status: str = ""                 # result status name, for logs and tests
    proof: dict[str, str] = field(default_factory=dict)
    completion: bytes = b""          # serialized Completion once proven
    progress: dict[str, Any] = field(default_factory=dict)  # the last progress marker
    expires_ms: int = 0              # the signed expiry: the id is remembered at least until then

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "digest": self.digest,
            "state": str(self.state),
            "command": _b64(self.command),
            "accepted_ms": self.accepted_ms,
            "started_ms": self.started_ms,
            "started_boot_id": self.started_boot_id,
            "attempts": self.attempts,
            "result": _b64(self.result),
            "status": self.status,
            "proof": dict(self.proof),
            "completion": _b64(self.completion),
            "progress": dict(self.progress),
            "expires_ms": self.expires_ms,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Entry:
        return cls(
            id=str(obj["id"]),
            kind=str(obj.get("kind", "")),
            digest=str(obj.get("digest", "")),
            state=State(obj["state"]),
            command=_unb64(obj.get("command", "")),
            accepted_ms=int(obj.get("accepted_ms", 0)),
            started_ms=int(obj.get("started_ms", 0)),
            started_boot_id=str(obj.get("started_boot_id", "")),
            attempts=int(obj.get("attempts", 0)),
            result=_unb64(obj.get("result", "")),
            status=str(obj.get("status", "")),
            proof={str(k): str(v) for k, v in dict(obj.get("proof", {})).items()},
            completion=_unb64(obj.get("completion", "")),
            progress=dict(obj.get("progress", {})),
            expires_ms=int(obj.get("expires_ms", 0)),
        )


@dataclass(frozen=True)
class Known:
    """A finished and acknowledged command id, remembered to refuse replays."""

    id: str
    kind: str
    digest: str
    status: str
    expires_ms: int = 0   # while its signature could still be valid it is never forgotten


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True) if text else b""


def encode_record(obj: dict[str, Any]) -> bytes:
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"journal record of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    length = struct.pack(">I", len(payload))
    crc = zlib.crc32(length + payload)
    return _HEADER.pack(MAGIC, len(payload), crc) + payload


@dataclass
class ScanResult:
    records: list[dict[str, Any]]
    valid_end: int          # offset just past the last valid record
    skipped: int            # bytes of corrupt records skipped before valid_end
    torn_tail: int          # bytes after valid_end that are not a valid record


def _record_at(data: bytes, offset: int) -> tuple[dict[str, Any], int] | None:
    """The record starting at ``offset`` and the offset after it, or None if it is not valid."""
    if offset + _HEADER.size > len(data):
        return None
    magic, length, crc = _HEADER.unpack_from(data, offset)
    if magic != MAGIC or length > MAX_RECORD_BYTES:
        return None
    end = offset + _HEADER.size + length
    if end > len(data):
        return None
    payload = data[offset + _HEADER.size : end]
    if zlib.crc32(struct.pack(">I", length) + payload) != crc:
        return None
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        return None
    return obj, end


def scan(data: bytes) -> ScanResult:
    """Every valid record of a journal image, skipping corrupt stretches."""
    records: list[dict[str, Any]] = []
    offset = valid_end = skipped = 0
    while offset < len(data):
        found = _record_at(data, offset)
        if found is not None:
            obj, offset = found
            records.append(obj)
            valid_end = offset
            continue
        # Not a valid record here: look for the next one that is.
        nxt = data.find(MAGIC, offset + 1)
        while nxt != -1 and _record_at(data, nxt) is None:
            nxt = data.find(MAGIC, nxt + 1)
        if nxt == -1:
            break
        skipped += nxt - offset
        offset = nxt
    return ScanResult(records, valid_end, skipped, len(data) - valid_end)


IN_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def _nothing_to_flush(fd: int) -> None:
    """fsync on tmpfs: a written record is already all the journal can have."""


class Journal:
    """The journal file and the state it describes. Thread-safe."""

    def __init__(
        self,
        path: Path,
        *,
        compact_bytes: int = DEFAULT_COMPACT_BYTES,
        max_known: int = DEFAULT_MAX_KNOWN,
        fsync: Callable[[int], None] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """``fsync``: how a record is made durable; by default os.fsync, except on a file system
        in memory (tmpfs, ramfs: the ramdisk's and the site daemon's /run), where a written
        record is as durable as it gets and fsync is a system call that does nothing (each one
        a wait for Python's GIL again, with a site's hundreds of BMC threads)."""
        self.path = Path(path)
        self.compact_bytes = compact_bytes
        self.max_known = max_known
        self._fsync = fsync or os.fsync
        self._fsync_given = fsync is not None   # else chosen by open(), for the file system
        self._clock: Callable[[], int] = clock or _now_ms   # unix ms, for the expiry of known ids
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._size = 0
        self._compacted_size = 0
        self.entries: dict[str, Entry] = {}
        self.known: OrderedDict[str, Known] = OrderedDict()
        self.compactions = 0
        self.last_scan: ScanResult | None = None
        self.state_id = ""       # set by open(): read from the journal, or new with a new one

    # -- opening and replay ------------------------------------------------------------------

    def open(self) -> None:
        """Read the journal (if any), rebuild the state, repair the file, open it for appending."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self._fsync_given and sysfs.filesystem_type(self.path.parent) in IN_MEMORY_FILESYSTEMS:
                self._fsync = _nothing_to_flush
            if atomicfile.sweep(self.path):   # a compaction that a crash cut short
                log.info("journal %s: an unfinished compaction's file removed", self.path)
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = b""
            result = scan(data)
            self.last_scan = result
            self.entries.clear()
            self.known.clear()
            self.state_id = ""
            for obj in result.records:
                try:
                    self._apply(obj)
                except (KeyError, ValueError, TypeError, AttributeError) as exc:
                    log.warning("journal %s: ignoring a record that does not apply (%s)", self.path, exc)
            if result.skipped or result.torn_tail:
                log.warning(
                    "journal %s: %d corrupt bytes skipped, %d bytes of torn tail ignored",
                    self.path, result.skipped, result.torn_tail,
                )
            if result.skipped:
                try:
                    self._compact_locked()
                    self._ensure_state_id(bool(result.records))
                    return
                except OSError as exc:
                    # Corrupt stretches stay in the file; scan() skips them again next time.
                    log.warning("journal %s: cannot rewrite it (%s); appending after it", self.path, exc)
            if result.torn_tail:
                with open(self.path, "r+b") as f:
                    f.truncate(result.valid_end)
                    f.flush()
                    self._fsync(f.fileno())
            self._open_append()
            self._compacted_size = 0
            self._ensure_state_id(bool(result.records))

    def _ensure_state_id(self, had_records: bool) -> None:
        """A journal without a state id (a new one, or one whose state record was lost) gets a
        new one, durable before open() returns."""
        if self.state_id:
            return
        self._append({"t": "state", "id": secrets.token_hex(16)})
        if had_records:
            log.warning("journal %s: it held no state id (lost or older); new state id %s: commands "
                        "bound to another are refused", self.path, self.state_id)
        else:
            log.info("journal %s: new, state id %s", self.path, self.state_id)

    def _open_append(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size
        if self._size == 0:
            self._fsync_dir()

    def _fsync_dir(self) -> None:
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            self._fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _entry(self, obj: dict[str, Any]) -> Entry:
        """The live entry a record refers to, made up if its "accepted" record was lost."""
        cid = str(obj["id"])
        entry = self.entries.get(cid)
        if entry is None:
            entry = Entry(cid, str(obj.get("kind", "")), str(obj.get("digest", "")), State.ACCEPTED)
            self.entries[cid] = entry
            self.known.pop(cid, None)
        return entry

    def _apply(self, obj: dict[str, Any]) -> None:
        t = obj["t"]
        if t == "state":
            if not self.state_id:
                self.state_id = str(obj["id"])
        elif t == "entry":
            entry = Entry.from_json(obj["entry"])
            self.entries[entry.id] = entry
        elif t == "known":
            self._remember(Known(str(obj["id"]), str(obj["kind"]), str(obj["digest"]), str(obj["status"]),
                                 int(obj.get("expires_ms", 0))))
        elif t == "accepted":
            cid = str(obj["id"])
            self.known.pop(cid, None)
            self.entries[cid] = Entry(
                cid, str(obj["kind"]), str(obj["digest"]), State.ACCEPTED,
                command=_unb64(obj["command"]), accepted_ms=int(obj.get("ms", 0)),
                expires_ms=int(obj.get("expires_ms", 0)),
            )
        elif t == "started":
            entry = self._entry(obj)
            entry.state = State.STARTED
            entry.started_ms = int(obj.get("ms", 0))
            entry.started_boot_id = str(obj.get("boot_id", ""))
            entry.attempts += 1
        elif t == "progress":
            if obj["id"] in self.entries:
                self.entries[obj["id"]].progress = dict(obj.get("marker", {}))
        elif t == "result":
            entry = self._entry(obj)
            entry.state = State.FINISHED
            entry.result = _unb64(obj["result"])
            entry.status = str(obj.get("status", ""))
            entry.command = b""
        elif t == "rejoin":
            entry = self._entry(obj)
            entry.state = State.AWAITING_REJOIN
            entry.proof = {str(k): str(v) for k, v in dict(obj.get("proof", {})).items()}
            entry.command = b""
            if obj.get("result"):
                entry.result = _unb64(obj["result"])
        elif t == "completion":
            entry = self._entry(obj)
            entry.state = State.COMPLETED
            entry.completion = _unb64(obj["completion"])
            entry.status = str(obj.get("status", ""))
            entry.command = b""
        elif t == "acked":
            cid = str(obj["id"])
            acked = self.entries.pop(cid, None)
            if acked is not None:
                self._remember(Known(cid, acked.kind, acked.digest, acked.status or str(acked.state),
                                     acked.expires_ms))
        else:
            raise ValueError(f"unknown record type {t!r}")

    def _remember(self, known: Known) -> None:
        """Keep ``known``; beyond ``max_known`` ids the oldest are forgotten, but never one whose
        signature could still be valid (its expiry not passed): that one could be replayed."""
        self.known.pop(known.id, None)
        self.known[known.id] = known
        excess = len(self.known) - self.max_known
        if excess <= 0:
            return
        now = self._clock()
        victims = []
        for cid, k in self.known.items():
            if k.expires_ms < now:
                victims.append(cid)
                if len(victims) >= excess:
                    break
        for cid in victims:
            del self.known[cid]

    # -- appending ---------------------------------------------------------------------------

    def _append(self, obj: dict[str, Any], *, sync: bool = True) -> None:
        """Write one record (and fsync it when ``sync``), then apply it to the state."""
        data = encode_record(obj)
        with self._lock:
            if self._fd is None:
                raise RuntimeError(f"journal {self.path} is not open")
            start = self._size
            try:
                view = memoryview(data)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                if sync:
                    self._fsync(self._fd)
            except BaseException:
                # Not durable, so not written: a record that failed must not come back on replay
                # (the caller has told nobody about it).
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                raise
            self._size += len(data)
            self._apply(obj)
            if self._size > self.compact_bytes and self._size > 2 * self._compacted_size:
                try:
                    self._compact_locked()
                except OSError as exc:
                    # The record is durable; a failed compaction only postpones the next one.
                    self._compacted_size = self._size
                    log.warning("journal %s: compaction failed, will retry later: %s", self.path, exc)

    def accepted(
        self, command_id: str, kind: str, digest: str, command: bytes, *, expires_ms: int = 0
    ) -> None:
        self._append(
            {"t": "accepted", "id": command_id, "kind": kind, "digest": digest,
             "command": _b64(command), "ms": _now_ms(), "expires_ms": expires_ms}
        )

    def started(self, command_id: str, boot_id: str) -> None:
        entry = self.entries.get(command_id)
        self._append(
            {"t": "started", "id": command_id, "kind": entry.kind if entry else "",
             "digest": entry.digest if entry else "", "ms": _now_ms(), "boot_id": boot_id}
        )

    def progress(self, command_id: str, marker: dict[str, Any]) -> None:
        """A progress marker, not fsync'ed (it acknowledges nothing)."""
        self._append({"t": "progress", "id": command_id, "marker": marker}, sync=False)

    def result(self, command_id: str, signed_result: bytes, status: str) -> None:
        entry = self.entries.get(command_id)
        self._append(
            {"t": "result", "id": command_id, "kind": entry.kind if entry else "",
             "digest": entry.digest if entry else "", "result": _b64(signed_result), "status": status}
        )

    def awaiting_rejoin(
        self, command_id: str, proof: dict[str, str], signed_result: bytes = b"", *, kind: str = ""
    ) -> None:
        entry = self.entries.get(command_id)
        self._append(
            {"t": "rejoin", "id": command_id, "kind": entry.kind if entry else kind,
             "digest": entry.digest if entry else "", "proof": dict(proof), "result": _b64(signed_result)}
        )

    def completion(self, command_id: str, completion: bytes, status: str, *, kind: str = "") -> None:
        entry = self.entries.get(command_id)
        self._append(
            {"t": "completion", "id": command_id, "kind": entry.kind if entry else kind,
             "digest": entry.digest if entry else "", "completion": _b64(completion), "status": status}
        )

    def acked(self, command_id: str) -> None:
        self._append({"t": "acked", "id": command_id})

    # -- lookups -----------------------------------------------------------------------------

    def lookup(self, command_id: str) -> Entry | Known | None:
        with self._lock:
            return self.entries.get(command_id) or self.known.get(command_id)

    def size(self) -> int:
        with self._lock:
            return self._size

    # -- compaction --------------------------------------------------------------------------

    def compact(self) -> None:
        with self._lock:
            self._compact_locked()

    def _compact_locked(self) -> None:
        chunks = [encode_record({"t": "state", "id": self.state_id})] if self.state_id else []
        chunks += [
            encode_record({"t": "known", "id": k.id, "kind": k.kind, "digest": k.digest,
                           "status": k.status, "expires_ms": k.expires_ms})
            for k in self.known.values()
        ]
        chunks += [encode_record({"t": "entry", "entry": e.to_json()}) for e in self.entries.values()]
        # The directory is fsync'ed below, once the new file is the one appended to.
        with atomicfile.replacing(self.path, 0o600, fsync=self._fsync, sync_folder=False) as f:
            f.write(b"".join(chunks))
        # From here on the new file is the journal: append to it whatever else fails.
        self._open_append()
        try:
            self._fsync_dir()
        except OSError as exc:
            log.warning("journal %s: fsync of its directory failed: %s", self.path, exc)
        self._compacted_size = self._size
        self.compactions += 1
        log.debug("journal %s compacted to %d bytes", self.path, self._size)


def _now_ms() -> int:
    return int(time.time() * 1000)
