"""The site's HTTP service on the provisioning network: boot scripts, cached kernels and
initrds, and the proxy routes.

    GET /boot.ipxe            what every chained iPXE runs: fetch its node's own script
    GET /boot.grub            the same for the site's GRUB (arm64 UEFI): its node's GRUB script
    GET /pxe/<mac>.ipxe       a node's script (404 unless its boot entry is live; .grub: arm64's;
                              403 to another address than the MAC's, agent/site/boot/pxe.py)
    GET /pxe/<mac>.cmdline    a UKI entry's bc.* settings, for the ramdisk's init (404 unless
                              live; 403 as the script)
    GET /cache/<sha256>       a kernel or initrd, by its content's digest, from the store
    GET|HEAD /r/<token>       a proxy route (agent/site/serve/routes.py; one with a manifest is
                              served from the chunk store, agent/site/serve/chunkroute.py)
    GET|HEAD /vm/<token>/ramdisk.iso, /vm/<token>/config.iso
                              a node's virtual media (agent/site/boot/vmedia.py; 404 once expired)

The same service may have a second listener with TLS (``HttpService(..., tls=context)``: the
site's own certificate, for BMCs that mount https:// images only): it serves the virtual
media alone (anything else is 404 there), under the same connection admission as the first
(one InboundConnections), each TLS handshake within the request head's deadline.

Anything else is 404; a method a path does not carry is 405. A route's response streams
the upstream's body through one buffer. When the upstream fails mid-body the client's
connection is cut before the announced Content-Length (or without the last chunk of a
chunked body): the client sees a failure, never a short success. Whatever else an upstream
does wrong is a 502; a response both chunked and with a Content-Length is framed by its
chunks. Connections are admitted under agent/site/serve/conns.py's caps, each request's head
within its deadline; no token is logged (``_safe``).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import logging
import mmap
import os
import re
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from agent.errors import NotFound
from agent.net import http as agent_http
from agent.site.boot.pxe import BootEntries, ClientRefused
from agent.site.boot.vmedia import MEDIA_PREFIX, MediaSets
from agent.site.chunkstore import DIGEST, ChunkStore
from agent.site.metrics import Metrics
from agent.site.serve import blobroute, chunkroute
from agent.site.serve.chunkroute import ChunkCache
from agent.site.serve.conns import InboundConnections
from agent.site.serve.routes import (
    PASS_REQUEST_HEADERS,
    PASS_RESPONSE_HEADERS,
    ROUTE_PREFIX,
    Route,
    RouteTable,
    UpstreamError,
    done_upstream,
    open_upstream,
)

log = logging.getLogger(__name__)

BUFFER = 16 << 20  # a route's relay buffer, while it relays a body (docs/performance.md)
RELAY_MEMORY = 256 << 20  # all relay buffers together: 16 requests at BUFFER
SMALL_BUFFER = 1 << 20  # a request's buffer once RELAY_MEMORY is taken
CLIENT_TIMEOUT = 120.0
# (client address, path, status, bytes sent, seconds, the MAC of a medium's set or "")
FetchObserver = Callable[[str, str, int, int, float, str], None]


class BufferBudget:
    """Relay buffers out of one total, so that a site feeding hundreds of ramdisks at once
    does not hold hundreds of large buffers: a request gets what it asks for while the
    total lasts, what is left of it next, and SMALL_BUFFER past it (never a wait: many
    transfers at once share the link anyway, and a smaller buffer costs only CPU)."""

    def __init__(self, total: int = RELAY_MEMORY) -> None:
        self.total = total
        self.left = total
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def buffer(self, want: int) -> Iterator[memoryview]:
        """A buffer of at most ``want`` bytes, its own anonymous mapping, unmapped when the
        body ends: the process's memory holds the budget and no more. (A bytearray of 16 MiB
        comes from malloc, which after the first free raises its mmap threshold and keeps
        the freed buffers in its arenas: 48 downloads at once held about 440 MiB so in issue 27.)"""
        with self._lock:
            size = max(1, min(want, max(self.left, SMALL_BUFFER)))
            taken = min(size, self.left)
            self.left -= taken
        try:
            area = mmap.mmap(-1, size)
        except BaseException:
            with self._lock:
                self.left += taken
            raise
        view = memoryview(area)
        try:
            yield view
        finally:
            view.release()
            with contextlib.suppress(BufferError):  # a slice still alive: unmapped when it goes
                area.close()
            with self._lock:
                self.left += taken


class SiteHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024  # the listen backlog: a burst of connections is not a SYN drop

    def __init__(self, address: tuple[str, int], entries: BootEntries | None,
                 routes: RouteTable, upstream: agent_http.HttpOptions,
                 store: ChunkStore | None = None, metrics: Metrics | None = None,
                 conns: InboundConnections | None = None,
                 media: MediaSets | None = None, observe: FetchObserver | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls           # a TLS listener: the virtual media alone
        self.entries = entries
        self.observe = observe   # each boot file served (agent/site/observe/: the timelines)
        self.media = media
        self.routes = routes
        self.upstream = upstream
        self.buffers = BufferBudget()
        self.metrics = metrics or Metrics()
        self.store = store
        self.chunks = ChunkCache(store, self.metrics, upstream, routes) if store is not None else None
        self.conns = conns or InboundConnections()
        self._accept_failed = 0.0
        super().__init__(address, _Handler)

    # -- connections: admitted under the caps (agent/site/serve/conns.py), never a spin ----------

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            sock, address = super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                # No descriptor for it: the connection waits in the backlog. Pause rather
                # than wake for it again at once (a core spun so in issue 27).
                now = time.monotonic()
                if now - self._accept_failed > 10:
                    log.warning("site HTTP: cannot accept a connection: %s", exc.strerror)
                self._accept_failed = now
                time.sleep(0.1)
            raise
        if self.tls is None:
            return sock, address
        # No handshake here: the accept loop would wait on one slow client. It is made on the
        # connection's own thread, within the head's deadline (_Handler.setup).
        try:
            return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address
        except OSError:
            sock.close()
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self.conns.admit(request, str(client_address[0])):
            return True
        if self.tls is not None:   # no plain text into a TLS handshake: closed, said nothing
            return False
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
        return False

    def shutdown_request(self, request: Any) -> None:
        self.conns.leave(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """What escapes a request's handler: a connection's own failure (a client that
        resets, a read that times out) is one line; anything else is a bug, logged whole."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.info("site HTTP: connection from %s ended: %s", client_address[0], _reason(exc))
        else:
            log.error("site HTTP: internal error serving %s", client_address[0], exc_info=True)


