"""The reference gateway's bookkeeping: what it knows of each command and node, its timeline's
events, and the command bodies it builds (agent/gateway/server.py keeps the tables and runs the
sessions that change them).
"""

from __future__ import annotations

import enum
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError, Message

from agent import catalog, schema
from agent.errors import AgentError, InvalidParameters
from agent.link import wire
from agent.proto import session_pb2


class State(enum.StrEnum):
    PENDING = "pending"                  # not yet accepted (queued, or sent and unanswered)
    ACCEPTED = "accepted"
    AWAITING_REJOIN = "awaiting_rejoin"  # self-terminating: waiting for the node to come back
    REJECTED = "rejected"                # final
    FINISHED = "finished"                # final: a (verified) result arrived
    COMPLETED = "completed"              # final: self-terminating, rejoin proof arrived
    FAILED = "failed"                    # final: the gateway gave up (rejoin timeout, lost)

    @property
    def final(self) -> bool:
        return self in (State.REJECTED, State.FINISHED, State.COMPLETED, State.FAILED)


class CommandRejected(AgentError):
    """The agent refused the command; ``reason`` is its reason code (a string)."""

    def __init__(self, command_id: str, reason: str, message: str) -> None:
        super().__init__(f"{command_id} rejected: {reason}: {message}")
        self.command_id = command_id
        self.reason_code = reason


@dataclass
class GatewayEvent:
    """One line of the gateway's timeline."""

    time: float
    what: str            # "connected", "accepted", "result", "result_rejected", ...
    node_id: str = ""
    command_id: str = ""
    detail: str = ""

    def __str__(self) -> str:
        parts = [f"{self.time:.3f}", self.what, self.node_id, self.command_id, self.detail]
        return " ".join(p for p in parts if p)


@dataclass
class CommandRecord:
    command_id: str
    node_id: str
    kind: str
    signed: session_pb2.SignedCommand
    state: State = State.PENDING
    created_at: float = field(default_factory=time.monotonic)
    accepted_at: float | None = None
    deliveries: int = 0
    reject_reason: str = ""
    reject_message: str = ""
    result: session_pb2.ResultBody | None = None
    result_message: Message | None = None
    interim_result: session_pb2.ResultBody | None = None  # self-terminating: before the rejoin
    completion: session_pb2.Completion | None = None
    progress: session_pb2.Progress | None = None
    logs: list[session_pb2.LogLine] = field(default_factory=list)
    results_received: int = 0
    signed_boot_id: str = ""              # the node's boot id when the command was delivered
    signed_state_id: str = ""             # ... and its agent's state id
    body: session_pb2.CommandBody | None = None  # built here: bound (and signed) at delivery
    sign_body: bool = False               # ... and signed with the gateway's key
    timeout_seconds: int = 0              # as the command asked (0: the kind's)
    result_key: bytes = b""               # attested kinds: the node key that signed the result
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def rejoin_timeout(self) -> float:
        """How long a self-terminating command may take to rejoin: its (or its kind's) timeout."""
        kind = self.catalog_kind
        limit = float(kind.timeout_seconds if kind is not None else 900)
        return min(limit, float(self.timeout_seconds)) if self.timeout_seconds else limit

    @property
    def catalog_kind(self) -> catalog.Kind | None:
        return catalog.KINDS.get(self.kind)

    @property
    def succeeded(self) -> bool:
        if self.state is State.FINISHED and self.result is not None:
            return self.result.status == session_pb2.SUCCEEDED
        return self.state is State.COMPLETED and self.completion is not None and self.completion.ok


@dataclass
class GatewayNode:
    """The gateway's record of one node that joined it: its Hello, key, sessions and channel."""

    node_id: str
    hello: session_pb2.Hello
    public_key: bytes
    authenticated_by: str                 # "certificate" or "token"
    connected: bool = True
    sessions: int = 1
    keys_seen: list[bytes] = field(default_factory=list)
    channel: wire.Channel | None = None

    @property
    def boot_id(self) -> str:
        return self.hello.boot_id

    @property
    def state_id(self) -> str:
        return self.hello.state_id


FaultHook = Callable[[str, session_pb2.Frame], str | None]


def build_command(
    node_id: str,
    kind: str,
    payload: Message | Mapping[str, Any] | str | bytes,
    *,
    command_id: str | None = None,
    timeout_seconds: int = 0,
    expires_in: float = 600.0,
    boot_id: str = "",
    state_id: str = "",
) -> session_pb2.CommandBody:
    """The CommandBody for ``kind`` with ``payload`` (a message, a dict, JSON text or bytes),
    bound to the node's ``boot_id`` and its agent's ``state_id`` when they are known
    (destructive kinds need both)."""
    if kind not in catalog.KINDS:
        raise InvalidParameters(f"unknown kind {kind!r}; see `agent kinds`")
    return schema.command_body(node_id, kind, payload,
                               command_id=command_id or f"{kind}-{secrets.token_hex(6)}",
                               timeout_seconds=timeout_seconds, expires_in=expires_in, boot_id=boot_id,
                               state_id=state_id)


def decode_result(body: session_pb2.ResultBody) -> Message | None:
    """The result's payload as its message (by its type, else the kind's result type); None when
    it carries none or it does not decode."""
    if not body.payload and not body.payload_type:
        return None
    try:
        cls = schema.message_class(body.payload_type) if body.payload_type else schema.result_class(body.kind)
        msg = cls()
        msg.ParseFromString(body.payload)
    except (KeyError, DecodeError):
        return None
    return msg
