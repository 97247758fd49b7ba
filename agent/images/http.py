"""A small HTTP(S) client on the standard library: streaming GET with resume, streaming PUT,
requests to JSON APIs, multipart uploads.

Used by deploy.image (image download), logs.collect and instance.snapshot (uploads),
daemon.upgrade (agent download) and the site role's Redfish client (``request``,
``post_multipart``). Only ``http://`` and ``https://`` URLs; TLS verifies the server's
certificate and host name unless ``HttpOptions.verify`` is False (only the Redfish client sets
it, when a request says ``verify_tls: false`` for a BMC with a self-signed certificate).

API::

    opts = HttpOptions(ca_pem=request.ca_bundle_pem, ca_file=config.ca_bundle,
                       headers={"Authorization": "..."}, timeout=30.0, max_retries=5,
                       cancel=ctx.cancel_event)

    with http.get(url, opts) as body:          # a Download; raises HttpError/SourceFailed
        body.total                             # full length in bytes, or None if unknown
        for chunk in body.iter_chunks(1 << 20): ...     # or body.read(n) / readinto(buf)
        body.received, body.resumes            # bytes delivered so far, Range resumes used
    # get(url, opts, offset=N) starts at byte N (Range: bytes=N-); with length=L it asks for
    # bytes N to N+L-1 only (Range: bytes=N-M) and ends there.

    with http.Connections(opts) as pool:       # one job's kept-alive connections (a deploy)
        http.get(url, opts, offset=N, length=L, pool=pool)   # each request reuses the one
        # connection to the URL's origin (one TLS handshake), and a redirect is followed once

    resp = http.put(url, source, opts, length=None, content_type="application/octet-stream")
        # source: bytes, a binary file object, or an iterable of bytes (chunked when length is
        # None and the source is not bytes); returns Response(status, headers, body) for 2xx,
        # raises HttpError (status set) otherwise.

    resp = http.request("PATCH", url, opts, json_body={"a": 1}, deadline=time.monotonic() + 30,
                        busy=lambda r: r.status == 409 and b"busy" in r.body)
        # one request to a JSON API; returns Response(status, headers, body, attempts) whatever
        # the status: the caller reads 4xx/5xx bodies (a BMC's own error message). Retried, with
        # backoff bounded by opts.cancel and ``deadline``: connection errors, 408/429/5xx and
        # answers ``busy`` says are "busy"; the last such answer is returned when retries end.
        # A POST or PATCH is sent again only where the server provably did not take it: 429,
        # 503 and "busy" answers, a connection never made; its 500/502/504/408 is returned at
        # once, and a failure after it was sent raises HttpError with detail ambiguous=true
        # (the caller reads back). 4xx is never retried. A transport failure after the retries
        # raises HttpError (status 0); a TLS certificate that does not verify raises it at once
        # (``tls`` detail). Each attempt is cut short (its socket shut down by one watch thread
        # for the process) at ``deadline``, on opts.cancel (Cancelled) and after
        # opts.total_timeout: a server that drips a byte at a time cannot hold the caller past them.

    resp = http.post_multipart(url, [Part("UpdateParameters", json_bytes, "application/json")],
                               Part("UpdateFile", path=Path("fw.bin")), opts)
        # multipart/form-data with the file streamed from disk (Content-Length computed first);
        # no retry, like put.

    http.ssl_context(ca_pem="", ca_file=None, verify=True)  # the TLS context all of them use

Behaviour of ``get``:

- Redirects (301/302/303/307/308) are followed, at most 5; with a pool, once: the requests
  after the first go where it led (a failure there forgets it, and the retry follows it again).
  The caller's headers go only to the URL's own origin, before and after a redirect.
- With a pool, a response read to its end leaves its connection open for the next request;
  a kept-alive connection that the server closed while idle is replaced, not counted as a
  failure.
- 5xx and 429 responses, connection errors and read timeouts are retried ``max_retries`` times
  with a short backoff (interruptible by ``cancel``). 4xx (other than 408/429) fail at once.
- A connection that drops or stalls (no byte for ``timeout`` seconds) mid-body is resumed with
  ``Range: bytes=<received>-`` (and ``If-Range`` with the ETag or Last-Modified when the server
  sent one, so a changed file is never spliced). A server that answers 200 to the Range request
  is read again from the start and the bytes already delivered are skipped.
- A body that ends before its Content-Length (or before the total of its Content-Range) after
  all retries raises SourceFailed: a short download is never a success. A body without a length
  (connection-delimited) cannot be checked here; callers check a digest.
- Header values are never logged (they may carry credentials); the URL is logged without its
  query string or user info.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.client
import itertools
import logging
import os
import re
import secrets
import select
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from agent import limits
from agent.errors import Cancelled, InvalidParameters, SourceFailed

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "bettercompute-agent"
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# A write (POST, PATCH) answered so was refused before it was processed: it may be sent again.
_NOT_TAKEN_STATUS = frozenset({429, 503})


class HttpError(SourceFailed):
    """A non-success HTTP status (``status``) or a transport failure (``status`` 0)."""

    def __init__(self, message: str, *, status: int = 0, **details: Any) -> None:
        super().__init__(message, status=status, **details)
        self.status = status


class BodyTooLarge(HttpError):
    """An answer's body longer than the caller takes (``request``'s and ``post_multipart``'s
    ``max_body``): refused, not read, not retried."""


MAX_BODY = 4 << 20  # what request() and post_multipart() read of an answer at most: a JSON API's


def _read_body(resp: http.client.HTTPResponse, max_body: int, where: str) -> bytes:
    """The body of ``resp``, at most ``max_body`` bytes; BodyTooLarge (what came is dropped)
    when it announces or carries more."""
    length = resp.getheader("Content-Length", "")
    if length.isdigit() and int(length) > max_body:
        raise BodyTooLarge(f"{where}: the answer is {int(length)} bytes, more than the "
                           f"{max_body} taken", status=resp.status)
    data = resp.read(max_body + 1)
    if len(data) > max_body:
        raise BodyTooLarge(f"{where}: the answer is more than the {max_body} bytes taken",
                           status=resp.status)
    return data


@dataclass(frozen=True)
class HttpOptions:
    ca_pem: str = ""                    # extra trusted CA certificates (PEM text)
    ca_file: Path | None = None         # extra trusted CA bundle file (the agent's own)
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0               # per connect / per read, seconds
    max_retries: int = 5
    backoff: float = 0.5                # first retry delay, doubled each time, up to max_backoff
    cancel: threading.Event | None = None
    verify: bool = True                 # False: no certificate or host name check (BMCs only)
    max_backoff: float = 8.0
    total_timeout: float | None = None  # request(): one attempt, connect to last byte (None: no bound)
    # The addresses a connection to (host, port) may dial, raising to refuse it (an address
    # policy: agent/site/serve/upstreams.py); each connection, a redirect's included, dials only
    # those. None: whatever the host name resolves to.
    resolve: Callable[[str, int], Iterable[str]] | None = None


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]             # names in lower case
    body: bytes
    attempts: int = 1                   # requests made, retries included


def redact(url: str) -> str:
    """The URL as it may be logged: no user info, no query string."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


