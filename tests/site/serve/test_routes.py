"""Proxy routes (site.httpProxy) through the site's real HTTP service to a real loopback
upstream: streaming, Range, the refusals, and an upstream that fails mid-body."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.errors import InvalidParameters, SourceFailed
from agent.net import http as agent_http
from agent.net.pool import ConnectionPool
from agent.proto import site_pb2
from agent.site.serve import web
from agent.site.serve.routes import RouteTable
from agent.site.services import SiteServices
from tests.loopback_http import Fault, LoopbackServer
from tests.runtime.harness import wait_until

DATA = os.urandom(3 * 1024 * 1024 + 17)


def route(site: SiteServices, upstream_url: str, **fields: object) -> str:
    h = handler_for("site.httpProxy")
    assert h is not None
    msg = site_pb2.HttpProxyRequest(node_id="n1", upstream_url=upstream_url, **fields)  # type: ignore[arg-type]
    result = h.run(Context.local("site.httpProxy", site=site), h.parse(msg))
    assert isinstance(result, site_pb2.HttpProxyResult)
    return result.proxy_url


def request(url: str, method: str = "GET", headers: dict[str, str] | None = None,
            path: str | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, path if path is not None else parts.path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.fixture
def upstream() -> Iterator[LoopbackServer]:
    with LoopbackServer() as srv:
        srv.add("/image.raw", DATA)
        yield srv


def test_get_streams_the_upstream(site: SiteServices, upstream: LoopbackServer) -> None:
    url = route(site, upstream.url("/image.raw"))
    assert url.startswith(site.base_url + "/r/") and len(url.rsplit("/", 1)[1]) >= 40
    status, headers, body = request(url)
    assert status == 200 and body == DATA and headers["Content-Length"] == str(len(DATA))
    # agent/net/http.py (what deploy.image uses) reads through it, and resumes by Range.
    with agent_http.get(url, agent_http.HttpOptions(timeout=10), offset=1000) as dl:
        assert b"".join(dl.iter_chunks()) == DATA[1000:]
    r = site.routes.lookup(url.rsplit("/", 1)[1])
    assert r is not None and r.requests == 2 and r.bytes_used == 2 * len(DATA) - 1000


def test_a_deploys_range_requests_share_one_connection_to_the_route(
        site: SiteServices, upstream: LoopbackServer) -> None:
    """As deploy.image fetches the data runs of a sparse image through a route: bounded Range
    requests, one after the other, on one kept-alive connection to the site (agent/net/http.py's
    ConnectionPool); each is relayed whole, and the connection serves the next."""
    url = route(site, upstream.url("/image.raw"))
    opts = agent_http.HttpOptions(timeout=10, max_retries=0)
    step = 256 * 1024
    with agent_http.ConnectionPool() as pool:
        for start in range(0, len(DATA), 4 * step):
            length = min(step, len(DATA) - start)
            with agent_http.get(url, opts, offset=start, length=length, pool=pool) as dl:
                assert b"".join(dl.iter_chunks()) == DATA[start : start + length]
    assert pool.opened == 1
    ranges = [h.get("Range") for _m, _p, h in upstream.requests]
    assert ranges == [f"bytes={a}-{min(a + step, len(DATA)) - 1}" for a in range(0, len(DATA), 4 * step)]


def test_a_routes_requests_share_one_upstream_connection(
        site: SiteServices, upstream: LoopbackServer) -> None:
    """Item 4 of issue 28 at the site: a deploy's Range requests through a route reach the
    upstream over one kept-alive connection, and the redirect the route's URL answers is
    followed once, then remembered for the route."""
    upstream.redirect("/img", "/image.raw")
    url = route(site, upstream.url("/img"))
    opts = agent_http.HttpOptions(timeout=10, max_retries=0)
    step = 256 * 1024
    starts = range(0, len(DATA), 3 * step)
    with agent_http.ConnectionPool() as client:      # as deploy.image: one connection to the site
        for start in starts:
            length = min(step, len(DATA) - start)
            with agent_http.get(url, opts, offset=start, length=length, pool=client) as dl:
                assert b"".join(dl.iter_chunks()) == DATA[start : start + length]
    paths = [path for _m, path, _h in upstream.requests]
    assert paths == ["/img"] + ["/image.raw"] * len(starts)
    assert upstream.connections == 1 and site.routes.upstreams.opened == 1
    wait_until(lambda: site.routes.upstreams.idle() == 1, 5, "the connection given back")
    token = url.rsplit("/", 1)[1]
    site.routes.remove_node("n1")            # a route that ends takes its connections along
    assert site.routes.lookup(token) is None and site.routes.upstreams.idle() == 0


def test_a_kept_alive_upstream_connection_closed_meanwhile(
        site: SiteServices, upstream: LoopbackServer) -> None:
    """An upstream that closes its idle connections without saying so (an idle timeout): the
    next request on the route finds it closed and is sent again on a new one, unseen by the
    route's client."""
    upstream.add("/closing.raw", DATA, Fault(close_after=True))
    url = route(site, upstream.url("/closing.raw"))
    opts = agent_http.HttpOptions(timeout=10, max_retries=0)
    with agent_http.ConnectionPool() as client:
        for _ in range(3):
            with agent_http.get(url, opts, offset=0, length=100, pool=client) as dl:
                assert b"".join(dl.iter_chunks()) == DATA[:100]
    assert client.opened == 1       # the route's client saw nothing of it
    assert upstream.connections == 3 and site.routes.upstreams.opened == 3


