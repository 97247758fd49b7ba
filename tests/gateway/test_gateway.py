"""The reference gateway against a hand-driven client: authentication, result verification
(a forged attested result is rejected before anything is marked), resends, rejoin.
"""

from __future__ import annotations

import socket
import ssl
import time

import pytest

from agent.errors import Reason, Untrusted
from agent.gateway import Gateway, State
from agent.gateway.certs import DevPki
from agent.link import wire
from agent.link.session import client_context
from agent.proto import session_pb2
from agent.security.trust import SigningKey, TrustStore

TIMEOUT = 30.0


class Client:
    """A minimal agent: TLS, Hello, Welcome, then frames by hand."""

    def __init__(self, gw: Gateway, pki: DevPki, node: str = "node-1", *, cert: bool = True,
                 token: str = "", key: SigningKey | None = None, boot_id: str = "boot-1",
                 **hello: object) -> None:
        ctx = client_context(pki.ca, pki.client_cert(node) if cert else None,
                             pki.client_key(node) if cert else None)
        raw = socket.create_connection((gw.host, gw.port), timeout=TIMEOUT)
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.key = key or SigningKey.generate()
        self.node = node
        self.hello = session_pb2.Hello(protocol_version=1, node_id=node, role="ramdisk", boot_id=boot_id,
                                       public_key=self.key.public_raw, enrollment_token=token, **hello)
        wire.send_frame(self.sock, session_pb2.Frame(hello=self.hello))
        self.first = wire.recv_frame(self.sock, TIMEOUT)

    def send(self, frame: session_pb2.Frame) -> None:
        wire.send_frame(self.sock, frame)

    def recv(self, what: str) -> session_pb2.Frame:
        while True:
            frame = wire.recv_frame(self.sock, TIMEOUT)
            if frame.WhichOneof("msg") == what:
                return frame

    def result(self, cid: str, kind: str, *, status: int = session_pb2.SUCCEEDED,
               signer: SigningKey | None = None, node: str | None = None) -> session_pb2.SignedResult:
        body = session_pb2.ResultBody(command_id=cid, kind=kind, node_id=node or self.node, status=status)
        if signer is None:
            return session_pb2.SignedResult(body=body.SerializeToString())
        return signer.sign_result(body)

    def close(self) -> None:
        self.sock.close()


def test_client_certificate_and_token_authentication(gateway: Gateway, pki: DevPki) -> None:
    ok = Client(gateway, pki)
    assert ok.first.WhichOneof("msg") == "welcome"
    assert ok.first.welcome.heartbeat_interval_ms == 1000 and ok.first.welcome.dead_after_ms == 3000
    ok.close()
    # A certificate for node-2 presented as node-1.
    ctx = client_context(pki.ca, pki.client_cert("node-2"), pki.client_key("node-2"))
    raw = socket.create_connection((gateway.host, gateway.port))
    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
        wire.send_frame(s, session_pb2.Frame(hello=session_pb2.Hello(protocol_version=1, node_id="node-1")))
        reply = wire.recv_frame(s, TIMEOUT)
    assert reply.error.code == wire.UNAUTHENTICATED and "node-2" in reply.error.message
    # No certificate, no token; then a wrong token; then the right one.
    assert Client(gateway, pki, cert=False).first.error.code == wire.UNAUTHENTICATED
    gateway.tokens["secret"] = "node-1"
    assert Client(gateway, pki, cert=False, token="wrong").first.error.code == wire.UNAUTHENTICATED
    assert Client(gateway, pki, "node-2", cert=False, token="secret").first.error.code == wire.UNAUTHENTICATED
    good = Client(gateway, pki, cert=False, token="secret")
    assert good.first.WhichOneof("msg") == "welcome"
    assert gateway.wait_node("node-1", TIMEOUT, sessions=2).authenticated_by == "token"
    good.close()


def test_tls_below_1_3_is_refused(gateway: Gateway, pki: DevPki) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki.ca)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    address = (gateway.host, gateway.port)
    with pytest.raises((ssl.SSLError, OSError)), socket.create_connection(address) as raw:
        ctx.wrap_socket(raw, server_hostname="localhost")


