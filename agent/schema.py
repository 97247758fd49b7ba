"""Which protobuf message each kind takes and returns, and the body of a command.

The catalog names each kind's payload and result types; this module resolves those names to
message classes through the descriptor pool, so nothing is listed twice. ``command_body``
builds the CommandBody of one command, for the gateway and for `agent exec` alike.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from agent import catalog, limits
from agent.errors import InvalidParameters

if TYPE_CHECKING:
    from agent.proto import session_pb2

# The generated module that registers each protobuf package's types, imported when a type of
# the package is first needed: agent_pb2 describes every kind's messages, and building those
# descriptors in pure-Python protobuf is the slowest import of the agent's start-up under
# emulation (1.3 s in the ramdisk under TCG), for types an idle agent never uses.
PACKAGE_MODULES: dict[str, str] = {
    "bettercompute.agent.v1.": "agent.proto.agent_pb2",
    "bettercompute.site.v1.": "agent.proto.site_pb2",
    "bettercompute.gateway.v1.": "agent.proto.session_pb2",
}

def message_class(full_name: str) -> type[Message]:
    for prefix, module in PACKAGE_MODULES.items():
        if full_name.startswith(prefix):
            importlib.import_module(module)
    descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    return message_factory.GetMessageClass(descriptor)


def payload_class(kind: str) -> type[Message]:
    k = catalog.KINDS[kind]
    return message_class(k.payload)


def result_class(kind: str) -> type[Message]:
    return message_class(catalog.KINDS[kind].result)


def decode_payload(kind: str, data: bytes) -> Message:
    """Parse a command's payload bytes as the kind's message; InvalidParameters if it fails."""
    msg = payload_class(kind)()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidParameters(f"{kind}: payload is not a valid {msg.DESCRIPTOR.full_name}") from exc
    return msg


def payload_from_json(kind: str, text: str | dict[str, object]) -> Message:
    """A kind's payload from JSON (the gateway CLI and `agent exec` take JSON); text over
    limits.MAX_JSON_BYTES or nested deeper than limits.MAX_JSON_DEPTH is refused."""
    from google.protobuf import json_format

    msg = payload_class(kind)()
    obj = limits.loads_json(text, what=f"{kind}: payload") if isinstance(text, str) else text
    try:
        json_format.ParseDict(obj, msg)
    except (ValueError, TypeError, AttributeError, RecursionError, json_format.ParseError) as exc:
        raise InvalidParameters(_json_error(kind, msg, exc)) from exc
    return msg


_NO_FIELD = re.compile(
    r'Message type "(?P<type>[\w.]+)" has no field named "(?P<field>[^"]*)" at "(?P<at>[^"]*)"')


def _json_error(kind: str, msg: Message, exc: Exception) -> str:
    """protobuf's parse error in an operator's words: which field, and what the message takes."""
    found = _NO_FIELD.search(str(exc))
    if found is None:
        return f"{kind}: payload JSON does not fit {msg.DESCRIPTOR.full_name}: {str(exc).splitlines()[0]}"
    descriptor = descriptor_pool.Default().FindMessageTypeByName(found["type"])
    fields = ", ".join(f.name for f in descriptor.fields)
    path = found["at"].split(".", 1)[1] if "." in found["at"] else ""
    where = f" in {path!r}" if path else ""
    return (f"{kind}: the payload has no field {found['field']!r}{where} "
            f"({descriptor.name}'s fields: {fields})")


def command_body(
    node_id: str,
    kind: str,
    payload: Message | Mapping[str, Any] | str | bytes,
    *,
    command_id: str,
    timeout_seconds: int = 0,
    expires_in: float = 0.0,
    boot_id: str = "",
) -> session_pb2.CommandBody:
    """The CommandBody of one command: ``payload`` (a message, a dict or JSON text: the
    kind's message; bytes: as they are) issued now, expiring ``expires_in`` seconds from now
    (0: no expiry), bound to ``boot_id`` when it is given (destructive kinds need it)."""
    from agent.proto import session_pb2

    if isinstance(payload, bytes):
        raw = payload
    elif isinstance(payload, Message):
        raw = payload.SerializeToString()
    else:
        raw = payload_from_json(kind, dict(payload) if isinstance(payload, Mapping) else payload
                                ).SerializeToString()
    now_ms = int(time.time() * 1000)
    return session_pb2.CommandBody(
        command_id=command_id,
        kind=kind,
        node_id=node_id,
        payload=raw,
        issued_at_unix_ms=now_ms,
        expires_at_unix_ms=now_ms + int(expires_in * 1000) if expires_in else 0,
        timeout_seconds=timeout_seconds,
        boot_id=boot_id,
    )


def to_json(msg: Message) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=2)
