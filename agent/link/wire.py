"""Framing of the gateway session, shared by the agent and the reference gateway.

On the TLS stream every frame is a 4-byte big-endian length followed by that many bytes of
one serialized ``session_pb2.Frame``. A frame longer than the limit (``MAX_FRAME_BYTES``,
4 MiB, announced in Welcome) is refused from its header alone, before its body is read: the
receiver answers ``ProtocolError{code: "frame_too_large"}`` and closes the session. Bytes that
do not parse as a Frame, or a Frame with no message set, get ``"malformed_frame"`` and the
session is closed the same way; the agent then reconnects (a session reset), so a broken
peer can cost a reconnect but never the agent. docs/protocol.md has the whole exchange.

``Channel`` runs one session's I/O in a single thread over a non-blocking socket (one
thread, because an OpenSSL connection must not be read and written from two threads at
once): it decodes incoming frames and hands each to a callback, writes what ``send`` queued,
sends heartbeats and notices a dead peer (nothing received for ``dead_after`` seconds).
What ``send`` queues is bounded (``max_queued_bytes``): a peer that stops reading gets the
channel closed with ``send_queue_full``, never an agent that grows without bound.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable

from google.protobuf.message import DecodeError

from agent.errors import AgentError
from agent.link.options import MAX_FRAME_BYTES as MAX_FRAME_BYTES  # the session's limit too
from agent.proto import session_pb2

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1                     # the session protocol the Hello announces
HEADER = struct.Struct(">I")

# ProtocolError codes (also the close reasons a Channel reports).
FRAME_TOO_LARGE = "frame_too_large"
MALFORMED_FRAME = "malformed_frame"
UNEXPECTED_FRAME = "unexpected_frame"    # a valid frame that is not allowed at this point
UNAUTHENTICATED = "unauthenticated"
PEER_DEAD = "peer_dead"                  # no frame (not even a heartbeat) for dead_after
PEER_CLOSED = "peer_closed"
HANDSHAKE_TIMEOUT = "handshake_timeout"
SEND_QUEUE_FULL = "send_queue_full"      # the peer reads slower than we write: closed, not grown

# What one channel holds in memory for a peer that does not read: 16 frames of the largest size.
# Past it the channel closes with SEND_QUEUE_FULL instead of growing; the agent reconnects, and
# its Hello carries again every result the gateway has not acknowledged (they are journaled), so
# what is dropped is progress and log lines only.
MAX_QUEUED_BYTES = 16 * MAX_FRAME_BYTES


class WireError(Exception):
    """A framing or protocol violation; ``code`` is the ProtocolError code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def encode(frame: session_pb2.Frame, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """The frame with its length prefix; WireError(frame_too_large) past the limit."""
    body = frame.SerializeToString()
    if len(body) > max_bytes:
        raise WireError(FRAME_TOO_LARGE, f"frame of {len(body)} bytes exceeds the limit of {max_bytes}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> session_pb2.Frame:
    frame = session_pb2.Frame()
    try:
        frame.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise WireError(MALFORMED_FRAME, f"{len(body)} bytes do not parse as a Frame ({exc})") from exc
    if frame.WhichOneof("msg") is None:
        raise WireError(MALFORMED_FRAME, f"frame of {len(body)} bytes carries no message")
    return frame


class Decoder:
    """Incremental decoder: ``feed`` bytes as they arrive, get the complete frames back.

    A framing error raises WireError; frames decoded before the bad one in the same ``feed``
    are returned first, and the error is raised by the next ``feed`` or ``check``.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._error: WireError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def feed(self, data: bytes) -> list[session_pb2.Frame]:
        self.check()
        self._buf += data
        frames: list[session_pb2.Frame] = []
        try:
            while len(self._buf) >= HEADER.size:
                (length,) = HEADER.unpack_from(self._buf)
                if length > self.max_bytes:
                    raise WireError(
                        FRAME_TOO_LARGE,
                        f"frame header announces {length} bytes, the limit is {self.max_bytes}",
                    )
                if len(self._buf) < HEADER.size + length:
                    break
                body = bytes(self._buf[HEADER.size : HEADER.size + length])
                del self._buf[: HEADER.size + length]
                frames.append(decode_body(body))
        except WireError as exc:
            self._error = exc
            if not frames:
                raise
        return frames


def error_frame(code: str, message: str) -> session_pb2.Frame:
    return session_pb2.Frame(error=session_pb2.ProtocolError(code=code, message=message))


def reject(command_id: str, error: AgentError) -> session_pb2.Reject:
    """The agent's refusal of a command, from the error that refused it."""
    return session_pb2.Reject(command_id=command_id, reason=str(error.reason), message=error.message)


def kind_of(frame: session_pb2.Frame) -> str:
    return frame.WhichOneof("msg") or "none"


# -- blocking helpers (handshake phase, tests, tools) ---------------------------------------


def send_frame(sock: socket.socket, frame: session_pb2.Frame, max_bytes: int = MAX_FRAME_BYTES) -> None:
    sock.sendall(encode(frame, max_bytes))


def recv_frame(sock: socket.socket, timeout: float, max_bytes: int = MAX_FRAME_BYTES) -> session_pb2.Frame:
    """Read exactly one frame from a blocking socket within ``timeout`` seconds.

    Raises WireError (frame_too_large, malformed_frame, peer_closed, handshake_timeout).
    """
    deadline = time.monotonic() + timeout

    def read(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(HANDSHAKE_TIMEOUT, f"no complete frame within {timeout:g}s")
            sock.settimeout(left)
            try:
                chunk = sock.recv(n - len(out))
            except TimeoutError as exc:
                raise WireError(HANDSHAKE_TIMEOUT, f"no complete frame within {timeout:g}s") from exc
            except (OSError, ssl.SSLError) as exc:
                raise WireError(PEER_CLOSED, f"connection failed: {exc}") from exc
            if not chunk:
                raise WireError(PEER_CLOSED, "connection closed" + (" mid-frame" if out else ""))
            out += chunk
        return bytes(out)

    (length,) = HEADER.unpack(read(HEADER.size))
    if length > max_bytes:
        raise WireError(FRAME_TOO_LARGE, f"frame header announces {length} bytes, the limit is {max_bytes}")
    return decode_body(read(length))


# -- the session's I/O loop -----------------------------------------------------------------

FrameHandler = Callable[[session_pb2.Frame], None]
CloseHandler = Callable[[str], None]


class Channel:
    """One connected session: a thread that reads, writes, heartbeats and watches the peer.

    ``on_frame`` runs on the I/O thread for every frame but heartbeats (it must not block for
    long); ``on_close(reason)`` runs once when the channel ends, whatever the cause. ``send``
    may be called from any thread. A framing error from the peer is answered with a
    ProtocolError frame, then the channel closes with that code as reason.
    """

    def __init__(
        self,
        sock: socket.socket,
        on_frame: FrameHandler,
        on_close: CloseHandler | None = None,
        *,
        name: str = "channel",
        max_frame_bytes: int = MAX_FRAME_BYTES,
        heartbeat_interval: float | None = None,
        dead_after: float | None = None,
        decoder: Decoder | None = None,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self.sock = sock
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self.max_queued_bytes = max_queued_bytes
        self._on_frame = on_frame
        self._on_close = on_close
        self._decoder = decoder or Decoder(max_frame_bytes)
        self._lock = threading.Lock()
        self._out: collections.deque[bytes] = collections.deque()
        self._out_bytes = 0                 # the bytes in _out (bounded by max_queued_bytes)
        self._pending = b""                 # the part of a frame not yet written
        self._closing: str | None = None     # close after the queue is flushed
        self._close_deadline = 0.0
        self.closed = threading.Event()
        self.close_reason = ""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._fds_closed = False
        self._heartbeat_interval = heartbeat_interval
        self._dead_after = dead_after
        self._hb_seq = 0
        now = time.monotonic()
        self._last_recv = now
        self._last_hb_sent = now
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    # -- API ------------------------------------------------------------------------------

    def start(self) -> Channel:
        if self.sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small frames must not wait for Nagle + delayed ACK (40 ms a round trip).
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self._thread.start()
        return self

    def send(self, frame: session_pb2.Frame) -> bool:
        """Queue a frame; False when the channel is closing or closed (the frame is dropped),
        or when the queue would pass ``max_queued_bytes``: then the channel closes with
        SEND_QUEUE_FULL, what is queued dropped with it."""
        return self._queue(encode(frame, self.max_frame_bytes))

    def send_bytes(self, data: bytes) -> bool:
        """Queue raw bytes as they are (tests: malformed, truncated and oversized frames)."""
        return self._queue(bytes(data))

    def _queue(self, data: bytes) -> bool:
        queued = 0
        with self._lock:
            if self._closing is not None or self.closed.is_set():
                return False
            full = self._out_bytes + len(data) > self.max_queued_bytes
            if full:
                queued = self._out_bytes + len(self._pending)
                self._drop_queue()
                self._closing = SEND_QUEUE_FULL
                self._close_deadline = 0.0
            else:
                self._out.append(data)
                self._out_bytes += len(data)
        if full:
            log.warning("%s: the peer has not read %d queued bytes (at most %d): closing the session",
                        self.name, queued, self.max_queued_bytes)
        self._wake()
        return not full

    def _drop_queue(self) -> None:
        """Under the lock: forget what is queued, the frame half written included."""
        self._out.clear()
        self._out_bytes = 0
        self._pending = b""

    def close(
        self, reason: str, *, error: session_pb2.Frame | None = None, flush_seconds: float = 2.0
    ) -> None:
        """Close after writing what is queued (and ``error`` last), waiting at most flush_seconds."""
        with self._lock:
            if self._closing is not None or self.closed.is_set():
                return
            if error is not None:
                with contextlib.suppress(WireError):
                    data = encode(error, self.max_frame_bytes)
                    self._out.append(data)   # one frame past the bound, the last one
                    self._out_bytes += len(data)
            self._closing = reason
            self._close_deadline = time.monotonic() + flush_seconds
        self._wake()

    def abort(self, reason: str) -> None:
        """Close now, dropping whatever is queued (tests use it to cut a connection)."""
        with self._lock:
            self._drop_queue()
            self._closing = reason
            self._close_deadline = 0.0
        self._wake()

    def queued(self) -> int:
        with self._lock:
            return len(self._out) + (1 if self._pending else 0)

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is written; False on timeout or close."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed.is_set():
            if self.queued() == 0:
                return True
            time.sleep(0.01)
        return self.queued() == 0 and not self.closed.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the loop -------------------------------------------------------------------------

    def _wake(self) -> None:
        with self._lock:
            if self._fds_closed:
                return
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        reason = "internal"
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            reason = self._run(sel)
        except WireError as exc:
            reason = exc.code
        except Exception:
            log.exception("%s: I/O loop failed", self.name)
            reason = "internal"
        finally:
            sel.close()
            self._finish(reason)

    def _run(self, sel: selectors.BaseSelector) -> str:
        want_write = False
        while True:
            with self._lock:
                closing, close_deadline = self._closing, self._close_deadline
                has_out = bool(self._pending or self._out)
            now = time.monotonic()
            if closing is not None and (not has_out or now >= close_deadline):
                return closing
            timeout = self._tick(now)
            if closing is not None:
                timeout = min(timeout, max(0.0, close_deadline - now))
            events = EVENT_RW if (has_out or want_write) else selectors.EVENT_READ
            sel.modify(self.sock, events)
            ready = sel.select(timeout)
            for key, mask in ready:
                if key.fileobj == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                if mask & selectors.EVENT_READ:
                    result = self._read()
                    if result is not None:
                        return result
            if self.sock.fileno() >= 0 and (has_out or want_write):
                want_write = self._write()
            # OpenSSL may hold decrypted bytes the selector does not see.
            if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
                result = self._read()
                if result is not None:
                    return result

    def _tick(self, now: float) -> float:
        """Heartbeat and dead-peer checks; returns how long the selector may wait."""
        timeout = 0.5
        with self._lock:
            interval, dead_after = self._heartbeat_interval, self._dead_after
            last_recv, last_hb = self._last_recv, self._last_hb_sent
        if dead_after:
            if now - last_recv >= dead_after:
                raise WireError(PEER_DEAD, f"nothing received for {now - last_recv:.1f}s")
            timeout = min(timeout, dead_after - (now - last_recv))
        if interval:
            if now - last_hb >= interval:
                self._hb_seq += 1
                hb = session_pb2.Heartbeat(seq=self._hb_seq, time_unix_ms=int(time.time() * 1000))
                with self._lock:
                    if self._closing is None:
                        data = encode(session_pb2.Frame(heartbeat=hb))
                        self._out.append(data)
                        self._out_bytes += len(data)
                    self._last_hb_sent = now
                last_hb = now
            timeout = min(timeout, interval - (now - last_hb))
        return max(0.0, timeout)

    def _read(self) -> str | None:
        while True:
            try:
                data = self.sock.recv(65536)
            except (ssl.SSLWantReadError, BlockingIOError):
                return None
            except ssl.SSLWantWriteError:
                return None
            except (ssl.SSLError, OSError) as exc:
                log.info("%s: connection failed: %s", self.name, exc)
                return PEER_CLOSED
            if not data:
                return PEER_CLOSED
            with self._lock:
                self._last_recv = time.monotonic()
            try:
                frames = self._decoder.feed(data)
            except WireError as exc:
                self._refuse(exc)
                return None
            for frame in frames:
                if frame.WhichOneof("msg") == "heartbeat":
                    continue
                with self._lock:
                    if self._closing is not None:
                        return None
                self._on_frame(frame)
            try:
                self._decoder.check()
            except WireError as exc:
                self._refuse(exc)
                return None

    def _refuse(self, exc: WireError) -> None:
        log.warning("%s: %s; closing the session", self.name, exc)
        self.close(exc.code, error=error_frame(exc.code, exc.message))

    def _write(self) -> bool:
        """Write as much as the socket takes; True when it wants to be called again."""
        while True:
            with self._lock:
                if not self._pending:
                    if not self._out:
                        return False
                    self._pending = self._out.popleft()
                    self._out_bytes -= len(self._pending)
                data = self._pending
            try:
                n = self.sock.send(data[:65536])
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                return True
            except (ssl.SSLError, OSError) as exc:
                log.info("%s: write failed: %s", self.name, exc)
                raise WireError(PEER_CLOSED, f"write failed: {exc}") from exc
            with self._lock:
                if self._pending is data:
                    self._pending = data[n:]

    def _finish(self, reason: str) -> None:
        self.close_reason = reason
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            self._fds_closed = True
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._drop_queue()
            if self._closing is None:
                self._closing = reason
        self.closed.set()
        log.debug("%s: closed (%s)", self.name, reason)
        if self._on_close is not None:
            try:
                self._on_close(reason)
            except Exception:
                log.exception("%s: close handler failed", self.name)


EVENT_RW = selectors.EVENT_READ | selectors.EVENT_WRITE
