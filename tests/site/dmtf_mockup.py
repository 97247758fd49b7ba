"""DMTF's own Redfish Mockup Server serving (part of) DMTF's public-rackmount1 mockup, both
vendored unmodified in tests/site/dmtf/ (its README says what and from where), on 127.0.0.1
over TLS with a throw-away self-signed certificate.

    with DmtfMockup(tmp_path) as bmc:
        bmc.address           # "127.0.0.1:PORT" (https), what a request's bmc_address names

The mockup is static: it answers GETs from its files, accepts a session POST (any
credentials: it checks none) and keeps PATCHes in memory.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loopback_http import self_signed_cert
from tests.site.sushy import free_port, serve, stop

DMTF = Path(__file__).parent / "dmtf"
SYSTEM = "/redfish/v1/Systems/437XR1138R2"


class DmtfMockup:
    def __init__(self, workdir: Path) -> None:
        if importlib.util.find_spec("grequests") is None:
            pytest.skip("DMTF's Redfish-Mockup-Server needs grequests (pip install grequests: the dev extra)")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> DmtfMockup:
        cert, key = self_signed_cert(str(self.workdir))
        argv = [sys.executable, str(DMTF / "redfishMockupServer.py"), "-D", str(DMTF / "public-rackmount1"),
                "-S", "-H", "127.0.0.1", "-p", str(self.port), "-s", "--cert", cert, "--key", key]
        self.proc = serve(argv, self.workdir / "mockup.log", f"https://{self.address}/redfish/v1/",
                          "DMTF's mockup server", cwd=DMTF)
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)
