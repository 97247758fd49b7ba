"""The agent's side of the gateway session: it dials out (it never listens), over TLS 1.3.

One ``Session`` serves one ``Agent`` (agent/runtime/core.py) for the life of the process:

    connect   TCP to config.gateway, TLS 1.3 only, the gateway verified against
              config.ca_bundle and its host name; a client certificate when configured,
              else the enrollment token goes in the Hello.
    hello     Agent.hello() (node id, role, version, boot id, state id, kinds, node public key,
              unacknowledged results, completions, in-flight states) -> Welcome, which sets
              the heartbeat interval and the dead-peer time.
    serve     command -> Agent.submit -> Accept/Reject; cancel -> Agent.cancel;
              ack -> Agent.ack; drain -> Agent.drain, wait (bounded) until every result is
              acknowledged, then Goodbye and the session ends.
              Frames the agent emits (progress, log lines, results; Agent.subscribe) are
              sent as they come; heartbeats both ways; nothing received for dead_after
              (3 heartbeat intervals by default) -> the peer is dead.
    reconnect any failure -> wait a random time in [0, min(cap, base * 2^attempt)] (full
              jitter), then again from connect. The new Hello carries every result the
              gateway has not acknowledged, so nothing that finished is lost; frames
              emitted while offline are dropped (progress and log lines are best effort).

Before a self-terminating action the agent calls the exit hook: the session writes what is
queued, says Goodbye("self_terminating") and waits (bounded) until it is on the wire.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from google.protobuf.message import DecodeError

from agent import limits
from agent.config import Config
from agent.errors import AgentError, InvalidParameters
from agent.link import wire
from agent.link.options import SessionOptions
from agent.proto import session_pb2
from agent.retry import Backoff

log = logging.getLogger(__name__)

TLS_MIN = ssl.TLSVersion.TLSv1_3
ATTEST_RETRY = "attest_retry"  # the close reason after the gateway said "retry": busy, join again later


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """TLS 1.3 only, the gateway verified against ``ca`` and its host name; mutual TLS with cert.
    (Here, not with the gateway's server context in agent/gateway/certs.py: the agent must not
    import the reference gateway to dial it.)"""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = TLS_MIN
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


class AgentLike(Protocol):
    """What the session needs of agent.runtime.core.Agent."""

    def hello(self, *, results_bytes: int = ...) -> session_pb2.Hello: ...
    def submit(self, cmd: session_pb2.SignedCommand) -> session_pb2.Accept | session_pb2.Reject: ...
    def cancel(self, command_id: str, reason: str) -> None: ...
    def ack(self, command_id: str) -> None: ...
    def drain(self, timeout: float | None = None) -> None: ...
    def subscribe(self, sink: Callable[[session_pb2.Frame], None]) -> None: ...
    def add_exit_hook(self, fn: Callable[[], None]) -> None: ...
    def unacked_results(self) -> list[session_pb2.SignedResult]: ...
    def joined(self) -> None: ...
    def attest(self, challenge: session_pb2.AttestChallenge) -> session_pb2.AttestAnswer: ...


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not limits.is_digits(port):
        raise InvalidParameters(f"gateway address {address!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def network_not_up(exc: BaseException) -> bool:
    """A dial that failed because this machine has no route or no name server yet (the ramdisk
    starts the agent while DHCP runs): nothing reached the gateway, so it is retried at the
    minimum delay instead of backing off, and the agent joins as soon as the network is up."""
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN
    return isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EADDRNOTAVAIL)


class Session:
    def __init__(self, agent: AgentLike, config: Config, options: SessionOptions | None = None) -> None:
        self.host, self.port, self._ssl = self.check_config(config)
        self.agent = agent
        self.config = config
        self.options = options or SessionOptions()
        self._lock = threading.Lock()
        self._channel: wire.Channel | None = None
        self._buffer: collections.deque[session_pb2.Frame] = collections.deque()
        self._stop = threading.Event()
        self._drained = threading.Event()
        # Full jitter: the nodes of a site that lost their gateway together do not dial back
        # together.
        self.redial = Backoff(first=self.options.reconnect_min_seconds,
                              cap=self.options.reconnect_max_seconds, jitter=1.0).start(cancel=self._stop)
        self._busy = 0  # joins in a row the gateway answered "retry" (attestation: docs/attestation.md)
        self.sessions = 0
        agent.subscribe(self._sink)
        agent.add_exit_hook(self._exit_hook)

    @staticmethod
    def check_config(config: Config) -> tuple[str, int, ssl.SSLContext]:
        """(host, port, TLS context) or InvalidParameters naming what is missing or unreadable."""
        if not config.gateway:
            raise InvalidParameters("no gateway address (--gateway, config file, or bc.gateway=)")
        if config.ca_bundle is None:
            raise InvalidParameters("no CA bundle to verify the gateway (--ca, config file, or bc.ca=)")
        host, port = parse_address(config.gateway)
        try:
            context = client_context(config.ca_bundle, config.client_cert, config.client_key)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidParameters(f"TLS set-up: cannot load the CA bundle or client cert: {exc}") from exc
        return host, port, context

    # -- the loop -------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.close("agent_stopping", error=None)

    @property
    def attempt(self) -> int:
        """Failed dials (or sessions that ended) since the last session began."""
        return self.redial.failures

    @property
    def drained(self) -> bool:
        return self._drained.is_set()

    def run(self) -> None:
        """Serve until stop() or a drain; reconnects on any failure."""
        while not self._stop.is_set() and not self._drained.is_set():
            no_network = False
            try:
                channel = self._connect()
            except (OSError, ssl.SSLError, wire.WireError) as exc:
                no_network = network_not_up(exc)
                if no_network:
                    log.info("gateway %s:%d: %s: the network is not up yet", self.host, self.port, exc)
                else:
                    log.warning("gateway %s:%d: %s", self.host, self.port, exc)
            except Exception:  # never let one bad session end the agent's loop
                log.exception("gateway %s:%d: session set-up failed", self.host, self.port)
            else:
                self.redial.reset()
                channel.closed.wait()
                with self._lock:
                    self._channel = None
                log.info("session ended: %s", channel.close_reason)
                if channel.close_reason == ATTEST_RETRY:  # a busy gateway: back off as from a failure
                    self._busy += 1
                    self.redial.failures = self._busy
                else:
                    self._busy = 0
            if self._stop.is_set() or self._drained.is_set():
                break
            if no_network:
                self.redial.sleep(self.options.reconnect_min_seconds)
                continue
            delay = self.redial.next() or 0.0     # never None: no bound on tries nor a deadline
            log.info("reconnecting in %.2fs (attempt %d)", delay, self.redial.failures)
            self.redial.sleep(delay)

    def _connect(self) -> wire.Channel:
        timeout = self.options.connect_timeout_seconds
        raw = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            tls = self._ssl.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
        try:
            with self._lock:
                self._buffer.clear()  # what finished so far travels in the Hello
            # Unacked results that do not fit follow the Welcome as result frames (buffered).
            hello = self.agent.hello(results_bytes=self.options.max_frame_bytes - HELLO_HEADROOM)
            if self.config.client_cert is None:
                hello.enrollment_token = self.config.enrollment_token
            tls.settimeout(timeout)
            wire.send_frame(tls, session_pb2.Frame(hello=hello), self.options.max_frame_bytes)
            reply = wire.recv_frame(tls, timeout, self.options.max_frame_bytes)
            what = reply.WhichOneof("msg")
            if what == "error":
                raise wire.WireError(reply.error.code, f"gateway refused the session: {reply.error.message}")
            if what != "welcome":
                raise wire.WireError(wire.UNEXPECTED_FRAME, f"expected welcome, got {what}")
        except BaseException:
            with contextlib.suppress(OSError):
                tls.close()
            raise
        welcome = reply.welcome
        interval = (welcome.heartbeat_interval_ms or int(self.config.heartbeat_seconds * 1000)) / 1000
        dead_after = (welcome.dead_after_ms / 1000) if welcome.dead_after_ms else 3 * interval
        send_limit = min(self.options.max_frame_bytes, welcome.max_frame_bytes or wire.MAX_FRAME_BYTES)
        channel = wire.Channel(
            tls,
            on_frame=self._on_frame,
            name="session",
            max_frame_bytes=send_limit,  # what the gateway takes; what we take is our own limit
            decoder=wire.Decoder(self.options.max_frame_bytes),
            heartbeat_interval=interval,
            dead_after=dead_after,
        )
        with self._lock:
            self._channel = channel
            channel.start()
            while self._buffer:
                channel.send(self._buffer.popleft())
        self.sessions += 1
        try:
            self.agent.joined()  # a daemon.upgrade trial is confirmed here
        except Exception:
            log.exception("Agent.joined failed")
        log.info(
            "connected to gateway %s at %s:%d (heartbeat %.1fs, dead after %.1fs, %d unacked results)",
            welcome.gateway_id, self.host, self.port, interval, dead_after, len(hello.unacked_results),
        )
        return channel

    # -- frames from the gateway ------------------------------------------------------------

    def _send(self, frame: session_pb2.Frame) -> None:
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.send(frame)

    def _on_frame(self, frame: session_pb2.Frame) -> None:
        what = frame.WhichOneof("msg")
        if what == "command":
            self._send(self._submit(frame.command))
        elif what == "cancel":
            self.agent.cancel(frame.cancel.command_id, frame.cancel.reason or "cancelled by the gateway")
        elif what == "ack":
            self.agent.ack(frame.ack.command_id)
        elif what == "drain":
            reason = frame.drain.reason
            # Refuse new commands from this frame on: the frames that follow the Drain are
            # handled before the drain thread would get to run.
            self.agent.drain(timeout=0)
            threading.Thread(target=self._drain, args=(reason,), name="drain", daemon=True).start()
        elif what == "attest_challenge" and len(frame.attest_challenge.nonce) != 32:
            with self._lock:
                channel = self._channel
            if channel is not None:    # a challenge without its nonce binds nothing: refused
                channel.close(wire.MALFORMED_FRAME, error=wire.error_frame(
                    wire.MALFORMED_FRAME, "an attest_challenge carries a nonce of 32 bytes"))
        elif what == "attest_challenge":
            # Attestation (docs/attestation.md): the TPM works off the reader's thread.
            threading.Thread(target=self._attest, args=(frame.attest_challenge,), name="attest",
                             daemon=True).start()
        elif what == "attest_verdict":
            v = frame.attest_verdict
            said = f" ({v.check}): {v.reason}" if v.check else (f": {v.reason}" if v.reason else "")
            matched = "".join(f" {k}={x}" for k, x in sorted(v.matched.items()))
            log.info("the gateway's attestation verdict: %s%s%s", v.status, said, matched)
            if v.status == "retry":  # the gateway is busy: join again later, backing off
                with self._lock:
                    channel = self._channel
                if channel is not None:
                    channel.close(ATTEST_RETRY)
        elif what == "error":
            log.warning("gateway reports a protocol error: %s: %s", frame.error.code, frame.error.message)
            with self._lock:
                channel = self._channel
            if channel is not None:
                channel.close(frame.error.code or "peer_error")
        elif what == "goodbye":
            log.info("gateway said goodbye: %s", frame.goodbye.reason)
            with self._lock:
                channel = self._channel
            if channel is not None:
                channel.close("gateway_goodbye")
        else:
            log.warning("unexpected %s frame from the gateway; resetting the session", what)
            with self._lock:
                channel = self._channel
            if channel is not None:
                channel.close(wire.UNEXPECTED_FRAME, error=wire.error_frame(
                    wire.UNEXPECTED_FRAME, f"an agent does not take {what} frames"))

    def _attest(self, challenge: session_pb2.AttestChallenge) -> None:
        try:
            answer = self.agent.attest(challenge)
        except Exception as exc:  # the gateway gets an answer, whatever went wrong
            log.exception("attestation failed")
            answer = session_pb2.AttestAnswer(nonce=challenge.nonce, error=f"{type(exc).__name__}: {exc}")
        self._send(session_pb2.Frame(attest_answer=answer))

    def _submit(self, cmd: session_pb2.SignedCommand) -> session_pb2.Frame:
        try:
            answer = self.agent.submit(cmd)
        except Exception as exc:  # the agent must answer every command, whatever went wrong
            log.exception("submit failed")
            body = session_pb2.CommandBody()
            with contextlib.suppress(DecodeError):
                body.ParseFromString(cmd.body)
            return session_pb2.Frame(reject=wire.reject(
                body.command_id, AgentError(f"{type(exc).__name__}: {exc}")))
        if isinstance(answer, session_pb2.Accept):
            return session_pb2.Frame(accept=answer)
        return session_pb2.Frame(reject=answer)

    def _drain(self, reason: str) -> None:
        log.info("draining: %s", reason or "requested by the gateway")
        try:
            self.agent.drain()
            # Results of what finished must reach the gateway (and be acknowledged) first.
            deadline = time.monotonic() + 2 * self.options.exit_flush_seconds
            while self.agent.unacked_results() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            self._drained.set()
            with self._lock:
                channel = self._channel
            if channel is not None:
                channel.send(session_pb2.Frame(goodbye=session_pb2.Goodbye(reason="drained")))
                channel.close("drained", flush_seconds=self.options.exit_flush_seconds)

    # -- frames from the agent --------------------------------------------------------------

    def _sink(self, frame: session_pb2.Frame) -> None:
        """Agent.subscribe sink: never blocks; sends when online, else buffers (bounded)."""
        with self._lock:
            channel = self._channel
            if channel is None:
                # Offline past the buffer: progress and logs are dropped, results kept (journaled).
                if frame.WhichOneof("msg") != "result" and len(self._buffer) >= self.options.offline_buffer:
                    return
                self._buffer.append(frame)
                return
        try:
            channel.send(frame)
        except wire.WireError as exc:
            log.error("cannot send a %s frame: %s", wire.kind_of(frame), exc)

    def _exit_hook(self) -> None:
        """Right before a self-terminating action: put everything queued on the wire."""
        with self._lock:
            channel = self._channel
        if channel is None:
            return
        channel.send(session_pb2.Frame(goodbye=session_pb2.Goodbye(reason="self_terminating")))
        if not channel.flush(self.options.exit_flush_seconds):
            log.warning("exit: the session queue did not drain within %.1fs", self.options.exit_flush_seconds)


HELLO_HEADROOM = 64 * 1024  # room in the first frame for the Hello's fields beside its results