class _Cut(Exception):
    """The response cannot be completed: drop the connection."""


class _Handler(BaseHTTPRequestHandler):
    server: SiteHttpServer
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_TIMEOUT
    # The headers and a small body go out as two writes: with Nagle on, the second waits for
    # the client's delayed ACK of the first (about 40 ms per request on a kept-alive
    # connection; docs/performance.md).
    disable_nagle_algorithm = True
    server_version = "bettercompute-site"
    sys_version = ""
    _answered: tuple[int, int] = (0, 0)   # the status and the bytes of the body sent

    def log_message(self, format: str, *args: Any) -> None:
        pass  # every request is logged once, by what serves it

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            # The TLS handshake under the head's deadline: a client that stalls in it is shut
            # down by the watch like one that sends no request (its failure: handle_error).
            self.server.conns.waiting(self.connection)
            self.connection.do_handshake()

    def handle_one_request(self) -> None:
        self.server.conns.waiting(self.connection)  # its head within HEAD_SECONDS
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if not self.server.conns.received(self.connection):  # too late: shut by the watch
            self.close_connection = True
            return False
        return ok

    # -- dispatch ----------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def _dispatch(self, method: str) -> None:
        path = self.path
        if path.startswith(ROUTE_PREFIX):
            self._serve(method, path)
            return
        self._answered = (0, 0)
        started = time.monotonic()
        try:
            self._serve(method, path)
        finally:
            self._observe(path, started)

    def _observe(self, path: str, started: float) -> None:
        """Tell the timelines what a node fetched of its boot: status, bytes, seconds."""
        observe = self.server.observe
        status, sent = self._answered
        if observe is None or "?" in path or status == 403:
            return   # a node's script refused to a stranger: nothing of that node's boot
        mac = ""
        if path.startswith(MEDIA_PREFIX) and self.server.media is not None:
            mac = self.server.media.mac_of(path[len(MEDIA_PREFIX):])
            if not mac:
                return  # a token of no set: nothing a node's timeline can hold
        try:
            observe(self.client_address[0], path, status, sent, time.monotonic() - started, mac)
        except Exception:  # a timeline is worth less than the boot file
            log.exception("site HTTP: the boot timelines' observer failed")

    def _serve(self, method: str, path: str) -> None:
        try:
            if path.startswith(ROUTE_PREFIX) and self.server.tls is None:
                self._route(method, path[len(ROUTE_PREFIX):])
                return
            if path.startswith(MEDIA_PREFIX) and self.server.media is not None and "?" not in path:
                if method not in ("GET", "HEAD"):
                    self._refuse(405, f"{method} not allowed", allow="GET, HEAD")
                    return
                self._file(method, self.server.media.path(path[len(MEDIA_PREFIX):]),
                           "application/octet-stream")
                return
            if self.server.tls is not None:
                self._refuse(404, "not found (only virtual media is served over https)")
                return
            if self.server.entries is None or "?" in path:
                self._refuse(404, "not found")
                return
            if method not in ("GET", "HEAD"):
                self._refuse(405, f"{method} not allowed", allow="GET, HEAD")
                return
            if path == "/boot.ipxe":
                self._bytes(method, self.server.entries.chain_script(), "text/plain")
            elif path == "/boot.grub":
                self._bytes(method, self.server.entries.chain_grub(), "text/plain")
            elif path.startswith("/pxe/") and path.endswith(".cmdline"):
                self._bytes(method, self.server.entries.node_settings(
                    path[len("/pxe/"):], self.client_address[0]), "text/plain")
            elif path.startswith("/pxe/"):
                self._file(method, self.server.entries.script_path(
                    path[len("/pxe/"):], self.client_address[0]), "text/plain")
            elif path.startswith("/cache/"):
                self._stored(method, path[len("/cache/"):])
            else:
                self._refuse(404, "not found")
        except NotFound as exc:
            self._refuse(404, exc.message)
        except ClientRefused as exc:
            self._refuse(403, exc.message)
        except _Cut:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except (ConnectionError, TimeoutError) as exc:
            log.info("%s %s: client went away: %s", method, _safe(path), exc)
            self.close_connection = True

    # -- plain files -------------------------------------------------------------------

    def _refuse(self, status: int, message: str, **headers: str) -> None:
        body = (message + "\n").encode()
        self._answered = (status, 0)
        log.info("%s %s -> %d %s", self.command, _safe(self.path), status, _scrub(message))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.capitalize(), value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _bytes(self, method: str, data: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method == "GET":
            self.wfile.write(data)
        self._answered = (200, len(data) if method == "GET" else 0)
        log.info("%s %s -> 200, %d bytes", method, _safe(self.path), len(data))

    def _file(self, method: str, path: Path, ctype: str) -> None:
        try:
            f = open(path, "rb")  # noqa: SIM115  (closed by the with below)
        except FileNotFoundError:
            raise NotFound("gone") from None
        with f:
            self._send_file(method, f, ctype)

    def _stored(self, method: str, digest: str) -> None:
        """A kernel or initrd by its digest, from the store (pinned while it is sent)."""
        store = self.server.store
        if store is None or not DIGEST.fullmatch(digest):
            raise NotFound(f"no such cached file {digest[:70]!r}")
        with store.open(digest) as f:
            if f is None:
                raise NotFound(f"no such cached file {digest}")
            self._send_file(method, f, "application/octet-stream")

    def _send_file(self, method: str, f: BinaryIO, ctype: str) -> None:
        size = os.fstat(f.fileno()).st_size
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self._answered = (200, 0)
        if method == "GET":
            self.wfile.flush()
            self._answered = (200, self.connection.sendfile(f))
        log.info("%s %s -> 200, %d bytes", method, _safe(self.path), size)

    # -- proxy routes ------------------------------------------------------------------

    def _route(self, method: str, token: str) -> None:
        route = self.server.routes.lookup(token) if token.isascii() else None
        if route is None:
            self._refuse(404, "no such route")
            return
        number = route.count_request()
        if route.expired():
            self._refuse(410, f"route {route.id} expired")
            return
        if method not in route.methods:
            self._refuse(405, f"{method} not allowed on route {route.id}",
                         allow=", ".join(sorted(route.methods)))
            return
        if self.headers.get("Content-Length", "0") not in ("", "0") or self.headers.get(
                "Transfer-Encoding"):
            self._refuse(400, "a route carries no request body")
            return
        if route.plan is not None and self.server.chunks is not None:
            self._chunks(route, method, number, self.server.chunks)
            return
        if route.blob and self.server.store is not None and self._blob(route, method, number):
            return
        headers = {name: value for name in PASS_REQUEST_HEADERS
                   if (value := self.headers.get(name)) is not None}
        pool = self.server.routes.upstreams
        try:
            conn, resp = open_upstream(route, method, headers, self.server.upstream,
                                       self.server.routes.policy, pool)
        except UpstreamError as exc:
            self._refuse(exc.status, str(exc))
            self._account(route, method, number, exc.status, 0, str(exc))
            return
        whole = False
        try:
            status, sent, note, whole = self._relay(route, method, number, resp)
        finally:
            done_upstream(pool, route, conn, resp, whole)
        self._account(route, method, number, status, sent, note)

    def _chunks(self, route: Route, method: str, number: int, chunks: ChunkCache) -> None:
        try:
            with _blocking(self.connection):  # as the relay: the kernel's timeouts, no polling
                served = chunkroute.serve(self, route, method, self.server.routes, chunks)
        except chunkroute.Cut as cut:
            route.count_served(cut.served.from_store, cut.served.from_upstream)
            self._account(route, method, number, cut.served.status, cut.served.sent,
                          f"{cut.served.note}; {cut.served.describe()}")
            raise _Cut() from cut
        route.count_served(served.from_store, served.from_upstream)
        note = f"{served.note}; " if served.note else ""
        self._account(route, method, number, served.status, served.sent,
                      note + served.describe() if served.sent else served.note)

    def _blob(self, route: Route, method: str, number: int) -> bool:
        """A registry blob from the store by its digest (blobroute.py); False: relay it."""
        assert self.server.store is not None
        try:
            with _blocking(self.connection):
                served = blobroute.serve(self, route, method, self.server.routes, self.server.store)
        except OSError as exc:
            self._account(route, method, number, 200, 0, f"cut: {exc}")
            raise _Cut() from exc
        if served is None:
            return False
        self._account(route, method, number, served.status, served.sent, served.note)
        return True

    def _relay(self, route: Route, method: str, number: int,
               resp: http.client.HTTPResponse) -> tuple[int, int, str, bool]:
        """Relay ``resp`` to the client: its status, the bytes sent, a note, and whether the
        upstream's answer was read to its end (its connection may serve the route again)."""
        coding = resp.getheader("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            why = f"upstream's Transfer-Encoding {coding[:40]!r} is not relayed"
            self._refuse(502, why)
            return 502, 0, why, False
        # RFC 9112 6.3: a message with Transfer-Encoding and Content-Length is framed by the
        # chunking; the Content-Length is not believed (nor passed on).
        length_header = None if coding is not None else resp.getheader("Content-Length")
        length = int(length_header) if length_header and length_header.isdigit() else None
        body_expected = method != "HEAD" and resp.status not in (204, 304)
        reserved = length if (body_expected and length is not None) else 0
        if reserved and not self.server.routes.reserve(route, reserved):
            self._refuse(403, f"route {route.id}: past its max_bytes ({route.max_bytes})")
            return 403, 0, "past max_bytes", False
        chunked = body_expected and length is None
        self.send_response(resp.status)
        for name in PASS_RESPONSE_HEADERS:
            value = resp.getheader(name)
            if value is not None:
                self.send_header(name, value)
        if length is not None:
            self.send_header("Content-Length", str(length))
        elif chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", "0")
        self.end_headers()
        if not body_expected:
            return resp.status, 0, "", True
        read, write, mode = self._body_io(resp, length)
        sent = 0
        try:
            with mode, self.server.buffers.buffer(BUFFER if length is None else min(BUFFER, length)) as buf:
                while length is None or sent < length:
                    try:
                        n = read(buf if length is None else buf[:length - sent])
                    except (OSError, http.client.HTTPException) as exc:
                        raise _Upstream(f"upstream failed mid-body: {_reason(exc)}") from exc
                    if not n:
                        break
                    if length is None:
                        if not self.server.routes.reserve(route, n):
                            raise _Upstream("past max_bytes")
                        write(b"%x\r\n" % n)
                        write(buf[:n])
                        write(b"\r\n")
                    else:
                        write(buf[:n])
                    sent += n
                if length is not None and sent < length:
                    raise _Upstream(f"upstream ended at {sent} of {length} bytes")
                if chunked:
                    write(b"0\r\n\r\n")
        except (_Upstream, ConnectionError, TimeoutError, BlockingIOError) as exc:
            if reserved:
                route.release(reserved - sent)
            note = (f"cut: {exc}" if isinstance(exc, _Upstream) else
                    f"client went away: {_reason(exc)}")
            self._account(route, method, number, resp.status, sent, note)
            raise _Cut() from exc
        return resp.status, sent, "", True

    def _body_io(self, resp: http.client.HTTPResponse, length: int | None) -> tuple[
            Callable[[memoryview], int | None], Callable[[bytes | memoryview], object],
            contextlib.AbstractContextManager[None]]:
        """How the body is read, written, and in which socket mode.

        A plain TCP upstream with a Content-Length is read from its socket, both sockets
        blocking with their timeouts as the kernel's (SO_RCVTIMEO, SO_SNDTIMEO): each call
        then moves megabytes, where Python's timeouts poll before every call. On loopback
        this copy through one large buffer was faster than splice(2) (docs/performance.md):
        the client reads data that is still in the CPU's cache. Anything else (TLS, chunked)
        goes through http.client."""
        if length is None or not _plain_upstream(resp):
            return resp.readinto, self.wfile.write, contextlib.nullcontext()
        assert resp.fp is not None
        try:  # what came in with the headers, if anything (at most the reader's buffer)
            pending = resp.fp.read(len(resp.fp.peek(1)[:length])) if length else b""
        except OSError:
            pending = b""  # the first read fails again, and says why
        src = _upstream_socket(resp)
        dst = self.connection

        def read(view: memoryview) -> int:
            nonlocal pending
            if pending:
                n = len(pending)
                view[:n] = pending
                pending = b""
                return n
            return src.recv_into(view)

        return read, dst.sendall, _blocking(src, dst)

    def _account(self, route: Route, method: str, number: int, status: int, sent: int,
                 note: str) -> None:
        # The counts are saved by the service's timer, and a mark ahead of max_bytes by
        # RouteTable.reserve: not two fsyncs after every request (routes.py).
        if route.plan is None:
            self.server.metrics.inc("relay_bytes_total", sent)
        log.info("route %s (node %s) request %d: %s %s -> %d, %d bytes%s; %d bytes in all",
                 route.id, route.node_id, number, method, agent_http.redact(route.upstream_url),
                 status, sent, f" ({note})" if note else "", route.bytes_used)


class _Upstream(Exception):
    pass


def _upstream_socket(resp: http.client.HTTPResponse) -> socket.socket:
    raw = getattr(resp.fp, "raw", None)
    sock = getattr(raw, "_sock", None)
    assert isinstance(sock, socket.socket)
    return sock


def _plain_upstream(resp: http.client.HTTPResponse) -> bool:
    """A plain TCP upstream (not TLS, not chunked): its body can be read from the socket."""
    if resp.fp is None or resp.chunked:
        return False
    try:
        sock = _upstream_socket(resp)
    except AssertionError:
        return False
    return not isinstance(sock, ssl.SSLSocket)


@contextlib.contextmanager
def _blocking(*socks: socket.socket) -> Iterator[None]:
    """The sockets in blocking mode, each one's Python timeout as its kernel receive and send
    timeouts (a call that waits longer fails with EAGAIN); their Python timeouts again
    afterwards."""
    timeouts = [sock.gettimeout() for sock in socks]
    try:
        for sock, timeout in zip(socks, timeouts, strict=True):
            seconds = timeout or 0.0
            limit = struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))
            sock.setblocking(True)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        yield
    finally:
        for sock, timeout in zip(socks, timeouts, strict=True):
            with contextlib.suppress(OSError):
                sock.settimeout(timeout)


