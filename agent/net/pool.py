"""Kept-alive connections, and the one way a request goes out over them: the pool keyed by
(scope, origin) with its redirect memo, the stale-connection rule, and the redirect loop.

Every outbound HTTP exchange of the agent goes through here: a deploy's Range requests (one
pool for the job, one connection to its origin), a BMC client's requests (``request`` in
agent/net/http.py: one pool a BMC) and the site's upstream side (one pool for the site, a
route's id its scope: only a route's own requests reuse what was dialled, to the addresses its
policy checked, for it).

    pool = ConnectionPool(per_scope=4, total=64, idle_seconds=30)
    conn, resp, final = follow(pool, url, "GET", headers_for, dial, scope=route_id)
    ...read resp...
    pool.release(origin(final), conn, resp, whole=resp.isclosed(), scope=route_id)

The rules, each written once:

- A scope's connection to an origin is taken by one request and given back when its answer
  was read to its end and the server keeps it open. Bounded: ``per_scope`` idle connections a
  (scope, origin) and ``total`` in all (the least recently used closed first), each closed
  after ``idle_seconds`` unused (``sweep``; None: kept until the pool closes).
- Stale: a kept-alive connection the server closed while it sat idle fails its next request
  at once (reset, broken pipe, or closed with no byte of an answer: RemoteDisconnected; for a
  request that may be repeated also a garbled status line, BadStatusLine). It is replaced
  by a new one, once, and that is not counted as a failure. A request that is not idempotent
  is replaced only when it failed before it was written whole (``request``): once sent, a lost
  answer may mean the server acted, so it is ambiguous; ``request`` takes a kept connection for
  one only when it was used a moment ago and the server has not closed it.
- Redirects (301/302/303/307/308): followed, at most MAX_REDIRECTS; with ``same_origin`` only
  to the URL's own scheme, host and port. Where a URL led is remembered per scope, and its next
  request goes there at once; a failure there (no answer, or an answer of 400 and more) forgets
  it and follows the URL itself again, at once.
"""

from __future__ import annotations

import collections
import http.client
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable

from agent.errors import AgentError
from agent.net.connect import TRANSPORT_ERRORS, close_quietly, still_open
from agent.net.exchange import HttpError
from agent.net.urls import Origin, check_url, origin, target

REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

# A kept connection the server closed while idle: nothing of an answer came (over TLS, the
# closed connection's EOF).
_UNANSWERED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
               ConnectionAbortedError, ssl.SSLEOFError, ssl.SSLZeroReturnError)

Dial = Callable[[urllib.parse.SplitResult], http.client.HTTPConnection]


def stale(exc: BaseException, *, reused: bool, method: str) -> bool:
    """Whether ``exc``, raised by a request of ``method`` on a connection that was ``reused``
    (kept alive), says the server had closed it while it was idle: then the request goes again
    on a new one, not counted as a failure. A new connection is never stale."""
    if not reused:
        return False
    if method.upper() in IDEMPOTENT:
        return isinstance(exc, (*_UNANSWERED, http.client.BadStatusLine))
    return isinstance(exc, _UNANSWERED)


class BadRedirect(HttpError):
    """A redirect that is not followed: no usable Location, another origin where only the
    URL's own is allowed, or too many. The message says which, without the URL (the caller
    says whose)."""


