"""What the verifier keeps per node, and keeps across its own restarts: the EK bound to the node
(one TPM, one node), the TPM's counters at the node's last quote (no TPM state rolled back), and
the hardware profile it attested under (a profile is not learned because a DMI string changed).

Each node is one JSON file in the state folder (``--attest-state DIR``, mode 0700, files 0600),
named by the SHA-256 of the node id and written whole or not at all (agent/atomicfile.py):

    {"node_id": "node-1", "ek": "<SHA-256 of the EK's TPMT_PUBLIC>",
     "counters": {"reset": 3, "restart": 0, "clock": 123456, "measured_boot": "<boot id>"},
     "profile": "<the hardware profile it attested under>", "accept": false, "accept_by": "",
     "accept_after": -1, "firmware": "<SHA-256 of PCR 0 and PCR 2 at its last attested join>"}

``accept`` is a window for that node, opened by an operator (``agent gateway accept``) or by the
site's own firmware update (``accept_by`` says which: "operator", or "site: firmware set S"):
its next attested join may learn what its firmware measured, under its profile or a new one;
then it closes. ``firmware`` is what the node's host firmware measured at its last attested join
(its code, PCR 0, and its option ROMs, PCR 2): another value is refused (``firmware_changed``)
unless its window is open, whatever the profile accepts (a node taken back to an older build the
profile still knows is a change too).

A node's file is read again at each use, so ``agent gateway reenroll`` (which removes it: a
TPM replaced) takes effect on a running gateway too. Without a folder the table is kept in
memory only (tests, a gateway that forgets on restart). The table is bounded (``max_nodes``):
past it a node the table does not hold is refused (``capacity``), never made room for by
forgetting another node, which would forget its binding and its counters.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent import atomicfile
from agent.errors import InvalidParameters

log = logging.getLogger(__name__)

MAX_NODES = 100_000
MAX_STATE_BYTES = 4096


@dataclass(frozen=True)
class Counters:
    reset: int
    restart: int
    clock: int
    measured_boot: str  # the first boot id quoted since the TPM's last reset: the one it measured


@dataclass(frozen=True)
class NodeState:
    node_id: str
    ek: bytes = b""                  # SHA-256 of the EK's public area bound to the node; b"" none
    counters: Counters | None = None
    profile: str = ""                # the hardware profile the node attested under; "" none yet
    accept: bool = False             # a window: the next attested join may learn
    accept_by: str = ""              # who opened it: "operator", "site: firmware set S"
    accept_after: int = -1           # the site's window: for a boot whose TPM reset count is past this
    firmware: str = ""               # SHA-256 (hex) of PCR 0 || PCR 2 at its last attested join

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node_id": self.node_id, "ek": self.ek.hex(), "profile": self.profile,
                               "accept": self.accept, "accept_by": self.accept_by,
                               "accept_after": self.accept_after, "firmware": self.firmware}
        if self.counters is not None:
            c = self.counters
            out["counters"] = {"reset": c.reset, "restart": c.restart, "clock": c.clock,
                               "measured_boot": c.measured_boot}
        return out

    @classmethod
    def from_json(cls, doc: Any, where: str) -> NodeState:
        try:
            ek = bytes.fromhex(doc["ek"])
            if len(ek) not in (0, 32) or not isinstance(doc["node_id"], str):
                raise ValueError("not a node id and a SHA-256 digest")
            c = doc.get("counters")
            counters = None if c is None else Counters(int(c["reset"]), int(c["restart"]), int(c["clock"]),
                                                       str(c["measured_boot"]))
            profile, accept = doc.get("profile", ""), doc.get("accept", False)
            accept_by = doc.get("accept_by", "operator" if accept else "")
            accept_after, firmware = doc.get("accept_after", -1), doc.get("firmware", "")
            if not (isinstance(profile, str) and isinstance(accept, bool) and isinstance(accept_by, str)
                    and isinstance(accept_after, int) and isinstance(firmware, str)):
                raise ValueError("profile, accept_by and firmware are strings, accept true or false, "
                                 "accept_after a number")
            return cls(doc["node_id"], ek, counters, profile, accept, accept_by, accept_after, firmware)
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidParameters(f"{where}: not a node's attestation state: {e}") from e


class StateFull(Exception):
    """The table holds ``max_nodes`` nodes and this one is not among them."""


class NodeStates:
    """The per-node table. Not thread-safe: the verifier calls it under its own lock."""

    def __init__(self, folder: Path | None = None, *, max_nodes: int = MAX_NODES) -> None:
        self.folder = folder
        self.max_nodes = max_nodes
        self._nodes: dict[str, NodeState] = {}
        self._owner: dict[bytes, str] = {}  # EK digest -> the node it is bound to
        if folder is not None:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path in sorted(folder.glob("*.json")):
                try:
                    state = self._read(path)
                except InvalidParameters as e:  # that node is refused (verifier) until re-enrolled
                    log.error("attestation state: %s", e)
                    continue
                if state is not None:
                    self._index(state)

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, node_id: str) -> NodeState | None:
        """The node's state; a file that cannot be read raises (the join fails closed)."""
        if self.folder is None:
            return self._nodes.get(node_id)
        state = self._read(self._path(node_id))
        old = self._nodes.pop(node_id, None)
        if old is not None and self._owner.get(old.ek) == node_id:
            del self._owner[old.ek]
        if state is not None:
            self._index(state)
        return state

    def owner(self, ek: bytes) -> str | None:
        """The node ``ek`` is bound to, checked against that node's file."""
        node = self._owner.get(ek)
        if node is None:
            return None
        state = self.get(node)
        return node if state is not None and state.ek == ek else None

    def put(self, state: NodeState) -> None:
        """Record the node's state (StateFull where the table has no room for a new node)."""
        if state.node_id not in self._nodes and len(self._nodes) >= self.max_nodes:
            raise StateFull(f"the verifier's table holds {self.max_nodes} nodes")
        if self.folder is not None:
            text = json.dumps(state.to_json(), sort_keys=True) + "\n"
            atomicfile.write_atomic(self._path(state.node_id), text.encode(), 0o600)
        self._index(state)

    def bind(self, node_id: str, ek: bytes) -> None:
        state = self.get(node_id) or NodeState(node_id)
        self.put(replace(state, ek=ek))

    def accept(self, node_id: str, by: str = "operator", *, next_boot: bool = False) -> NodeState:
        """Open the node's window: its next attested join may learn its firmware's PCRs (a new
        profile, or new values for its profile). ``by``: who opened it; ``next_boot``: only for a
        boot after the TPM's last reset the table holds (a firmware update applies at a reset)."""
        state = self.get(node_id) or NodeState(node_id)
        after = state.counters.reset if next_boot and state.counters is not None else -1
        state = replace(state, accept=True, accept_by=by, accept_after=after)
        self.put(state)
        return state

    def release(self, node_id: str) -> NodeState | None:
        """Forget the node: its EK and its counters (a TPM replaced). Returns what was kept."""
        state = self.get(node_id)
        self._nodes.pop(node_id, None)
        if state is not None and self._owner.get(state.ek) == node_id:
            del self._owner[state.ek]
        if self.folder is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(node_id))
                atomicfile.fsync_dir(self._path(node_id))
        return state

    def _index(self, state: NodeState) -> None:
        old = self._nodes.get(state.node_id)
        if old is not None and old.ek and self._owner.get(old.ek) == state.node_id:
            del self._owner[old.ek]
        self._nodes[state.node_id] = state
        if state.ek:
            self._owner[state.ek] = state.node_id

    def _path(self, node_id: str) -> Path:
        assert self.folder is not None
        return self.folder / (hashlib.sha256(node_id.encode()).hexdigest()[:32] + ".json")

    def _read(self, path: Path) -> NodeState | None:
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise InvalidParameters(f"{path}: cannot read the node's attestation state: {e}") from e
        if len(raw) > MAX_STATE_BYTES:
            raise InvalidParameters(f"{path}: over {MAX_STATE_BYTES} bytes")
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise InvalidParameters(f"{path}: not JSON: {e}") from e
        state = NodeState.from_json(doc, str(path))
        if self._path(state.node_id) != path:
            raise InvalidParameters(f"{path}: holds node {state.node_id!r}, whose file is another")
        return state