def test_idle_upstream_connections_bounded() -> None:
    """At most ``per_route`` idle connections a route and ``total`` in all (the least recently
    used closed first); those idle past ``idle_seconds`` are closed by the sweep."""
    pool = ConnectionPool(per_scope=2, total=3, idle_seconds=60)
    origin = ("http", "127.0.0.1", 1)

    made = [agent_http.PinnedConnection("127.0.0.1", 1) for _ in range(6)]
    for c in made[:3]:
        pool.give_back(origin, c, "a")          # the first of a's is closed: 2 a route
    for c in made[3:5]:
        pool.give_back(origin, c, "b")          # 4 in all: a's oldest left closed
    assert pool.idle() == 3
    assert pool.take(origin, "a") is made[2] and pool.take(origin, "a") is None
    assert pool.take(origin, "b") is made[4]
    pool.idle_seconds = 0
    assert pool.sweep() == 1 and pool.idle() == 0


def test_range_passed_through(site: SiteServices, upstream: LoopbackServer) -> None:
    url = route(site, upstream.url("/image.raw"))
    status, headers, body = request(url, headers={"Range": "bytes=100-", "If-Range": '"v1"'})
    assert status == 206 and body == DATA[100:]
    assert headers["Content-Range"] == f"bytes 100-{len(DATA) - 1}/{len(DATA)}"
    assert headers["ETag"] == '"v1"' and headers["Accept-Ranges"] == "bytes"
    assert upstream.requests[-1][2]["Range"] == "bytes=100-"
    assert upstream.requests[-1][2]["If-Range"] == '"v1"'
    assert request(url, headers={"Range": f"bytes={len(DATA)}-"})[0] == 416


def test_nothing_else_reachable(site: SiteServices, upstream: LoopbackServer) -> None:
    upstream.add("/secret", b"not for the node")
    url = route(site, upstream.url("/image.raw"))
    path = urllib.parse.urlsplit(url).path
    for other in (path + "/../secret", path + "?u=/secret", path + "x", path[:-1],
                  "/r/", "/r/" + "A" * 43, "/secret", "http://127.0.0.1/secret"):
        status, _, _ = request(url, path=other)
        assert status == 404, other
    assert [r for r in upstream.requests if r[1] == "/secret"] == []


def test_expired_route_refused(site: SiteServices, upstream: LoopbackServer) -> None:
    url = route(site, upstream.url("/image.raw"), ttl_seconds=1)
    assert request(url)[0] == 200
    time.sleep(1.1)
    assert request(url)[0] in (404, 410)


def test_methods_outside_the_route_refused(site: SiteServices, upstream: LoopbackServer) -> None:
    url = route(site, upstream.url("/image.raw"), allowed_methods=["GET"])
    status, headers, _ = request(url, "HEAD")
    assert status == 405 and headers["Allow"] == "GET"
    for method in ("POST", "PUT", "DELETE"):
        assert request(url, method)[0] == 405
    with pytest.raises(InvalidParameters, match="not carried"):
        route(site, upstream.url("/image.raw"), allowed_methods=["CONNECT"])


