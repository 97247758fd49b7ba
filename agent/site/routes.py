"""Proxy routes (site.httpProxy): a scoped way for one node's ramdisk to reach one upstream URL.

A route is a random, unguessable path on the site's HTTP service (``/r/<token>``, 256 bits)
that stands for exactly one upstream URL. It lives ``ttl_seconds``, carries only its
``allowed_methods`` (GET and HEAD; GET and HEAD by default), delivers at most ``max_bytes`` of
bodies in all (0: no byte limit), and reaches only its upstream: no other path or query is
accepted, and a redirect is followed only on the same scheme, host and port (a redirect to
another host is refused, never followed). It is not an open proxy.

The bytes are streamed (``agent/site/web.py``): nothing is held in memory beyond one buffer,
nothing is written to disk. Range and If-Range are passed through, so a download resumes
through a route. Every request is counted and logged. The routes are state on disk
(``routes/<id>.json``, mode 0600: the token is a capability) and reconciled at start, so a
restart of the daemon keeps them (the bytes used are saved after each request).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import http.client
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent import http as agent_http
from agent.atomicfile import write_atomic
from agent.errors import InvalidParameters
from agent.proto import site_pb2
from agent.site.pxe import parse_node_id, parse_ttl

log = logging.getLogger(__name__)

ROUTE_PREFIX = "/r/"
MAX_REDIRECTS = 5


class Method(enum.StrEnum):
    GET = "GET"
    HEAD = "HEAD"


DEFAULT_METHODS = frozenset({Method.GET, Method.HEAD})


@dataclass(frozen=True)
class RouteRequest:
    """A validated site.httpProxy payload."""

    node_id: str
    upstream_url: str
    methods: frozenset[Method]
    ttl_seconds: int
    max_bytes: int

    @classmethod
    def from_proto(cls, msg: site_pb2.HttpProxyRequest) -> RouteRequest:
        node_id = parse_node_id(msg.node_id)
        agent_http.check_url(msg.upstream_url)
        methods: set[Method] = set()
        for name in msg.allowed_methods:
            try:
                methods.add(Method(name.strip().upper()))
            except ValueError:
                raise InvalidParameters(
                    f"allowed_methods: {name[:20]!r} is not carried by a route; "
                    f"one of {', '.join(m.value for m in Method)}"
                ) from None
        return cls(node_id, msg.upstream_url, frozenset(methods) or DEFAULT_METHODS,
                   parse_ttl(msg.ttl_seconds), msg.max_bytes)


def route_id(token: str) -> str:
    """What the logs and file names say of a route: a digest of its token, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclass
class Route:
    token: str
    node_id: str
    upstream_url: str
    methods: frozenset[Method]
    expires_at: float
    max_bytes: int                       # 0: no limit
    bytes_used: int = 0                  # bodies delivered or reserved for a response
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def id(self) -> str:
        return route_id(self.token)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at

    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes of the budget; False (nothing taken) when they do not fit."""
        with self._lock:
            if self.max_bytes and self.bytes_used + n > self.max_bytes:
                return False
            self.bytes_used += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.bytes_used = max(0, self.bytes_used - n)

    def count_request(self) -> int:
        with self._lock:
            self.requests += 1
            return self.requests

    def to_json(self) -> str:
        with self._lock:
            data = {"token": self.token, "node_id": self.node_id,
                    "upstream_url": self.upstream_url, "methods": sorted(self.methods),
                    "expires_at": self.expires_at, "max_bytes": self.max_bytes,
                    "bytes_used": self.bytes_used, "requests": self.requests}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Route:
        data = json.loads(text)
        data["methods"] = frozenset(Method(m) for m in data["methods"])
        agent_http.check_url(data["upstream_url"])
        return cls(**data)


class RouteTable:
    """The live routes, by token; state on disk under ``root``."""

    def __init__(self, root: Path, base_url: str) -> None:
        self.root = root
        self.base_url = base_url.rstrip("/")
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}

    def reconcile(self) -> int:
        """Load the routes on disk; drop the expired and unreadable. Returns how many live."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        now = time.time()
        with self._lock:
            self._routes.clear()
            for path in sorted(self.root.iterdir()):
                try:
                    route = Route.from_json(path.read_text())
                    ok = path.name == f"{route.id}.json" and not route.expired(now)
                except (OSError, ValueError, TypeError, KeyError, InvalidParameters):
                    ok = False
                    route = None
                if not ok or route is None:
                    path.unlink(missing_ok=True)
                    continue
                self._routes[route.token] = route
            return len(self._routes)

    def add(self, req: RouteRequest) -> tuple[Route, str]:
        """A new route for ``req``; returns it and its proxy URL."""
        token = secrets.token_urlsafe(32)
        route = Route(token=token, node_id=req.node_id, upstream_url=req.upstream_url,
                      methods=req.methods, expires_at=time.time() + req.ttl_seconds,
                      max_bytes=req.max_bytes)
        self._save(route)
        with self._lock:
            self._routes[token] = route
        log.info("route %s for node %s to %s: %s, %ds, %s", route.id, route.node_id,
                 agent_http.redact(route.upstream_url), "+".join(sorted(route.methods)),
                 req.ttl_seconds, f"at most {route.max_bytes} bytes" if route.max_bytes
                 else "no byte limit")
        return route, self.url(route)

    def url(self, route: Route) -> str:
        return f"{self.base_url}{ROUTE_PREFIX}{route.token}"

    def lookup(self, token: str) -> Route | None:
        """The route of ``token``, expired or not; None when there is none."""
        with self._lock:
            return self._routes.get(token)

    def expire(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self._lock:
            gone = [r for r in self._routes.values() if r.expired(now)]
            for route in gone:
                del self._routes[route.token]
        for route in gone:
            (self.root / f"{route.id}.json").unlink(missing_ok=True)
            log.info("route %s for node %s expired after %d requests, %d bytes", route.id,
                     route.node_id, route.requests, route.bytes_used)
        return len(gone)

    def remove_node(self, node_id: str) -> list[str]:
        with self._lock:
            gone = [r for r in self._routes.values() if r.node_id == node_id]
            for route in gone:
                del self._routes[route.token]
        for route in gone:
            (self.root / f"{route.id}.json").unlink(missing_ok=True)
        return [route.id for route in gone]

    def save(self, route: Route) -> None:
        with self._lock:
            live = self._routes.get(route.token) is route
        if live:
            self._save(route)

    def _save(self, route: Route) -> None:
        write_atomic(self.root / f"{route.id}.json", route.to_json().encode(), 0o600)


# -- the upstream side -------------------------------------------------------------------

PASS_REQUEST_HEADERS = ("Range", "If-Range", "If-None-Match", "If-Modified-Since", "Accept")
PASS_RESPONSE_HEADERS = ("Content-Type", "Content-Range", "Accept-Ranges", "ETag",
                         "Last-Modified", "Cache-Control", "Content-Encoding")


class UpstreamError(Exception):
    """The upstream could not be asked (``status`` is what the client gets: 502 or 504)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


def open_upstream(
    route: Route, method: str, headers: dict[str, str], ssl_options: agent_http.HttpOptions,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send ``method`` to the route's upstream; follow redirects on the same origin only."""
    url = route.upstream_url
    home = agent_http.origin(url)
    for _hop in range(MAX_REDIRECTS + 1):
        parts = agent_http.check_url(url)
        if agent_http.origin(parts) != home:
            raise UpstreamError(
                f"upstream redirected to another host ({parts.hostname}); not followed")
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=ssl_options.timeout,
                context=agent_http.ssl_context(ssl_options.ca_pem, ssl_options.ca_file))
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                              timeout=ssl_options.timeout)
        try:
            conn.request(method, target, headers={**headers, "User-Agent": "bettercompute-site"})
            resp = conn.getresponse()
        except TimeoutError as exc:
            conn.close()
            raise UpstreamError(f"upstream timed out: {exc}", 504) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise UpstreamError(f"upstream failed: {type(exc).__name__}: {exc}") from exc
        if resp.status in agent_http.REDIRECTS:
            conn.close()
            try:
                url = agent_http.redirect_location(url, resp)
            except agent_http.HttpError:
                raise UpstreamError(f"upstream answered {resp.status} without a Location") from None
            continue
        return conn, resp
    raise UpstreamError(f"upstream redirected more than {MAX_REDIRECTS} times")


def close_quietly(conn: http.client.HTTPConnection) -> None:
    with contextlib.suppress(OSError):
        conn.close()