_UNSAFE_IN_URL = re.compile(r"[\x00-\x20\x7f]")


def check_url(url: str) -> urllib.parse.SplitResult:
    """Parse and validate an http(s) URL from the wire; InvalidParameters otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise InvalidParameters(f"bad URL {redact(url)!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidParameters(f"URL scheme must be http or https, not {parts.scheme!r}")
    if not parts.hostname:
        raise InvalidParameters(f"URL has no host: {redact(url)!r}")
    if _UNSAFE_IN_URL.search(url):
        raise InvalidParameters("URL contains whitespace or control characters")
    if not url.isascii():
        raise InvalidParameters(f"URL {redact(url).encode('ascii', 'backslashreplace').decode()!r} "
                                "is not ASCII: percent-encode its other characters")
    return parts


def origin(url: str | urllib.parse.SplitResult) -> tuple[str, str, int]:
    """A URL's origin: scheme, host (lower case) and port (the scheme's default if none)."""
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def redirect_location(url: str, resp: http.client.HTTPResponse) -> str:
    """Where the redirect ``resp`` (to a request for ``url``) points, resolved against ``url``;
    HttpError when it says nowhere. The caller checks the new URL like any other."""
    location = resp.getheader("Location", "")
    if not location:
        raise HttpError(f"{redact(url)}: redirect without Location", status=resp.status)
    return urllib.parse.urljoin(url, location)


def ssl_context(ca_pem: str = "", ca_file: Path | None = None, *, verify: bool = True) -> ssl.SSLContext:
    """System trust store plus the given CAs; certificate and host name verified unless
    ``verify`` is False (then nothing is checked: the caller asked for it by name).

    One context per set of arguments (and CA file as it is on disk), made once and shared:
    making one reads the system's trust store, about 20 ms of CPU, which every request to a
    BMC paid before (bench/site_fleet.py)."""
    stamp = 0
    if ca_file is not None:
        with contextlib.suppress(OSError):
            stamp = ca_file.stat().st_mtime_ns
    return _context(ca_pem, ca_file, stamp, verify)


@functools.lru_cache(maxsize=32)
def _context(ca_pem: str, ca_file: Path | None, stamp: int, verify: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        if ca_file is not None:
            ctx.load_verify_locations(cafile=str(ca_file))
        if ca_pem.strip():
            ctx.load_verify_locations(cadata=ca_pem)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InvalidParameters(f"CA bundle is not usable: {exc}") from exc
    return ctx


class PinnedConnection(http.client.HTTPConnection):
    """A connection to ``addresses``, checked before it was made, not to what the host name
    resolves to when http.client looks it up again (a name that resolves elsewhere a moment
    after the check gains nothing)."""

    addresses: tuple[str, ...] = ()

    def connect(self) -> None:
        error: OSError | None = None
        for address in self.addresses:
            try:
                self.sock = socket.create_connection((address, self.port), self.timeout)
            except OSError as exc:
                error = exc
                continue
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return
        raise error or OSError("no address to connect to")


class PinnedTLSConnection(http.client.HTTPSConnection, PinnedConnection):
    """The same over TLS: the certificate is checked against the URL's host name."""


