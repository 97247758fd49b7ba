"""agent/net/pool.py: the one stale-connection rule and the one redirect loop, for every caller
(a deploy's GETs, a BMC's requests, the site's upstream side), against real loopback sockets."""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from http import client

import pytest

from agent.net import http
from agent.net.pool import BadRedirect, ConnectionPool, follow, stale
from tests.loopback_http import LoopbackServer

OPTS = http.HttpOptions(timeout=5.0, max_retries=0, backoff=0.01)
BODY = b'{"ok": true}'


class GarblingServer:
    """Answers the first request on each connection with 200 and keeps it open; the second
    request on a connection gets a garbled status line (an upstream or BMC that reuses a
    connection wrongly: http.client's BadStatusLine), then the connection is closed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            for answer in (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY,
                           b"garbage that is no status line\r\n"):
                data = b""
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                with self._lock:
                    self.requests.append(data.split(b" ", 1)[0])
                conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def garbling() -> Iterator[GarblingServer]:
    srv = GarblingServer()
    yield srv
    srv.close()


def test_a_get_on_a_kept_connection_that_answers_garbage_goes_again_on_a_new_one(
        garbling: GarblingServer) -> None:
    """The rule the site's copy alone had (BadStatusLine): now a deploy's GETs and a BMC's
    follow it too, without a retry counted (max_retries is 0)."""
    with ConnectionPool() as pool:
        for _ in range(2):
            with http.get(garbling.url("/img"), OPTS, pool=pool) as body:
                assert body.read() == BODY
        assert garbling.connections == 2 and pool.opened == 2
        kept = ConnectionPool()
        for _ in range(2):
            assert http.request("GET", garbling.url("/x"), OPTS, connections=kept).attempts == 1
        kept.close()
    assert garbling.connections == 4


def test_a_post_on_a_kept_connection_that_answers_garbage_is_not_sent_again(
        garbling: GarblingServer) -> None:
    """Bytes of an answer came (garbled): the server read the POST; it is not sent again."""
    kept = ConnectionPool()
    try:
        assert http.request("GET", garbling.url("/x"), OPTS, connections=kept).status == 200
        with pytest.raises(http.AmbiguousWrite, match="not repeated"):
            http.request("POST", garbling.url("/x"), OPTS, json_body={}, connections=kept)
    finally:
        kept.close()
    assert garbling.requests == [b"GET", b"POST"] and garbling.connections == 1


def test_the_stale_rule() -> None:
    for method in ("GET", "DELETE", "POST", "PATCH"):
        assert stale(client.RemoteDisconnected("closed"), reused=True, method=method)
        assert stale(ssl.SSLEOFError(), reused=True, method=method)
        assert not stale(client.RemoteDisconnected("closed"), reused=False, method=method)
        assert not stale(TimeoutError(), reused=True, method=method)
    assert stale(client.BadStatusLine("x"), reused=True, method="GET")
    assert not stale(client.BadStatusLine("x"), reused=True, method="POST")


def test_the_redirect_loop_same_origin_and_its_memo() -> None:
    with LoopbackServer() as srv, LoopbackServer() as other:
        other.add("/x", b"elsewhere")
        srv.add("/real", b"real")
        srv.redirect("/old", "/real")
        srv.redirect("/away", other.url("/x"))
        srv.redirect("/loop", "/loop")

        def dial(parts: urllib.parse.SplitResult) -> client.HTTPConnection:
            return http.connect(parts, OPTS)

        def headers(_parts: urllib.parse.SplitResult) -> dict[str, str]:
            return {}

        with ConnectionPool() as pool:
            conn, resp, final = follow(pool, srv.url("/old"), "GET", headers, dial, scope="r1")
            assert resp.read() == b"real" and final == srv.url("/real")
            pool.release(http.origin(final), conn, resp, whole=True, scope="r1")
            assert pool.resolved(srv.url("/old"), "r1") == srv.url("/real")
            assert pool.resolved(srv.url("/old"), "r2") == srv.url("/old")   # per scope
            with pytest.raises(BadRedirect, match="another host"):
                follow(pool, srv.url("/away"), "GET", headers, dial, same_origin=True)
            with pytest.raises(BadRedirect, match="more than 5 redirects"):
                follow(pool, srv.url("/loop"), "GET", headers, dial)
            pool.forget("r1")
            assert pool.resolved(srv.url("/old"), "r1") == srv.url("/old")
            assert pool.take(http.origin(final), "r1") is None      # its connection closed
        assert other.requests == []
