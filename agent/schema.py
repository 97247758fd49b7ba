"""Which protobuf message each kind takes and returns.

The catalog names each kind's payload type; this module resolves names to message classes
(through the descriptor pool, so nothing is listed twice) and names each kind's result type.
"""

from __future__ import annotations

import importlib

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from agent import catalog, limits
from agent.errors import InvalidParameters

# The generated module that registers each protobuf package's types, imported when a type of
# the package is first needed: agent_pb2 describes every kind's messages, and building those
# descriptors in pure-Python protobuf is the slowest import of the agent's start-up under
# emulation (1.3 s in the ramdisk under TCG), for types an idle agent never uses.
PACKAGE_MODULES: dict[str, str] = {
    "bettercompute.agent.v1.": "agent.proto.agent_pb2",
    "bettercompute.site.v1.": "agent.proto.site_pb2",
    "bettercompute.gateway.v1.": "agent.proto.session_pb2",
}

# Result message of each kind. Site kinds have theirs for completeness.
RESULT_TYPES: dict[str, str] = {
    "bmc.boot": "bettercompute.site.v1.BmcOperationResult",
    "bmc.firmware": "bettercompute.site.v1.BmcOperationResult",
    "bmc.power": "bettercompute.site.v1.BmcOperationResult",
    "bmc.query": "bettercompute.site.v1.BmcOperationResult",
    "bmc.rotate": "bettercompute.site.v1.BmcOperationResult",
    "bmc.storage": "bettercompute.site.v1.BmcOperationResult",
    "boot.cleanUp": "bettercompute.site.v1.BootCleanUpResult",
    "boot.kexec": "bettercompute.agent.v1.KexecResult",
    "boot.prepareRamdisk": "bettercompute.site.v1.ProxyDhcpResult",
    "daemon.upgrade": "bettercompute.agent.v1.DaemonUpgradeResult",
    "deploy.image": "bettercompute.agent.v1.DeployImageResult",
    "diag.dcgm": "bettercompute.agent.v1.DiagDcgmResult",
    "diag.nvml": "bettercompute.agent.v1.DiagNvmlResult",
    "disk.wipe": "bettercompute.agent.v1.WipeResult",
    "driver.invoke": "bettercompute.agent.v1.DriverInvokeResult",
    "gpu.reset": "bettercompute.agent.v1.GpuResetResult",
    "instance.snapshot": "bettercompute.agent.v1.InstanceSnapshotResult",
    "inventory.refresh": "bettercompute.agent.v1.InventoryRefreshResult",
    "logs.collect": "bettercompute.agent.v1.LogsCollectResult",
    "node.reboot": "bettercompute.agent.v1.NodeRebootResult",
    "site.httpProxy": "bettercompute.site.v1.HttpProxyResult",
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
    return message_class(RESULT_TYPES[kind])


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
        raise InvalidParameters(
            f"{kind}: payload JSON does not fit {msg.DESCRIPTOR.full_name}: {exc}"
        ) from exc
    return msg


def to_json(msg: Message) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=2)
