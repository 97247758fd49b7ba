"""agent.net.http.request and post_multipart (the JSON-API half of the client) against a real
loopback server: retries of 5xx, busy and refused connections, bounded by the deadline and
cancel; 4xx never retried; TLS verify on, with a CA, and off; a streamed multipart upload."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from agent.errors import Cancelled
from agent.net import http
from tests.conftest import free_port
from tests.loopback_http import ScriptedServer, Seen, self_signed_cert

FAST = http.HttpOptions(timeout=5.0, max_retries=3, backoff=0.01)
JSON = {"Content-Type": "application/json"}


def ok(seen: Seen) -> tuple[int, dict[str, str], bytes]:
    return 200, JSON, json.dumps({"method": seen.method, "got": seen.body.decode()}).encode()


def countdown(fail: int, status: int) -> object:
    left = [fail]

    def route(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        if left[0] > 0:
            left[0] -= 1
            return status, JSON, b'{"error": "later"}'
        return ok(seen)

    return route



def test_json_body_sent_and_answer_returned() -> None:
    with ScriptedServer() as srv:
        srv.route("PATCH", "/a", ok)
        resp = http.request("PATCH", srv.url("/a"), FAST, json_body={"x": 1}, headers={"X-Auth-Token": "t"})
        seen = srv.seen[0]
    assert resp.status == 200 and resp.attempts == 1
    assert json.loads(resp.body) == {"method": "PATCH", "got": '{"x": 1}'}
    assert seen.headers["Content-Type"] == "application/json" and seen.headers["X-Auth-Token"] == "t"
    assert resp.headers["content-type"] == "application/json"


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_5xx_retried_then_served(method: str) -> None:
    with ScriptedServer() as srv:
        srv.route(method, "/a", countdown(2, 503))
        resp = http.request(method, srv.url("/a"), FAST)
    assert resp.status == 200 and resp.attempts == 3


@pytest.mark.parametrize(("method", "status"), [("POST", 500), ("PATCH", 502), ("POST", 503)])
def test_a_write_answered_5xx_is_sent_once(method: str, status: int) -> None:
    """A POST or PATCH that the server answers 5xx (a 503 without Retry-After included) may
    have been taken: never sent again; AmbiguousWrite carries the answer for the caller."""
    with ScriptedServer() as srv:
        srv.route(method, "/a", countdown(100, status))
        with pytest.raises(http.AmbiguousWrite, match=f"HTTP {status}") as err:
            http.request(method, srv.url("/a"), FAST, json_body={"ResetType": "On"})
        assert len(srv.seen) == 1
    assert err.value.response is not None and err.value.response.status == status
    assert b"later" in err.value.response.body and err.value.status == status
    assert isinstance(err.value, http.HttpError)     # callers that catch HttpError still do


def test_a_write_refused_with_retry_after_is_sent_again() -> None:
    """A 429 or 503 with Retry-After says the server did not take it: the write goes again."""
    left = [2]

    def refusing(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        if left[0] > 0:
            left[0] -= 1
            return (429 if left[0] else 503), {**JSON, "Retry-After": "0"}, b'{"error": "later"}'
        return ok(seen)

    with ScriptedServer() as srv:
        srv.route("POST", "/a", refusing)
        resp = http.request("POST", srv.url("/a"), FAST)
        assert len(srv.seen) == 3
    assert resp.status == 200 and resp.attempts == 3


def test_a_write_with_no_answer_in_time_is_ambiguous() -> None:
    """Sent, then no answer within the attempt's time: not sent again (a GET would be)."""
    def slow(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        time.sleep(1.0)
        return ok(seen)

    opts = http.HttpOptions(timeout=5.0, max_retries=3, backoff=0.01, total_timeout=0.3)
    with ScriptedServer() as srv:
        srv.route("POST", "/a", slow)
        srv.route("GET", "/a", slow)
        with pytest.raises(http.AmbiguousWrite, match="not repeated") as err:
            http.request("POST", srv.url("/a"), opts)
        assert err.value.response is None and len(srv.seen) == 1
        with pytest.raises(http.HttpError, match="giving up after 4 attempts") as got:
            http.request("GET", srv.url("/a"), opts)
        assert not isinstance(got.value, http.AmbiguousWrite)
        time.sleep(1.1)
        assert len(srv.seen) == 1 + 4


def test_5xx_forever_returns_last_answer_after_bounded_attempts() -> None:
    with ScriptedServer() as srv:
        srv.route("GET", "/a", countdown(100, 500))
        resp = http.request("GET", srv.url("/a"), FAST)
        assert len(srv.seen) == 4
    assert resp.status == 500 and resp.attempts == 4 and b"later" in resp.body


def test_4xx_never_retried() -> None:
    with ScriptedServer() as srv:
        srv.route("GET", "/a", countdown(100, 401))
        resp = http.request("GET", srv.url("/a"), FAST)
        assert len(srv.seen) == 1
    assert resp.status == 401


def test_busy_predicate_retries() -> None:
    with ScriptedServer() as srv:
        srv.route("POST", "/a", countdown(2, 409))
        resp = http.request("POST", srv.url("/a"), FAST, busy=lambda r: r.status == 409)
    assert resp.status == 200 and resp.attempts == 3


def test_refused_connection_bounded_then_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/a"
    with pytest.raises(http.HttpError, match=r"giving up after 4 attempts: ConnectionRefusedError") as err:
        http.request("POST", url, FAST)
    assert err.value.status == 0


def test_deadline_bounds_the_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}/a"
    opts = http.HttpOptions(timeout=5.0, max_retries=100, backoff=0.2, max_backoff=0.2)
    start = time.monotonic()
    with pytest.raises(http.HttpError, match="deadline"):
        http.request("GET", url, opts, deadline=start + 1.0)
    assert time.monotonic() - start < 1.5