class ConnectionPool:
    """Kept-alive connections by (scope, origin), and each scope's redirects; see the module
    docstring. ``opened`` counts the connections made through it (for tests and benches)."""

    def __init__(self, *, per_scope: int = 1, total: int = 64,
                 idle_seconds: float | None = None) -> None:
        self.per_scope = per_scope
        self.total = total
        self.idle_seconds = idle_seconds
        self.opened = 0
        self._idle: collections.OrderedDict[tuple[str, Origin],
                                            list[tuple[float, http.client.HTTPConnection]]] = \
            collections.OrderedDict()
        self._count = 0
        self._redirects: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def take(self, home: Origin, scope: str = "", *, fresh: float | None = None
             ) -> http.client.HTTPConnection | None:
        """The scope's most recently used idle connection to ``home``, or None (the caller
        makes one). With ``fresh``, only one given back at most that many seconds ago and that
        the server has not closed meanwhile (nothing to read on it: no FIN, no stray bytes);
        else it is closed."""
        closing: list[http.client.HTTPConnection] = []
        conn = None
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get((scope, home))
            while idle:
                since, candidate = idle.pop()
                self._count -= 1
                if self.idle_seconds is None or now - since < self.idle_seconds:
                    conn = candidate
                    break
                closing.append(candidate)
            if idle is not None and not idle:
                del self._idle[(scope, home)]
        if conn is not None and fresh is not None and (now - since > fresh or not still_open(conn)):
            closing.append(conn)
            conn = None
        for old in closing:
            close_quietly(old)
        return conn

    def give_back(self, home: Origin, conn: http.client.HTTPConnection, scope: str = "") -> None:
        """A connection to ``home`` whose last answer was read to its end, for the scope's
        next request."""
        closing: list[http.client.HTTPConnection] = []
        key = (scope, home)
        with self._lock:
            idle = self._idle.setdefault(key, [])
            self._idle.move_to_end(key)
            idle.append((time.monotonic(), conn))
            self._count += 1
            if len(idle) > self.per_scope:
                closing.append(idle.pop(0)[1])
                self._count -= 1
            while self._count > self.total:
                oldest_key, oldest = next(iter(self._idle.items()))
                closing.append(oldest.pop(0)[1])
                self._count -= 1
                if not oldest:
                    del self._idle[oldest_key]
        for old in closing:
            close_quietly(old)

    def release(self, home: Origin, conn: http.client.HTTPConnection,
                resp: http.client.HTTPResponse | None, *, whole: bool, scope: str = "") -> None:
        """The request on ``conn`` is over: kept for the scope's next one when its answer was
        read to the end (``whole``) and the server keeps the connection open; closed otherwise."""
        if resp is None or not whole or resp.will_close:
            close_quietly(conn)
            return
        resp.close()             # a body read from the socket itself leaves http.client's count
        self.give_back(home, conn, scope)

    def dialled(self) -> None:
        """One more connection made for the pool."""
        with self._lock:
            self.opened += 1

    def resolved(self, url: str, scope: str = "") -> str:
        """Where ``url`` led the scope's last request (``url`` itself when nowhere else)."""
        with self._lock:
            return self._redirects.get((scope, url), url)

    def remember(self, url: str, final: str, scope: str = "") -> None:
        with self._lock:
            if final == url:
                self._redirects.pop((scope, url), None)
            else:
                self._redirects[(scope, url)] = final

    def forget(self, scope: str) -> None:
        """A scope ended (a route): its idle connections closed, its redirects forgotten."""
        with self._lock:
            for key in [key for key in self._redirects if key[0] == scope]:
                del self._redirects[key]
            keys = [key for key in self._idle if key[0] == scope]
            closing = [conn for key in keys for _since, conn in self._idle.pop(key)]
            self._count -= len(closing)
        for conn in closing:
            close_quietly(conn)

    def idle(self) -> int:
        """How many connections are kept idle now."""
        with self._lock:
            return self._count

    def sweep(self) -> int:
        """Close the connections idle for ``idle_seconds`` (a timer's); how many."""
        if self.idle_seconds is None:
            return 0
        limit = time.monotonic() - self.idle_seconds
        closing: list[http.client.HTTPConnection] = []
        with self._lock:
            for key in list(self._idle):
                idle = self._idle[key]
                closing += [conn for since, conn in idle if since <= limit]
                idle[:] = [(since, conn) for since, conn in idle if since > limit]
                if not idle:
                    del self._idle[key]
            self._count -= len(closing)
        for conn in closing:
            close_quietly(conn)
        return len(closing)

    def close(self) -> None:
        with self._lock:
            closing = [conn for idle in self._idle.values() for _since, conn in idle]
            self._idle.clear()
            self._redirects.clear()
            self._count = 0
        for conn in closing:
            close_quietly(conn)

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send(pool: ConnectionPool | None, parts: urllib.parse.SplitResult, method: str,
         headers: dict[str, str], dial: Dial, *, scope: str = "",
         usable: Callable[[http.client.HTTPConnection], bool] | None = None,
         ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """``method`` to ``parts`` (no body), on the scope's idle connection to its origin when
    there is one (and ``usable`` says it still may be used), else on a new one from ``dial``;
    a kept one found stale is replaced once. Raises what the connection raised (closed)."""
    conn = pool.take(origin(parts), scope) if pool is not None else None
    if conn is not None and usable is not None and not usable(conn):
        close_quietly(conn)       # e.g. the policy changed since it was dialled: dial (and refuse) anew
        conn = None
    while True:
        reused = conn is not None
        if conn is None:
            conn = dial(parts)
            if pool is not None:
                pool.dialled()
        try:
            conn.request(method, target(parts), headers=headers)
            return conn, conn.getresponse()
        except TRANSPORT_ERRORS as exc:
            close_quietly(conn)
            if stale(exc, reused=reused, method=method):
                conn = None
                continue
            raise


def redirect_location(url: str, resp: http.client.HTTPResponse) -> str:
    """Where the redirect ``resp`` (to a request for ``url``) points, resolved against ``url``;
    BadRedirect when it says nowhere. The caller checks the new URL like any other."""
    location = resp.getheader("Location", "")
    if not location:
        raise BadRedirect(f"sent a redirect without Location (HTTP {resp.status} without a Location header)",
                          status=resp.status)
    try:
        return urllib.parse.urljoin(url, location)
    except ValueError:
        raise BadRedirect(f"answered {resp.status} with an unusable Location",
                          status=resp.status) from None


def drained(resp: http.client.HTTPResponse, limit: int = 64 * 1024) -> bool:
    """Read a small answer's body (a redirect's) to its end; False when it is not small."""
    try:
        resp.read(limit)
    except TRANSPORT_ERRORS:
        return False
    return resp.isclosed()


def follow(
    pool: ConnectionPool | None, url: str, method: str,
    headers: Callable[[urllib.parse.SplitResult], dict[str, str]], dial: Dial, *,
    scope: str = "", same_origin: bool = False,
    usable: Callable[[http.client.HTTPConnection], bool] | None = None, plain_http: bool = True,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
    """``method`` to ``url`` through its redirects (see the module docstring): the connection,
    the answer that is not a redirect, and the URL that gave it. ``headers(parts)`` are the
    headers for each hop; ``plain_http`` False refuses a hop from https:// to http://.
    Raises BadRedirect, what ``dial`` raises, or the transport's error."""
    first = pool.resolved(url, scope) if pool is not None else url
    if pool is not None and first != url:
        try:
            conn, resp, final = _hops(pool, url, first, method, headers, dial, scope, same_origin, usable,
                                      plain_http)
        except (AgentError, *TRANSPORT_ERRORS):
            pass
        else:
            if resp.status < 400:
                pool.remember(url, final, scope)
                return conn, resp, final
            close_quietly(conn)
        pool.remember(url, url, scope)       # where it led failed: follow the URL itself again
    conn, resp, final = _hops(pool, url, url, method, headers, dial, scope, same_origin, usable, plain_http)
    if pool is not None:
        pool.remember(url, final, scope)
    return conn, resp, final


def _hops(
    pool: ConnectionPool | None, url: str, start: str, method: str,
    headers: Callable[[urllib.parse.SplitResult], dict[str, str]], dial: Dial, scope: str,
    same_origin: bool, usable: Callable[[http.client.HTTPConnection], bool] | None, plain_http: bool = True,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
    home = origin(url)
    at = start
    secure = check_url(url).scheme == "https"
    for _hop in range(MAX_REDIRECTS + 1):
        try:
            parts = check_url(at)
        except AgentError as exc:        # only a redirect's Location can be bad here
            raise BadRedirect(f"redirected to an unusable URL: {exc.message}", status=310) from None
        if same_origin and origin(parts) != home:
            raise BadRedirect(f"redirected to another host ({parts.hostname}); not followed", status=310)
        if secure and parts.scheme != "https" and not plain_http:
            raise BadRedirect(f"redirected from https to plain http ({parts.hostname}): refused, the"
                              " fetch would be seen on the wire", status=310)
        conn, resp = send(pool, parts, method, headers(parts), dial, scope=scope, usable=usable)
        if resp.status not in REDIRECTS:
            return conn, resp, at
        try:
            following = redirect_location(at, resp)
        except BadRedirect:
            close_quietly(conn)
            raise
        whole = drained(resp)      # a redirect's short body, read: its connection is reused
        if pool is None:
            close_quietly(conn)
        else:
            pool.release(origin(parts), conn, resp, whole=whole, scope=scope)
        at = following
    raise BadRedirect(f"more than {MAX_REDIRECTS} redirects", status=310)