def test_max_bytes(site: SiteServices, upstream: LoopbackServer) -> None:
    url = route(site, upstream.url("/image.raw"), max_bytes=len(DATA) + 500)
    assert request(url)[0] == 200
    assert request(url, headers={"Range": f"bytes={len(DATA) - 400}-"})[2] == DATA[-400:]
    status, _, body = request(url, headers={"Range": f"bytes={len(DATA) - 200}-"})
    assert status == 403 and b"max_bytes" in body
    assert request(url, headers={"Range": f"bytes={len(DATA) - 100}-"})[2] == DATA[-100:]


def test_redirect_to_another_host_not_followed(site: SiteServices, upstream: LoopbackServer) -> None:
    with LoopbackServer() as elsewhere:
        elsewhere.add("/x", b"elsewhere")
        upstream.redirect("/away", elsewhere.url("/x"))
        upstream.redirect("/moved", "/image.raw")
        assert request(route(site, upstream.url("/moved")))[2] == DATA  # same host: followed
        status, _, body = request(route(site, upstream.url("/away")))
        assert status == 502 and b"another host" in body
        assert elsewhere.requests == []


def test_redirect_to_nowhere_is_502(site: SiteServices, upstream: LoopbackServer) -> None:
    upstream.redirect("/nowhere", "")
    status, _, body = request(route(site, upstream.url("/nowhere")))
    assert status == 502 and b"without a Location" in body


def test_upstream_failing_mid_body_is_a_failure(site: SiteServices, upstream: LoopbackServer) -> None:
    upstream.add("/reset", DATA, fault=Fault(reset_after=1 << 20))
    upstream.add("/short", DATA, fault=Fault(truncate_after=1 << 20))
    for name in ("/reset", "/short"):
        url = route(site, upstream.url(name))
        with pytest.raises(http.client.IncompleteRead):
            request(url)
        # and the agent's own client, which resumes, never reports a short success
        with pytest.raises(SourceFailed), agent_http.get(
                url, agent_http.HttpOptions(timeout=5, max_retries=1, backoff=0.01)) as dl:
            b"".join(dl.iter_chunks())


def test_a_cut_counts_the_bytes_relayed(site: SiteServices, upstream: LoopbackServer) -> None:
    """An upstream that ends early: the route counts what the client got, not the whole
    Content-Length it reserved, nor nothing."""
    upstream.add("/short", DATA, fault=Fault(truncate_after=1 << 20))
    url = route(site, upstream.url("/short"))
    with pytest.raises(http.client.IncompleteRead):
        request(url)
    r = site.routes.lookup(url.rsplit("/", 1)[1])
    assert r is not None
    wait_until(lambda: r.bytes_used == 1 << 20, 5, "the cut request accounted")


def test_upstream_stalling_mid_body_is_cut_at_its_timeout(
        site: SiteServices, upstream: LoopbackServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site.http.server, "upstream", agent_http.HttpOptions(timeout=0.5))
    upstream.add("/stall", DATA, fault=Fault(stall_after=1 << 20, stall=6.0))
    url = route(site, upstream.url("/stall"))
    t0 = time.monotonic()
    with pytest.raises(http.client.IncompleteRead):
        request(url)
    assert time.monotonic() - t0 < 4.0
    r = site.routes.lookup(url.rsplit("/", 1)[1])
    assert r is not None
    wait_until(lambda: r.bytes_used == 1 << 20, 5, "the stalled request accounted")


