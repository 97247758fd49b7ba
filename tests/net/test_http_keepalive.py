"""http.request with Connections: requests to one origin share one kept-alive TLS connection;
a POST rides on one only when it is fresh and still open; a kept connection the server closed
is replaced at once."""

from __future__ import annotations

import base64
import socket
from pathlib import Path

from pytest import MonkeyPatch

from agent.net import http
from qemu.bmcfleet import Behaviour, RedfishFleet

AUTH = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}


def test_gets_share_one_connection_and_a_closed_one_is_replaced(tmp_path: Path) -> None:
    with RedfishFleet([Behaviour.OK], username="u", password="p", workdir=tmp_path) as fleet:
        bmc = fleet.bmcs[0]
        url = f"https://{bmc.address}/redfish/v1/Systems/1"
        opts = http.HttpOptions(verify=False)
        kept = http.ConnectionPool()
        try:
            for _ in range(3):
                assert http.request("GET", url, opts, headers=AUTH, connections=kept).status == 200
            assert bmc.connections == 1
            reset = f"https://{bmc.address}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
            answer = http.request("POST", reset, opts, headers=AUTH, json_body={"ResetType": "On"},
                                  connections=kept)
            assert answer.status == 204 and bmc.connections == 1 and bmc.power == "On"
            # The kept connection dies (as a BMC closes an idle one): the next GET makes a new one
            # within the same attempt.
            kill(kept, url)
            again = http.request("GET", url, opts, headers=AUTH, connections=kept)
            assert again.status == 200 and again.attempts == 1 and bmc.connections == 2
            # A POST never goes out on a dead one (it could not be sent again): a new connection.
            kill(kept, url)
            answer = http.request("POST", reset, opts, headers=AUTH, json_body={"ResetType": "ForceOff"},
                                  connections=kept)
            assert answer.status == 204 and answer.attempts == 1 and bmc.connections == 3
            assert bmc.power == "Off"
        finally:
            kept.close()


def test_a_post_takes_no_connection_idle_too_long(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    with RedfishFleet([Behaviour.OK], username="u", password="p", workdir=tmp_path) as fleet:
        bmc = fleet.bmcs[0]
        url = f"https://{bmc.address}/redfish/v1/Systems/1"
        reset = f"{url}/Actions/ComputerSystem.Reset"
        opts = http.HttpOptions(verify=False)
        kept = http.ConnectionPool()
        try:
            assert http.request("GET", url, opts, headers=AUTH, connections=kept).status == 200
            monkeypatch.setattr(http, "FRESH_SECONDS", 0.0)   # it has been idle longer than that
            answer = http.request("POST", reset, opts, headers=AUTH, json_body={"ResetType": "On"},
                                  connections=kept)
            assert answer.status == 204 and bmc.connections == 2 and bmc.power == "On"
        finally:
            kept.close()


def kill(kept: http.ConnectionPool, url: str) -> None:
    """Shut the kept connection to ``url``'s origin down under it, as a BMC that closed it."""
    conn = kept.take(http.origin(url))
    assert conn is not None and conn.sock is not None
    socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
    kept.give_back(http.origin(url), conn)
