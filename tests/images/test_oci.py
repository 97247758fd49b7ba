"""agent/images/oci.py against a real registry (Debian's docker-registry on 127.0.0.1):
references, push and resolve, anonymous, htpasswd over TLS and the Bearer token flow, and the
refusals (a bound passed, no entry for the platform, every token refused, a redirect to
another host, a blob whose bytes are not its digest)."""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.errors import AuthFailed, ChecksumMismatch, InvalidParameters, Reason
from agent.images import manifest, oci
from agent.net import http
from tests.images.registry import Registry

MiB = 1 << 20


def disk_file(tmp: Path, name: str = "disk.raw", size: int = 4 * MiB) -> Path:
    path = tmp / name
    path.write_bytes(os.urandom(MiB) + bytes(size - MiB))
    return path


def client(reg: Registry, name: str, *, creds: bool = True, **policy: object) -> oci.Registry:
    return oci.Registry(oci.parse(reg.ref(name)), http.HttpOptions(ca_pem=reg.ca_pem, max_retries=1),
                        credentials=reg.credentials if creds else None,
                        policy=oci.Policy(**policy))  # type: ignore[arg-type]


def read_blob(c: oci.Registry, desc: oci.Descriptor) -> bytes:
    with c.open_blob(desc) as body:
        return b"".join(body.iter_chunks())


# -- references ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ("oci://reg.example/os/ubuntu:24.04", ("https", "reg.example", "os/ubuntu", "24.04", "")),
    ("oci://reg.example:5000/ubuntu", ("https", "reg.example:5000", "ubuntu", "latest", "")),
    ("oci+http://127.0.0.1:5000/a/b-c/d__e@sha256:" + "ab" * 32,
     ("http", "127.0.0.1:5000", "a/b-c/d__e", "", "sha256:" + "ab" * 32)),
    ("oci://[::1]:5000/x:v1", ("https", "[::1]:5000", "x", "v1", "")),
])
def test_reference_parses(text: str, want: tuple[str, ...]) -> None:
    ref = oci.parse(text)
    assert (ref.scheme, ref.host, ref.repository, ref.tag, ref.digest) == want
    assert oci.parse(str(ref)) == ref


@pytest.mark.parametrize("text", [
    "https://reg.example/os:1", "oci://reg.example/OS/ubuntu:1", "oci://reg.example/os:bad tag",
    "oci://reg.example/os@sha256:abc", "oci://user@reg.example/os:1", "oci://reg.example/",
    "oci://reg.example/os/../x:1", "oci://reg.example/os:-x", "oci://reg.exämple/os:1",
    "oci://reg.example/os:1\r\nX: y",
])
def test_reference_refused(text: str) -> None:
    with pytest.raises(InvalidParameters):
        oci.parse(text)


def test_node_arch() -> None:
    assert oci.node_arch("x86_64") == "amd64" and oci.node_arch("aarch64") == "arm64"
    with pytest.raises(Exception, match="no OCI architecture"):
        oci.node_arch("mips")


# -- push and resolve --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["anonymous", "htpasswd-tls", "token"])
def test_push_then_resolve(tmp_path: Path, kind: str) -> None:
    auth = {"anonymous": "", "htpasswd-tls": "htpasswd", "token": "token"}[kind]
    img = disk_file(tmp_path)
    man, _, _ = manifest.write(img)
    with Registry(tmp_path, auth=auth, tls=kind == "htpasswd-tls") as reg:
        pushed = oci.push(client(reg, "os/test:v1"), img, man, arch="amd64")
        assert pushed.uploaded > img.stat().st_size
        again = oci.push(client(reg, "os/test:v2"), img, man, arch="amd64")
        assert again.uploaded == 0                       # the registry had every blob already
        art = client(reg, "os/test:v1").resolve(arch="amd64")
        assert art.manifest_digest == pushed.manifest_digest and art.index_digest == pushed.index_digest
        assert art.format == oci.Fmt.RAW
        assert art.disk.digest == "sha256:" + hashlib.sha256(img.read_bytes()).hexdigest()
        c = client(reg, "os/test:v1")
        assert read_blob(c, c.resolve(arch="amd64").disk) == img.read_bytes()
        assert art.chunk_manifest is not None and c.blob_bytes(art.chunk_manifest) == man.read_bytes()
        pinned = client(reg, f"os/test@{pushed.manifest_digest}").resolve(arch="amd64")
        assert pinned.manifest_digest == pushed.manifest_digest and not pinned.index_digest
        if kind == "token":
            assert reg.token is not None and reg.token.requests >= 2 and reg.token.issued
        if auth:
            with pytest.raises(AuthFailed):
                client(reg, "os/test:v1", creds=False).resolve(arch="amd64")


