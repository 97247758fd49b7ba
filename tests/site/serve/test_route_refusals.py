"""Proxy routes against upstreams and clients that misbehave (issue 27, items 1 to 3): every
refusal is an HTTP answer and no traceback, a body framed by its chunking whatever its
Content-Length says, and a route's token in no log line whatever the request looks like."""

from __future__ import annotations

import http.client
import logging
import socket
import urllib.parse
from collections.abc import Iterator

import pytest

from agent.errors import InvalidParameters
from agent.site.services import SiteServices
from tests.loopback_http import LoopbackServer, RawServer
from tests.site.serve.test_routes import request, route


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


def no_traceback(logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    assert [r.getMessage() for r in logs.records if r.exc_info] == []
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_redirect_to_a_file_url_is_a_502(site: SiteServices, logs: pytest.LogCaptureFixture,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    with LoopbackServer() as upstream:
        upstream.redirect("/passwd", "file:///etc/passwd")
        upstream.redirect("/cafe", "/caf\u00e9")
        upstream.redirect("/v6", "http://[::1/x")
        for path, why in (("/passwd", b"unusable URL"), ("/cafe", b"not ASCII"),
                          ("/v6", b"unusable Location")):
            status, _, body = request(route(site, upstream.url(path)))
            assert status == 502 and why in body, (path, body)
    no_traceback(logs, capfd)


def test_a_non_ascii_url_is_refused_when_the_route_is_made(site: SiteServices) -> None:
    for url in ("http://127.0.0.1/caf\u00e9", "http://h\u00f6st/x", "http://127.0.0.1/a\x00b",
                "http://127.0.0.1/a\x7fb"):
        with pytest.raises(InvalidParameters, match=r"ASCII|control"):
            route(site, url)


def test_chunked_framing_wins_over_content_length(site: SiteServices) -> None:
    """RFC 9112 6.3: Content-Length 100 with a chunked body of 150 bytes is 150 bytes."""
    body = bytes(range(150))
    answer = (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"96\r\n" + body + b"\r\n0\r\n\r\n")
    with RawServer(answer) as upstream:
        status, headers, got = request(route(site, upstream.url("/x")))
    assert status == 200 and got == body
    assert "Content-Length" not in headers and headers["Transfer-Encoding"] == "chunked"


def test_a_chunked_body_cut_short_is_never_a_short_success(site: SiteServices) -> None:
    answer = (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"96\r\n" + bytes(100))
    with RawServer(answer) as upstream, pytest.raises(http.client.IncompleteRead):
        request(route(site, upstream.url("/x")))


def test_another_transfer_coding_is_a_502(site: SiteServices) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\nhello"
    with RawServer(answer) as upstream:
        status, _, body = request(route(site, upstream.url("/x")))
    assert status == 502 and b"Transfer-Encoding" in body


def raw_request(url: str, target: str) -> bytes:
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: site\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_a_token_is_never_logged(site: SiteServices, logs: pytest.LogCaptureFixture,
                                 capfd: pytest.CaptureFixture[str]) -> None:
    with LoopbackServer() as upstream:
        upstream.add("/image", b"x" * 1000)
        url = route(site, upstream.url("/image"))
        token = url.rsplit("/", 1)[1]
        host = urllib.parse.urlsplit(url).netloc
        for target in (f"/r/{token}", f"/R/{token}", f"http://{host}/r/{token}",
                       f"HTTP://{host}/R/{token}", f"/r//{token}", f"/x/{token}", f"/{token}",
                       f"/r/{token}?a=1", f"/pxe/{token}.ipxe", f"/cache/{token}"):
            answer = raw_request(url, target)
            assert answer.startswith(b"HTTP/1.1 "), target
    messages = "\n".join(r.getMessage() for r in logs.records)
    assert "route " in messages and "/r/…" in messages  # the requests were logged
    assert token not in messages and token[:16] not in messages
    out, err = capfd.readouterr()
    assert token[:16] not in out + err


def test_digests_and_macs_are_still_logged(site: SiteServices, logs: pytest.LogCaptureFixture) -> None:
    digest = "ab" * 32
    raw_request(site.base_url, f"/cache/{digest}")
    raw_request(site.base_url, "/pxe/52-54-00-aa-bb-cc.ipxe")
    messages = "\n".join(r.getMessage() for r in logs.records)
    assert digest in messages and "52-54-00-aa-bb-cc" in messages