def _reason(exc: Exception) -> str:
    """An error as a route's log says it: a kernel timeout (EAGAIN on a blocking socket) is
    "timed out"."""
    if isinstance(exc, BlockingIOError | TimeoutError):
        return "timed out"
    return type(exc).__name__


_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_-]{16,}")
_NOT_SECRET = re.compile(r"[0-9a-f-]+")  # a sha256 of /cache/, a MAC of /pxe/


def _safe(path: str) -> str:
    """A request target as it may be logged. A route's token is a capability: whatever the
    request looks like (``/r/<token>``, ``/R/<token>``, the absolute form ``http://site/r/<token>``
    of ``curl --proxy``, a token pasted anywhere), nothing from ``/r/`` on (in any case) and no
    run of 16 or more token characters is logged, but for lower-case hex (digests, MACs)."""
    path = path[:200].encode("ascii", "backslashreplace").decode()
    if path.startswith(MEDIA_PREFIX):  # so is a virtual-media token
        return MEDIA_PREFIX + "…/" + _scrub(path.rsplit("/", 1)[-1][:20])
    cut = path.lower().find(ROUTE_PREFIX)
    if cut >= 0:
        path = path[:cut] + ROUTE_PREFIX + "…"
    return _scrub(path)[:100]


def _scrub(text: str) -> str:
    """``text`` without a run of token characters in it (a refusal may quote the request)."""
    return _TOKEN_LIKE.sub(lambda m: m[0] if _NOT_SECRET.fullmatch(m[0]) else "…", text)


