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
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.loopback_http import self_signed_cert
from tests.site.sushy import free_port

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
        log = (self.workdir / "mockup.log").open("wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=DMTF)
        ctx = ssl._create_unverified_context()
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"https://{self.address}/redfish/v1/", timeout=2, context=ctx):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    pytest.fail("DMTF's mockup server did not start: " + self.log()[-2000:])
                time.sleep(0.2)

    def log(self) -> str:
        return (self.workdir / "mockup.log").read_text(errors="replace")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
