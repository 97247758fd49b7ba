"""A BMC's answer has a bound (issue 27, item 12): a Redfish BMC that answers with a body of
hundreds of MiB is refused with a clear error after a few MiB at most, not read into memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import BmcRefused
from agent.net import http
from tests.loopback_http import RawServer, self_signed_cert
from tests.site.test_bmc_redfish import config_with, run_kind


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