class HttpService:
    """The server on its own thread."""

    def __init__(self, address: str, port: int, entries: BootEntries | None, routes: RouteTable,
                 upstream: agent_http.HttpOptions | None = None, store: ChunkStore | None = None,
                 metrics: Metrics | None = None, *, media: MediaSets | None = None,
                 observe: FetchObserver | None = None, tls: ssl.SSLContext | None = None,
                 conns: InboundConnections | None = None) -> None:
        """``tls``: a TLS listener serving the virtual media alone; ``conns``: the admission of
        another listener of the service, shared (the caps hold for both together; its owner
        starts and stops its watch)."""
        self.server = SiteHttpServer((address, port), entries, routes,
                                     upstream or agent_http.HttpOptions(timeout=30.0), store,
                                     metrics, conns, media=media, observe=observe, tls=tls)
        self._owns_conns = conns is None
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"site-{self.scheme}",
                                        kwargs={"poll_interval": 0.2}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        if self._owns_conns:
            self.server.conns.start()
        self._thread.start()
        conns = self.server.conns
        log.info("site HTTP service (%s) on %s:%d (at most %d connections, %d per client%s)",
                 self.scheme, self.server.server_address[0], self.port, conns.total, conns.per_client,
                 "" if self._owns_conns else ", with the http listener's")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._owns_conns:
            self.server.conns.stop()
        self._thread.join(5)
        if self.server.chunks is not None:
            self.server.chunks.close()