def test_cancel_interrupts_the_backoff() -> None:
    cancel = threading.Event()
    opts = http.HttpOptions(timeout=5.0, max_retries=100, backoff=5.0, cancel=cancel)
    threading.Timer(0.3, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(Cancelled):
        http.request("GET", f"http://127.0.0.1:{free_port()}/a", opts)
    assert time.monotonic() - start < 2.0


def test_post_dropped_after_sending_is_not_repeated() -> None:
    with ScriptedServer() as srv:
        srv.route("POST", "/a", lambda seen: (-1, {}, b""))
        with pytest.raises(http.AmbiguousWrite, match="not repeated"):
            http.request("POST", srv.url("/a"), FAST)
        assert len(srv.seen) == 1


def test_header_values_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agent.net.http")
    with ScriptedServer() as srv:
        srv.route("GET", "/a", countdown(1, 503))
        http.request("GET", srv.url("/a?token=q"), FAST, headers={"X-Auth-Token": "s3cr3t-token"})
    assert caplog.records and "s3cr3t-token" not in caplog.text and "token=q" not in caplog.text


def test_tls_verified_with_ca_refused_without_and_unchecked_when_asked(tmp_path: Path) -> None:
    cert, key = self_signed_cert(str(tmp_path))
    with ScriptedServer(tls=(cert, key)) as srv:
        srv.route("GET", "/a", ok)
        with pytest.raises(http.HttpError, match="TLS certificate is not trusted") as err:
            http.request("GET", srv.url("/a"), FAST)
        assert err.value.details["tls"] == "untrusted"
        assert len(srv.seen) == 0  # refused at once, no retries
        with_ca = http.HttpOptions(timeout=5.0, ca_file=Path(cert))
        assert http.request("GET", srv.url("/a"), with_ca).status == 200
        unverified = http.HttpOptions(timeout=5.0, verify=False)
        assert http.request("GET", srv.url("/a"), unverified).status == 200


def test_multipart_streams_a_file(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)
    image = tmp_path / "fw.bin"
    image.write_bytes(data)
    with ScriptedServer() as srv:
        srv.route("POST", "/push", lambda seen: (202, {"Location": "/task/1"}, b""))
        resp = http.post_multipart(
            srv.url("/push"),
            [http.Part("UpdateParameters", b'{"Targets": []}', "application/json"),
             http.Part("UpdateFile", path=image)],
            FAST,
        )
        seen = srv.seen[0]
    assert resp.status == 202 and resp.headers["location"] == "/task/1"
    ctype = seen.headers["Content-Type"]
    boundary = ctype.split("boundary=", 1)[1]
    assert int(seen.headers["Content-Length"]) == len(seen.body)
    chunks = seen.body.split(f"--{boundary}".encode())
    assert chunks[-1] == b"--\r\n"
    params, upload = chunks[1], chunks[2]
    assert b'name="UpdateParameters"' in params and b'{"Targets": []}\r\n' in params
    assert b'name="UpdateFile"; filename="fw.bin"' in upload
    content = upload.split(b"\r\n\r\n", 1)[1][:-2]
    assert hashlib.sha256(content).digest() == hashlib.sha256(data).digest()


def test_multipart_dropped_after_sending_is_ambiguous_and_refused_is_not() -> None:
    parts = [http.Part("UpdateParameters", b"{}", "application/json")]
    with ScriptedServer() as srv:
        srv.route("POST", "/push", lambda seen: (-1, {}, b""))
        with pytest.raises(http.AmbiguousWrite, match="not repeated"):
            http.post_multipart(srv.url("/push"), parts, FAST)
        assert len(srv.seen) == 1
    with pytest.raises(http.HttpError, match="ConnectionRefusedError") as err:
        http.post_multipart(f"http://127.0.0.1:{free_port()}/push", parts, FAST)
    assert not isinstance(err.value, http.AmbiguousWrite)


def test_head_reads_no_body_whatever_its_content_length() -> None:
    # RFC 9110 9.3.2: a HEAD's Content-Length is the GET's (here past the bound of a body
    # taken), and no body follows: none is read, and the kept connection serves the next one.
    big = str(http.MAX_BODY * 4)
    with ScriptedServer() as srv, http.ConnectionPool() as kept:
        srv.route("HEAD", "/blob", lambda seen: (200, {"Content-Length": big, "ETag": '"e"'}, b""))
        srv.route("GET", "/small", ok)
        head = http.request("HEAD", srv.url("/blob"), FAST, connections=kept)
        after = http.request("GET", srv.url("/small"), FAST, connections=kept)
        connections = srv.connections
    assert head.status == 200 and head.body == b"" and head.attempts == 1
    assert head.headers["content-length"] == big and head.headers["etag"] == '"e"'
    assert after.status == 200 and json.loads(after.body)["method"] == "GET"
    assert connections == 1