def test_a_client_that_stops_reading_is_let_go(
        site: SiteServices, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay waits for a client that takes no data only as long as the client timeout,
    then drops it and gives back the route's unsent bytes."""
    monkeypatch.setattr(web._Handler, "timeout", 0.5)  # CLIENT_TIMEOUT, shortened
    big = bytes(64 << 20)
    with LoopbackServer() as srv:
        url = route(site, srv.add("/big", big))
        parts = urllib.parse.urlsplit(url)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        client.connect((parts.hostname or "", parts.port or 80))
        try:
            client.sendall(f"GET {parts.path} HTTP/1.1\r\nHost: site\r\n\r\n".encode())
            r = site.routes.lookup(url.rsplit("/", 1)[1])
            assert r is not None
            buffers = site.http.server.buffers
            wait_until(lambda: buffers.left == buffers.total - web.BUFFER, 5, "the relay's buffer taken")
            wait_until(lambda: 0 < r.bytes_used < len(big), 15, "the stuck client let go")
            wait_until(lambda: buffers.left == buffers.total, 5, "the buffer given back")
        finally:
            client.close()


def test_relay_buffers_come_out_of_one_budget() -> None:
    budget = web.BufferBudget(total=40 << 20)
    with budget.buffer(16 << 20) as a, budget.buffer(16 << 20) as b, budget.buffer(16 << 20) as c:
        assert [len(x) for x in (a, b, c)] == [16 << 20, 16 << 20, 8 << 20]  # what is left
        with budget.buffer(16 << 20) as d, budget.buffer(1000) as e:
            assert (len(d), len(e), budget.left) == (web.SMALL_BUFFER, 1000, 0)  # past it: small
        assert budget.left == 0
    assert budget.left == budget.total
    with pytest.raises(RuntimeError), budget.buffer(16 << 20):
        raise RuntimeError("a relay that fails")
    assert budget.left == budget.total


def test_upstream_down_is_502(site: SiteServices) -> None:
    status, _, _ = request(route(site, "http://127.0.0.1:9/nothing"))
    assert status == 502


@pytest.mark.parametrize("url", ["ftp://h/x", "file:///etc/passwd", "http:///x", "http://h:99999/x",
                                 "http://h/a b", ""])
def test_bad_upstream_refused(url: str) -> None:
    h = handler_for("site.httpProxy")
    assert h is not None
    with pytest.raises(InvalidParameters):
        h.parse(site_pb2.HttpProxyRequest(node_id="n1", upstream_url=url))


def test_routes_survive_a_restart(tmp_path: Path, upstream: LoopbackServer) -> None:
    from agent.site.serve.routes import RouteRequest
    from agent.site.serve.upstreams import UpstreamPolicy

    table = RouteTable(tmp_path, "http://s", UpstreamPolicy.parse(["127.0.0.1"]))
    table.reconcile()
    live, _ = table.add(RouteRequest("n1", upstream.url("/image.raw"), frozenset({"GET"}),  # type: ignore[arg-type]
                                       600, 0))
    table.add(RouteRequest("n1", upstream.url("/image.raw"), frozenset({"GET"}), 1, 0))  # type: ignore[arg-type]
    time.sleep(1.1)
    again = RouteTable(tmp_path, "http://s")
    assert again.reconcile() == 1
    assert again.lookup(live.token) is not None
    assert len(list(tmp_path.iterdir())) == 1
    assert oct(next(tmp_path.iterdir()).stat().st_mode & 0o777) == "0o600"


class _ChunkedUpstream(BaseHTTPRequestHandler):
    """HEAD with headers only; GET as a chunked body of unknown length (``/cut`` stops
    without the last chunk)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True    # headers and chunks are several writes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(DATA)))
        self.send_header("ETag", '"h1"')
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(0, len(DATA), 1 << 20):
            piece = DATA[i:i + (1 << 20)]
            self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            if self.path == "/cut":
                self.close_connection = True
                return
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def chunked() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChunkedUpstream)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_head_passes_headers_only(site: SiteServices, chunked: str) -> None:
    url = route(site, chunked + "/x")
    status, headers, body = request(url, "HEAD")
    assert status == 200 and body == b"" and headers["ETag"] == '"h1"'
    assert headers["Content-Length"] == str(len(DATA))
    r = site.routes.lookup(url.rsplit("/", 1)[1])
    assert r is not None and r.bytes_used == 0


def test_unknown_length_streams_chunked_and_is_cut_on_failure(site: SiteServices, chunked: str) -> None:
    status, headers, body = request(route(site, chunked + "/x"))
    assert status == 200 and body == DATA and headers["Transfer-Encoding"] == "chunked"
    with pytest.raises(http.client.IncompleteRead):
        request(route(site, chunked + "/cut"))
    # past max_bytes with no length known up front: cut, never a short success
    with pytest.raises(http.client.IncompleteRead):
        request(route(site, chunked + "/x", max_bytes=len(DATA) // 2))
