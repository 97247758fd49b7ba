"""Proxy routes (site.httpProxy): a scoped way for one node's ramdisk to reach one upstream URL.

A route is a random, unguessable path on the site's HTTP service (``/r/<token>``, 256 bits)
that stands for exactly one upstream URL. It lives ``ttl_seconds``, carries only its
``allowed_methods`` (GET and HEAD; GET and HEAD by default), delivers at most ``max_bytes`` of
bodies in all (0: no byte limit), and reaches only its upstream: no other path or query is
accepted, and a redirect is followed only on the same scheme, host and port (a redirect to
another host is refused, never followed). It is not an open proxy, and it reaches only
upstreams the site's ``site_upstreams`` policy allows (agent/site/serve/upstreams.py: not loopback,
link-local or the site itself by default), checked when it is made and at each connection.

The bytes are streamed (``agent/site/serve/web.py``): nothing is held in memory beyond one buffer,
nothing is written to disk. Range and If-Range are passed through, so a download resumes
through a route. Every request is counted and logged. The routes are state on disk
(``routes/<id>.json``, mode 0600: the token is a capability) and reconciled at start, so a
restart of the daemon keeps them.

A route with a ``manifest`` (the image's chunk manifest, a FileSource with its digest) is not
relayed: it serves the image from the site's chunk store (agent/site/serve/chunkroute.py). Its
manifest is fetched and checked when the route is made and kept beside it
(``routes/<id>.manifest``, checked against its digest again at start).

The byte count is not saved after every request (two fsyncs on the path of every download):
a route with ``max_bytes`` saves a mark ahead of what it has reserved, a sixteenth of
``max_bytes`` (or the request, when larger) at a time, before the bytes past the last mark are
delivered, so the count on disk is never below what was delivered and a restart can never
grant more than ``max_bytes`` (it may grant up to one step less); the exact counts (and those
of routes without a limit) are saved by the service's timer, at most once a second for a
route that changed, and when the service stops.
"""

from __future__ import annotations

import enum
import hashlib
import http.client
import ipaddress
import json
import logging
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.atomicfile import write_atomic
from agent.errors import InvalidParameters
from agent.images import manifest, oci
from agent.images.filesource import FileRef, parse_source
from agent.images.plan import Plan
from agent.net import http as agent_http
from agent.net.connect import close_quietly
from agent.net.pool import BadRedirect, ConnectionPool, drained, follow
from agent.proto import site_pb2
from agent.site.boot.fields import parse_node_id, parse_ttl
from agent.site.serve.upstreams import UpstreamPolicy
from agent.site.ttltable import Expiring, TtlTable

log = logging.getLogger(__name__)

ROUTE_PREFIX = "/r/"


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
    manifest: FileRef | None = None       # the image's chunk manifest: served from the store
    registry: str = ""                    # an oci:// upstream (the handler resolves it to a blob)
    credentials_ref: str = ""             # the site's secret store entry for that registry
    architecture: str = ""
    registry_hosts: tuple[str, ...] = ()
    blob: str = ""                        # the blob's sha256 (hex): served from the store by it

    @classmethod
    def from_proto(cls, msg: site_pb2.HttpProxyRequest) -> RouteRequest:
        node_id = parse_node_id(msg.node_id)
        if oci.is_reference(msg.upstream_url):
            return cls._registry(msg, node_id)
        if msg.credentials_ref or msg.architecture or msg.registry_hosts:
            raise InvalidParameters("credentials_ref, architecture and registry_hosts are for an"
                                    " oci:// upstream")
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
        manifest_ref = None
        if msg.HasField("manifest"):
            manifest_ref = parse_source(msg.manifest, "manifest")
            if not manifest_ref.url:
                raise InvalidParameters("manifest: a route's manifest is fetched by its url")
        return cls(node_id, msg.upstream_url, frozenset(methods) or DEFAULT_METHODS,
                   parse_ttl(msg.ttl_seconds), msg.max_bytes, manifest_ref)


    @classmethod
    def _registry(cls, msg: site_pb2.HttpProxyRequest, node_id: str) -> RouteRequest:
        """A route to a registry: its manifest is the artifact's own, GET and HEAD only."""
        oci.parse(msg.upstream_url)
        if msg.HasField("manifest"):
            raise InvalidParameters("manifest: a registry route takes the artifact's chunk manifest layer")
        arch = msg.architecture or "amd64"
        if arch not in oci.ARCHES.values():
            raise InvalidParameters(f"architecture: amd64 or arm64, not {arch[:20]!r}")
        if len(msg.registry_hosts) > 16 or not all(oci.HOST.fullmatch(h) and ":" not in h
                                                    for h in msg.registry_hosts):
            raise InvalidParameters("registry_hosts: at most 16 host names")
        return cls(node_id, msg.upstream_url, DEFAULT_METHODS, parse_ttl(msg.ttl_seconds), msg.max_bytes,
                   None, msg.upstream_url, msg.credentials_ref, arch,
                   tuple(h.lower() for h in msg.registry_hosts))