def pinned(parts: urllib.parse.SplitResult, addresses: tuple[str, ...], timeout: float | None,
           context: ssl.SSLContext | None, port: int | None = None) -> PinnedConnection:
    """A connection to the host of ``parts`` that dials ``addresses`` only (the caller checked
    them), on ``port`` (the URL's by default); over TLS with ``context`` for https."""
    host, port = parts.hostname or "", parts.port if port is None else port
    conn = (PinnedTLSConnection(host, port, timeout=timeout, context=context)
            if parts.scheme == "https" else PinnedConnection(host, port, timeout=timeout))
    conn.addresses = addresses
    return conn


def _connect(
    parts: urllib.parse.SplitResult, opts: HttpOptions, timeout: float | None = None, *,
    context: ssl.SSLContext | None = None,
) -> http.client.HTTPConnection:
    host = parts.hostname or ""
    timeout = opts.timeout if timeout is None else timeout
    tls = parts.scheme == "https"
    if tls:
        context = context or ssl_context(opts.ca_pem, opts.ca_file, verify=opts.verify)
    if opts.resolve is not None:
        return pinned(parts, tuple(opts.resolve(host, parts.port or (443 if tls else 80))),
                      timeout, context)
    if tls:
        return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=context)
    return http.client.HTTPConnection(host, parts.port, timeout=timeout)


def _target(parts: urllib.parse.SplitResult) -> str:
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def _headers(opts: HttpOptions, extra: Mapping[str, str] | None = None, *,
             callers: bool = True) -> dict[str, str]:
    """The request's headers: ours, the caller's (``opts.headers``, unless ``callers`` is
    False: a redirect to another origin gets none of them, as curl does), then ``extra``."""
    hdrs = {"User-Agent": USER_AGENT}
    if callers:
        hdrs.update(opts.headers)
    if extra:
        hdrs.update(extra)
    for name, value in hdrs.items():
        if any(c in name + value for c in "\r\n"):
            raise InvalidParameters(f"HTTP header {name!r} contains a line break")
    return hdrs


def _sleep(opts: HttpOptions, attempt: int) -> None:
    delay = min(opts.max_backoff, opts.backoff * (2 ** max(0, attempt - 1)))
    if opts.cancel is not None:
        if opts.cancel.wait(delay):
            raise Cancelled("download cancelled")
    else:
        time.sleep(delay)


_TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ssl.SSLError)
# What a kept-alive connection that the server closed while idle raises at its next request.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class Connections:
    """The kept-alive connections of one job (a deploy; a Redfish BMC's commands, for
    ``request``): one idle connection per origin, taken
    by each request and given back when its body was read to the end, so a deploy's Range
    requests share one TCP connection (and over TLS one handshake); and each URL's redirect,
    followed once and remembered for the requests after it (forgotten when a request to where
    it led fails, so a retry follows it again).

        with http.Connections(opts) as pool:
            with http.get(url, opts, offset=a, length=n, pool=pool) as body: ...
        pool.opened                        # connections made (counted, for tests and benches)
    """

    def __init__(self, opts: HttpOptions) -> None:
        self.opts = opts
        self.opened = 0
        self._idle: dict[tuple[str, str, int], tuple[http.client.HTTPConnection, float]] = {}
        self._redirects: dict[str, str] = {}
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def take(self, parts: urllib.parse.SplitResult) -> tuple[http.client.HTTPConnection, bool]:
        """A connection to ``parts``' origin: the idle one (True: reused) or a new one."""
        with self._lock:
            kept = self._idle.pop(origin(parts), None)
            if kept is not None:
                return kept[0], True
            self.opened += 1
            if parts.scheme == "https" and self._context is None:
                self._context = ssl_context(self.opts.ca_pem, self.opts.ca_file, verify=self.opts.verify)
        return _connect(parts, self.opts, context=self._context), False

    def idle(self, parts: urllib.parse.SplitResult, *, fresh: float | None = None
             ) -> http.client.HTTPConnection | None:
        """The idle connection to ``parts``' origin, or None (the caller makes one). With
        ``fresh``, only one given back at most that many seconds ago and that the server has
        not closed meanwhile (nothing to read on it: no FIN, no stray bytes); else it is closed."""
        with self._lock:
            kept = self._idle.pop(origin(parts), None)
        if kept is None:
            return None
        conn, since = kept
        if fresh is not None and (time.monotonic() - since > fresh or not still_open(conn)):
            conn.close()
            return None
        return conn

    def give_back(self, parts: urllib.parse.SplitResult, conn: http.client.HTTPConnection) -> None:
        """A connection whose last response was read to its end, for the next request."""
        with self._lock:
            old = self._idle.pop(origin(parts), None)
            self._idle[origin(parts)] = (conn, time.monotonic())
        if old is not None:
            old[0].close()

    def resolved(self, url: str) -> str:
        with self._lock:
            return self._redirects.get(url, url)

    def remember(self, url: str, final: str) -> None:
        with self._lock:
            if final == url:
                self._redirects.pop(url, None)
            else:
                self._redirects[url] = final

    def close(self) -> None:
        with self._lock:
            idle, self._idle = [conn for conn, _ in self._idle.values()], {}
        for conn in idle:
            conn.close()

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def still_open(conn: http.client.HTTPConnection) -> bool:
    """True when an idle connection's socket has nothing to read: the server has not closed
    it (a FIN reads as readable) and sent nothing unasked. poll(2), not select: a site daemon's
    descriptors go past select's 1024."""
    sock = conn.sock
    if sock is None:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


