"""A hostile registry and a hostile image layout (docs/oci.md, "What is refused"): a registry
of our own on 127.0.0.1 that answers what distribution never would (a manifest nested 200,000
deep, a token answer nested as deep), a real token realm on another loopback port that records
what it is sent, and deploy.image into a file disk. Each one refused by name, nothing written,
nothing sent where the operator did not send it."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.errors import Reason
from agent.images import oci, ocilayout
from agent.net import http
from agent.proto import agent_pb2, common_pb2
from tests.commands.test_deploy import Target, deploy
from tests.images.registry import Registry

DEEP = b"[" * 200_000

Answer = tuple[int, dict[str, str], bytes]


@contextmanager
def server(answer: Callable[[BaseHTTPRequestHandler], Answer], tls: tuple[str, str] | None = None
           ) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An HTTP server on 127.0.0.1 (HTTPS with ``tls``: certificate and key files) answering
    every GET and HEAD with ``answer(request)``; yields its port and the headers of every
    request it got."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            status, headers, body = answer(self)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1], seen
    finally:
        srv.shutdown()
        srv.server_close()


def oci_request(ref: str, **kw: Any) -> agent_pb2.DeployImageRequest:
    return agent_pb2.DeployImageRequest(url=ref, target=common_pb2.DiskHints(name="disk"), **kw)


# -- 1. one bounded JSON reader ------------------------------------------------------------


def test_a_manifest_nested_200000_deep_is_the_registrys_bad_document(tmp_path: Path) -> None:
    """Was ``internal: RecursionError``: now a RegistryError (source_failed) naming the depth,
    nothing written."""
    t = Target(tmp_path)

    def answer(req: BaseHTTPRequestHandler) -> Answer:
        digest = "sha256:" + hashlib.sha256(DEEP).hexdigest()
        return 200, {"Content-Type": oci.OCI_MANIFEST, "Docker-Content-Digest": digest}, DEEP

    with server(answer) as (port, _seen), pytest.raises(oci.RegistryError, match="nested deeper than") as err:
        deploy(oci_request(f"oci+http://127.0.0.1:{port}/os/node:1"), t.disks)
    assert err.value.reason == Reason.SOURCE_FAILED and t.untouched()


def test_a_token_answer_nested_200000_deep_is_the_registrys_bad_answer() -> None:
    def realm(req: BaseHTTPRequestHandler) -> Answer:
        return 200, {"Content-Type": "application/json"}, DEEP

    with server(realm) as (realm_port, _):
        def registry(req: BaseHTTPRequestHandler) -> Answer:
            return 401, {"WWW-Authenticate": f'Bearer realm="http://127.0.0.1:{realm_port}/token",'
                                             'service="reg"'}, b""

        with server(registry) as (port, _):
            reg = oci.Registry(oci.parse(f"oci+http://127.0.0.1:{port}/os/node:1"), http.HttpOptions())
            with pytest.raises(oci.RegistryError, match="token service's answer: JSON nested deeper"):
                reg.resolve(arch="amd64")


def test_an_image_layout_whose_index_is_nested_200000_deep(tmp_path: Path) -> None:
    root = tmp_path / "layout"
    root.mkdir()
    (root / ocilayout.LAYOUT_FILE).write_bytes(ocilayout.LAYOUT)
    (root / "index.json").write_bytes(DEEP)
    with pytest.raises(oci.RegistryError, match="nested deeper than"):
        ocilayout.resolve(root, arch="amd64")
    index = {"schemaVersion": 2, "manifests": [{"mediaType": oci.OCI_MANIFEST, "size": len(DEEP),
             "digest": "sha256:" + hashlib.sha256(DEEP).hexdigest(), "platform": {"architecture": "amd64"}}]}
    (root / "index.json").write_text(json.dumps(index))
    blob = ocilayout.blob_path(root, index["manifests"][0]["digest"])  # type: ignore[index]
    blob.parent.mkdir(parents=True)
    blob.write_bytes(DEEP)
    with pytest.raises(oci.RegistryError, match="nested deeper than"):
        ocilayout.resolve(root, arch="amd64")


# -- 2. credentials only where the operator sent them ---------------------------------------


@pytest.mark.parametrize("realm_host", ["127.0.0.1", "localhost"])
def test_a_token_realm_never_gets_the_deploys_headers(tmp_path: Path, realm_host: str) -> None:
    """A real registry behind the token flow, its realm on another loopback port (the
    registry's host; or ``localhost``, a host the request lists): the realm is asked for an
    anonymous token and sees none of the deploy's http_headers; the registry's origin does."""
    from tests.commands.test_deploy import sparse_image

    t = Target(tmp_path)
    img = sparse_image()
    (tmp_path / "disk.raw").write_bytes(img)
    secret = {"Authorization": "Basic b3BlcmF0b3I6aHVudGVyMg==", "X-Tenant-Key": "tenant-secret"}
    hosts = ["localhost"] if realm_host == "localhost" else []
    with Registry(tmp_path, auth="token", anonymous_pull=True, realm_host=realm_host) as reg:
        pusher = oci.Registry(oci.parse(reg.ref("os/node:1")), credentials=reg.credentials,
                              policy=oci.Policy(other_hosts=frozenset(hosts)))
        oci.push(pusher, tmp_path / "disk.raw", arch="amd64")
        assert reg.token is not None
        reg.token.seen.clear()
        r = deploy(oci_request(reg.ref("os/node:1"), http_headers=secret, registry_hosts=hosts), t.disks)
        seen = list(reg.token.seen)
    assert t.data()[: len(img)] == img and r.resolved_manifest
    assert seen, "the realm was never asked"
    for headers in seen:
        assert "authorization" not in headers and "x-tenant-key" not in headers, headers


# -- 3. Retry-After waited for, up to the deadline; no silent downgrade to http ---------------


class Artifact:
    """A registry of our own serving one artifact (a raw disk layer made by oci.prepare) at
    os/node:1, over TLS when ``tls``; ``before(kind, handler)`` may answer first (kind:
    "manifest" or "blob"), and ``times`` records when each request of a kind came."""

    def __init__(self, tmp: Path, img: bytes, *, tls: bool = False,
                 before: Callable[[str, BaseHTTPRequestHandler], Answer | None] | None = None) -> None:
        path = tmp / "disk.raw"
        path.write_bytes(img)
        self.img = img
        self.parts = oci.prepare(path, None, "amd64")
        self.before = before
        self.times: dict[str, list[float]] = {"manifest": [], "blob": []}
        self.tls = tls
        self.ca_pem = ""
        self._tmp = tmp

    def answer(self, req: BaseHTTPRequestHandler) -> Answer:
        import time

        kind = "manifest" if "/manifests/" in req.path else "blob" if "/blobs/" in req.path else ""
        if req.command == "GET" and kind:
            self.times[kind].append(time.monotonic())
        if kind and self.before is not None and req.command == "GET":
            early = self.before(kind, req)
            if early is not None:
                return early
        if kind == "manifest":
            return 200, {"Content-Type": oci.OCI_MANIFEST,
                         "Docker-Content-Digest": self.parts.manifest_digest}, self.parts.manifest
        if kind == "blob" and req.path.endswith(self.parts.disk.digest):
            return 200, {"Content-Type": "application/octet-stream"}, self.img
        return 404, {}, b""

    @contextmanager
    def serving(self) -> Iterator[str]:
        with server(self.answer) as (port, _seen):
            yield f"oci+http://127.0.0.1:{port}/os/node:1"


def test_a_retry_after_is_waited_for_and_said_in_the_progress(tmp_path: Path) -> None:
    """A 429 with Retry-After: 2 on the manifest, then a 503 with Retry-After: 2 on the blob:
    each retried after the 2 s asked (it was half a second), the wait said in the progress."""
    from agent.commands.base import Context
    from tests.commands.test_deploy import sparse_image

    t = Target(tmp_path)
    img = sparse_image()
    asked: set[str] = set()

    def before(kind: str, req: BaseHTTPRequestHandler) -> Answer | None:
        if kind in asked:
            return None
        asked.add(kind)
        return (429 if kind == "manifest" else 503), {"Retry-After": "2"}, b"slow down"

    art = Artifact(tmp_path, img, before=before)
    progress: list[str] = []
    ctx = Context.local("deploy.image", progress_sink=lambda p: progress.append(p.message))
    with art.serving() as ref:
        deploy(oci_request(ref), t.disks, ctx=ctx)
    assert t.data()[: len(img)] == img
    for kind in ("manifest", "blob"):
        first, second = art.times[kind][:2]
        assert second - first >= 1.9, (kind, second - first)
    assert sum("Retry-After" in m for m in progress) == 2, progress


def test_a_retry_after_past_the_deadline_is_refused_at_once(tmp_path: Path) -> None:
    """Retry-After: 3600 against a deploy with 30 s left: one request, refused naming the
    wait and the deadline (it was five retries in 16 s, then HTTP 429), nothing written."""
    from agent.commands.base import Context
    from tests.commands.test_deploy import sparse_image

    t = Target(tmp_path)
    art = Artifact(tmp_path, sparse_image(), before=lambda kind, req: (429, {"Retry-After": "3600"}, b""))
    ctx = Context.local("deploy.image", timeout=30)
    refused = r"Retry-After asks for 3600 s.*deadline"
    with art.serving() as ref, pytest.raises(oci.RegistryError, match=refused):
        deploy(oci_request(ref), t.disks, ctx=ctx)
    assert len(art.times["manifest"]) == 1 and t.untouched()


@contextmanager
def https_registry_redirecting_blobs_to_http(tmp_path: Path, img: bytes) -> Iterator[tuple[str, str]]:
    """An HTTPS registry (a test CA) whose blob answers 307 to the same bytes over plain http
    on another loopback port: yields the reference and the CA."""
    from tests.loopback_http import self_signed_cert

    plain = Artifact(tmp_path, img)
    certdir = tmp_path / "tls"
    certdir.mkdir()
    cert, key = self_signed_cert(str(certdir))
    with server(plain.answer) as (plain_port, _):
        def before(kind: str, req: BaseHTTPRequestHandler) -> Answer | None:
            if kind == "blob":
                return 307, {"Location": f"http://127.0.0.1:{plain_port}{req.path}"}, b""
            return None

        secure = Artifact(tmp_path, img, before=before)
        with server(secure.answer, tls=(cert, key)) as (port, _):
            yield f"oci://127.0.0.1:{port}/os/node:1", Path(cert).read_text()


@pytest.mark.parametrize("allowed", [False, True])
def test_an_https_registry_redirecting_a_blob_to_plain_http(tmp_path: Path, allowed: bool) -> None:
    from tests.commands.test_deploy import sparse_image

    t = Target(tmp_path)
    img = sparse_image()
    with https_registry_redirecting_blobs_to_http(tmp_path, img) as (ref, ca):
        req = oci_request(ref, ca_bundle_pem=ca, allow_plain_http_redirect=allowed)
        if allowed:
            deploy(req, t.disks)
            assert t.data()[: len(img)] == img
            return
        with pytest.raises(http.BadRedirect, match="from https to plain http"):
            deploy(req, t.disks)
    assert t.untouched()
