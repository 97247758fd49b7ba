"""http.request with a ConnectionPool: requests to one origin share one kept-alive TLS
connection; a POST rides on one only when it is fresh and still open; a kept connection the
server closed is replaced at once. Against a loopback TLS server of the tests' own."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest import MonkeyPatch

from agent.net import http
from tests.loopback_http import ScriptedServer, Seen, self_signed_cert

SYSTEM = "/redfish/v1/Systems/1"
RESET = f"{SYSTEM}/Actions/ComputerSystem.Reset"
OPTS = http.HttpOptions(verify=False)


class Bmc:
    """A BMC's System and its Reset action, enough to see where each request went."""

    def __init__(self, srv: ScriptedServer) -> None:
        self.srv = srv
        self.power = "Off"
        srv.route("GET", SYSTEM, self.system)
        srv.route("POST", RESET, self.reset)

    def system(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "application/json"}, json.dumps({"PowerState": self.power}).encode()

    def reset(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        self.power = {"On": "On", "ForceOff": "Off"}[json.loads(seen.body)["ResetType"]]
        return 204, {}, b""

    @property
    def connections(self) -> int:
        return self.srv.connections


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[Bmc]:
    with ScriptedServer(tls=self_signed_cert(str(tmp_path))) as srv:
        yield Bmc(srv)


def test_gets_share_one_connection_and_a_closed_one_is_replaced(bmc: Bmc) -> None:
    url, reset = bmc.srv.url(SYSTEM), bmc.srv.url(RESET)
    kept = http.ConnectionPool()
    try:
        for _ in range(3):
            assert http.request("GET", url, OPTS, connections=kept).status == 200
        assert bmc.connections == 1
        answer = http.request("POST", reset, OPTS, json_body={"ResetType": "On"}, connections=kept)
        assert answer.status == 204 and bmc.connections == 1 and bmc.power == "On"
        # The kept connection dies (as a BMC closes an idle one): the next GET makes a new one
        # within the same attempt.
        kill(kept, url)
        again = http.request("GET", url, OPTS, connections=kept)
        assert again.status == 200 and again.attempts == 1 and bmc.connections == 2
        # A POST never goes out on a dead one (it could not be sent again): a new connection.
        kill(kept, url)
        answer = http.request("POST", reset, OPTS, json_body={"ResetType": "ForceOff"},
                              connections=kept)
        assert answer.status == 204 and answer.attempts == 1 and bmc.connections == 3
        assert bmc.power == "Off"
        assert [s.method for s in bmc.srv.seen] == ["GET"] * 3 + ["POST", "GET", "POST"]
    finally:
        kept.close()


def test_a_post_takes_no_connection_idle_too_long(bmc: Bmc, monkeypatch: MonkeyPatch) -> None:
    url, reset = bmc.srv.url(SYSTEM), bmc.srv.url(RESET)
    kept = http.ConnectionPool()
    try:
        assert http.request("GET", url, OPTS, connections=kept).status == 200
        monkeypatch.setattr(http, "FRESH_SECONDS", 0.0)   # it has been idle longer than that
        answer = http.request("POST", reset, OPTS, json_body={"ResetType": "On"}, connections=kept)
        assert answer.status == 204 and bmc.connections == 2 and bmc.power == "On"
    finally:
        kept.close()


def kill(kept: http.ConnectionPool, url: str) -> None:
    """Shut the kept connection to ``url``'s origin down under it, as a BMC that closed it."""
    conn = kept.take(http.origin(url))
    assert conn is not None and conn.sock is not None
    socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
    kept.give_back(http.origin(url), conn)
