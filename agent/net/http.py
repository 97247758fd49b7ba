"""A small HTTP(S) client on the standard library: streaming GET with resume, streaming PUT,
requests to JSON APIs, multipart uploads; the front of agent/net/ (its names are this
module's: ``http.HttpOptions``, ``http.ConnectionPool``, ``http.check_url``...).

Used by deploy.image (image download), logs.collect and instance.snapshot (uploads),
daemon.upgrade (agent download) and the site role's Redfish client (``request``,
``post_multipart``). Only ``http://`` and ``https://`` URLs; TLS verifies the server's
certificate and host name unless ``HttpOptions.verify`` is False (only the Redfish client sets
it, when a request says ``verify_tls: false`` for a BMC with a self-signed certificate).

agent/net/ by noun: urls.py (check_url, redact, origin), exchange.py (HttpOptions, Response,
HttpError, AmbiguousWrite, the headers), connect.py (ssl_context, pinned connections),
pool.py (ConnectionPool, the stale-connection rule, the redirect loop), and this module; the
attempts' deadlines are watched by agent/deadlines.py.

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

    with http.ConnectionPool() as pool:        # one job's kept-alive connections (a deploy)
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
        # backoff bounded by opts.cancel and ``deadline``, by the rule of its method (below);
        # the last such answer is returned when retries end. A transport failure after the
        # retries raises HttpError (status 0); a TLS certificate that does not verify raises it
        # at once (``tls`` detail). Each attempt is cut short (its socket shut down by one
        # watcher for the process, agent/deadlines.py) at ``deadline``, on opts.cancel
        # (Cancelled) and after opts.total_timeout: a server that drips a byte at a time cannot
        # hold the caller past them.

    resp = http.post_multipart(url, [Part("UpdateParameters", json_bytes, "application/json")],
                               Part("UpdateFile", path=Path("fw.bin")), opts)
        # multipart/form-data with the file streamed from disk (Content-Length computed first);
        # no retry, like put.

    http.ssl_context(ca_pem="", ca_file=None, verify=True)  # the TLS context all of them use

Writes are never sent twice. ``request`` retries by the method:

- GET, HEAD, PUT, DELETE, OPTIONS (idempotent): connection errors, timeouts, cut answers,
  408/429/5xx and answers ``busy`` says are "busy", up to ``max_retries``.
- POST, PATCH and any other method: sent again only when the server provably did not take
  it: the connection could not be made (nothing was sent), a kept-alive connection was found
  closed before the request was written whole (agent/net/pool.py's ``stale``), a 429 or 503 that carries
  Retry-After (the server says it refused it for now), or a 4xx or 503 ``busy`` says is "busy"
  (the server refused it before acting on it). An ambiguous outcome (any other 5xx, a timeout or
  a broken connection after the request was sent, an answer cut short) raises
  ``AmbiguousWrite`` (an HttpError; ``response`` holds the 5xx answer when there was one):
  the caller reads back what it meant to change, and never sends it again blindly.

Behaviour of ``get``:

- Redirects (301/302/303/307/308) are followed, at most 5; with a pool, once: the requests
  after the first go where it led (a failure there forgets it and follows the URL again).
  The caller's headers go only to the URL's own origin, before and after a redirect.
- With a pool, a response read to its end leaves its connection open for the next request;
  a kept-alive connection that the server closed while idle is replaced, not counted as a
  failure (agent/net/pool.py).
- 5xx and 429 responses, connection errors and read timeouts are retried ``max_retries`` times
  with a short backoff (interruptible by ``cancel``). 4xx (other than 408/429) fail at once.
- A connection that drops or stalls (no byte for ``timeout`` seconds) mid-body is resumed with
  ``Range: bytes=<received>-`` (and ``If-Range`` with the ETag or Last-Modified when the server
  sent one, so a changed file is never spliced). A server that answers 200 to the Range request
  is read again from the start and the bytes already delivered are skipped.
- With ``opts.auth`` (a registry's token, agent/images/oci.py), a 401 from the URL's own origin,
  at the start or at a resume (the token expired during a long download), has the challenge
  answered once (``auth.renew``) and the request made again with the new headers; a second 401
  fails as any 4xx.
- A body that ends before its Content-Length (or before the total of its Content-Range) after
  all retries raises SourceFailed: a short download is never a success. A body without a length
  (connection-delimited) cannot be checked here; callers check a digest.
- Header values are never logged (they may carry credentials); the URL is logged without its
  query string or user info.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import logging
import os
import secrets
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agent import limits
from agent.deadlines import DeadlineWatch
from agent.errors import Cancelled, InvalidParameters, SourceFailed
from agent.net.connect import (
    TRANSPORT_ERRORS,
    PinnedConnection,
    close_quietly,
    connect,
    pinned,
    ssl_context,
    still_open,
    tls_refused,
)
from agent.net.exchange import (
    MAX_BODY,
    USER_AGENT,
    AmbiguousWrite,
    Authorization,
    BodyTooLarge,
    HttpError,
    HttpOptions,
    Response,
    read_body,
    request_headers,
)
from agent.net.pool import (
    IDEMPOTENT,
    MAX_REDIRECTS,
    REDIRECTS,
    BadRedirect,
    ConnectionPool,
    follow,
    stale,
)
from agent.net.urls import check_url, origin, redact, target

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _sleep(opts: HttpOptions, attempt: int) -> None:
    delay = min(opts.max_backoff, opts.backoff * (2 ** max(0, attempt - 1)))
    if opts.cancel is not None:
        if opts.cancel.wait(delay):
            raise Cancelled("download cancelled")
    else:
        time.sleep(delay)



class Download:
    """The body of a GET, read in order; resumes by Range when the connection drops."""

    def __init__(self, url: str, opts: HttpOptions, offset: int = 0, length: int | None = None,
                 pool: ConnectionPool | None = None) -> None:
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
        self._challenge = ""           # a 401's WWW-Authenticate from the URL's origin
        self._open(first=True)

    # -- connection ----------------------------------------------------------------------

    def _open(self, *, first: bool) -> None:
        """(Re)open the response at ``start + received``; retries transient failures, and
        renews ``opts.auth`` once when the URL's origin answers 401 (a token expired)."""
        renewed = False
        while True:
            self._check_cancel()
            try:
                self._request(first=first)
                return
            except HttpError as exc:
                auth = self.opts.auth
                if exc.status == 401 and self._challenge and auth is not None and not renewed:
                    renewed = True
                    if not auth.renew(self._challenge):
                        raise HttpError(f"{exc.message} (the authorization could not be renewed)",
                                        status=401) from exc
                    log.info("%s: HTTP 401 at byte %d: authorization renewed", redact(self.url),
                             self.start + self.received)
                    continue
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
        self._challenge = ""
        pool = self.pool
        home = origin(check_url(self.url))
        position = self.start + self.received
        extra: dict[str, str] = {}
        if position or self.length is not None:
            last = "" if self.length is None else str(self.start + self.length - 1)
            extra["Range"] = f"bytes={position}-{last}"
            if self._validator:
                extra["If-Range"] = self._validator

        def headers(parts: urllib.parse.SplitResult) -> dict[str, str]:
            return request_headers(self.opts, extra, callers=origin(parts) == home)

        def dial(parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
            return connect(parts, self.opts)

        try:
            conn, resp, final = follow(pool, self.url, "GET", headers, dial)
        except BadRedirect as exc:
            raise BadRedirect(f"{redact(self.url)}: {exc.message}", status=exc.status) from None
        except TRANSPORT_ERRORS as exc:
            raise HttpError(f"{redact(self.url)}: {type(exc).__name__}: {exc}") from exc
        self._conn, self._resp, self._parts = conn, resp, check_url(final)
        try:
            self._accept(resp, position, first=first)
        except BaseException:
            if pool is not None:
                pool.remember(self.url, self.url)  # the next attempt follows the redirect again
            raise

    def _accept(self, resp: http.client.HTTPResponse, position: int, *, first: bool) -> None:
        status = resp.status
        if status == 416 and self.total is not None and position >= self.total:
            return  # nothing left; read() returns b""
        if status not in (200, 206):
            home = origin(check_url(self.url))
            if status == 401 and self._parts is not None and origin(self._parts) == home:
                self._challenge = resp.getheader("WWW-Authenticate", "")
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
            except TRANSPORT_ERRORS as exc:
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
        if self.pool is not None and resp is not None and parts is not None:
            self.pool.release(origin(parts), conn, resp, whole=resp.isclosed() or resp.length == 0)
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
        pool: ConnectionPool | None = None) -> Download:
    """Open ``url`` for streaming from byte ``offset`` (only ``length`` bytes when given: a
    bounded Range request, for the data chunks of a sparse image), on a connection of ``pool``
    when given (see ConnectionPool); see the module docstring."""
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
    conn = connect(parts, opts)
    try:
        conn.request(
            "PUT",
            target(parts),
            body=body,  # type: ignore[arg-type]  # an iterator of bytes: http.client streams it
            headers=request_headers(opts, extra),
            encode_chunked=length is None,
        )
        resp = conn.getresponse()
        data = resp.read(1 << 20)
    except TRANSPORT_ERRORS as exc:
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