def test_forged_attested_result_is_rejected_before_anything_is_marked(gateway: Gateway, pki: DevPki) -> None:
    c = Client(gateway, pki)
    gateway.wait_node("node-1", TIMEOUT)
    cid = gateway.send("node-1", "diag.nvml", {})
    cmd = c.recv("command").command
    assert session_pb2.CommandBody.FromString(cmd.body).command_id == cid
    c.send(session_pb2.Frame(accept=session_pb2.Accept(command_id=cid, state=session_pb2.QUEUED)))
    # Signed by another key, unsigned, and a valid one for another node: all rejected.
    c.send(session_pb2.Frame(result=c.result(cid, "diag.nvml", signer=SigningKey.generate())))
    c.send(session_pb2.Frame(result=c.result(cid, "diag.nvml")))
    c.send(session_pb2.Frame(result=c.result(cid, "diag.nvml", signer=c.key, node="node-2")))
    gateway.wait_for(lambda: len([e for e in gateway.events_for(cid) if e.what == "result_rejected"]) == 3,
                     TIMEOUT, "three rejections")
    rec = gateway.commands[cid]
    assert rec.state is State.ACCEPTED and rec.result is None and not rec.done.is_set()
    reasons = [e.detail.split(":")[0] for e in gateway.events_for(cid) if e.what == "result_rejected"]
    assert reasons[:2] == ["signature_invalid", "signature_missing"]
    # The genuine one is accepted and acknowledged.
    c.send(session_pb2.Frame(result=c.result(cid, "diag.nvml", signer=c.key)))
    assert c.recv("ack").ack.command_id == cid
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED
    c.close()


def test_unacked_result_in_hello_is_recorded_once_and_acked(gateway: Gateway, pki: DevPki) -> None:
    c = Client(gateway, pki)
    gateway.wait_node("node-1", TIMEOUT)
    cid = gateway.send("node-1", "disk.wipe", {"disks": [{"serial": "S"}]})
    c.recv("command")
    c.close()
    gateway.wait_for(lambda: not gateway.nodes["node-1"].connected, TIMEOUT, "disconnect")
    key = c.key
    result = c.result(cid, "disk.wipe", signer=key)
    again = Client(gateway, pki, key=key, unacked_results=[result])
    assert again.recv("ack").ack.command_id == cid
    assert gateway.wait_result(cid, TIMEOUT)[0].status == session_pb2.SUCCEEDED
    again.send(session_pb2.Frame(result=result))  # a duplicate: acked again, recorded once
    assert again.recv("ack").ack.command_id == cid
    assert gateway.commands[cid].results_received == 2
    assert [e.what for e in gateway.events_for(cid)].count("result") == 1
    again.close()


def test_unaccepted_command_is_resent_on_reconnect(gateway: Gateway, pki: DevPki) -> None:
    c = Client(gateway, pki)
    gateway.wait_node("node-1", TIMEOUT)
    cid = gateway.send("node-1", "inventory.refresh", {})
    first = c.recv("command").command
    c.close()  # never answered
    gateway.wait_for(lambda: not gateway.nodes["node-1"].connected, TIMEOUT, "disconnect")
    c2 = Client(gateway, pki)
    assert c2.recv("command").command == first  # the same bytes
    assert gateway.commands[cid].deliveries == 2
    c2.close()


