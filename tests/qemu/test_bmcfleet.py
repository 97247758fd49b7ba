"""qemu/bmcfleet.py as bench/site_fleet.py runs it, a process of its own: what each BMC
answered (requests) and accepted (connections, each a TLS handshake) is told on a "counts" line,
so the bench can record counted figures beside its timings."""

from __future__ import annotations

import http.client
import json
import select
import ssl
import subprocess
import sys
from pathlib import Path

from tests.runtime.harness import wait_until

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_fleet_process_counts_each_bmcs_requests_and_connections(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("Fleet-Count-3xQ")
    fleet = subprocess.Popen([sys.executable, "-m", "qemu.bmcfleet", "--count", "2", "--username", "admin",
                              "--password-file", str(secret), "--dir", str(tmp_path)],
                             cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert fleet.stdout is not None and fleet.stdin is not None
        bmcs = json.loads(fleet.stdout.readline())["bmcs"]
        host, port = bmcs[1]["address"].rsplit(":", 1)
        unverified = ssl._create_unverified_context()     # the fleet's self-signed certificate
        conn = http.client.HTTPSConnection(host, int(port), context=unverified, timeout=30)
        try:
            for _ in range(3):                     # three requests on one kept-alive connection
                conn.request("GET", "/redfish/v1/")
                answer = conn.getresponse()
                assert answer.status == 200
                answer.read()
        finally:
            conn.close()

        def counts() -> dict[str, list[int]]:
            assert fleet.stdin is not None and fleet.stdout is not None
            fleet.stdin.write("counts\n")
            fleet.stdin.flush()
            ready, _, _ = select.select([fleet.stdout], [], [], 30)   # never a test that hangs
            assert ready, "the fleet did not answer counts"
            told: dict[str, list[int]] = json.loads(fleet.stdout.readline())
            return told

        # a request is logged just after its answer is sent: asked until the third is in
        told = wait_until(lambda: (c := counts())["requests"][1] >= 3 and c, 30, "three requests logged")
        assert told == {"requests": [0, 3], "connections": [0, 1]}
        fleet.stdin.close()                        # then it stops
        assert fleet.wait(30) == 0
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait()
