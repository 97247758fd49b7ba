"""One HTTP exchange's terms: the options it is made with, the answer it gives, the headers it
carries, and what it fails with.

``AmbiguousWrite`` is the one a caller of a write must know: a POST or PATCH (any request that
is not idempotent) whose fate is unknown. The server may have taken it: it answered 5xx, the
connection broke or the time ran out after the request was sent, or the answer was cut. It is
never sent again by the client (agent/net/http.py's ``request``); the caller reads back what
it meant to change and decides. ``response`` is the answer when one came (a BMC's 5xx and its
message), None when none did.
"""

from __future__ import annotations

import email.utils
import http.client
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.errors import InvalidParameters, SourceFailed
from agent.retry import Backoff

USER_AGENT = "bettercompute-agent"
MAX_BODY = 4 << 20  # what request() and post_multipart() read of an answer at most: a JSON API's

# The answers that say "ask again later": get() and request() retry them (a write only as
# agent/net/http.py's request says).
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class Authorization(Protocol):
    """What a job's requests to one origin carry, read at each request (a registry's Bearer
    token: agent/images/oci.py's ``Authorizer``), and renewed from the server's 401 challenge
    (its WWW-Authenticate) when it expired: ``renew`` answers whether it was."""

    def headers(self) -> Mapping[str, str]: ...

    def renew(self, challenge: str) -> bool: ...


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
    # Headers made at each request and renewed on a 401 (get(): once per 401, then asked
    # again); like ``headers``, sent to the URL's own origin only.
    auth: Authorization | None = None
    # The job's end (a time.monotonic() value, a deploy's deadline): a 429 or 503 whose
    # Retry-After asks for a wait is waited for up to it (``retry_wait``), and refused at once
    # when the wait would pass it. None: a Retry-After up to RETRY_AFTER_CAP.
    deadline: float | None = None
    # Told of each wait a server asked for, in words (a deploy's progress says it).
    on_wait: Callable[[str], None] | None = None
    # get(): a redirect from an https:// URL to a plain http:// one is followed (False: refused,
    # a BadRedirect; a registry's blobs unless the operator allowed it, agent/images/oci.py).
    plain_http_redirect: bool = True

    @property
    def retries(self) -> Backoff:
        """The waits between a request's tries: ``max_retries`` after the first, from
        ``backoff`` doubling up to ``max_backoff`` (agent/retry.py)."""
        return Backoff(first=self.backoff, cap=self.max_backoff, tries=max(self.max_retries, 0) + 1)


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]             # names in lower case
    body: bytes
    attempts: int = 1                   # requests made, retries included


class HttpError(SourceFailed):
    """A non-success HTTP status (``status``) or a transport failure (``status`` 0);
    ``retry_after``: the seconds its answer's Retry-After asked for, if it said."""

    def __init__(self, message: str, *, status: int = 0, retry_after: float | None = None,
                 **details: Any) -> None:
        super().__init__(message, status=status, **details)
        self.status = status
        self.retry_after = retry_after


RETRY_AFTER_CAP = 60.0   # seconds of Retry-After waited for by a request without a deadline


def retry_after(value: str | None) -> float | None:
    """The seconds a Retry-After header asks for (delta-seconds, or an HTTP-date from now);
    None when there is none or it cannot be read."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(min(int(value[:12]), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def retry_wait(opts: HttpOptions, asked: float | None, delay: float, deadline: float | None = None,
               *, where: str = "") -> float | None:
    """The wait before the next try after an answer whose Retry-After asked for ``asked``
    seconds: the backoff's ``delay``, or ``asked`` when longer (told to ``opts.on_wait``);
    None when that wait would reach the earlier of ``deadline`` and ``opts.deadline`` (without
    either: RETRY_AFTER_CAP): the caller gives up now rather than retry too early."""
    if asked is None or asked <= delay:
        return delay
    ends = [d for d in (deadline, opts.deadline) if d is not None]
    room = min(ends) - time.monotonic() if ends else RETRY_AFTER_CAP
    if asked >= room:
        return None
    if opts.on_wait is not None:
        opts.on_wait(f"{where + ': ' if where else ''}the server asks to wait {asked:.0f} s"
                     f" (Retry-After); waiting, {room:.0f} s left before the deadline")
    return asked


class BodyTooLarge(HttpError):
    """An answer's body longer than the caller takes (``request``'s and ``post_multipart``'s
    ``max_body``): refused, not read, not retried."""


class AmbiguousWrite(HttpError):
    """A request that is not idempotent may or may not have been taken: not sent again; read
    back instead (see the module docstring). ``response``: the answer, when one came."""

    def __init__(self, message: str, *, response: Response | None = None, **details: Any) -> None:
        super().__init__(message, status=response.status if response is not None else 0,
                         ambiguous="write", **details)
        self.response = response


def read_body(resp: http.client.HTTPResponse, max_body: int, where: str) -> bytes:
    """The body of ``resp``, at most ``max_body`` bytes; BodyTooLarge (what came is dropped)
    when it announces or carries more. A body sent ``Content-Encoding: gzip`` (asked for, or
    not: HPE iLO 5 compresses parts of its tree whatever the request says,
    DMTF/Redfish-Mockup-Creator#58) is decoded, to at most ``max_body`` bytes too; another
    coding is refused (HttpError)."""
    length = resp.getheader("Content-Length", "")
    if length.isdigit() and int(length) > max_body:
        raise BodyTooLarge(f"{where}: the answer is {int(length)} bytes, more than the "
                           f"{max_body} taken", status=resp.status)
    data = resp.read(max_body + 1)
    if len(data) > max_body:
        raise BodyTooLarge(f"{where}: the answer is more than the {max_body} bytes taken",
                           status=resp.status)
    coding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
    if coding == "identity" or not data:
        return data
    if coding not in ("gzip", "x-gzip"):
        raise HttpError(f"{where}: the answer's Content-Encoding {coding[:40]!r} is not one this "
                        "client reads (gzip)", status=resp.status)
    inflate = zlib.decompressobj(wbits=31)
    try:
        plain = inflate.decompress(data, max_body + 1)
    except zlib.error as exc:
        raise HttpError(f"{where}: the answer's gzip body does not decode: {exc}",
                        status=resp.status) from None
    if len(plain) > max_body:
        raise BodyTooLarge(f"{where}: the answer decodes to more than the {max_body} bytes taken",
                           status=resp.status)
    if not inflate.eof:
        raise HttpError(f"{where}: the answer's gzip body is cut short", status=resp.status)
    return plain


def request_headers(opts: HttpOptions, extra: Mapping[str, str] | None = None, *,
                    callers: bool = True) -> dict[str, str]:
    """A request's headers: ours, the caller's (``opts.headers`` and ``opts.auth``'s, unless
    ``callers`` is False: a redirect to another origin gets none of them, as curl does), then
    ``extra``."""
    hdrs = {"User-Agent": USER_AGENT}
    if callers:
        hdrs.update(opts.headers)
        if opts.auth is not None:
            hdrs.update(opts.auth.headers())
    if extra:
        hdrs.update(extra)
    for name, value in hdrs.items():
        if any(c in name + value for c in "\r\n"):
            raise InvalidParameters(f"HTTP header {name!r} contains a line break")
    return hdrs
