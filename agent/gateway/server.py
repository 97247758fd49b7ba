"""The reference gateway: accepts agent sessions, sends commands, collects results.

See agent/gateway/__init__.py for the design and the API in short; the records it keeps (commands,
nodes, the timeline's events) and the bodies it builds are agent/gateway/records.py's.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError, Message

from agent import catalog
from agent.errors import InvalidParameters, Untrusted
from agent.gateway import certs, spdm_report
from agent.gateway.records import (
    CommandRecord,
    CommandRejected,
    FaultHook,
    GatewayEvent,
    GatewayNode,
    State,
    build_command,
    decode_result,
)
from agent.gateway.verifier.join import JoinAttestation, file_release, site_refusal, site_report
from agent.gateway.verifier.spdm_verdict import DeviceChallenges
from agent.link import wire
from agent.proto import session_pb2
from agent.security.trust import SigningKey, verify_result

log = logging.getLogger(__name__)


class Gateway:
    """A small TLS gateway for agents. ``start()`` it, then use the methods below."""

    def __init__(
        self,
        *,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        signing_key: Path | SigningKey | None = None,
        tokens: Mapping[str, str] | None = None,
        boot_tokens: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_seconds: float = 2.0,
        dead_after_seconds: float | None = None,
        max_frame_bytes: int = wire.MAX_FRAME_BYTES,
        gateway_id: str = "reference-gateway",
        handshake_seconds: float = 10.0,
        attestation: JoinAttestation | None = None,
        site_node: str = "",
        devices: DeviceChallenges | None = None,
    ) -> None:
        self._ssl = certs.server_context(cert, key, client_ca)
        if isinstance(signing_key, SigningKey) or signing_key is None:
            self.signing_key = signing_key
        else:
            self.signing_key = SigningKey.load(Path(signing_key))
        self.tokens: dict[str, str] = dict(tokens or {})   # token -> node id ("" = any node)
        # Tokens good for one boot's join (a PXE entry's bc.token=, served on the provisioning
        # network): token -> node id; the first join binds it to that boot (its boot id and key),
        # and a join of any other boot with it is refused, named (``token_reused``).
        self.boot_tokens: dict[str, str] = dict(boot_tokens or {})
        self._token_boots: dict[str, tuple[str, str, bytes]] = {}   # token -> (node, boot, key)
        self.host, self.port = host, port
        self.heartbeat_seconds = heartbeat_seconds
        self.dead_after_seconds = dead_after_seconds or 3 * heartbeat_seconds
        self.max_frame_bytes = max_frame_bytes
        self.gateway_id = gateway_id
        self.handshake_seconds = handshake_seconds
        self.attestation = attestation  # attestation at every join (docs/attestation.md)
        self.site_node = site_node      # the site daemon told of a refused join (verifier/join.py)
        self.devices = devices          # SPDM device attestation through the site (spdm_report.py)
        self.device_rounds = spdm_report.Rounds()
        if attestation is not None and attestation.on_verdict is None:
            attestation.on_verdict = lambda node, v: self._event(f"attest_{v.status}", node, detail=str(v))
        self.nodes: dict[str, GatewayNode] = {}
        self.commands: dict[str, CommandRecord] = {}
        self.orphan_results: list[session_pb2.ResultBody] = []  # results for ids it never sent
        self.events: list[GatewayEvent] = []
        self.listeners: list[Callable[[GatewayEvent, CommandRecord | None], None]] = []
        self.fault_hook: FaultHook | None = None  # tests: return "drop" to cut the connection
        self._cond = threading.Condition(threading.RLock())
        self._server: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._channels: set[wire.Channel] = set()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> Gateway:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.host, self.port))
        server.listen(64)
        server.settimeout(0.2)
        self.port = server.getsockname()[1]
        self._server = server
        self._stop.clear()
        for target, name in ((self._accept_loop, "gw-accept"), (self._watchdog, "gw-watchdog")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self._event("listening", detail=self.address)
        return self

    def stop(self) -> None:
        """Stop listening and close every session (the command table is kept)."""
        self._stop.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        with self._cond:
            channels = list(self._channels)
        for ch in channels:
            ch.abort("gateway_stopped")
        for ch in channels:
            ch.join(5)
        for t in self._threads:
            t.join(5)
        self._threads.clear()
        self._server = None
        self._event("stopped")

    def restart(self) -> None:
        """Stop and listen again on the same port, keeping nodes and commands (tests)."""
        self.stop()
        self.start()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- sessions -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._server is not None
        server = self._server
        while not self._stop.is_set():
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._session, args=(conn, addr), name=f"gw-{addr}", daemon=True)
            t.start()

    def _session(self, conn: socket.socket, addr: Any) -> None:
        try:
            conn.settimeout(self.handshake_seconds)
            tls = self._ssl.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self._event("tls_failed", detail=f"{addr}: {exc}")
            with contextlib.suppress(OSError):
                conn.close()
            return
        try:
            frame = wire.recv_frame(tls, self.handshake_seconds, self.max_frame_bytes)
            if frame.WhichOneof("msg") != "hello":
                raise wire.WireError(wire.UNEXPECTED_FRAME, f"expected hello, got {wire.kind_of(frame)}")
            hello = frame.hello
            how = self._authenticate(tls, hello)
            welcome = session_pb2.Welcome(
                gateway_id=self.gateway_id,
                heartbeat_interval_ms=int(self.heartbeat_seconds * 1000),
                dead_after_ms=int(self.dead_after_seconds * 1000),
                max_frame_bytes=self.max_frame_bytes,
            )
            wire.send_frame(tls, session_pb2.Frame(welcome=welcome))
        except wire.WireError as exc:
            self._event("session_refused", detail=f"{addr}: {exc}")
            with contextlib.suppress(OSError, ssl.SSLError):
                tls.settimeout(2)
                wire.send_frame(tls, wire.error_frame(exc.code, exc.message))
            with contextlib.suppress(OSError):
                tls.close()
            return
        except (OSError, ssl.SSLError) as exc:
            self._event("session_failed", detail=f"{addr}: {exc}")
            with contextlib.suppress(OSError):
                tls.close()
            return
        node_id = hello.node_id
        channel = wire.Channel(
            tls,
            on_frame=lambda f: self._on_frame(node_id, channel, f),
            on_close=lambda reason: self._on_close(node_id, channel, reason),
            name=f"gw-{node_id}",
            max_frame_bytes=self.max_frame_bytes,
            heartbeat_interval=self.heartbeat_seconds,
            dead_after=self.dead_after_seconds,
        )
        with self._cond:
            if self._stop.is_set():
                tls.close()
                return
            self._channels.add(channel)
            old = self.nodes.get(node_id)
            if old is not None and old.channel is not None:
                old.channel.abort("replaced_by_new_session")
            if old is not None and old.public_key != hello.public_key:
                self._event("node_key_changed", node_id, detail=f"boot {hello.boot_id}")
            node = GatewayNode(
                node_id=node_id, hello=hello, public_key=bytes(hello.public_key), authenticated_by=how,
                sessions=(old.sessions + 1) if old else 1,
                keys_seen=(old.keys_seen if old else []),
                channel=channel,
            )
            if node.public_key not in node.keys_seen:
                node.keys_seen.append(node.public_key)
            self.nodes[node_id] = node
            self._event(
                "connected", node_id,
                detail=f"{hello.role} {hello.agent_version} boot={hello.boot_id} by {how}",
            )
            if self.attestation is not None:  # the node's previous verdict vouches for nothing from here
                self.attestation.begin(node_id, hello)
            channel.start()
            self._process_hello(node, hello)
            self._cond.notify_all()
        if self.attestation is not None:  # attestation: challenge the node's TPM, off the lock
            source = str(addr[0]) if isinstance(addr, tuple) and addr else ""
            self._attest_reply(node_id, channel, self.attestation.on_hello(node_id, hello, source))

    def _attest_reply(self, node_id: str, channel: wire.Channel, frame: session_pb2.Frame) -> None:
        """Send the node its challenge or verdict; a refused join is told to the site."""
        channel.send(frame)
        told = site_refusal(node_id, frame) if self.site_node and node_id != self.site_node else None
        if told is not None:
            cid = self.send(self.site_node, "boot.cleanUp", told)
            self._event("join_refused", node_id, cid, f"told {self.site_node}: {told['join_refused']}")

    def _authenticate(self, tls: ssl.SSLSocket, hello: session_pb2.Hello) -> str:
        if not hello.node_id:
            raise wire.WireError(wire.UNAUTHENTICATED, "hello carries no node id")
        if hello.protocol_version != wire.PROTOCOL_VERSION:
            raise wire.WireError(
                "unsupported_protocol",
                f"protocol {hello.protocol_version}; this gateway speaks {wire.PROTOCOL_VERSION}",
            )
        cn = certs.peer_common_name(tls)
        if cn is not None:
            if cn != hello.node_id:
                raise wire.WireError(
                    wire.UNAUTHENTICATED, f"client certificate is for {cn!r}, hello says {hello.node_id!r}"
                )
            return "certificate"
        token = hello.enrollment_token
        if token:
            for known, node in self.tokens.items():
                if secrets.compare_digest(known.encode(), token.encode()) and node in ("", hello.node_id):
                    return "token"
            with self._cond:
                for known, node in self.boot_tokens.items():
                    if secrets.compare_digest(known.encode(), token.encode()) and node in ("", hello.node_id):
                        return self._boot_token(known, hello)
        raise wire.WireError(wire.UNAUTHENTICATED, "no client certificate and no valid enrollment token")

    def issue_boot_token(self, node_id: str) -> str:
        """A token good for one join of ``node_id``'s next boot (its PXE entry's bc.token=). A
        node holds one: a new one replaces its last, so the table is bounded by the nodes."""
        token = secrets.token_urlsafe(24)
        with self._cond:
            for old in [t for t, n in self.boot_tokens.items() if n == node_id]:
                del self.boot_tokens[old]
                self._token_boots.pop(old, None)
            self.boot_tokens[token] = node_id
        return token

    def _boot_token(self, token: str, hello: session_pb2.Hello) -> str:
        """Under the lock: a boot token's join. Its first binds it to that boot (the node, its
        boot id and key): a reconnect of the same boot is the same join; any other boot with it
        is refused, named."""
        joined = (hello.node_id, hello.boot_id, bytes(hello.public_key))
        first = self._token_boots.setdefault(token, joined)
        if first == joined:
            return "boot token"
        node, boot, _ = first
        why = (f"enrollment token already used: it joined node {node}'s boot {boot or '(no boot id)'}; "
               "a boot token is good for one boot's join")
        self._event("token_reused", hello.node_id, detail=f"boot {hello.boot_id}: {why}")
        raise wire.WireError(wire.UNAUTHENTICATED, why)

    def _process_hello(self, node: GatewayNode, hello: session_pb2.Hello) -> None:
        """Under the lock: results and completions carried by the Hello, then resends."""
        in_flight = {s.command_id: s for s in hello.in_flight}
        for signed in hello.unacked_results:
            self._handle_result(node, signed)
        for completion in hello.completions:
            self._handle_completion(node, completion)
        for cid, status in in_flight.items():
            rec = self.commands.get(cid)
            if rec is not None and not rec.state.final:
                if status.state == session_pb2.AWAITING_REJOIN:
                    rec.state = State.AWAITING_REJOIN
                elif rec.state is State.PENDING:
                    rec.state = State.ACCEPTED
                    rec.accepted_at = time.monotonic()
        for rec in list(self.commands.values()):
            if rec.node_id != node.node_id or rec.state.final:
                continue
            if rec.state is State.PENDING:
                self._deliver(rec)
            elif (
                rec.state is State.ACCEPTED
                and rec.command_id not in in_flight
                and rec.catalog_kind is not None
                and not rec.catalog_kind.self_terminating
                and (rec.signed_boot_id not in ("", hello.boot_id)
                     or rec.signed_state_id not in ("", hello.state_id))
            ):
                why = "booted again" if rec.signed_boot_id not in ("", hello.boot_id) else "lost its journal"
                self._finish(rec, State.FAILED, f"interrupted: the node {why} and does not know it")

    def _on_close(self, node_id: str, channel: wire.Channel, reason: str) -> None:
        with self._cond:
            self._channels.discard(channel)
            node = self.nodes.get(node_id)
            if node is not None and node.channel is channel:
                node.connected = False
                node.channel = None
                self._event("disconnected", node_id, detail=reason)
                for rec in self.commands.values():
                    kind = rec.catalog_kind
                    if (
                        rec.node_id == node_id and rec.state is State.ACCEPTED
                        and kind is not None and kind.self_terminating
                    ):
                        rec.state = State.AWAITING_REJOIN
            self._cond.notify_all()

    def _on_frame(self, node_id: str, channel: wire.Channel, frame: session_pb2.Frame) -> None:
        if self.fault_hook is not None and self.fault_hook(node_id, frame) == "drop":
            self._event("fault_drop", node_id, detail=f"cut the connection at a {wire.kind_of(frame)} frame")
            channel.abort("fault_injected")
            return
        what = frame.WhichOneof("msg")
        if what == "attest_answer" and self.attestation is not None:  # attestation, off the lock
            with self._cond:
                node = self.nodes.get(node_id)
                current = node is not None and node.channel is channel
            if current:  # an answer on a session already replaced answers nothing
                self._attest_reply(node_id, channel, self.attestation.on_answer(node_id, frame.attest_answer))
            return
        with self._cond:
            node = self.nodes.get(node_id)
            if node is None or node.channel is not channel:
                return
            if what == "accept":
                self._handle_accept(node, frame.accept)
            elif what == "reject":
                rec = self.commands.get(frame.reject.command_id)
                self._event("rejected", node_id, frame.reject.command_id,
                            f"{frame.reject.reason}: {frame.reject.message}")
                if rec is not None and not rec.state.final:
                    rec.reject_reason, rec.reject_message = frame.reject.reason, frame.reject.message
                    self._finish(rec, State.REJECTED, frame.reject.reason)
            elif what == "progress":
                rec = self.commands.get(frame.progress.command_id)
                if rec is not None:
                    rec.progress = frame.progress
                self._event("progress", node_id, frame.progress.command_id,
                            f"{frame.progress.fraction:.3f} {frame.progress.message}", quiet=True)
            elif what == "log":
                rec = self.commands.get(frame.log.command_id)
                if rec is not None:
                    rec.logs.append(frame.log)
                self._event("log", node_id, frame.log.command_id,
                            f"{frame.log.level} {frame.log.message}", quiet=True)
            elif what == "result":
                self._handle_result(node, frame.result)
            elif what == "goodbye":
                self._event("goodbye", node_id, detail=frame.goodbye.reason)
            elif what == "error":
                self._event("protocol_error", node_id, detail=f"{frame.error.code}: {frame.error.message}")
            else:
                self._event("unexpected_frame", node_id, detail=str(what))
                channel.close(wire.UNEXPECTED_FRAME, error=wire.error_frame(
                    wire.UNEXPECTED_FRAME, f"a gateway does not take {what} frames"))
            self._cond.notify_all()

    def _handle_accept(self, node: GatewayNode, accept: session_pb2.Accept) -> None:
        rec = self.commands.get(accept.command_id)
        state_name = session_pb2.CommandState.Name(accept.state) if accept.state else ""
        self._event("accepted", node.node_id, accept.command_id, state_name)
        if rec is None or rec.state.final:
            return
        if accept.state == session_pb2.AWAITING_REJOIN:
            rec.state = State.AWAITING_REJOIN
        elif rec.state is State.PENDING:
            rec.state = State.ACCEPTED
        if rec.accepted_at is None:
            rec.accepted_at = time.monotonic()

    def _handle_result(self, node: GatewayNode, signed: session_pb2.SignedResult) -> None:
        body = session_pb2.ResultBody()
        try:
            body.ParseFromString(signed.body)
        except DecodeError:
            self._event("result_rejected", node.node_id, detail="result body does not parse")
            return
        cid = body.command_id
        rec = self.commands.get(cid)
        kind = catalog.KINDS.get(rec.kind if rec is not None else body.kind)
        if kind is None:
            self._event("result_rejected", node.node_id, cid, f"unknown kind {body.kind!r}")
            return
        if rec is not None and body.kind != rec.kind:
            self._event("result_rejected", node.node_id, cid, f"result for {body.kind!r}, sent {rec.kind!r}")
            return
        if body.node_id != node.node_id:
            self._event("result_rejected", node.node_id, cid, f"result names node {body.node_id!r}")
            return
        # An attested kind's result must be signed; any result that carries a signature (a
        # release report's, runtime/core.py carries_release_report) is verified too.
        if kind.attested or signed.signature:
            try:
                verify_result(signed, node.public_key)
            except Untrusted as exc:
                # Not acknowledged and nothing marked: a forged result changes nothing.
                self._event("result_rejected", node.node_id, cid, f"{exc.reason}: {exc}")
                return
            if rec is not None:
                rec.result_key = node.public_key
        status = session_pb2.Status.Name(body.status)
        self._ack(node, cid)
        if rec is None:
            self.orphan_results.append(body)
            self._event("result_orphan", node.node_id, cid, status)
            return
        rec.results_received += 1
        if rec.state.final:
            self._event("result_duplicate", node.node_id, cid, status)
            return
        if kind.self_terminating and body.status == session_pb2.SUCCEEDED:
            rec.interim_result = body
            rec.state = State.AWAITING_REJOIN
            self._event("result_interim", node.node_id, cid, "waiting for the node to rejoin")
            return
        rec.result = body
        rec.result_message = decode_result(body)
        file_release(self.attestation, node.node_id, body.boot_id, rec.result_message)
        filed = spdm_report.node_report(self.device_rounds, node.node_id, body.boot_id, rec.result_message)
        if filed is not None:
            self._event("devices_filed", node.node_id, cid, "the node's device round in its release report")
        if self.site_node and node.node_id == self.site_node:  # the site's word on its nodes' BMCs
            told = site_report(self.attestation, rec.kind, rec.signed.body,
                               body.status == session_pb2.SUCCEEDED, rec.result_message)
            if told:
                self._event("attest_site_report", node.node_id, cid, told)
            done = spdm_report.site_round(self.devices, self.device_rounds, rec.signed.body, body.status,
                                          body.reason, rec.result_message, self._current_boot)
            if done is not None:
                self._event("devices_attested", done.node_id, cid, spdm_report.summary(done.results))
        detail = status + (f" {body.reason}: {body.message}" if body.reason else "")
        self._finish(rec, State.FINISHED, detail, event="result")

    def _current_boot(self, node_id: str) -> str:
        """The boot id of the node's session now ("" where it has none)."""
        with self._cond:
            node = self.nodes.get(node_id)
            return node.boot_id if node is not None and node.connected else ""

    def _handle_completion(self, node: GatewayNode, completion: session_pb2.Completion) -> None:
        cid = completion.command_id
        self._ack(node, cid)
        rec = self.commands.get(cid)
        detail = "ok" if completion.ok else f"failed {completion.reason}: {completion.message}"
        if rec is None:
            self._event("completion_orphan", node.node_id, cid, detail)
            return
        if rec.state.final:
            self._event("completion_duplicate", node.node_id, cid, detail)
            return
        rec.completion = completion
        self._finish(rec, State.COMPLETED, detail, event="completed")

    def _ack(self, node: GatewayNode, command_id: str) -> None:
        if node.channel is not None:
            node.channel.send(session_pb2.Frame(ack=session_pb2.Ack(command_id=command_id)))

    def _finish(self, rec: CommandRecord, state: State, detail: str, *, event: str | None = None) -> None:
        rec.state = state
        rec.done.set()
        self._event(event or str(state), rec.node_id, rec.command_id, detail)
        self._cond.notify_all()

    def _watchdog(self) -> None:
        """Fail self-terminating commands whose node did not come back within their time."""
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._cond:
                for rec in self.commands.values():
                    kind = rec.catalog_kind
                    if rec.state.final or kind is None or not kind.self_terminating:
                        continue
                    if rec.accepted_at is None:
                        continue
                    if now - rec.accepted_at > rec.rejoin_timeout:
                        self._finish(rec, State.FAILED,
                                     f"rejoin_timeout: node did not come back within {rec.rejoin_timeout:g}s")

    # -- commands -------------------------------------------------------------------------

    def build(
        self,
        node_id: str,
        kind: str,
        payload: Message | Mapping[str, Any] | str | bytes,
        *,
        command_id: str | None = None,
        timeout_seconds: int = 0,
        expires_in: float = 600.0,
    ) -> session_pb2.CommandBody:
        """The body, bound to the boot and agent state the node last announced (send binds it
        again at delivery)."""
        with self._cond:
            node = self.nodes.get(node_id)
            boot_id = node.boot_id if node is not None else ""
            state_id = node.state_id if node is not None else ""
        return build_command(node_id, kind, payload, command_id=command_id,
                             timeout_seconds=timeout_seconds, expires_in=expires_in, boot_id=boot_id,
                             state_id=state_id)

    def device_nonces(self, node_id: str, devices: list[str]) -> str:
        """A fresh nonce for each of ``node_id``'s SPDM responders (as bmc.query responders
        listed them), as bmc.query measurements' ``nonces`` parameter; its earlier ones void."""
        if self.devices is None:
            raise InvalidParameters("this gateway attests no devices (no device roots configured)")
        try:
            return spdm_report.nonces_parameter(self.devices.issue(node_id, devices))
        except ValueError as exc:
            raise InvalidParameters(str(exc)) from None

    def sign(self, body: session_pb2.CommandBody) -> session_pb2.SignedCommand:
        if self.signing_key is None:
            raise InvalidParameters("this gateway has no signing key (--signing-key)")
        return self.signing_key.sign_command(body)

    def send(
        self,
        node_id: str,
        kind: str,
        payload: Message | Mapping[str, Any] | str | bytes,
        *,
        sign: bool | None = None,
        command_id: str | None = None,
        timeout_seconds: int = 0,
        expires_in: float = 600.0,
    ) -> str:
        """Build, sign (always for destructive kinds; by default whenever there is a key) and
        send a command; queued until the node connects. Returns the command id."""
        body = self.build(node_id, kind, payload, command_id=command_id,
                          timeout_seconds=timeout_seconds, expires_in=expires_in)
        destructive = catalog.KINDS[kind].destructive
        if sign is None:
            sign = destructive or self.signing_key is not None
        if destructive and not sign:
            raise InvalidParameters(f"{kind} is destructive: it must be signed (send_signed sends anything)")
        signed = self.sign(body) if sign else session_pb2.SignedCommand(
            body=body.SerializeToString(deterministic=True))
        return self.send_signed(node_id, signed, body=body, sign_body=sign)

    def send_signed(
        self,
        node_id: str,
        signed: session_pb2.SignedCommand,
        *,
        body: session_pb2.CommandBody | None = None,
        sign_body: bool = False,
    ) -> str:
        """Send exactly these bytes (tests use it for forged, expired or unsigned commands).

        With ``body`` (what ``send`` built), the command is bound at each delivery to the boot
        id and state id the node announced in its Hello, and signed again when that changed it:
        the agent refuses a destructive command for another boot or state. Within one boot and
        state the bytes stay the same.
        """
        if body is None:
            body = session_pb2.CommandBody()
            body.ParseFromString(signed.body)
            rebind = None
        else:
            rebind = body
        with self._cond:
            if body.command_id in self.commands and self.commands[body.command_id].state.final:
                rec = self.commands[body.command_id]
                rec.signed = signed
                rec.state = State.PENDING
                rec.done.clear()
            rec = self.commands.setdefault(
                body.command_id,
                CommandRecord(command_id=body.command_id, node_id=node_id, kind=body.kind, signed=signed),
            )
            rec.signed = signed
            rec.body, rec.sign_body = rebind, sign_body
            rec.timeout_seconds = body.timeout_seconds
            self._event("queued", node_id, body.command_id, body.kind)
            node = self.nodes.get(node_id)
            if node is not None and node.channel is not None:
                rec.signed_boot_id, rec.signed_state_id = node.boot_id, node.state_id
                self._deliver(rec)
        return body.command_id

    def _deliver(self, rec: CommandRecord) -> None:
        node = self.nodes.get(rec.node_id)
        if node is None or node.channel is None:
            return
        rec.deliveries += 1
        rec.signed_boot_id, rec.signed_state_id = node.boot_id, node.state_id
        if rec.body is not None and (rec.body.boot_id, rec.body.state_id) != (node.boot_id, node.state_id):
            rec.body.boot_id, rec.body.state_id = node.boot_id, node.state_id
            rec.signed = self.sign(rec.body) if rec.sign_body else session_pb2.SignedCommand(
                body=rec.body.SerializeToString(deterministic=True))
        node.channel.send(session_pb2.Frame(command=rec.signed))
        self._event("sent", rec.node_id, rec.command_id, f"{rec.kind} delivery {rec.deliveries}")

    def cancel(self, command_id: str, reason: str = "cancelled by the operator") -> None:
        with self._cond:
            rec = self.commands[command_id]
            node = self.nodes.get(rec.node_id)
            if node is None or node.channel is None:
                raise InvalidParameters(f"node {rec.node_id} is not connected")
            cancel = session_pb2.Cancel(command_id=command_id, reason=reason)
            node.channel.send(session_pb2.Frame(cancel=cancel))
            self._event("cancel_sent", rec.node_id, command_id, reason)

    def drain(self, node_id: str, reason: str = "drain requested") -> None:
        with self._cond:
            node = self.nodes.get(node_id)
            if node is None or node.channel is None:
                raise InvalidParameters(f"node {node_id} is not connected")
            node.channel.send(session_pb2.Frame(drain=session_pb2.Drain(reason=reason)))
            self._event("drain_sent", node_id, detail=reason)

    def drop(self, node_id: str) -> None:
        """Cut a node's connection without a goodbye (tests: network faults)."""
        with self._cond:
            node = self.nodes.get(node_id)
            channel = node.channel if node is not None else None
        if channel is not None:
            channel.abort("dropped_by_gateway")

    def send_raw(self, node_id: str, frame: session_pb2.Frame | bytes) -> bool:
        """Send one frame, or raw bytes as they are (tests: bad input at a live agent)."""
        with self._cond:
            node = self.nodes.get(node_id)
            if node is None or node.channel is None:
                return False
            if isinstance(frame, bytes):
                return node.channel.send_bytes(frame)
            return node.channel.send(frame)

    # -- waiting --------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"gateway: timed out after {timeout:g}s waiting for {what}")
                self._cond.wait(min(left, 0.25))

    def wait_node(self, node_id: str, timeout: float, *, sessions: int = 1) -> GatewayNode:
        """Wait until ``node_id`` is connected (for at least the ``sessions``-th time)."""
        def ready() -> GatewayNode | None:
            node = self.nodes.get(node_id)
            return node if node is not None and node.connected and node.sessions >= sessions else None

        rec: GatewayNode = self.wait_for(ready, timeout, f"node {node_id}")
        return rec

    def wait(self, command_id: str, timeout: float) -> CommandRecord:
        """Wait until the command is settled (rejected, finished, completed or failed)."""
        rec: CommandRecord = self.wait_for(
            lambda: self.commands[command_id] if self.commands[command_id].state.final else None,
            timeout, f"command {command_id}",
        )
        return rec

    def wait_result(self, command_id: str, timeout: float) -> tuple[session_pb2.ResultBody, Message | None]:
        """(result body, decoded result message); CommandRejected when the agent refused it.

        For a self-terminating command the body is the one sent before the agent ended, with
        its status set from the rejoin proof (Completion) and the proof in its details.
        """
        rec = self.wait(command_id, timeout)
        if rec.state is State.REJECTED:
            raise CommandRejected(command_id, rec.reject_reason, rec.reject_message)
        if rec.state is State.COMPLETED and rec.completion is not None:
            body = session_pb2.ResultBody()
            if rec.interim_result is not None:
                body.CopyFrom(rec.interim_result)
            c = rec.completion
            body.command_id, body.kind, body.node_id = c.command_id, rec.kind, rec.node_id
            body.status = session_pb2.SUCCEEDED if c.ok else session_pb2.FAILED
            body.reason, body.message = c.reason, c.message
            for k in ("old_boot_id", "new_boot_id", "old_version", "new_version"):
                if getattr(c, k):
                    body.details[k] = getattr(c, k)
            return body, decode_result(body) if body.payload else None
        if rec.state is State.FAILED:
            body = session_pb2.ResultBody(
                command_id=command_id, kind=rec.kind, node_id=rec.node_id, status=session_pb2.FAILED,
                reason=self._last_detail(command_id).split(":")[0], message=self._last_detail(command_id),
            )
            return body, None
        assert rec.result is not None
        return rec.result, rec.result_message

    def verified(self, command_id: str) -> tuple[bool, str]:
        """An attested kind's result is verified only when its signature verified (it was
        accepted) and the boot that signed it attested: (verified, why)."""
        with self._cond:
            rec = self.commands.get(command_id)
        if rec is None or rec.result is None or not rec.result_key or self.attestation is None:
            return False, "no signed result of an attested kind, or a gateway that does not attest"
        return self.attestation.vouches(rec.node_id, rec.result.boot_id, rec.result_key)

    def _last_detail(self, command_id: str) -> str:
        for ev in reversed(self.events):
            if ev.command_id == command_id and ev.what == "failed":
                return ev.detail
        return "failed"

    def node_list(self) -> list[GatewayNode]:
        with self._cond:
            return sorted(self.nodes.values(), key=lambda n: n.node_id)

    def events_for(self, command_id: str) -> list[GatewayEvent]:
        with self._cond:
            return [e for e in self.events if e.command_id == command_id]

    # -- timeline -------------------------------------------------------------------------

    def _event(self, what: str, node_id: str = "", command_id: str = "", detail: str = "",
               *, quiet: bool = False) -> None:
        ev = GatewayEvent(time.time(), what, node_id, command_id, detail)
        with self._cond:
            if not quiet:
                self.events.append(ev)
                log.info("gateway: %s", ev)
            rec = self.commands.get(command_id)
            listeners = list(self.listeners)
        for fn in listeners:
            try:
                fn(ev, rec)
            except Exception:
                log.exception("gateway listener failed")