class Download:
    """The body of a GET, read in order; resumes by Range when the connection drops."""

    def __init__(self, url: str, opts: HttpOptions, offset: int = 0, length: int | None = None,
                 pool: Connections | None = None) -> None:
        self.url = url
        self.opts = opts
        self.pool = pool
        self.start = offset
        self.length = length           # only these bytes from ``start`` (Range: bytes=a-b)
        self.ranged = False            # the server answered a Range request with 206
        self.received = 0              # bytes delivered to the caller (after ``start``)
        self.resumes = 0
        self.total: int | None = None  # full size of the resource, when known
        self._validator = ""
        self._conn: http.client.HTTPConnection | None = None
        self._resp: http.client.HTTPResponse | None = None
        self._parts: urllib.parse.SplitResult | None = None   # where _conn is connected
        self._failures = 0
        self._open(first=True)

    # -- connection ----------------------------------------------------------------------

    def _open(self, *, first: bool) -> None:
        """(Re)open the response at ``start + received``; retries transient failures."""
        while True:
            self._check_cancel()
            try:
                self._request(first=first)
                return
            except HttpError as exc:
                if exc.status and exc.status not in _RETRY_STATUS:
                    raise
                self._failures += 1
                if self._failures > self.opts.max_retries:
                    raise HttpError(
                        f"{redact(self.url)}: giving up after {self._failures} attempts: {exc.message}",
                        status=exc.status,
                    ) from exc
                log.warning("%s: %s; retrying", redact(self.url), exc.message)
                _sleep(self.opts, self._failures)

    def _request(self, *, first: bool) -> None:
        self.close()
        pool = self.pool
        home = origin(check_url(self.url))
        url = pool.resolved(self.url) if pool is not None else self.url
        position = self.start + self.received
        try:
            for _hop in range(MAX_REDIRECTS + 1):
                parts = check_url(url)
                extra: dict[str, str] = {}
                if position or self.length is not None:
                    last = "" if self.length is None else str(self.start + self.length - 1)
                    extra["Range"] = f"bytes={position}-{last}"
                    if self._validator:
                        extra["If-Range"] = self._validator
                conn, resp = self._send(parts, _headers(self.opts, extra, callers=origin(parts) == home))
                if resp.status in REDIRECTS:
                    with contextlib.suppress(*_TRANSPORT_ERRORS):
                        resp.read(64 << 10)  # a redirect's short body, read: its connection is reused
                    self._conn, self._resp, self._parts = conn, resp, parts
                    self.close()
                    url = redirect_location(url, resp)
                    continue
                self._conn, self._resp, self._parts = conn, resp, parts
                break
            else:
                raise HttpError(f"{redact(self.url)}: more than {MAX_REDIRECTS} redirects", status=310)
            self._accept(resp, position, first=first)
        except BaseException:
            if pool is not None:
                pool.remember(self.url, self.url)  # the next attempt follows the redirect again
            raise
        if pool is not None:
            pool.remember(self.url, url)

    def _send(self, parts: urllib.parse.SplitResult, headers: dict[str, str]
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """The GET on a connection of the pool (a kept-alive one that the server closed while
        idle is replaced once, not counted as a failure) or on a new one."""
        while True:
            if self.pool is not None:
                conn, reused = self.pool.take(parts)
            else:
                conn, reused = _connect(parts, self.opts), False
            try:
                conn.request("GET", _target(parts), headers=headers)
                return conn, conn.getresponse()
            except _STALE as exc:
                conn.close()
                if reused:
                    log.debug("%s: kept-alive connection closed by the server (%s); reconnecting",
                              redact(self.url), type(exc).__name__)
                    continue
                raise HttpError(f"{redact(self.url)}: {type(exc).__name__}: {exc}") from exc
            except _TRANSPORT_ERRORS as exc:
                conn.close()
                raise HttpError(f"{redact(self.url)}: {type(exc).__name__}: {exc}") from exc

    def _accept(self, resp: http.client.HTTPResponse, position: int, *, first: bool) -> None:
        status = resp.status
        if status == 416 and self.total is not None and position >= self.total:
            return  # nothing left; read() returns b""
        if status not in (200, 206):
            detail = resp.read(512).decode("utf-8", "replace").strip().splitlines()[:1]
            self.close()
            raise HttpError(
                f"{redact(self.url)}: HTTP {status} {resp.reason}" + (f": {detail[0]}" if detail else ""),
                status=status,
            )
        length = resp.getheader("Content-Length")
        body_len = int(length) if length and limits.is_digits(length) else None
        if status == 206:
            start, total = _content_range(resp.getheader("Content-Range", ""))
            if start != position:
                self.close()
                raise HttpError(f"{redact(self.url)}: server resumed at {start}, asked for {position}")
            if total is not None:
                self._set_total(total)
                if self.length is not None:  # a range past the end: the server sends what there is
                    self.length = min(self.length, max(total - self.start, 0))
            self.ranged = True
        else:
            # A full body: skip what was already delivered (a server that ignores Range).
            if body_len is not None:
                self._set_total(body_len)
            skip = position
            while skip:
                got = resp.read(min(skip, 1 << 20))
                if not got:
                    self.close()
                    raise HttpError(f"{redact(self.url)}: body ended while skipping to {position}")
                skip -= len(got)
        if first:
            self._validator = resp.getheader("ETag", "") or resp.getheader("Last-Modified", "")
            if self._validator.startswith("W/"):
                self._validator = ""  # a weak ETag cannot guard a Range request

    def _set_total(self, total: int) -> None:
        if self.total is not None and total != self.total:
            self.close()
            raise SourceFailed(f"{redact(self.url)}: size changed from {self.total} to {total} on resume")
        self.total = total

    def _check_cancel(self) -> None:
        if self.opts.cancel is not None and self.opts.cancel.is_set():
            raise Cancelled("download cancelled")

    # -- reading -------------------------------------------------------------------------

    @property
    def remaining(self) -> int | None:
        if self.length is not None:
            return self.length - self.received
        return None if self.total is None else self.total - self.start - self.received

    def read(self, size: int = 1 << 20) -> bytes:
        """Up to ``size`` bytes (whatever one socket read gives); b"" only at the true end.

        One read at a time (``read1``): a timeout never swallows bytes already received.
        """
        while True:
            self._check_cancel()
            left = self.remaining
            if left == 0 or self._resp is None:
                return b""
            want = size if left is None else min(size, left)
            try:
                data = self._resp.read1(want)
            except _TRANSPORT_ERRORS as exc:
                self._resume(f"{type(exc).__name__}: {exc}")
                continue
            if data:
                self.received += len(data)
                return data
            if left is None:
                return b""  # connection-delimited body: its end is the end
            self._resume(f"body ended {left} bytes early")

    def readinto(self, buf: memoryview | bytearray) -> int:
        data = self.read(len(buf))
        memoryview(buf)[: len(data)] = data
        return len(data)

    def iter_chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        while chunk := self.read(size):
            yield chunk

    def _resume(self, why: str) -> None:
        self._failures += 1
        if self._failures > self.opts.max_retries:
            self.close()
            raise SourceFailed(
                f"{redact(self.url)}: download failed at byte {self.start + self.received}"
                f" of {self.total if self.total is not None else '?'} after"
                f" {self.resumes} resumes: {why}",
                received=self.start + self.received,
            )
        log.warning("%s: %s; resuming at byte %d", redact(self.url), why, self.start + self.received)
        self.resumes += 1
        _sleep(self.opts, self._failures)
        self._open(first=False)

    def close(self) -> None:
        """Done with the response: its connection goes back to the pool when the body was read
        to its end and the server keeps it open, else it is closed."""
        conn, resp, parts = self._conn, self._resp, self._parts
        self._conn = self._resp = self._parts = None
        if conn is None:
            return
        if (self.pool is not None and resp is not None and parts is not None and not resp.will_close
                and (resp.isclosed() or resp.length == 0)):
            resp.close()
            self.pool.give_back(parts, conn)
        else:
            conn.close()

    def __enter__(self) -> Download:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _content_range(value: str) -> tuple[int, int | None]:
    """'bytes 100-199/1000' -> (100, 1000); '/*' -> (100, None)."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        start = int(span.split("-", 1)[0])
        if unit != "bytes":
            raise ValueError(unit)
        return start, None if total == "*" else int(total)
    except ValueError as exc:
        raise SourceFailed(f"bad Content-Range {value!r}") from exc


def get(url: str, opts: HttpOptions | None = None, *, offset: int = 0, length: int | None = None,
        pool: Connections | None = None) -> Download:
    """Open ``url`` for streaming from byte ``offset`` (only ``length`` bytes when given: a
    bounded Range request, for the data chunks of a sparse image), on a connection of ``pool``
    when given (see Connections); see the module docstring."""
    check_url(url)
    return Download(url, opts or HttpOptions(), offset, length, pool)


def download_to(url: str, path: Path, opts: HttpOptions | None = None,
                cancel: threading.Event | None = None) -> Path:
    """``url``'s body into ``path``, whole or not at all: written to a temporary sibling,
    fsync'ed, mode 0644, renamed into place (``cancel`` stops it)."""
    opts = dataclasses.replace(opts or HttpOptions(), cancel=cancel)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with get(url, opts) as body, open(tmp, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def put(
    url: str,
    source: bytes | BinaryIO | Iterable[bytes],
    opts: HttpOptions | None = None,
    *,
    length: int | None = None,
    content_type: str = "application/octet-stream",
) -> Response:
    """PUT ``source`` to ``url`` (streamed; chunked when the length is unknown). No retry:
    a stream cannot be replayed; the caller retries with a fresh source if it can."""
    opts = opts or HttpOptions()
    parts = check_url(url)
    extra = {"Content-Type": content_type}
    if isinstance(source, bytes | bytearray | memoryview):
        length = len(source)
    if length is not None:
        extra["Content-Length"] = str(length)
    else:
        extra["Transfer-Encoding"] = "chunked"
    body: object = source
    if not isinstance(source, bytes | bytearray | memoryview) and hasattr(source, "read"):
        reader = source

        def chunks() -> Iterator[bytes]:
            while data := reader.read(1 << 20):
                if opts.cancel is not None and opts.cancel.is_set():
                    raise Cancelled("upload cancelled")
                yield data

        body = chunks()
    conn = _connect(parts, opts)
    try:
        conn.request(
            "PUT",
            _target(parts),
            body=body,  # type: ignore[arg-type]  # an iterator of bytes: http.client streams it
            headers=_headers(opts, extra),
            encode_chunked=length is None,
        )
        resp = conn.getresponse()
        data = resp.read(1 << 20)
    except _TRANSPORT_ERRORS as exc:
        raise HttpError(f"PUT {redact(url)}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    if not 200 <= resp.status < 300:
        first = data.decode("utf-8", "replace").strip().splitlines()[:1]
        raise HttpError(
            f"PUT {redact(url)}: HTTP {resp.status} {resp.reason}" + (f": {first[0]}" if first else ""),
            status=resp.status,
        )
    return Response(resp.status, headers, data)


# -- JSON APIs ---------------------------------------------------------------------------

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
FRESH_SECONDS = 2.0   # a kept connection this recently used and still open takes a POST or PATCH


class _Attempt:
    """One watched attempt: its connection, until when it may last, and why it was cut."""

    def __init__(self, conn: http.client.HTTPConnection, until: float,
                 cancel: threading.Event | None) -> None:
        self.conn, self.until, self.cancel = conn, until, cancel
        self.cut = ""                   # "", "cancel" or "time"

    def cut_short(self, why: str) -> None:
        self.cut = why
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                # The plain socket's shutdown, also under TLS: a blocked read returns at once,
                # and the TLS object is left for the reader to fail on, not pulled from under it.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watch:
    """Cuts attempts short at their time or on their cancel; one thread for the process, made
    on first use, that wakes at the next limit or every ``POLL`` seconds for the cancels."""

    POLL = 0.25

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._attempts: dict[int, _Attempt] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._wakes_at = 0.0   # when the thread wakes next: an attempt due before that wakes it

    @contextlib.contextmanager
    def attempt(self, conn: http.client.HTTPConnection, until: float,
                cancel: threading.Event | None) -> Iterator[_Attempt]:
        watched = _Attempt(conn, until, cancel)
        with self._cond:
            key = next(self._ids)
            self._attempts[key] = watched
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-watch", daemon=True)
                self._thread.start()
            elif until < self._wakes_at:
                # Only then: with hundreds of requests in flight (a site's BMCs), waking the
                # thread for each would have it walk them all at every request.
                self._cond.notify()
        try:
            yield watched
        finally:
            with self._cond:
                del self._attempts[key]

    def _run(self) -> None:
        with self._cond:
            while True:
                now, wait = time.monotonic(), self.POLL
                for watched in self._attempts.values():
                    if watched.cut:
                        continue
                    if watched.cancel is not None and watched.cancel.is_set():
                        watched.cut_short("cancel")
                    elif now >= watched.until:
                        watched.cut_short("time")
                    else:
                        wait = min(wait, watched.until - now)
                self._wakes_at = now + max(wait, 0.01)
                self._cond.wait(max(wait, 0.01))


_WATCH = _Watch()


def _tls_refused(exc: BaseException) -> bool:
    return isinstance(exc, ssl.SSLCertVerificationError) or (
        isinstance(exc, ssl.SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(exc)
    )


def request(
    method: str,
    url: str,
    opts: HttpOptions | None = None,
    *,
    json_body: object = None,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    deadline: float | None = None,
    busy: Callable[[Response], bool] | None = None,
    max_body: int = MAX_BODY,
    connections: Connections | None = None,
) -> Response:
    """One request to a JSON API, retried when the server is down, failing or busy; an
    answer's body longer than ``max_body`` raises BodyTooLarge.

    Returns the final Response whatever its status (see the module docstring). A request that
    is not idempotent (POST, PATCH) is retried after a transport error only when the error came
    before the request was sent (the connection could not be made): a BMC that may have acted
    on it is never asked twice. ``deadline`` (a time.monotonic() value) bounds every wait.
    With ``connections``, a request goes over the kept-alive connection to the same origin
    when there is one (and leaves its own there): an idempotent one over any (one the server
    closed meanwhile is replaced at once, not counted as an attempt), a POST or PATCH only over
    one used in the last FRESH_SECONDS and still open (see ``Connections.idle``).
    """
    import json

    opts = opts or HttpOptions()
    method = method.upper()
    parts = check_url(url)
    if json_body is not None and body is not None:
        raise InvalidParameters("request: give json_body or body, not both")
    extra: dict[str, str] = {"Accept": "application/json"}
    payload: bytes | None = body
    if json_body is not None:
        payload = json.dumps(json_body).encode()
        extra["Content-Type"] = "application/json"
    if headers:
        extra.update(headers)
    hdrs = _headers(opts, extra)
    where = f"{method} {redact(url)}"
    attempt = 0
    while True:
        attempt += 1
        if opts.cancel is not None and opts.cancel.is_set():
            raise Cancelled(f"{where}: cancelled")
        timeout = opts.timeout
        now = time.monotonic()
        until = now + opts.total_timeout if opts.total_timeout is not None else float("inf")
        if deadline is not None:
            left = deadline - now
            if left <= 0:
                raise HttpError(f"{where}: deadline passed before attempt {attempt}", attempts=attempt - 1)
            timeout = min(timeout, left)
            until = min(until, deadline)
        idempotent = method in _IDEMPOTENT
        # A POST or PATCH goes over a kept connection only when it is fresh and still open: a
        # server that closed it meanwhile would leave it unknown whether it acted (never asked
        # twice), where a GET is simply sent again on a new connection.
        kept = connections.idle(parts, fresh=None if idempotent else FRESH_SECONDS) \
            if connections is not None else None
        conn = kept or _connect(parts, opts, timeout)
        if kept is not None and kept.sock is not None:
            kept.sock.settimeout(timeout)
        sent = False
        retry_why = ""
        last: Response | None = None
        keep = False
        try:
            with _WATCH.attempt(conn, until, opts.cancel) as watched:
                if conn.sock is None:
                    conn.connect()
                sent = True
                conn.request(method, _target(parts), body=payload, headers=hdrs)
                resp = conn.getresponse()
                data = _read_body(resp, max_body, where)
                last = Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, attempt)
                keep = connections is not None and not resp.will_close
        except _TRANSPORT_ERRORS as exc:
            if kept is not None and not watched.cut and (idempotent or not sent):
                # A kept-alive connection the server had closed: the same attempt, afresh.
                log.debug("%s: kept-alive connection gone (%s); a new one", where, exc)
                attempt -= 1
                continue
            if watched.cut == "cancel":
                raise Cancelled(f"{where}: cancelled") from exc
            if watched.cut and deadline is not None and time.monotonic() >= deadline:
                raise HttpError(f"{where}: no complete answer before the deadline (attempt {attempt})",
                                attempts=attempt) from exc
            if watched.cut:
                exc = TimeoutError(f"no complete answer within {opts.total_timeout:g} s")
            if _tls_refused(exc):
                raise HttpError(
                    f"{where}: the server's TLS certificate is not trusted: {exc}", tls="untrusted"
                ) from exc
            if sent and method not in _IDEMPOTENT:
                raise HttpError(
                    f"{where}: {type(exc).__name__}: {exc} (after the request was sent; not repeated)",
                    attempts=attempt, ambiguous="true",
                ) from exc
            retry_why = f"{type(exc).__name__}: {exc}"
        finally:
            if keep and connections is not None:
                connections.give_back(parts, conn)
            else:
                conn.close()
        if last is not None:
            log.debug("%s: HTTP %d (attempt %d)", where, last.status, attempt)
            if last.status in _RETRY_STATUS and (idempotent or last.status in _NOT_TAKEN_STATUS):
                retry_why = f"HTTP {last.status}"
            elif busy is not None and busy(last):
                retry_why = f"HTTP {last.status}, busy"
            else:
                return last
        delay = min(opts.max_backoff, opts.backoff * (2 ** (attempt - 1)))
        out_of_time = deadline is not None and time.monotonic() + delay >= deadline
        if attempt > opts.max_retries or out_of_time:
            if last is not None:
                return last
            raise HttpError(
                f"{where}: giving up after {attempt} attempts"
                + (" (deadline)" if out_of_time else "") + f": {retry_why}",
                attempts=attempt,
            )
        log.warning("%s: %s; retrying in %.1f s", where, retry_why, delay)
        if opts.cancel is not None:
            if opts.cancel.wait(delay):
                raise Cancelled(f"{where}: cancelled")
        else:
            time.sleep(delay)


@dataclass(frozen=True)
class Part:
    """One part of a multipart/form-data body: ``data`` in memory or the file at ``path``."""

    name: str
    data: bytes = b""
    content_type: str = "application/octet-stream"
    path: Path | None = None
    filename: str = ""


def _part_head(boundary: str, part: Part) -> bytes:
    for text in (part.name, part.filename, part.content_type):
        if any(c in text for c in '\r\n"'):
            raise InvalidParameters(f"multipart: bad character in part {part.name!r}")
    disposition = f'form-data; name="{part.name}"'
    filename = part.filename or (part.path.name if part.path is not None else "")
    if filename:
        if any(c in filename for c in '\r\n"'):
            raise InvalidParameters("multipart: bad character in a file name")
        disposition += f'; filename="{filename}"'
    return (
        f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        f"Content-Type: {part.content_type}\r\n\r\n"
    ).encode()


def post_multipart(url: str, parts: Iterable[Part], opts: HttpOptions | None = None, *,
                   max_body: int = MAX_BODY) -> Response:
    """POST a multipart/form-data body, files streamed from disk in 1 MiB chunks (the length is
    computed first, so no chunked encoding: BMCs rarely accept it). Returns the Response
    whatever its status; a transport failure raises HttpError, an answer longer than
    ``max_body`` BodyTooLarge. No retry: the caller decides."""
    opts = opts or HttpOptions()
    target = check_url(url)
    boundary = f"bettercompute-{uuid.uuid4().hex}"
    pieces: list[tuple[bytes, Part]] = [(_part_head(boundary, p), p) for p in parts]
    tail = f"--{boundary}--\r\n".encode()
    length = len(tail)
    for head, part in pieces:
        try:
            size = part.path.stat().st_size if part.path is not None else len(part.data)
        except OSError as exc:
            raise InvalidParameters(f"multipart: cannot read {part.path}: {exc.strerror}") from exc
        length += len(head) + size + 2

    def stream() -> Iterator[bytes]:
        for head, part in pieces:
            yield head
            if part.path is None:
                yield part.data
            else:
                with part.path.open("rb") as f:
                    while data := f.read(1 << 20):
                        if opts.cancel is not None and opts.cancel.is_set():
                            raise Cancelled("upload cancelled")
                        yield data
            yield b"\r\n"
        yield tail

    hdrs = _headers(opts, {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(length),
        "Accept": "application/json",
    })
    where = f"POST {redact(url)}"
    conn = _connect(target, opts)
    try:
        conn.request("POST", _target(target), body=stream(), headers=hdrs)
        resp = conn.getresponse()
        data = _read_body(resp, max_body, where)
    except _TRANSPORT_ERRORS as exc:
        tls = "untrusted" if _tls_refused(exc) else ""
        raise HttpError(f"{where}: {type(exc).__name__}: {exc}", tls=tls) from exc
    finally:
        conn.close()
    log.debug("%s: HTTP %d, %d bytes sent", where, resp.status, length)
    return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)


__all__ = ["BodyTooLarge", "Connections", "Download", "HttpError", "HttpOptions", "Part", "Response",
           "check_url", "get", "post_multipart", "put", "redact", "request", "ssl_context"]
