"""A real registry for the tests: Debian's docker-registry (distribution 2.8) started on
127.0.0.1 with a temporary config, over TLS with a test CA or plain HTTP, anonymous, behind
htpasswd (bcrypt entries made by apache2-utils' htpasswd), or behind a token service of our
own (``TokenService``: the Bearer flow, tokens signed ES256 with a test key whose certificate
is the registry's root bundle).

    with Registry(tmp_path, auth="htpasswd", tls=True) as reg:
        reg.host, reg.ca_pem, reg.credentials
        reg.blob_path("sha256:...")         # a blob's file in the registry's storage

Skipped where /usr/bin/docker-registry is missing.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import pytest

from agent.images.oci import Credentials
from tests.conftest import free_port
from tests.loopback_http import self_signed_cert

BINARY = "/usr/bin/docker-registry"
USER, PASSWORD = "publisher", "s3cret-Pa55"
LEEWAY = 60   # distribution takes a token up to 60 s past its "exp": ``seconds`` counts that in



def need_registry() -> None:
    if not os.access(BINARY, os.X_OK):
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")


class TokenService:
    """The registry's token realm: GET /token?service=..&scope=.. with basic credentials (or
    none: anonymous pull when ``anonymous_pull``) answers {"token": JWT}; ``refuse`` makes every
    token one the registry will not take (signed by another key)."""

    def __init__(self, directory: Path, *, anonymous_pull: bool = False,
                 tls: tuple[str, str] | None = None, seconds: int = 600, host: str = "127.0.0.1") -> None:
        from cryptography.hazmat.primitives import serialization

        self.dir = directory / "token"
        self.dir.mkdir()
        self.certfile, keyfile = self_signed_cert(str(self.dir))
        self.key = serialization.load_pem_private_key(Path(keyfile).read_bytes(), None)
        other = directory / "token-other"
        other.mkdir()
        self.other_cert, other_key = self_signed_cert(str(other))
        self.other_key = serialization.load_pem_private_key(Path(other_key).read_bytes(), None)
        self.anonymous_pull = anonymous_pull
        self.seconds = seconds
        self.refuse = False
        self.issued: list[str] = []
        self.requests = 0
        self.seen: list[dict[str, str]] = []   # each request's headers (names in lower case)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                service.requests += 1
                service.seen.append({k.lower(): v for k, v in self.headers.items()})
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                user = ""
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                    if (user, password) != (USER, PASSWORD):
                        self.send_response(401)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                actions = ["pull", "push"] if user else (["pull"] if service.anonymous_pull else [])
                access = []
                for scope in query.get("scope", []):
                    kind, name, _wanted = scope.split(":")
                    access.append({"type": kind, "name": name, "actions": actions})
                token = service.sign(query.get("service", [""])[0], user, access)
                body = json.dumps({"token": token}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        if tls is not None:   # the registry's own certificate: one CA for the client to trust
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.realm = f"{'https' if tls else 'http'}://{host}:{self.port}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def sign(self, audience: str, subject: str, access: list[dict[str, Any]]) -> str:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        certfile, key = (self.other_cert, self.other_key) if self.refuse else (self.certfile, self.key)
        cert = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
        der = cert.public_bytes(serialization.Encoding.DER)

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": "test-issuer", "sub": subject, "aud": audience, "exp": now + self.seconds - LEEWAY,
                  "nbf": now - 60, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        r, s = decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        token = f"{signing}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
        self.issued.append(token)
        return token

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Registry:
    """docker-registry on 127.0.0.1: ``auth`` "" (anonymous), "htpasswd" or "token"."""

    def __init__(self, directory: Path, *, auth: str = "", tls: bool = False,
                 redirect_to: str = "", anonymous_pull: bool = False, storage: Path | None = None,
                 token_seconds: int = 600, realm_host: str = "127.0.0.1") -> None:
        need_registry()
        self.dir = directory / f"registry-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir(parents=True)
        self.storage = storage or self.dir / "storage"
        self.storage.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls
        self.ca_pem = ""
        self.credentials = Credentials(USER, PASSWORD) if auth else None
        self.token: TokenService | None = None
        lines = [
            "version: 0.1",
            "log:", "  level: warn", "  formatter: text",
            "storage:", "  filesystem:", f"    rootdirectory: {self.storage}",
            "  delete:", "    enabled: true",
            "http:", f"  addr: 127.0.0.1:{self.port}",
        ]
        cert = key = ""
        if tls:
            certdir = self.dir / "tls"
            certdir.mkdir()
            cert, key = self_signed_cert(str(certdir))
            self.ca_pem = Path(cert).read_text()
            lines += ["  tls:", f"    certificate: {cert}", f"    key: {key}"]
        if auth == "htpasswd":
            if shutil.which("htpasswd") is None:
                pytest.skip("htpasswd (apache2-utils) is not installed")
            htpasswd = self.dir / "htpasswd"
            subprocess.run(["htpasswd", "-Bbc", str(htpasswd), USER, PASSWORD], check=True,
                           capture_output=True)
            lines += ["auth:", "  htpasswd:", "    realm: test-realm", f"    path: {htpasswd}"]
        elif auth == "token":
            self.token = TokenService(self.dir, anonymous_pull=anonymous_pull,
                                      tls=(cert, key) if tls else None, seconds=token_seconds,
                                      host=realm_host)
            lines += ["auth:", "  token:", f"    realm: {self.token.realm}", "    service: test-registry",
                      "    issuer: test-issuer", f"    rootcertbundle: {self.token.certfile}"]
        if redirect_to:
            lines += ["middleware:", "  storage:", "    - name: redirect", "      options:",
                      f"        baseurl: {redirect_to}"]
        (self.dir / "config.yml").write_text("\n".join(lines) + "\n")
        self.log = (self.dir / "registry.log").open("wb")
        self.proc = subprocess.Popen([BINARY, "serve", str(self.dir / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def prefix(self) -> str:
        return "oci://" if self.tls else "oci+http://"

    def ref(self, name: str) -> str:
        return f"{self.prefix}{self.host}/{name}"

    def _wait(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "registry.log").read_text()[-2000:]
                raise RuntimeError(f"docker-registry exited: {log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError("docker-registry did not start listening")

    def blob_gets(self, digest: str) -> list[tuple[int, int]]:
        """(status, bytes sent) of each GET of the blob ``digest``, from the registry's own
        access log."""
        self.log.flush()
        pattern = re.compile(rf'"GET /v2/[^ ]*/blobs/{re.escape(digest)} HTTP/1\.1" (\d+) (\d+)')
        text = (self.dir / "registry.log").read_text(errors="replace")
        return [(int(m[1]), int(m[2])) for m in pattern.finditer(text)]

    def blob_path(self, digest: str) -> Path:
        hexdigest = digest.partition(":")[2]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self.token is not None:
            self.token.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def registry(tmp: Path, **kw: Any) -> Iterator[Registry]:
    with Registry(tmp, **kw) as reg:
        yield reg


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
