"""A fleet of emulated Redfish BMCs on 127.0.0.1: one process, one event loop, one TLS port per
BMC, each with its own System (power state, boot override), some scripted to misbehave.

    fleet = RedfishFleet([Behaviour.OK] * 60 + [Behaviour.HANG] * 4, username="admin",
                         password=pw, workdir=tmp)
    with fleet:
        fleet.bmcs[0].address          # "127.0.0.1:PORT" (https, a self-signed certificate)
        fleet.bmcs[0].log              # every request it answered: (start, end, method, path, body)
        fleet.bmcs[0].max_concurrent   # the most requests it ever had in hand at once

    python -m qemu.bmcfleet --count 64 --hang 4 --dir /tmp/fleet    # the same, as a process: it
        # prints one JSON line {"bmcs": [{"address", "behaviour"}...]} and serves until stdin closes;
        # a line "counts" on stdin is answered {"requests": [...], "connections": [...]}, each
        # BMC's so far, in the order of "bmcs" (bench/site_fleet.py)

It is not a BMC: it answers the Redfish the site daemon's client uses for power and boot (the
service root, Systems, the System with its Boot override and Reset action, PATCH of Boot, POST
of Reset), with HTTP basic auth (no SessionService, as some BMCs), as DSP0266 documents them.
Behaviours, per BMC:

- ``ok``: answers at once; power changes take effect at once.
- ``hang``: a listening socket whose connections are never accepted or answered (the kernel
  completes the TCP handshake; nothing else ever comes), as a half-booted BMC or a dead port.
- ``slow``: every answer after ``slow_seconds``.
- ``busy``: its first ``busy_times`` requests are answered 503 with a Redfish "busy" message
  (then it answers as ``ok``), as a BMC that rate-limits a burst.
- ``refuse``: nothing listens on its port (connection refused).
- ``drip``: reads the request, then sends the answer one byte a second.

``latency`` (seconds, 0 by default) delays every answer of every BMC that answers, as a real
BMC's own time to answer a Redfish request (tenths of a second to seconds on the BMCs of GPU
servers): with it a fleet's figures measure waiting on BMCs, as at a site, and not the site
daemon's CPU alone.

Its CPU time is the process's (``python -m`` run: the site_fleet bench reads it from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import enum
import functools
import ipaddress
import json
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = "/redfish/v1/"
SYSTEMS = "/redfish/v1/Systems"
SYSTEM = "/redfish/v1/Systems/1"
RESET = f"{SYSTEM}/Actions/ComputerSystem.Reset"
RESET_TYPES = ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"]
BOOT_TARGETS = ["None", "Pxe", "Hdd", "Cd", "BiosSetup", "UefiHttp"]
MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024


class Behaviour(enum.StrEnum):
    OK = "ok"
    HANG = "hang"
    SLOW = "slow"
    BUSY = "busy"
    REFUSE = "refuse"
    DRIP = "drip"


@dataclass
class Request:
    start: float
    end: float
    method: str
    path: str
    body: dict[str, Any]


@dataclass
class Bmc:
    """One emulated BMC and what it saw."""

    index: int
    behaviour: Behaviour
    port: int = 0
    power: str = "Off"
    boot: dict[str, str] = field(default_factory=lambda: {
        "BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None",
        "BootSourceOverrideMode": "UEFI"})
    log: list[Request] = field(default_factory=list)
    busy_left: int = 0
    in_hand: int = 0
    max_concurrent: int = 0
    connections: int = 0
    sock: socket.socket | None = None     # hang, refuse: the socket that holds the port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def changes(self) -> list[str]:
        """The state-changing requests it answered, in order ("Reset On", "Boot Pxe/Once")."""
        out = []
        for r in self.log:
            if r.method == "POST" and r.path == RESET:
                out.append(f"Reset {r.body.get('ResetType')}")
            elif r.method == "PATCH" and r.path == SYSTEM:
                boot = r.body.get("Boot", {})
                target, enabled = boot.get("BootSourceOverrideTarget"), boot.get("BootSourceOverrideEnabled")
                out.append(f"Boot {target}/{enabled}")
        return out


def self_signed(workdir: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, made with cryptography (the dev extra); (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "emulated BMC fleet")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    workdir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = workdir / "fleet-cert.pem", workdir / "fleet-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


class RedfishFleet:
    def __init__(self, behaviours: list[Behaviour], *, username: str, password: str, workdir: Path,
                 slow_seconds: float = 1.0, busy_times: int = 2, latency: float = 0.0) -> None:
        self.bmcs = [Bmc(i, b, busy_left=busy_times if b is Behaviour.BUSY else 0)
                     for i, b in enumerate(behaviours)]
        self.auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.slow_seconds = slow_seconds
        self.latency = latency
        self.workdir = workdir
        self.guard = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    # -- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> RedfishFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        cert, key = self_signed(self.workdir)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(cert), str(key))
        self._thread = threading.Thread(target=self._serve, args=(tls,), name="bmc-fleet", daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._failed is not None:
            raise RuntimeError(f"the BMC fleet did not start: {self._failed}") from self._failed
        if not self._ready.is_set():
            raise RuntimeError("the BMC fleet did not start within 60 s")

    def stop(self) -> None:
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None
        for bmc in self.bmcs:
            if bmc.sock is not None:
                bmc.sock.close()

    def _serve(self, tls: ssl.SSLContext) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._open(tls))
        except BaseException as exc:
            self._failed = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            for server in self._servers:
                server.close()
            # Connections a client still keeps alive (the site daemon keeps one per BMC
            # between commands) are ended here, not left pending as the loop closes.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _open(self, tls: ssl.SSLContext) -> None:
        for bmc in self.bmcs:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            bmc.port = sock.getsockname()[1]
            if bmc.behaviour is Behaviour.REFUSE:
                bmc.sock = sock     # bound, never listening: a connection is refused (RST)
                continue
            if bmc.behaviour is Behaviour.HANG:
                sock.listen(1024)
                bmc.sock = sock
                continue
            server = await asyncio.start_server(functools.partial(self._connection, bmc),
                                                sock=sock, ssl=tls, backlog=1024)
            self._servers.append(server)

    # -- HTTP ------------------------------------------------------------------------------

    async def _connection(self, bmc: Bmc, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        bmc.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                if len(head) > MAX_HEAD:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = [*lines[0].split(" "), "", ""][:3]
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:] if line)}
                length = int(headers.get("content-length", "0") or 0)
                if length > MAX_BODY:
                    return
                body = await reader.readexactly(length) if length else b""
                start = time.monotonic()
                bmc.in_hand += 1
                bmc.max_concurrent = max(bmc.max_concurrent, bmc.in_hand)
                try:
                    status, doc = self._answer(bmc, method, path.split("?")[0], headers, body)
                    if bmc.behaviour is Behaviour.SLOW:
                        await asyncio.sleep(self.slow_seconds)
                    elif self.latency:
                        await asyncio.sleep(self.latency)
                    payload = json.dumps(doc).encode() if doc is not None else b""
                    reason = {200: "OK", 204: "No Content", 401: "Unauthorized", 404: "Not Found",
                              400: "Bad Request", 503: "Service Unavailable"}.get(status, "Status")
                    out = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(payload)}\r\n"
                           f"Connection: {'close' if headers.get('connection') == 'close' else 'keep-alive'}"
                           "\r\n\r\n").encode() + payload
                    if bmc.behaviour is Behaviour.DRIP:
                        for i in range(len(out)):
                            writer.write(out[i:i + 1])
                            await writer.drain()
                            await asyncio.sleep(1.0)
                    else:
                        writer.write(out)
                        await writer.drain()
                finally:
                    bmc.in_hand -= 1
                try:
                    parsed = json.loads(body) if body else {}
                except ValueError:
                    parsed = {}
                with self.guard:
                    bmc.log.append(Request(start, time.monotonic(), method, path,
                                           parsed if isinstance(parsed, dict) else {}))
                if headers.get("connection") == "close":
                    return
        except (ConnectionError, ssl.SSLError, asyncio.CancelledError):   # the last: the fleet stops
            return
        finally:
            writer.close()

    def _answer(self, bmc: Bmc, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, Any] | None]:
        if bmc.busy_left > 0:
            bmc.busy_left -= 1
            busy = "Base.1.8.ServiceTemporarilyUnavailable"
            return 503, {"error": {"code": busy, "message": "The service is temporarily unavailable (busy).",
                                   "@Message.ExtendedInfo": [{"MessageId": busy,
                                                              "Message": "Service busy, retry later."}]}}
        path = path.rstrip("/") or "/"
        if method == "GET" and path == ROOT.rstrip("/"):
            return 200, {"@odata.id": ROOT, "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                         "Id": "RootService", "RedfishVersion": "1.6.0",
                         "Systems": {"@odata.id": SYSTEMS}}
        if headers.get("authorization") != self.auth:
            return 401, {"error": {"code": "Base.1.8.NoValidSession", "message": "Authentication required"}}
        try:
            doc = json.loads(body) if body else {}
        except ValueError:
            return 400, {"error": {"code": "Base.1.8.MalformedJSON", "message": "Malformed JSON"}}
        if method == "GET" and path == SYSTEMS:
            return 200, {"@odata.id": SYSTEMS, "Members@odata.count": 1, "Members": [{"@odata.id": SYSTEM}]}
        if method == "GET" and path == SYSTEM:
            return 200, self._system(bmc)
        if method == "PATCH" and path == SYSTEM:
            boot = doc.get("Boot", {}) if isinstance(doc, dict) else {}
            if boot.get("BootSourceOverrideTarget") not in BOOT_TARGETS:
                return 400, {"error": {"code": "Base.1.8.PropertyValueNotInList",
                                       "message": "BootSourceOverrideTarget not allowed"}}
            bmc.boot.update({k: str(v) for k, v in boot.items()})
            return 204, None
        if method == "POST" and path == RESET:
            kind = doc.get("ResetType") if isinstance(doc, dict) else None
            if kind not in RESET_TYPES:
                return 400, {"error": {"code": "Base.1.8.ActionParameterValueNotInList",
                                       "message": f"ResetType {kind!r} not allowed"}}
            bmc.power = "Off" if kind in ("ForceOff", "GracefulShutdown") else "On"
            return 204, None
        return 404, {"error": {"code": "Base.1.8.ResourceMissingAtURI", "message": f"{path} not found"}}

    @staticmethod
    def _system(bmc: Bmc) -> dict[str, Any]:
        return {
            "@odata.id": SYSTEM, "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem", "Id": "1",
            "Name": f"fleet node {bmc.index}", "Manufacturer": "bettercompute", "Model": "fleet-emulated",
            "SerialNumber": f"FLEET-{bmc.index:05d}", "PowerState": bmc.power,
            "Boot": {**bmc.boot, "BootSourceOverrideTarget@Redfish.AllowableValues": BOOT_TARGETS},
            "Actions": {"#ComputerSystem.Reset": {"target": RESET,
                                                  "ResetType@Redfish.AllowableValues": RESET_TYPES}},
        }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m qemu.bmcfleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=16, help="BMCs that answer (behaviour ok)")
    for name in ("hang", "slow", "busy", "refuse", "drip"):
        p.add_argument(f"--{name}", type=int, default=0, metavar="N", help=f"BMCs that {name}")
    p.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                   help="every answer after this long (a real BMC's time to answer)")
    p.add_argument("--username", default="admin")
    p.add_argument("--password-file", type=Path, required=True, help="the BMCs' password, in a file")
    p.add_argument("--dir", type=Path, required=True, help="where its certificate goes")
    a = p.parse_args()
    behaviours = [Behaviour.OK] * a.count
    for b in (Behaviour.HANG, Behaviour.SLOW, Behaviour.BUSY, Behaviour.REFUSE, Behaviour.DRIP):
        behaviours += [b] * getattr(a, str(b))
    password = a.password_file.read_text().strip()
    with RedfishFleet(behaviours, username=a.username, password=password, workdir=a.dir,
                      latency=a.latency) as fleet:
        print(json.dumps({"bmcs": [{"address": b.address, "behaviour": str(b.behaviour)}
                                   for b in fleet.bmcs]}), flush=True)
        for line in sys.stdin:
            if line.strip() == "counts":
                with fleet.guard:
                    counts = {"requests": [len(b.log) for b in fleet.bmcs],
                              "connections": [b.connections for b in fleet.bmcs]}
                print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
