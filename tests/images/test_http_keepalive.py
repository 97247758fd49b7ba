"""http.request with Connections: idempotent requests to one origin share one kept-alive TLS
connection; POST never rides on one; a kept connection the server closed is replaced at once."""

from __future__ import annotations

import base64
import socket
from pathlib import Path

from agent.images import http
from qemu.bmcfleet import Behaviour, RedfishFleet

AUTH = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}


def test_gets_share_one_connection_and_a_closed_one_is_replaced(tmp_path: Path) -> None:
    with RedfishFleet([Behaviour.OK], username="u", password="p", workdir=tmp_path) as fleet:
        bmc = fleet.bmcs[0]
        url = f"https://{bmc.address}/redfish/v1/Systems/1"
        opts = http.HttpOptions(verify=False)
        kept = http.Connections(opts)
        try:
            for _ in range(3):
                assert http.request("GET", url, opts, headers=AUTH, connections=kept).status == 200
            assert bmc.connections == 1
            reset = f"https://{bmc.address}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
            answer = http.request("POST", reset, opts, headers=AUTH, json_body={"ResetType": "On"},
                                  connections=kept)
            assert answer.status == 204 and bmc.connections == 2 and bmc.power == "On"
            # The kept connection dies (as a BMC closes an idle one): the next GET makes a new one
            # within the same attempt.
            conn = kept.idle(http.check_url(url))
            assert conn is not None and conn.sock is not None
            socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
            kept.give_back(http.check_url(url), conn)
            again = http.request("GET", url, opts, headers=AUTH, connections=kept)
            assert again.status == 200 and again.attempts == 1 and bmc.connections == 3
        finally:
            kept.close()
