"""A BMC's answer has a bound (issue 27, item 12): a Redfish BMC that answers with a body of
hundreds of MiB is refused with a clear error after a few MiB at most, not read into memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import BmcRefused
from agent.net import http
from tests.loopback_http import RawServer, self_signed_cert
from tests.site.bmc.test_bmc_redfish import config_with, run_kind


def chunked(data: bytes, size: int = 1 << 20) -> bytes:
    out = b"".join(b"%x\r\n" % len(data[i:i + size]) + data[i:i + size] + b"\r\n"
                   for i in range(0, len(data), size))
    return out + b"0\r\n\r\n"


@pytest.mark.parametrize("answer", [
    # announced: 512 MiB (the body never comes; nothing waits for it)
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 536870912\r\n\r\n{",
    # not announced: 8 MiB chunked
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    + chunked(b'{"Name": "' + b"x" * (8 << 20) + b'"}'),
], ids=["content-length", "chunked"])
def test_a_huge_service_root_is_refused(tmp_path: Path, answer: bytes) -> None:
    config = config_with(tmp_path, "admin", "pw-1")
    tls = self_signed_cert(str(tmp_path))
    with RawServer(answer, tls=tls) as bmc, pytest.raises(
            BmcRefused, match=r"more than the 4194304 (bytes )?taken; a Redfish resource"):
        run_kind("bmc.query", config, bmc.address, "query")


def test_request_reads_no_more_than_max_body() -> None:
    body = b"y" * 5000
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + body
    with RawServer(answer) as srv:
        assert http.request("GET", srv.url("/x"), max_body=5000).body == body
        with pytest.raises(http.BodyTooLarge, match="5000 bytes, more than the 4999"):
            http.request("GET", srv.url("/x"), max_body=4999)
    with RawServer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body) as srv, pytest.raises(
            http.BodyTooLarge, match="more than the 4999 bytes"):
        http.request("GET", srv.url("/x"), max_body=4999)


def test_a_gzip_answer_is_decoded_within_the_same_bound() -> None:
    """A body sent Content-Encoding: gzip (iLO 5 sends it, asked or not) is decoded; one that
    decodes past max_body is refused like a long one (a 64 MiB bomb in 64 KiB), a coding the
    client does not read and a cut gzip body are errors, never passed on as JSON."""
    import gzip
    import zlib

    doc = b'{"Name": "' + b"z" * 3000 + b'"}'

    def answer(body: bytes, coding: str = "gzip") -> bytes:
        return (b"HTTP/1.1 200 OK\r\nContent-Encoding: " + coding.encode()
                + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with RawServer(answer(gzip.compress(doc))) as srv:
        assert http.request("GET", srv.url("/x"), max_body=5000).body == doc
        with pytest.raises(http.BodyTooLarge, match="decodes to more than the 2999 bytes"):
            http.request("GET", srv.url("/x"), max_body=2999)
    bomb = zlib.compressobj(wbits=31)
    packed = bomb.compress(b"\0" * (64 << 20)) + bomb.flush()
    assert len(packed) < 128 << 10
    with RawServer(answer(packed)) as srv, pytest.raises(http.BodyTooLarge, match="decodes to more"):
        http.request("GET", srv.url("/x"))
    with RawServer(answer(gzip.compress(doc)[:-20])) as srv, pytest.raises(http.HttpError, match="cut short"):
        http.request("GET", srv.url("/x"))
    with RawServer(answer(b"xx", "br")) as srv, pytest.raises(http.HttpError, match="'br' is not one"):
        http.request("GET", srv.url("/x"))
