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
def server(answer: Callable[[BaseHTTPRequestHandler], Answer]) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An HTTP server on 127.0.0.1 answering every GET with ``answer(request)``; yields its port
    and the headers of every request it got."""
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