class UpstreamAuth(Protocol):
    """What a route adds to its requests to its upstream (a registry's authorization:
    agent/site/registries.py), and renews once when the upstream answers 401."""

    def headers(self) -> dict[str, str]: ...

    def renew(self, challenge: str) -> bool: ...

    def blob_options(self, url: str) -> agent_http.HttpOptions:
        """Options for a download of ``url`` (a blob into the store): the authorization,
        renewed first if it expired, and the hosts a redirect may lead to."""
        ...


def route_id(token: str) -> str:
    """What the logs and file names say of a route: a digest of its token, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def load_plan(data: bytes, what: str) -> Plan:
    """A route's manifest: an ImageManifest of a raw image (InvalidParameters otherwise)."""
    plan = manifest.parse(data, what)
    if plan.kind != "manifest":
        raise InvalidParameters(
            f"{what}: a .bmap's ranges are not chunks; a route serves from the store with an "
            "image manifest (`agent manifest IMAGE`)")
    if plan.published_format not in (-1, manifest.Fmt.RAW):
        raise InvalidParameters(
            f"{what}: made from a {manifest.image_format_name(plan.published_format)} file; a "
            "route serves a raw image's chunks (route the raw image, or route without a manifest)")
    return plan


@dataclass
class Route(Expiring):
    token: str
    node_id: str
    upstream_url: str
    methods: frozenset[Method]
    expires_at: float
    max_bytes: int                       # 0: no limit
    bytes_used: int = 0                  # bodies delivered or reserved for a response
    requests: int = 0
    manifest: str = ""                   # sha256 of the chunk manifest ("": a relay)
    registry: str = ""                   # the oci:// reference the route was made from
    credentials_ref: str = ""            # the secret store entry whose authorization it adds
    registry_hosts: tuple[str, ...] = ()
    blob: str = ""                       # a blob route: the sha256 hex it is served by from the store
    auth: UpstreamAuth | None = field(default=None, repr=False, compare=False)
    plan: Plan | None = field(default=None, repr=False, compare=False)
    bytes_mark: int = field(default=0, repr=False, compare=False)   # bytes_used on disk
    dirty: bool = field(default=False, repr=False, compare=False)   # counts not saved yet
    from_store: int = field(default=0, repr=False, compare=False)   # bytes served (this run)
    from_upstream: int = field(default=0, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _mark_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def id(self) -> str:
        return route_id(self.token)

    def reserve(self, n: int, save_mark: Callable[[Route, int], None] | None = None) -> bool:
        """Take ``n`` bytes of the budget; False (nothing taken) when they do not fit. Past
        the mark on disk, a new mark is saved (``save_mark``) before this returns."""
        with self._lock:
            if self.max_bytes and self.bytes_used + n > self.max_bytes:
                return False
            self.bytes_used += n
            self.dirty = True
            if save_mark is None or not self.max_bytes or self.bytes_used <= self.bytes_mark:
                return True
        with self._mark_lock:
            with self._lock:
                used = self.bytes_used
                if used <= self.bytes_mark:
                    return True  # another request saved a mark past this one meanwhile
                mark = min(self.max_bytes, used + max(n, self.max_bytes // MARK_STEPS))
            try:
                save_mark(self, mark)
            except BaseException:
                self.release(n)
                raise
            with self._lock:
                self.bytes_mark = max(self.bytes_mark, mark)
        return True

    def release(self, n: int) -> None:
        with self._lock:
            self.bytes_used = max(0, self.bytes_used - n)
            self.dirty = True

    def count_served(self, from_store: int, from_upstream: int) -> None:
        with self._lock:
            self.from_store += from_store
            self.from_upstream += from_upstream

    def count_request(self) -> int:
        with self._lock:
            self.requests += 1
            self.dirty = True
            return self.requests

    def to_json(self, mark: int | None = None) -> str:
        """The route as saved: its bytes_used never below a mark already on disk."""
        with self._lock:
            used = max(self.bytes_used, self.bytes_mark, mark or 0)
            data = {"token": self.token, "node_id": self.node_id,
                    "upstream_url": self.upstream_url, "methods": sorted(self.methods),
                    "expires_at": self.expires_at, "max_bytes": self.max_bytes,
                    "bytes_used": used, "requests": self.requests, "manifest": self.manifest}
            if self.registry:
                data.update(registry=self.registry, credentials_ref=self.credentials_ref,
                            registry_hosts=list(self.registry_hosts), blob=self.blob)
            if mark is None:
                self.dirty = False
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Route:
        data = json.loads(text)
        data["methods"] = frozenset(Method(m) for m in data["methods"])
        data["registry_hosts"] = tuple(data.get("registry_hosts", ()))
        agent_http.check_url(data["upstream_url"])
        route = cls(**data)
        route.bytes_mark = route.bytes_used
        return route


MARK_STEPS = 16  # a route with max_bytes saves its count at most this often (plus large requests)


class RouteTable:
    """The live routes, by token; state on disk under ``root``."""

    def __init__(self, root: Path, base_url: str, policy: UpstreamPolicy | None = None) -> None:
        self.root = root
        self.base_url = base_url.rstrip("/")
        self.policy = policy or UpstreamPolicy()
        self.upstreams = upstream_pool()   # the routes' kept-alive upstream connections
        self.authorizer: Callable[[Route], UpstreamAuth | None] | None = None   # registry routes
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}
        self.table: TtlTable[Route] = TtlTable(root, "route", name=lambda r: r.id,
                                               parse=Route.from_json, dump=lambda r: r.to_json())

    def reconcile(self) -> int:
        """Load the routes on disk; drop the expired and unreadable. Returns how many live."""
        def manifest_matches(route: Route) -> bool:
            if route.manifest:
                route.plan = self._load_manifest(route)
            if route.registry and self.authorizer is not None:
                route.auth = self.authorizer(route)
            return True

        with self._lock:
            self._routes.clear()
            self._routes.update((route.token, route) for route in
                                self.table.load(check=manifest_matches).live)
            wanted = {f"{r.id}.json" for r in self._routes.values()} | {
                f"{r.id}.manifest" for r in self._routes.values() if r.manifest}
            for path in self.root.iterdir():
                if path.name not in wanted:
                    path.unlink(missing_ok=True)
            return len(self._routes)

    def _load_manifest(self, route: Route) -> Plan:
        data = (self.root / f"{route.id}.manifest").read_bytes()
        if hashlib.sha256(data).hexdigest() != route.manifest:
            raise InvalidParameters(f"route {route.id}: its manifest file does not match its digest")
        return load_plan(data, f"route {route.id}'s manifest")

    def add(self, req: RouteRequest, manifest: bytes = b"", plan: Plan | None = None,
            auth: UpstreamAuth | None = None) -> tuple[Route, str]:
        """A new route for ``req`` (serving from the store with ``plan``, whose ``manifest``
        file is kept beside it); returns it and its proxy URL. InvalidParameters when the
        upstream is not one routes may reach (agent/site/serve/upstreams.py)."""
        self.policy.check(req.upstream_url)
        token = secrets.token_urlsafe(32)
        route = Route(token=token, node_id=req.node_id, upstream_url=req.upstream_url,
                      methods=req.methods, expires_at=time.time() + req.ttl_seconds,
                      max_bytes=req.max_bytes,
                      manifest=hashlib.sha256(manifest).hexdigest() if plan else "", plan=plan,
                      registry=req.registry, credentials_ref=req.credentials_ref,
                      registry_hosts=req.registry_hosts, blob=req.blob, auth=auth)
        if plan is not None:
            write_atomic(self.root / f"{route.id}.manifest", manifest, 0o600)
        self._save(route)
        with self._lock:
            self._routes[token] = route
        log.info("route %s for node %s to %s: %s, %ds, %s", route.id, route.node_id,
                 agent_http.redact(route.upstream_url), "+".join(sorted(route.methods)),
                 req.ttl_seconds, f"at most {route.max_bytes} bytes" if route.max_bytes
                 else "no byte limit")
        if plan is not None:
            log.info("route %s serves from the chunk store: %d bytes in %d chunks of %d, "
                     "manifest sha256:%s", route.id, plan.image_size, len(plan.segments),
                     plan.chunk_size, route.manifest)
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
            gone = self.table.due(self._routes.values(), now)
            for route in gone:
                del self._routes[route.token]
        for route in gone:
            self._unlink(route)
            log.info("route %s for node %s expired after %d requests, %d bytes%s", route.id,
                     route.node_id, route.requests, route.bytes_used,
                     f" ({route.from_store} from the store, {route.from_upstream} from the "
                     "upstream since the daemon started)" if route.plan is not None else "")
        return len(gone)

    def remove_node(self, node_id: str) -> list[str]:
        with self._lock:
            gone = [r for r in self._routes.values() if r.node_id == node_id]
            for route in gone:
                del self._routes[route.token]
        for route in gone:
            self._unlink(route)
        return [route.id for route in gone]

    def all(self) -> list[Route]:
        with self._lock:
            return list(self._routes.values())

    def save(self, route: Route) -> None:
        """Save ``route``'s counts now (under its mark lock: a mark being saved is never
        overwritten by a lower count)."""
        with self._lock:
            live = self._routes.get(route.token) is route
        if live:
            with route._mark_lock:
                self._save(route)

    def flush(self) -> int:
        """Save the routes whose counts changed since they were last saved (the timer's and
        the stop's); returns how many were written."""
        with self._lock:
            routes = [r for r in self._routes.values() if r.dirty]
        for route in routes:
            self.save(route)
        return len(routes)

    def save_mark(self, route: Route, mark: int) -> None:
        """Save ``route`` with ``mark`` bytes used (Route.reserve: before delivering past it)."""
        with self._lock:
            live = self._routes.get(route.token) is route
        if live:
            self.table.save(route, route.to_json(mark))

    def reserve(self, route: Route, n: int) -> bool:
        """Take ``n`` bytes of ``route``'s budget, its mark saved first when past it."""
        return route.reserve(n, self.save_mark)

    def _save(self, route: Route) -> None:
        self.table.save(route)

    def _unlink(self, route: Route) -> None:
        self.upstreams.forget(route.id)
        self.table.remove(route)
        (self.root / f"{route.id}.manifest").unlink(missing_ok=True)


# -- the upstream side -------------------------------------------------------------------

PASS_REQUEST_HEADERS = ("Range", "If-Range", "If-None-Match", "If-Modified-Since", "Accept")
PASS_RESPONSE_HEADERS = ("Content-Type", "Content-Range", "Accept-Ranges", "ETag",
                         "Last-Modified", "Cache-Control", "Content-Encoding")


class UpstreamError(Exception):
    """The upstream could not be asked (``status`` is what the client gets: 502 or 504)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


# The site's kept-alive connections to its routes' upstreams: one ConnectionPool, a route's id
# its scope (agent/net/pool.py). A route's requests (the relay's, and the chunk store's fetches
# for it) take an idle connection of that route and give it back when the upstream's answer
# was read to its end, so a deploy through a route opens one connection to its upstream (over
# TLS, one handshake), not one per Range request; a redirect the route's URL answers with is
# followed once and remembered for the route's next requests. A connection is only ever reused
# for the route (and origin) it was made for: the addresses it was pinned to are the ones the
# policy checked for that route, and they are checked again when it is taken. Bounded: at most
# UPSTREAM_PER_ROUTE idle connections a route and UPSTREAM_TOTAL in all (the least recently
# used closed first), each closed after UPSTREAM_IDLE_SECONDS unused; a route's go when it ends.
UPSTREAM_PER_ROUTE = 4
UPSTREAM_TOTAL = 64
UPSTREAM_IDLE_SECONDS = 30.0


def upstream_pool() -> ConnectionPool:
    return ConnectionPool(per_scope=UPSTREAM_PER_ROUTE, total=UPSTREAM_TOTAL,
                          idle_seconds=UPSTREAM_IDLE_SECONDS)


def open_upstream(
    route: Route, method: str, headers: dict[str, str], ssl_options: agent_http.HttpOptions,
    policy: UpstreamPolicy, pool: ConnectionPool | None = None,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send ``method`` to the route's upstream; follow redirects on the same origin only; dial
    only addresses ``policy`` allows. With ``pool``, an idle connection of the route is used
    (a fresh one when it turns out closed) and the route's remembered redirect is gone to
    first; hand the connection back with ``done_upstream``. UpstreamError when it cannot be
    asked (504 when it timed out)."""
    sent = {**headers, "User-Agent": "bettercompute-site"}

    def dial(parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        """A connection to the route's origin, pinned to the addresses its policy allows."""
        host, port = parts.hostname or "", agent_http.origin(parts)[2]
        addresses = tuple(policy.addresses(host, port))   # InvalidParameters: refused
        context = agent_http.ssl_context(ssl_options.ca_pem, ssl_options.ca_file) \
            if parts.scheme == "https" else None
        return agent_http.pinned(parts, addresses, ssl_options.timeout, context, port)

    def ask() -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        auth = route.auth
        conn, resp, _final = follow(pool, route.upstream_url, method,
                                    lambda _parts: {**sent, **(auth.headers() if auth else {})}, dial,
                                    scope=route.id, same_origin=True,
                                    usable=lambda conn: _still_allowed(conn, policy))
        return conn, resp

    try:
        conn, resp = ask()
        if resp.status == 401 and route.auth is not None:
            # A registry's token expired: its challenge answered once more, then asked again.
            challenge = resp.getheader("WWW-Authenticate", "")
            done_upstream(pool, route, conn, resp, drained(resp))
            if not route.auth.renew(challenge):
                raise UpstreamError("the registry refused the site's authorization", 502)
            conn, resp = ask()
    except BadRedirect as exc:
        raise UpstreamError(f"upstream {exc.message}") from None
    except InvalidParameters as exc:
        raise UpstreamError(exc.message) from None
    except TimeoutError as exc:
        raise UpstreamError(f"upstream timed out: {exc}", 504) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise UpstreamError(f"upstream failed: {type(exc).__name__}: {exc}") from exc
    return conn, resp


def _still_allowed(conn: http.client.HTTPConnection, policy: UpstreamPolicy) -> bool:
    """Whether the address ``conn`` is connected to may still be reached under ``policy``."""
    try:
        address, port = conn.sock.getpeername()[:2]
        return policy.refusal(conn.host, ipaddress.ip_address(address), port) == ""
    except (OSError, ValueError, AttributeError):
        return False


def done_upstream(pool: ConnectionPool | None, route: Route,
                  conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                  whole: bool) -> None:
    """The request on ``conn`` is over: kept for the route's next one when its answer was read
    to the end (``whole``) and the upstream keeps the connection open; closed otherwise."""
    if pool is None:
        close_quietly(conn)
    else:
        pool.release(agent_http.origin(route.upstream_url), conn, resp, whole=whole, scope=route.id)
