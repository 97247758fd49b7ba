"""The reference gateway: the agent's counterpart, small and honest (not a control plane).

Tests, the QEMU harness, the README demo and an operator in a recovery use it. It listens on
TLS 1.3 (``certs.server_context``), accepts agent sessions authenticated by a client
certificate (CN = node id) or an enrollment token, records each node's Hello (role, version,
boot id, kinds, public key), sends commands and collects what comes back.

Python API (agent/gateway/server.py; its records: records.py)::

    gw = Gateway(cert=..., key=..., client_ca=ca, signing_key=key_path, tokens={tok: node}).start()
    gw.wait_node("node-1", timeout=30)                  # -> GatewayNode (hello, public key)
    cid = gw.send("node-1", "disk.wipe", {"disks": [{"serial": "S1"}]})   # JSON/dict/message
    body, result = gw.wait_result(cid, timeout=600)     # ResultBody, decoded WipeResult
    gw.cancel(cid); gw.drain("node-1"); gw.events       # timeline of GatewayEvent(time, what, ...)
    gw.stop()

Rules it follows (docs/protocol.md has the protocol itself):

- ``send`` builds a CommandBody (payload JSON -> the kind's protobuf via
  schema.payload_from_json), bound to the node, with an expiry (default 10 min), and signs
  it with the control-plane key; destructive kinds are always signed (no key: refused).
  ``send_signed`` sends exact bytes (tests craft forged, expired or unsigned commands).
- A command is queued until its node is connected; on every (re)connect, commands never
  accepted are sent again with the same bytes (the agent answers a known id with its state,
  never runs it twice).
- A result is acknowledged only after it is checked: it must name this node and the kind
  sent; an attested kind's result must carry a valid signature by the node key from this
  session's Hello. A forged or modified result is recorded as ``result_rejected`` and changes
  nothing (no ack, no state). Duplicates are acknowledged again and ignored.
- A self-terminating command (boot.kexec, node.reboot, daemon.upgrade) is complete only when
  the rejoining agent's Hello carries its Completion; a succeeded result before the agent
  ends is kept as interim. Without a rejoin within the command's (or kind's) timeout, it
  fails with ``rejoin_timeout``.
- ``fault_hook(node_id, frame) -> "drop"`` lets tests cut a connection at a chosen frame;
  ``drop(node)`` cuts it now; ``restart()`` stops and listens again with the same tables.

CLI: ``python -m agent.gateway`` (also ``agent gateway``): ``keys`` makes a dev PKI and a
signing key, ``serve`` runs a gateway with a small console, ``send`` runs one command.
"""

from agent.gateway.records import CommandRecord, CommandRejected, GatewayEvent, GatewayNode, State
from agent.gateway.server import Gateway

__all__ = ["CommandRecord", "CommandRejected", "Gateway", "GatewayEvent", "GatewayNode", "State"]
