"""The site's HTTP service on the provisioning network: boot scripts, cached kernels and
initrds, and the proxy routes.

    GET /boot.ipxe            what every chained iPXE runs: fetch its node's own script
    GET /pxe/<mac>.ipxe       a node's script (404 unless its boot entry is live)
    GET /cache/<sha256>       a cached kernel or initrd
    GET|HEAD /r/<token>       a proxy route (agent/site/routes.py)

Anything else is 404; a method a path does not carry is 405. A route's response streams
the upstream's body through one buffer. When the upstream fails mid-body the client's
connection is cut before the announced Content-Length (or without the last chunk of a
chunked body): the client sees a failure, never a short success.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import logging
import os
import select
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent import http as agent_http
from agent.errors import NotFound
from agent.site.pxe import BootEntries
from agent.site.routes import (
    PASS_REQUEST_HEADERS,
    PASS_RESPONSE_HEADERS,
    ROUTE_PREFIX,
    Route,
    RouteTable,
    UpstreamError,
    close_quietly,
    open_upstream,
)

log = logging.getLogger(__name__)

BUFFER = 1 << 20
CLIENT_TIMEOUT = 120.0


class SiteHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], entries: BootEntries | None,
                 routes: RouteTable, upstream: agent_http.HttpOptions) -> None:
        self.entries = entries
        self.routes = routes
        self.upstream = upstream
        super().__init__(address, _Handler)


class _Cut(Exception):
    """The response cannot be completed: drop the connection."""


class _Handler(BaseHTTPRequestHandler):
    server: SiteHttpServer
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_TIMEOUT
    server_version = "bettercompute-site"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # every request is logged once, by what serves it

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
        try:
            if path.startswith(ROUTE_PREFIX):
                self._route(method, path[len(ROUTE_PREFIX):])
                return
            if self.server.entries is None or "?" in path:
                self._refuse(404, "not found")
                return
            if method not in ("GET", "HEAD"):
                self._refuse(405, f"{method} not allowed", allow="GET, HEAD")
                return
            if path == "/boot.ipxe":
                self._bytes(method, self.server.entries.chain_script(), "text/plain")
            elif path.startswith("/pxe/"):
                self._file(method, self.server.entries.script_path(path[len("/pxe/"):]),
                           "text/plain")
            elif path.startswith("/cache/"):
                self._file(method, self.server.entries.cache_path(path[len("/cache/"):]),
                           "application/octet-stream")
            else:
                self._refuse(404, "not found")
        except NotFound as exc:
            self._refuse(404, exc.message)
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
        log.info("%s %s -> %d %s", self.command, _safe(self.path), status, message)
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
        log.info("%s %s -> 200, %d bytes", method, _safe(self.path), len(data))

    def _file(self, method: str, path: Path, ctype: str) -> None:
        try:
            f = open(path, "rb")  # noqa: SIM115  (closed by the with below)
        except FileNotFoundError:
            raise NotFound("gone") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if method == "GET":
                self.wfile.flush()
                self.connection.sendfile(f)
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
        headers = {name: value for name in PASS_REQUEST_HEADERS
                   if (value := self.headers.get(name)) is not None}
        try:
            conn, resp = open_upstream(route, method, headers, self.server.upstream)
        except UpstreamError as exc:
            self._refuse(exc.status, str(exc))
            self._account(route, method, number, exc.status, 0, str(exc))
            return
        try:
            status, sent, note = self._relay(route, method, number, resp)
        finally:
            close_quietly(conn)
        self._account(route, method, number, status, sent, note)

    def _relay(self, route: Route, method: str, number: int,
               resp: http.client.HTTPResponse) -> tuple[int, int, str]:
        length_header = resp.getheader("Content-Length")
        length = int(length_header) if length_header and length_header.isdigit() else None
        body_expected = method != "HEAD" and resp.status not in (204, 304)
        reserved = length if (body_expected and length is not None) else 0
        if reserved and not route.reserve(reserved):
            self._refuse(403, f"route {route.id}: past its max_bytes ({route.max_bytes})")
            return 403, 0, "past max_bytes"
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
            return resp.status, 0, ""
        sent = 0
        buf = bytearray(BUFFER)
        view = memoryview(buf)
        write = self.wfile.write
        try:
            if length is not None and _can_splice(resp):
                sent = self._splice(resp, length)
            while length is None or sent < length:
                try:
                    n = resp.readinto(view)
                except (OSError, http.client.HTTPException) as exc:
                    raise _Upstream(f"upstream failed mid-body: {type(exc).__name__}") from exc
                if not n:
                    break
                if length is None:
                    if not route.reserve(n):
                        raise _Upstream("past max_bytes")
                    write(b"%x\r\n" % n)
                    write(view[:n])
                    write(b"\r\n")
                else:
                    if sent + n > length:
                        raise _Upstream("upstream sent more than its Content-Length")
                    write(view[:n])
                sent += n
            if length is not None and sent < length:
                raise _Upstream(f"upstream ended at {sent} of {length} bytes")
            if chunked:
                write(b"0\r\n\r\n")
        except _Upstream as exc:
            if reserved:
                route.release(reserved - sent)
            self._account(route, method, number, resp.status, sent, f"cut: {exc}")
            raise _Cut() from exc
        except (ConnectionError, TimeoutError):
            if reserved:
                route.release(reserved - sent)
            raise
        return resp.status, sent, ""

    def _splice(self, resp: http.client.HTTPResponse, length: int) -> int:
        """The body from the upstream's socket to the client's in the kernel (splice(2)
        through a pipe): no copy through Python. Returns the bytes relayed; fewer than
        ``length`` when the upstream ended early (the caller cuts the connection)."""
        assert resp.fp is not None
        sent = 0
        try:
            pending = resp.fp.peek(1)[: length] if length else b""  # read with the headers
        except OSError as exc:
            raise _Upstream(f"upstream failed mid-body: {type(exc).__name__}") from exc
        if pending:
            self.wfile.write(resp.fp.read(len(pending)))
            sent = len(pending)
        src = _upstream_socket(resp)
        dst = self.connection
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, F_SETPIPE_SZ, BUFFER)
        try:
            while sent < length:
                try:
                    n = _splice_once(src, write_end, min(BUFFER, length - sent), select.POLLIN)
                except OSError as exc:
                    raise _Upstream(f"upstream failed mid-body: {type(exc).__name__}") from exc
                if n == 0:
                    break
                left = n
                while left:
                    left -= _splice_once(read_end, dst, left, select.POLLOUT, dst_is_out=True)
                sent += n
        finally:
            os.close(read_end)
            os.close(write_end)
        return sent

    def _account(self, route: Route, method: str, number: int, status: int, sent: int,
                 note: str) -> None:
        self.server.routes.save(route)
        log.info("route %s (node %s) request %d: %s %s -> %d, %d bytes%s; %d bytes in all",
                 route.id, route.node_id, number, method, agent_http.redact(route.upstream_url),
                 status, sent, f" ({note})" if note else "", route.bytes_used)


class _Upstream(Exception):
    pass


F_SETPIPE_SZ = 1031


def _upstream_socket(resp: http.client.HTTPResponse) -> socket.socket:
    raw = getattr(resp.fp, "raw", None)
    sock = getattr(raw, "_sock", None)
    assert isinstance(sock, socket.socket)
    return sock


def _can_splice(resp: http.client.HTTPResponse) -> bool:
    """Plain TCP upstream with a known length: relay with splice(2) (Linux)."""
    if not hasattr(os, "splice") or resp.fp is None or resp.chunked:
        return False
    try:
        sock = _upstream_socket(resp)
    except AssertionError:
        return False
    return not isinstance(sock, ssl.SSLSocket)


def _splice_once(src: socket.socket | int, dst: socket.socket | int, count: int, event: int,
                 *, dst_is_out: bool = False) -> int:
    """One splice(2), waiting (poll, the socket's timeout) while the socket is not ready."""
    sock = dst if dst_is_out else src
    assert isinstance(sock, socket.socket)
    src_fd = src if isinstance(src, int) else src.fileno()
    dst_fd = dst if isinstance(dst, int) else dst.fileno()
    timeout = sock.gettimeout()
    while True:
        try:
            return os.splice(src_fd, dst_fd, count, flags=SPLICE_F_MOVE | SPLICE_F_MORE)
        except BlockingIOError:
            poller = select.poll()
            poller.register(sock.fileno(), event)
            if not poller.poll(None if timeout is None else timeout * 1000):
                raise TimeoutError("no progress for the socket's timeout") from None


SPLICE_F_MOVE = getattr(os, "SPLICE_F_MOVE", 1)
SPLICE_F_MORE = getattr(os, "SPLICE_F_MORE", 4)


def _safe(path: str) -> str:
    """A request path as it may be logged: a route's token is a capability, not logged."""
    if path.startswith(ROUTE_PREFIX):
        return ROUTE_PREFIX + "…"
    return path[:100].encode("ascii", "backslashreplace").decode()


class HttpService:
    """The server on its own thread."""

    def __init__(self, address: str, port: int, entries: BootEntries | None, routes: RouteTable,
                 upstream: agent_http.HttpOptions | None = None) -> None:
        self.server = SiteHttpServer((address, port), entries, routes,
                                     upstream or agent_http.HttpOptions(timeout=30.0))
        self._thread = threading.Thread(target=self.server.serve_forever, name="site-http",
                                        kwargs={"poll_interval": 0.2}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("site HTTP service on %s:%d", self.server.server_address[0], self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
