"""A route to a registry's blob, served from the site's content store by the blob's own digest
(docs/oci.md): the first request has the site download the whole blob from the registry
(ChunkStore.fetch: once however many ask at once, verified against the digest before it gets
its name), every request is then answered from the stored file, with one ``Range`` (the
ramdisk resumes by Range) and ``If-Range`` against an ETag of the digest. A route to a registry
whose artifact has a chunk manifest is served chunk by chunk instead (chunkroute.py).

    served = blobroute.serve(handler, route, method, routes, store)   # None: relay it instead

The registry's authorization (renewed when it answers 401) and the hosts the download may
dial come from the route's ``auth`` (agent/site/registries.py). A blob the store cannot hold
(larger than its budget, a full disk) is relayed instead (None). Nothing is served of a blob
whose bytes do not match its digest: the client gets a 502 that says so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from agent.errors import AgentError
from agent.site.chunkstore import ChunkStore, StoreFull
from agent.site.serve.chunkroute import parse_range
from agent.site.serve.routes import Route, RouteTable

log = logging.getLogger(__name__)


@dataclass
class Served:
    status: int
    sent: int = 0
    note: str = ""


def etag(route: Route) -> str:
    return f'"b-{route.blob[:32]}"'


def _answer(h: BaseHTTPRequestHandler, status: int, message: str, **headers: str) -> Served:
    body = (message + "\n").encode()
    h.send_response(status)
    for name, value in headers.items():
        h.send_header(name.replace("_", "-"), value)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)
    return Served(status, note=message)


def serve(h: BaseHTTPRequestHandler, route: Route, method: str, routes: RouteTable,
          store: ChunkStore) -> Served | None:
    """Answer ``h``'s request on the blob route ``route`` from the store (the blob fetched first
    when it is not there); None when the store cannot hold it (the caller relays)."""
    fetched = False
    if not store.has(route.blob):
        if route.auth is None:
            return _answer(h, 502, f"route {route.id}: no authorization for its registry")
        try:
            store.fetch(route.upstream_url, route.blob, route.auth.blob_options(route.upstream_url),
                        "registry blob")
        except StoreFull as exc:
            log.warning("route %s: the store cannot hold its blob (%s); relayed", route.id, exc.message)
            return None
        except AgentError as exc:
            return _answer(h, 502, f"the registry's blob was not served: {exc.message}")
        fetched = True
    with store.open(route.blob) as f:
        if f is None:      # evicted between the fetch and now: the client asks again
            return _answer(h, 503, "the blob was evicted from the store; ask again", Retry_After="1")
        size = os.fstat(f.fileno()).st_size
        tag = etag(route)
        wanted = parse_range(h.headers.get("Range"), size)
        if_range = h.headers.get("If-Range")
        if if_range is not None and if_range.strip() != tag:
            wanted = None
        if wanted == "unsatisfiable":
            return _answer(h, 416, "range not satisfiable", Content_Range=f"bytes */{size}")
        start, end = (0, size) if wanted is None or isinstance(wanted, str) else wanted
        status = 200 if wanted is None else 206
        length = end - start
        if method != "HEAD" and not routes.reserve(route, length):
            return _answer(h, 403, f"route {route.id}: past its max_bytes ({route.max_bytes})")
        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", tag)
        h.send_header("Content-Length", str(length))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        h.end_headers()
        note = "from the registry, then the store" if fetched else "from the store"
        if method == "HEAD":
            return Served(status, 0, note)
        h.wfile.flush()
        sent = h.connection.sendfile(f, offset=start, count=length)
        if sent < length:
            raise ConnectionError(f"route {route.id}: the client took {sent} of {length} bytes")
        return Served(status, sent, note)