def test_self_terminating_completion_in_hello(gateway: Gateway, pki: DevPki) -> None:
    c = Client(gateway, pki, boot_id="boot-A")
    gateway.wait_node("node-1", TIMEOUT)
    cid = gateway.send("node-1", "boot.kexec", {})
    c.recv("command")
    c.send(session_pb2.Frame(accept=session_pb2.Accept(command_id=cid)))
    c.send(session_pb2.Frame(goodbye=session_pb2.Goodbye(reason="self_terminating")))
    c.close()
    gateway.wait_for(lambda: gateway.commands[cid].state is State.AWAITING_REJOIN, TIMEOUT, "awaiting rejoin")
    completion = session_pb2.Completion(command_id=cid, kind="boot.kexec", ok=True,
                                        old_boot_id="boot-A", new_boot_id="boot-B")
    c2 = Client(gateway, pki, boot_id="boot-B", completions=[completion])
    assert c2.recv("ack").ack.command_id == cid
    body, _ = gateway.wait_result(cid, TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED and body.details["new_boot_id"] == "boot-B"
    c2.close()


def test_commands_for_an_offline_node_wait_for_it(gateway: Gateway, pki: DevPki) -> None:
    cid = gateway.send("node-2", "inventory.refresh", {})
    assert "node-2" not in gateway.nodes  # no session: nothing could deliver it
    assert gateway.commands[cid].state is State.PENDING and gateway.commands[cid].deliveries == 0
    c = Client(gateway, pki, "node-2")
    assert session_pb2.CommandBody.FromString(c.recv("command").command.body).command_id == cid
    c.close()


def test_destructive_commands_are_always_signed(gateway: Gateway, pki: DevPki) -> None:
    from agent.errors import InvalidParameters

    with pytest.raises(InvalidParameters):
        gateway.send("node-1", "disk.wipe", {"disks": [{"serial": "S"}]}, sign=False)
    cid = gateway.send("node-1", "disk.wipe", {"disks": [{"serial": "S"}]})
    signed = gateway.commands[cid].signed
    body = session_pb2.CommandBody.FromString(signed.body)
    assert signed.signature and signed.key_id == SigningKey.load(pki.signing_key).key_id
    assert body.node_id == "node-1" and body.expires_at_unix_ms > body.issued_at_unix_ms


def test_every_command_is_signed_for_the_boot_the_node_announced(gateway: Gateway, pki: DevPki) -> None:
    """Queued before the node connected, it is bound (and signed) at delivery to the Hello's boot
    id; resent within the same boot it keeps its bytes; resent to a new boot it is signed again
    for that boot (it never ran: it was never accepted)."""
    control = SigningKey.load(pki.signing_key)
    cid = gateway.send("node-2", "disk.wipe", {"disks": [{"serial": "S"}]})
    c = Client(gateway, pki, "node-2", boot_id="boot-A")
    first = c.recv("command").command
    assert session_pb2.CommandBody.FromString(first.body).boot_id == "boot-A"
    store = TrustStore([control.public_raw])
    now = int(time.time() * 1000)
    assert store.verify_command(first, node_id="node-2", now_ms=now, boot_id="boot-A",
                                max_lifetime_ms=900_000)
    c.close()
    gateway.wait_for(lambda: not gateway.nodes["node-2"].connected, TIMEOUT, "disconnect")
    c = Client(gateway, pki, "node-2", boot_id="boot-A")
    assert c.recv("command").command == first
    c.close()
    gateway.wait_for(lambda: not gateway.nodes["node-2"].connected, TIMEOUT, "disconnect")
    c = Client(gateway, pki, "node-2", boot_id="boot-B")
    again = c.recv("command").command
    assert session_pb2.CommandBody.FromString(again.body).boot_id == "boot-B"
    assert store.verify_command(again, node_id="node-2", now_ms=now, boot_id="boot-B")
    assert gateway.commands[cid].deliveries == 3
    c.close()


def test_every_command_is_signed_for_the_agent_state_the_node_announced(gateway: Gateway,
                                                                         pki: DevPki) -> None:
    """The same for the state id: within one boot, a Hello with a new state (the agent lost its
    journal) gets the undelivered command bound and signed again for that state."""
    control = SigningKey.load(pki.signing_key)
    store = TrustStore([control.public_raw])
    now = int(time.time() * 1000)
    cid = gateway.send("node-2", "disk.wipe", {"disks": [{"serial": "S"}]})
    c = Client(gateway, pki, "node-2", boot_id="boot-A", state_id="state-1")
    first = c.recv("command").command
    body = session_pb2.CommandBody.FromString(first.body)
    assert (body.boot_id, body.state_id) == ("boot-A", "state-1")
    assert store.verify_command(first, node_id="node-2", now_ms=now, boot_id="boot-A", state_id="state-1")
    with pytest.raises(Untrusted) as info:
        store.verify_command(first, node_id="node-2", now_ms=now, boot_id="boot-A", state_id="state-2")
    assert info.value.reason is Reason.WRONG_STATE
    c.close()
    gateway.wait_for(lambda: not gateway.nodes["node-2"].connected, TIMEOUT, "disconnect")
    c = Client(gateway, pki, "node-2", boot_id="boot-A", state_id="state-2")
    again = c.recv("command").command
    assert session_pb2.CommandBody.FromString(again.body).state_id == "state-2"
    assert store.verify_command(again, node_id="node-2", now_ms=now, boot_id="boot-A", state_id="state-2")
    assert gateway.commands[cid].deliveries == 2
    c.close()


def test_a_boot_token_is_good_for_one_boots_join(gateway: Gateway, pki: DevPki) -> None:
    """A PXE entry's bc.token= is served on the provisioning network: the token the gateway
    issues for a boot joins that boot (and its reconnects) only; another boot, or a stranger
    who read the script, joining with it is refused, named, and said in the gateway's events."""
    token = gateway.issue_boot_token("node-1")
    key = SigningKey.generate()
    first = Client(gateway, pki, cert=False, token=token, boot_id="boot-1", key=key)
    assert first.first.WhichOneof("msg") == "welcome"
    assert gateway.wait_node("node-1", TIMEOUT).authenticated_by == "boot token"
    first.close()
    again = Client(gateway, pki, cert=False, token=token, boot_id="boot-1", key=key)   # a reconnect
    assert again.first.WhichOneof("msg") == "welcome"
    again.close()
    for boot, other in (("boot-2", key), ("boot-1", SigningKey.generate())):
        refused = Client(gateway, pki, cert=False, token=token, boot_id=boot, key=other).first
        assert refused.error.code == wire.UNAUTHENTICATED
        assert "already used" in refused.error.message and "boot-1" in refused.error.message
    assert Client(gateway, pki, "node-2", cert=False, token=token).first.error.code == wire.UNAUTHENTICATED
    reused = [e for e in gateway.events if e.what == "token_reused"]
    assert len(reused) == 2 and all(e.node_id == "node-1" for e in reused), reused


def test_a_nodes_new_boot_token_replaces_its_last(gateway: Gateway, pki: DevPki) -> None:
    """One boot token per node: the table is bounded by the nodes, and a token issued for an
    earlier boot no longer joins once the next one is issued."""
    old = gateway.issue_boot_token("node-1")
    new = gateway.issue_boot_token("node-1")
    assert list(gateway.boot_tokens.values()).count("node-1") == 1
    stale = Client(gateway, pki, cert=False, token=old, boot_id="boot-1").first
    assert stale.error.code == wire.UNAUTHENTICATED
    assert Client(gateway, pki, cert=False, token=new, boot_id="boot-2").first.WhichOneof("msg") == "welcome"


def test_a_signature_on_a_result_of_any_kind_is_verified(gateway: Gateway, pki: DevPki) -> None:
    """A release report comes signed from inventory.refresh, which is not an attested kind: a
    signature a result carries is checked whatever the kind, so a forged one changes nothing."""
    c = Client(gateway, pki)
    gateway.wait_node("node-1", TIMEOUT)
    cid = gateway.send("node-1", "inventory.refresh", {})
    c.recv("command")
    c.send(session_pb2.Frame(accept=session_pb2.Accept(command_id=cid, state=session_pb2.QUEUED)))
    c.send(session_pb2.Frame(result=c.result(cid, "inventory.refresh", signer=SigningKey.generate())))
    gateway.wait_for(lambda: any(e.what == "result_rejected" for e in gateway.events_for(cid)),
                     TIMEOUT, "the forged signature rejected")
    assert gateway.commands[cid].result is None
    c.send(session_pb2.Frame(result=c.result(cid, "inventory.refresh", signer=c.key)))
    assert c.recv("ack").ack.command_id == cid
    c.close()
