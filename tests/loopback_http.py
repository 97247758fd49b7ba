"""A loopback HTTP(S) server for tests: serves bytes, honours Range, and misbehaves on request.

    with LoopbackServer() as srv:
        srv.add("/img", data, fault=Fault(reset_after=1000, times=1))
        url = srv.url("/img")
        ... srv.requests  # list of (method, path, headers) seen
        ... srv.uploads["/up"]  # bodies received by PUT
        ... srv.sent("/img")    # body bytes sent (Range bytes=a-b is honoured to b)
        ... srv.connections     # TCP connections accepted (HTTP/1.1 keeps them alive)

Faults: ``status`` (e.g. 404, 500) answered ``times`` times then normal service; ``reset_after``
(bytes sent, then the socket is reset), ``truncate_after`` (bytes sent with the full
Content-Length, then a clean close), ``delay`` (seconds slept before each 64 KiB chunk),
``ignore_range`` (always 200 with the full body), ``stall_after`` (bytes sent, then sleep
``stall`` seconds before closing), ``close_after`` (the connection closed after the response
without saying so, as a server's idle timeout does to a kept-alive one). ``times`` bounds how
many requests get the fault (0 = all). Only 127.0.0.1. For TLS give ``tls=(certfile, keyfile)``.

``ScriptedServer`` answers each request with a function of it; ``RawServer`` answers every
connection with the same bytes, framed as wrongly as a test needs.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Fault:
    status: int = 0
    reset_after: int = -1
    truncate_after: int = -1
    stall_after: int = -1
    stall: float = 0.0
    delay: float = 0.0
    ignore_range: bool = False
    close_after: bool = False
    times: int = 0  # 0: every request


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True    # headers and body are two writes: no delayed-ACK wait

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        with self.server.guard:
            self.server.connections += 1
        super().setup()

    def _fault(self, path: str) -> Fault | None:
        with self.server.guard:
            fault = self.server.faults.get(path)
            if fault is None:
                return None
            count = self.server.fault_count.get(path, 0)
            if fault.times and count >= fault.times:
                return None
            self.server.fault_count[path] = count + 1
            return fault

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        with self.server.guard:
            self.server.requests.append(("GET", self.path, dict(self.headers.items())))
        data = self.server.files.get(path)
        if path in self.server.redirects:
            self.send_response(302)
            self.send_header("Location", self.server.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if data is None:
            self._status(404)
            return
        fault = self._fault(path) or Fault()
        if fault.status:
            self._status(fault.status)
            return
        start, end = 0, len(data)
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and not fault.ignore_range:
            first, _, last = rng[6:].partition("-")
            start = int(first)
            end = min(int(last) + 1, len(data)) if last else len(data)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = memoryview(data)[start:end]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"v1"')
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        sent = 0
        step = 64 * 1024
        try:
            while sent < len(body):
                limit = len(body)
                for cut in (fault.reset_after, fault.truncate_after, fault.stall_after):
                    if cut >= 0:
                        limit = min(limit, cut)
                if sent >= limit:
                    break
                if fault.delay:
                    time.sleep(fault.delay)
                n = min(step, limit - sent)
                self.wfile.write(body[sent : sent + n])
                sent += n
                with self.server.guard:
                    self.server.sent[path] = self.server.sent.get(path, 0) + n
            self.wfile.flush()
        except OSError:
            return
        if fault.close_after:
            self.close_connection = True
        if sent < len(body):
            if fault.stall_after >= 0:
                time.sleep(fault.stall)
            if fault.reset_after >= 0:
                # SO_LINGER 0: close sends RST instead of FIN.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

    def do_PUT(self) -> None:
        path = self.path.split("?", 1)[0]
        with self.server.guard:
            self.server.requests.append(("PUT", self.path, dict(self.headers.items())))
        fault = self._fault(path)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            body = b"".join(chunks)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if fault is not None and fault.status:
            self._status(fault.status)
            return
        with self.server.guard:
            self.server.uploads[path] = body
        self.send_response(201)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def _status(self, status: int) -> None:
        msg = f"status {status}\n".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(msg)))
        self.end_headers()
        self.wfile.write(msg)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    guard: threading.Lock
    files: dict[str, bytes]
    faults: dict[str, Fault]
    fault_count: dict[str, int]
    redirects: dict[str, str]
    requests: list[tuple[str, str, dict[str, str]]]
    uploads: dict[str, bytes]
    sent: dict[str, int]
    connections: int


class _Serving:
    """A server on its own thread while the ``with`` block runs."""

    server: ThreadingHTTPServer
    thread: threading.Thread

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        with contextlib.suppress(OSError):
            self.server.server_close()
        self.thread.join(5)


class LoopbackServer(_Serving):
    server: _Server

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.guard = threading.Lock()
        self.server.files, self.server.faults, self.server.fault_count = {}, {}, {}
        self.server.redirects, self.server.requests, self.server.uploads = {}, [], {}
        self.server.sent = {}
        self.server.connections = 0
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, path: str, data: bytes, fault: Fault | None = None) -> str:
        self.server.files[path] = data
        if fault is not None:
            self.server.faults[path] = fault
        return self.url(path)

    def redirect(self, path: str, to: str) -> None:
        self.server.redirects[path] = to

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}{path}"

    @property
    def requests(self) -> list[tuple[str, str, dict[str, str]]]:
        return self.server.requests

    @property
    def uploads(self) -> dict[str, bytes]:
        return self.server.uploads

    @property
    def connections(self) -> int:
        return self.server.connections

    def sent(self, path: str) -> int:
        """Body bytes sent for ``path`` so far (every GET, Range requests included)."""
        return self.server.sent.get(path, 0)



def self_signed_cert(directory: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (and localhost), written as PEM files; (certfile, keyfile)."""
    import datetime
    import ipaddress
    import os

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loopback test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile = os.path.join(directory, "cert.pem")
    keyfile = os.path.join(directory, "key.pem")
    with open(certfile, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(keyfile, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return certfile, keyfile


# -- a scripted server for JSON APIs -------------------------------------------------------

Reply = tuple[int, dict[str, str], bytes]
Route = Any  # Callable[[Seen], Reply]


@dataclass
class Seen:
    """One request as the scripted server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _ScriptedHandler(BaseHTTPRequestHandler):
    server: _ScriptedServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True    # headers and body are two writes: no delayed-ACK wait

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.guard:
            self.server.connections += 1

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or "0")
        body = self.rfile.read(length) if length else b""
        seen = Seen(self.command, self.path, dict(self.headers.items()), body)
        with self.server.guard:
            self.server.seen.append(seen)
            route = self.server.routes.get((self.command, self.path.split("?", 1)[0]))
            route = route or self.server.fallback
        status, headers, data = route(seen)
        if status == -1:  # drop the connection without an answer
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

    def do_HEAD(self) -> None:
        """As the GET would answer, without its body (a route may give the GET's
        Content-Length among its headers)."""
        seen = Seen(self.command, self.path, dict(self.headers.items()), b"")
        with self.server.guard:
            self.server.seen.append(seen)
            route = self.server.routes.get((self.command, self.path.split("?", 1)[0]))
            route = route or self.server.fallback
        status, headers, data = route(seen)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()


class _ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True
    guard: threading.Lock
    routes: dict[tuple[str, str], Route]
    fallback: Route
    seen: list[Seen]
    connections: int


class ScriptedServer(_Serving):
    """Answers each (method, path) with a function of the request: ``srv.route("GET", "/x",
    fn)``, ``fn(seen) -> (status, headers, body)``; status -1 drops the connection. Unrouted
    requests get 404. ``srv.seen`` lists every request, ``srv.connections`` counts the TCP
    connections. Only 127.0.0.1; TLS with ``tls``."""

    server: _ScriptedServer

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.server = _ScriptedServer(("127.0.0.1", 0), _ScriptedHandler)
        self.server.guard = threading.Lock()
        self.server.routes, self.server.seen = {}, []
        self.server.connections = 0
        self.server.fallback = lambda seen: (404, {"Content-Type": "application/json"}, b'{"error": {}}')
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, method: str, path: str, fn: Route) -> None:
        with self.server.guard:
            self.server.routes[(method, path)] = fn

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    @property
    def connections(self) -> int:
        """TCP connections accepted (HTTP/1.1: kept alive between requests)."""
        return self.server.connections

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.address}{path}"


class RawServer:
    """Answers every connection with the same bytes (``answer``), whatever it asked, then closes
    it: an upstream or a BMC that frames its answers wrongly. Only 127.0.0.1."""

    def __init__(self, answer: bytes, tls: tuple[str, str] | None = None) -> None:
        self.answer = answer
        self.tls: ssl.SSLContext | None = None
        if tls is not None:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(*tls)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def url(self, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}{path}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    if self.tls is not None:
                        conn = self.tls.wrap_socket(conn, server_side=True)
                    conn.recv(65536)
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
