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
pool.py (ConnectionPool, the stale-connection rule, the redirect loop), download.py (``get``:
the streaming GET and its resumes), upload.py (``put``, ``post_multipart``, ``post_file``: bodies
sent once), and this module (``request``: a JSON API's request and its retries); the attempts'
deadlines are watched by agent/deadlines.py.

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

Writes are never sent twice. A retried answer's Retry-After is waited for when it asks for
more than the backoff, up to ``deadline`` or ``opts.deadline`` (exchange.retry_wait: the wait
told to ``opts.on_wait``; one past them ends the retries at once). ``request`` retries by the
method:

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

Behaviour of ``get``: agent/net/download.py.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from agent.deadlines import DeadlineWatch
from agent.errors import Cancelled, InvalidParameters
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
from agent.net.download import Download, download_to, get
from agent.net.exchange import (
    MAX_BODY,
    RETRY_STATUS,
    USER_AGENT,
    AmbiguousWrite,
    Authorization,
    BodyTooLarge,
    HttpError,
    HttpOptions,
    Response,
    read_body,
    request_headers,
    retry_after,
    retry_wait,
)
from agent.net.pool import IDEMPOTENT, MAX_REDIRECTS, REDIRECTS, BadRedirect, ConnectionPool, stale
from agent.net.upload import Part, post_file, post_multipart, put
from agent.net.urls import check_url, origin, redact, target

log = logging.getLogger(__name__)


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
    tries = opts.retries.start(cancel=opts.cancel, deadline=deadline)
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
        delay = tries.next()
        if delay is not None and last is not None:
            # A Retry-After is waited for, up to the deadline (exchange.retry_wait); asked past
            # it, the answer is the last one.
            delay = retry_wait(opts, retry_after(last.headers.get("retry-after")), delay, deadline,
                               where=where)
        if delay is None:
            if last is not None:
                return last
            raise HttpError(
                f"{where}: giving up after {attempt} attempts"
                + (" (deadline)" if tries.spent == "deadline" else "") + f": {retry_why}",
                attempts=attempt,
            )
        log.warning("%s: %s; retrying in %.1f s", where, retry_why, delay)
        if not tries.sleep(delay):
            raise Cancelled(f"{where}: cancelled")


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
    if answer.status in RETRY_STATUS:
        return f"HTTP {answer.status}"
    if busy is not None and busy(answer):
        return f"HTTP {answer.status}, busy"
    return ""


__all__ = [
    "IDEMPOTENT", "MAX_BODY", "MAX_REDIRECTS", "REDIRECTS", "USER_AGENT", "AmbiguousWrite",
    "Authorization", "BadRedirect", "BodyTooLarge", "ConnectionPool", "Download", "HttpError",
    "HttpOptions", "Part", "PinnedConnection", "Response", "check_url", "close_quietly", "connect",
    "download_to", "get", "origin", "pinned", "post_file", "post_multipart", "put", "redact", "request",
    "retry_after",
    "ssl_context", "still_open",
]
