"""A GET read as a stream: resumed by Range when the connection drops, on a pool's kept-alive
connection when given (agent/net/http.py is the front: ``http.get``, ``http.Download``).

Behaviour of ``get``:

- Redirects (301/302/303/307/308) are followed, at most 5; with a pool, once: the requests
  after the first go where it led (a failure there forgets it and follows the URL again).
  The caller's headers go only to the URL's own origin, before and after a redirect.
- With a pool, a response read to its end leaves its connection open for the next request;
  a kept-alive connection that the server closed while idle is replaced, not counted as a
  failure (agent/net/pool.py).
- 5xx and 429 responses, connection errors and read timeouts are retried ``max_retries`` times
  with a short backoff (interruptible by ``cancel``), or after the wait a Retry-After asks for
  when longer, up to ``opts.deadline`` (exchange.retry_wait; past it: refused at once). 4xx
  (other than 408/429) fail at once.
- A redirect from https:// to http:// is refused when ``opts.plain_http_redirect`` is False (a
  registry's blobs, agent/images/oci.py).
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

import dataclasses
import http.client
import logging
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from agent import limits
from agent.atomicfile import replacing
from agent.errors import Cancelled, SourceFailed
from agent.net.connect import TRANSPORT_ERRORS, connect
from agent.net.exchange import RETRY_STATUS, HttpError, HttpOptions, request_headers, retry_after, retry_wait
from agent.net.pool import BadRedirect, ConnectionPool, follow
from agent.net.urls import check_url, origin, redact

log = logging.getLogger(__name__)


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
        # Failures to open and resumes alike count against max_retries, waits between them
        # growing from opts.backoff.
        self._tries = opts.retries.start(cancel=opts.cancel)
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
                if exc.status and exc.status not in RETRY_STATUS:
                    raise
                delay = self._tries.next()
                if delay is None:
                    raise HttpError(
                        f"{redact(self.url)}: giving up after {self._tries.failures} attempts:"
                        f" {exc.message}", status=exc.status,
                    ) from exc
                wait = retry_wait(self.opts, exc.retry_after, delay, where=redact(self.url))
                if wait is None:   # a Retry-After past the deadline: not retried before it
                    raise HttpError(f"{exc.message} (the server asks to retry after"
                                    f" {exc.retry_after:.0f} s, past the deadline)",
                                    status=exc.status) from exc
                log.warning("%s: %s; retrying in %.1f s", redact(self.url), exc.message, wait)
                self._wait(wait)

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
            conn, resp, final = follow(pool, self.url, "GET", headers, dial,
                                       plain_http=self.opts.plain_http_redirect)
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
                status=status, retry_after=retry_after(resp.getheader("Retry-After")),
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

    def _wait(self, delay: float) -> None:
        if not self._tries.sleep(delay):
            raise Cancelled("download cancelled")

    def _resume(self, why: str) -> None:
        delay = self._tries.next()
        if delay is None:
            self.close()
            raise SourceFailed(
                f"{redact(self.url)}: download failed at byte {self.start + self.received}"
                f" of {self.total if self.total is not None else '?'} after"
                f" {self.resumes} resumes: {why}",
                received=self.start + self.received,
            )
        log.warning("%s: %s; resuming at byte %d", redact(self.url), why, self.start + self.received)
        self.resumes += 1
        self._wait(delay)
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
    mode 0644, renamed into place (agent/atomicfile.py; ``cancel`` stops it)."""
    opts = dataclasses.replace(opts or HttpOptions(), cancel=cancel)
    with get(url, opts) as body, replacing(path, 0o644) as f:
        for chunk in body.iter_chunks(1 << 20):
            f.write(chunk)
    return path

