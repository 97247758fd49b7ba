"""Each node's parts as its BMC gave them at the node's last bmc.query query: the system, every
part with its serial number and firmware version, and the FirmwareInventory
(agent/site/bmc/redfish/hardware.py and firmware.py read them). The site's inventory.refresh
reports them (``report``), so the control plane has every node's serials and versions from one
place (break-fix, NVIDIA's BFX03) without asking each BMC again.

One record a node, kept on disk in the site's table with a time to live
(agent/site/ttltable.py: a JSON file each, written whole or not at all, reloaded at start), so a
restart of the daemon loses none; a node's next read replaces its record. Bounded: at most
``MAX_NODES`` nodes (past it the node read longest ago is forgotten), ``MAX_RECORD_BYTES`` a
node, and a report holds the nodes read most recently within ``REPORT_BYTES``, naming how many
did not fit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.proto import agent_pb2, site_pb2
from agent.site.ttltable import Expiring, TtlTable

log = logging.getLogger(__name__)

MAX_NODES = 4096  # as many as the site's boot timelines keep (agent/site/observe/timeline.py)
MAX_RECORD_BYTES = 512 * 1024  # one node's parts, serialized
REPORT_BYTES = 2 * 1024 * 1024  # within an inventory.refresh result (a frame is 4 MiB at most)
KEEP_SECONDS = 30 * 86400.0


@dataclass(frozen=True)
class PartsRecord(Expiring):
    node_id: str
    bmc_address: str
    read_at: float  # time.time()
    expires_at: float
    parts: str  # base64 of the BmcOperationResult holding system, parts and firmware_inventory

    @property
    def file_name(self) -> str:
        return hashlib.sha256(self.node_id.encode()).hexdigest()[:40]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PartsRecord:
        doc = json.loads(text)
        record = cls(str(doc["node_id"]), str(doc["bmc_address"]), float(doc["read_at"]),
                     float(doc["expires_at"]), str(doc["parts"]))
        base64.b64decode(record.parts, validate=True)
        return record

    def message(self) -> agent_pb2.NodeParts:
        return agent_pb2.NodeParts(node_id=self.node_id, bmc_address=self.bmc_address,
                                   read_unix_ms=int(self.read_at * 1000),
                                   bmc_parts=base64.b64decode(self.parts))


def parts_of(result: site_pb2.BmcOperationResult) -> site_pb2.BmcOperationResult:
    """What of a bmc.query query's result is the node's parts."""
    out = site_pb2.BmcOperationResult(parts=result.parts, firmware_inventory=result.firmware_inventory)
    if result.HasField("system"):
        out.system.CopyFrom(result.system)
    return out


class PartsTable:
    """The nodes' parts, in memory and on disk; thread-safe."""

    def __init__(self, folder: Path, *, keep_seconds: float = KEEP_SECONDS,
                 max_nodes: int = MAX_NODES) -> None:
        self.keep_seconds, self.max_nodes = keep_seconds, max_nodes
        self.table: TtlTable[PartsRecord] = TtlTable(folder, "node parts", name=lambda r: r.file_name,
                                                     parse=PartsRecord.from_json, dump=PartsRecord.to_json)
        self._lock = threading.Lock()
        self._records: dict[str, PartsRecord] = {}
        for record in sorted(self.table.load().live, key=lambda r: r.read_at):  # oldest first
            self._records[record.node_id] = record

    def record(self, node_id: str, bmc_address: str,
               result: site_pb2.BmcOperationResult) -> PartsRecord | None:
        """Keep ``result``'s parts as ``node_id``'s (None, and nothing kept, where they are too big)."""
        data = parts_of(result).SerializeToString(deterministic=True)
        if len(data) > MAX_RECORD_BYTES:
            log.warning("node %s: its BMC's parts are %d bytes, more than %d: not kept", node_id, len(data),
                        MAX_RECORD_BYTES)
            return None
        now = time.time()
        record = PartsRecord(node_id, bmc_address, now, now + self.keep_seconds,
                             base64.b64encode(data).decode())
        with self._lock:
            self.table.save(record)
            self._records.pop(node_id, None)
            self._records[node_id] = record
            while len(self._records) > self.max_nodes:  # the node read longest ago
                self.table.remove(self._records.pop(next(iter(self._records))))
        return record

    def report(self, result: agent_pb2.InventoryRefreshResult, budget: int = REPORT_BYTES) -> None:
        """The live records into ``result``, the most recently read first, within ``budget`` bytes;
        an expired one removed."""
        now = time.time()
        with self._lock:
            for gone in self.table.due(list(self._records.values()), now):
                self.table.remove(self._records.pop(gone.node_id))
            records = sorted(self._records.values(), key=lambda r: r.read_at, reverse=True)
        used = 0
        for record in records:
            message = record.message()
            size = message.ByteSize()
            if used + size > budget:
                result.node_parts_left_out += 1
                continue
            used += size
            result.node_parts.append(message)