FRESH_SECONDS = 2.0   # a kept connection this recently used and still open takes a POST or PATCH


CANCEL_POLL = 0.25   # how often the watch looks at the cancel events of attempts in flight


class _Attempt:
    """One watched attempt: its connection, until when it may last, and why it was cut."""

    def __init__(self, conn: http.client.HTTPConnection, until: float,
                 cancel: threading.Event | None) -> None:
        self.conn, self.until, self.cancel = conn, until, cancel
        self.cut = ""                   # "", "cancel" or "time"
        self.over = False               # the attempt ended: its connection is not ours to cut
        self._lock = threading.Lock()

    def cut_short(self, why: str) -> None:
        with self._lock:
            if self.cut or self.over:
                return
            self.cut = why
            sock = self.conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    # The plain socket's shutdown, also under TLS: a blocked read returns at
                    # once, and the TLS object is left for the reader to fail on.
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def end(self) -> None:
        with self._lock:
            self.over = True


class _Watch:
    """Cuts attempts short at their time (agent/deadlines.py: one thread for the process, woken
    only for an earlier deadline) or on their cancel (looked at every CANCEL_POLL seconds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancellable: set[_Attempt] = set()
        self._deadlines: DeadlineWatch[_Attempt] = DeadlineWatch(
            "http-watch", self._due, tick=CANCEL_POLL, on_tick=self._cancels)

    @contextlib.contextmanager
    def attempt(self, conn: http.client.HTTPConnection, until: float,
                cancel: threading.Event | None) -> Iterator[_Attempt]:
        watched = _Attempt(conn, until, cancel)
        if cancel is not None:
            with self._lock:
                self._cancellable.add(watched)
            self._deadlines.start()
        if until != float("inf"):
            self._deadlines.set(watched, until)
        try:
            yield watched
        finally:
            watched.end()
            self._deadlines.clear(watched)
            with self._lock:
                self._cancellable.discard(watched)

    @staticmethod
    def _due(attempts: list[_Attempt]) -> None:
        for watched in attempts:
            watched.cut_short("time")

    def _cancels(self) -> None:
        with self._lock:
            cancelled = [w for w in self._cancellable if w.cancel is not None and w.cancel.is_set()]
        for watched in cancelled:
            watched.cut_short("cancel")


_WATCH = _Watch()


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
    connections: ConnectionPool | None = None,
) -> Response:
    """One request to a JSON API, retried by the rule of its method (see the module
    docstring: a write is never sent twice; an ambiguous outcome raises AmbiguousWrite); an
    answer's body longer than ``max_body`` raises BodyTooLarge (a HEAD's answer has no body:
    its Content-Length, the size of the GET's, is not read nor bounded).

    Returns the final Response whatever its status. ``deadline`` (a time.monotonic() value)
    bounds every wait. With ``connections``, a request goes over the kept-alive connection to
    the same origin when there is one (and leaves its own there): an idempotent one over any
    (one found stale is replaced at once, not counted as an attempt), a POST or PATCH only
    over one used in the last FRESH_SECONDS and still open (``ConnectionPool.take``'s
    ``fresh``).
    """
    import json

    opts = opts or HttpOptions()
    method = method.upper()
    write = method not in IDEMPOTENT
    parts = check_url(url)
    home = origin(parts)
    if json_body is not None and body is not None:
        raise InvalidParameters("request: give json_body or body, not both")
    extra: dict[str, str] = {"Accept": "application/json"}
    payload: bytes | None = body
    if json_body is not None:
        payload = json.dumps(json_body).encode()
        extra["Content-Type"] = "application/json"
    if headers:
        extra.update(headers)
    hdrs = request_headers(opts, extra)
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
        # A POST or PATCH goes over a kept connection only when it is fresh and still open: a
        # server that closed it meanwhile would leave it unknown whether it acted (never asked
        # twice), where a GET is simply sent again on a new connection.
        kept = connections.take(home, fresh=FRESH_SECONDS if write else None) \
            if connections is not None else None
        conn = kept or connect(parts, opts, timeout)
        if kept is not None and kept.sock is not None:
            kept.sock.settimeout(timeout)
        elif kept is None and connections is not None:
            connections.dialled()
        sent = written = answered = False
        retry_why = ""
        last: Response | None = None
        keep = False
        try:
            with _WATCH.attempt(conn, until, opts.cancel) as watched:
                if conn.sock is None:
                    conn.connect()
                sent = True
                conn.request(method, target(parts), body=payload, headers=hdrs)
                written = True
                resp = conn.getresponse()
                answered = True
                # A HEAD's answer has no body (RFC 9110 9.3.2): its Content-Length is the GET's;
                # http.client reads nothing of it (b"") and frees the connection.
                data = resp.read() if method == "HEAD" else read_body(resp, max_body, where)
                last = Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, attempt)
                keep = connections is not None and not resp.will_close
        except TRANSPORT_ERRORS as exc:
            # A write that went out whole may have been taken even when nothing of an answer
            # came (the BMC acted, then dropped the connection): never sent again.
            if not watched.cut and not answered and not (write and written) \
                    and stale(exc, reused=kept is not None, method=method):
                # A kept-alive connection the server had closed: the same attempt, afresh.
                log.debug("%s: kept-alive connection gone (%s); a new one", where, exc)
                attempt -= 1
                continue
            if watched.cut == "cancel":
                raise Cancelled(f"{where}: cancelled") from exc
            if watched.cut and deadline is not None and time.monotonic() >= deadline:
                raise (AmbiguousWrite if write and sent else HttpError)(
                    f"{where}: no complete answer before the deadline (attempt {attempt})",
                    attempts=attempt) from exc
            if watched.cut:
                exc = TimeoutError(f"no complete answer within {opts.total_timeout:g} s")
            if tls_refused(exc):
                raise HttpError(
                    f"{where}: the server's TLS certificate is not trusted: {exc}", tls="untrusted"
                ) from exc
            if sent and write:
                raise AmbiguousWrite(
                    f"{where}: {type(exc).__name__}: {exc} (after the request was sent; not repeated)",
                    attempts=attempt,
                ) from exc
            retry_why = f"{type(exc).__name__}: {exc}"
        finally:
            if keep and connections is not None:
                connections.give_back(home, conn)
            else:
                conn.close()
        if last is not None:
            log.debug("%s: HTTP %d (attempt %d)", where, last.status, attempt)
            retry_why = _retry_why(last, write, busy)
            if not retry_why and write and last.status >= 500:
                raise AmbiguousWrite(
                    f"{where}: HTTP {last.status} (the server may have taken it; not repeated)",
                    response=last, attempts=attempt)
            if not retry_why:
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


def _retry_why(answer: Response, write: bool, busy: Callable[[Response], bool] | None) -> str:
    """Why ``answer`` is asked for again ("" when it is the answer): for a write only what
    says the server refused it untaken (a 429 or 503 with Retry-After, a 4xx or 503 that is
    busy: iDRAC's SYS518 job queue answers 503 without Retry-After)."""
    if write:
        if answer.status in (429, 503) and "retry-after" in answer.headers:
            return f"HTTP {answer.status}, Retry-After"
        if (400 <= answer.status < 500 or answer.status == 503) and busy is not None and busy(answer):
            return f"HTTP {answer.status}, busy"
        return ""
    if answer.status in _RETRY_STATUS:
        return f"HTTP {answer.status}"
    if busy is not None and busy(answer):
        return f"HTTP {answer.status}, busy"
    return ""


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
    whatever its status; a transport failure raises HttpError (AmbiguousWrite once the
    connection was made: the server may have taken it), an answer longer than ``max_body``
    BodyTooLarge. No retry: the caller decides."""
    opts = opts or HttpOptions()
    check_url(url)
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

    return _post_stream(url, stream(), length, f"multipart/form-data; boundary={boundary}", opts, max_body)


def post_file(url: str, path: Path, opts: HttpOptions | None = None, *,
              content_type: str = "application/octet-stream", max_body: int = MAX_BODY) -> Response:
    """POST the file at ``path`` as the whole body (a Redfish HttpPushUri push), streamed in
    1 MiB chunks with its length; as ``post_multipart`` otherwise (no retry, AmbiguousWrite
    once the connection was made)."""
    opts = opts or HttpOptions()
    try:
        length = path.stat().st_size
    except OSError as exc:
        raise InvalidParameters(f"POST: cannot read {path}: {exc.strerror}") from exc

    def stream() -> Iterator[bytes]:
        with path.open("rb") as f:
            while data := f.read(1 << 20):
                if opts.cancel is not None and opts.cancel.is_set():
                    raise Cancelled("upload cancelled")
                yield data

    return _post_stream(url, stream(), length, content_type, opts, max_body)


def _post_stream(url: str, body: Iterator[bytes], length: int, content_type: str, opts: HttpOptions,
                 max_body: int) -> Response:
    """POST ``body`` (``length`` bytes) once: post_multipart's and post_file's one transport."""
    to = check_url(url)
    hdrs = request_headers(opts, {
        "Content-Type": content_type,
        "Content-Length": str(length),
        "Accept": "application/json",
    })
    where = f"POST {redact(url)}"
    conn = connect(to, opts)
    sent = False
    try:
        conn.connect()
        sent = True
        conn.request("POST", target(to), body=body, headers=hdrs)
        resp = conn.getresponse()
        data = read_body(resp, max_body, where)
    except TRANSPORT_ERRORS as exc:
        tls = "untrusted" if tls_refused(exc) else ""
        if sent and not tls:
            raise AmbiguousWrite(f"{where}: {type(exc).__name__}: {exc} (after the request was "
                                 "sent; not repeated)") from exc
        raise HttpError(f"{where}: {type(exc).__name__}: {exc}", tls=tls) from exc
    finally:
        conn.close()
    log.debug("%s: HTTP %d, %d bytes sent", where, resp.status, length)
    return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)


__all__ = [
    "IDEMPOTENT", "MAX_BODY", "MAX_REDIRECTS", "REDIRECTS", "USER_AGENT", "AmbiguousWrite",
    "Authorization", "BadRedirect", "BodyTooLarge", "ConnectionPool", "Download", "HttpError",
    "HttpOptions", "Part", "PinnedConnection", "Response", "check_url", "close_quietly", "connect",
    "get", "origin", "pinned", "post_file", "post_multipart", "put", "redact", "request", "ssl_context",
    "still_open",
]