def test_index_keeps_other_architectures(tmp_path: Path) -> None:
    amd, arm = disk_file(tmp_path, "amd.raw"), disk_file(tmp_path, "arm.raw")
    with Registry(tmp_path) as reg:
        oci.push(client(reg, "os/multi:1"), amd, arch="amd64")
        oci.push(client(reg, "os/multi:1"), arm, arch="arm64")
        got = {arch: client(reg, "os/multi:1").resolve(arch=arch).disk.digest for arch in ("amd64", "arm64")}
        assert got == {"amd64": "sha256:" + hashlib.sha256(amd.read_bytes()).hexdigest(),
                       "arm64": "sha256:" + hashlib.sha256(arm.read_bytes()).hexdigest()}


def test_plain_manifest_and_compressed_media_type(tmp_path: Path) -> None:
    import gzip

    gz = tmp_path / "disk.raw.gz"
    gz.write_bytes(gzip.compress(disk_file(tmp_path).read_bytes(), 1))
    with Registry(tmp_path) as reg:
        pushed = oci.push(client(reg, "os/gz:1"), gz, arch="amd64", index=False)
        art = client(reg, "os/gz:1").resolve(arch="arm64")   # no index: no platform to choose
        assert art.manifest_digest == pushed.manifest_digest and art.format == oci.Fmt.GZIP
        assert art.disk.media_type == oci.DISK_PREFIX + "raw+gzip"


# -- refusals --------------------------------------------------------------------------------


def test_index_without_the_platform(tmp_path: Path) -> None:
    with Registry(tmp_path) as reg:
        oci.push(client(reg, "os/arm:1"), disk_file(tmp_path), arch="arm64")
        with pytest.raises(oci.RegistryError, match="no whole-disk entry for architecture amd64") as err:
            client(reg, "os/arm:1").resolve(arch="amd64")
        assert err.value.reason == Reason.NOT_FOUND


def test_manifest_over_the_bound(tmp_path: Path) -> None:
    with Registry(tmp_path) as reg:
        oci.push(client(reg, "os/big:1"), disk_file(tmp_path), arch="amd64")
        with pytest.raises(oci.RegistryError, match="larger than the 100 bytes") as err:
            client(reg, "os/big:1", max_manifest=100).resolve(arch="amd64")
        assert err.value.reason == Reason.TOO_LARGE


def test_every_token_refused(tmp_path: Path) -> None:
    with Registry(tmp_path, auth="token") as reg:
        oci.push(client(reg, "os/t:1"), disk_file(tmp_path), arch="amd64")
        assert reg.token is not None
        reg.token.refuse = True        # tokens signed by a key the registry does not trust
        with pytest.raises(AuthFailed, match="HTTP 401"):
            client(reg, "os/t:1").resolve(arch="amd64")


def test_bad_credentials_at_the_token_service(tmp_path: Path) -> None:
    with Registry(tmp_path, auth="token") as reg:
        c = client(reg, "os/t:1", creds=False)
        c.credentials = oci.Credentials("publisher", "wrong")
        with pytest.raises(AuthFailed, match="token service refused the credentials"):
            c.resolve(arch="amd64")


def test_untrusted_tls(tmp_path: Path) -> None:
    with Registry(tmp_path, tls=True) as reg:
        c = oci.Registry(oci.parse(reg.ref("os/x:1")), http.HttpOptions(max_retries=0))
        with pytest.raises(http.HttpError, match="not trusted"):
            c.resolve(arch="amd64")


def test_blob_bytes_not_matching_the_digest(tmp_path: Path) -> None:
    img = disk_file(tmp_path)
    man, _, _ = manifest.write(img)
    with Registry(tmp_path) as reg:
        pushed = oci.push(client(reg, "os/bad:1"), img, man, arch="amd64")
        assert pushed.chunk_manifest is not None
        stored = reg.blob_path(pushed.chunk_manifest.digest)
        data = bytearray(stored.read_bytes())
        data[10] ^= 0xFF
        stored.write_bytes(bytes(data))      # the registry's storage, changed behind its back
        c = client(reg, "os/bad:1")
        with pytest.raises(ChecksumMismatch, match="its bytes are"):
            c.blob_bytes(c.resolve(arch="amd64").chunk_manifest)  # type: ignore[arg-type]


def serve_directory(root: Path) -> tuple[ThreadingHTTPServer, int]:
    """A plain HTTP server on 127.0.0.1 serving ``root``: the "blob storage" a registry's
    redirect middleware sends clients to (by the name localhost: another host than 127.0.0.1)."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


def test_redirect_to_another_host(tmp_path: Path) -> None:
    img = disk_file(tmp_path)
    storage = tmp_path / "blob-storage"
    storage.mkdir()
    server, port = serve_directory(storage)
    try:
        with Registry(tmp_path, storage=storage,
                      redirect_to=f"http://localhost:{port}/") as reg:
            oci.push(client(reg, "os/r:1"), img, arch="amd64")
            art = client(reg, "os/r:1").resolve(arch="amd64")
            with pytest.raises(oci.RegistryError, match="refused to connect to localhost"):
                read_blob(client(reg, "os/r:1"), art.disk)
            allowed = client(reg, "os/r:1", other_hosts=frozenset({"localhost"}))
            assert read_blob(allowed, art.disk) == img.read_bytes()
    finally:
        server.shutdown()
        server.server_close()
