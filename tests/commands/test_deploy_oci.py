"""deploy.image from an oci:// reference, against a real registry (docker-registry on
127.0.0.1), images pushed by our own push, deployed into a file disk."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.commands.deploy import DeployImage
from agent.errors import AuthFailed, ChecksumMismatch, InvalidParameters, Reason
from agent.images import manifest, oci
from agent.net import http
from agent.proto import agent_pb2, common_pb2
from tests.commands.test_deploy import Target, deploy, sparse_image
from tests.diskfixtures import MiB
from tests.images.registry import Registry

Fmt = agent_pb2.ImageFormat


def publish(reg: Registry, name: str, path: Path, *, chunks: bool = False, arch: str = "amd64",
            index: bool = True) -> oci.Pushed:
    man = manifest.write(path)[0] if chunks else None
    client = oci.Registry(oci.parse(reg.ref(name)), http.HttpOptions(ca_pem=reg.ca_pem),
                          credentials=reg.credentials)
    return oci.push(client, path, man, arch=arch, index=index)


def oci_request(ref: str, **kw: object) -> agent_pb2.DeployImageRequest:
    return agent_pb2.DeployImageRequest(url=ref, target=common_pb2.DiskHints(name="disk"),
                                        **kw)  # type: ignore[arg-type]


def image_file(tmp: Path, data: bytes, name: str = "disk.raw") -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def test_tag_resolved_once_and_reported(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "os/node:1", image_file(tmp_path, img))
        r = deploy(oci_request(reg.ref("os/node:1")), t.disks)
    assert t.data()[: len(img)] == img
    assert r.verification == "digest" and r.format == Fmt.RAW
    assert r.digest.hex == hashlib.sha256(img).hexdigest() == pushed.disk.hex
    assert r.resolved_manifest == pushed.manifest_digest


def test_chunk_manifest_layer_verifies_every_chunk(tmp_path: Path) -> None:
    """Over TLS with the registry's CA, behind the token service (anonymous pull), the image
    pinned by its manifest digest: the chunk manifest layer makes it a manifest deploy."""
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path, tls=True, auth="token", anonymous_pull=True) as reg:
        pushed = publish(reg, "os/node:2", image_file(tmp_path, img), chunks=True)
        ref = reg.ref(f"os/node@{pushed.manifest_digest}")
        r = deploy(oci_request(ref, ca_bundle_pem=reg.ca_pem), t.disks)
        assert reg.token is not None and reg.token.issued
    assert t.data()[: len(img)] == img
    assert r.verification == "manifest" and r.chunks_verified >= 3 and r.zero_chunks >= 1
    assert r.resolved_manifest == pushed.manifest_digest
    assert r.source_bytes < len(img)          # Range requests of the data runs only


def test_compressed_layer(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path) as reg:
        publish(reg, "os/gz:1", image_file(tmp_path, gzip.compress(img, 1), "disk.raw.gz"))
        r = deploy(oci_request(reg.ref("os/gz:1")), t.disks)
    assert t.data()[: len(img)] == img and r.format == Fmt.GZIP and r.image_bytes == len(img)


def test_request_digest_must_be_the_layers(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path) as reg:
        publish(reg, "os/node:1", image_file(tmp_path, img))
        req = oci_request(reg.ref("os/node:1"),
                          digest=common_pb2.Digest(algorithm="sha256", hex="0" * 64))
        with pytest.raises(InvalidParameters, match="not the registry's digest"):
            deploy(req, t.disks)
        ok = oci_request(reg.ref("os/node:1"),
                         digest=common_pb2.Digest(algorithm="sha256", hex=hashlib.sha256(img).hexdigest()))
        assert t.untouched()
        deploy(ok, t.disks)
    assert t.data()[: len(img)] == img


def test_blob_not_matching_its_digest(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "os/bad:1", image_file(tmp_path, img))
        stored = reg.blob_path(pushed.disk.digest)
        data = bytearray(stored.read_bytes())
        data[5 * MiB] ^= 1
        stored.write_bytes(bytes(data))
        with pytest.raises(ChecksumMismatch):
            deploy(oci_request(reg.ref("os/bad:1")), t.disks)
    assert t.ends_cleared()                   # no half image can boot
    # and, as docs/oci.md says, between the ends: the unverified bytes, the changed one included
    assert t.data()[4 * MiB: len(img)] == bytes(data[4 * MiB:])


def test_blob_not_matching_with_chunk_manifest_never_writes_the_bad_chunk(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "os/bad:2", image_file(tmp_path, img), chunks=True)
        stored = reg.blob_path(pushed.disk.digest)
        data = bytearray(stored.read_bytes())
        data[3 * MiB + 7] ^= 1
        stored.write_bytes(bytes(data))
        with pytest.raises(ChecksumMismatch, match="chunk 0 at offset 0"):
            deploy(oci_request(reg.ref("os/bad:2")), t.disks)
    assert bytes(data[3 * MiB: 4 * MiB]) not in t.data()
    assert t.ends_cleared()


def test_index_without_the_nodes_platform(tmp_path: Path) -> None:
    t = Target(tmp_path)
    with Registry(tmp_path) as reg:
        publish(reg, "os/arm:1", image_file(tmp_path, sparse_image()), arch="arm64")
        with pytest.raises(oci.RegistryError, match="no whole-disk entry for architecture") as err:
            deploy(oci_request(reg.ref("os/arm:1")), t.disks)
    assert err.value.reason == Reason.NOT_FOUND and t.untouched()


def test_registry_that_wants_credentials(tmp_path: Path) -> None:
    """A node holds no registry credentials: an htpasswd registry refuses it, nothing written
    (the site's route adds the authorization: docs/oci.md)."""
    t = Target(tmp_path)
    with Registry(tmp_path, auth="htpasswd") as reg:
        publish(reg, "os/private:1", image_file(tmp_path, sparse_image()))
        with pytest.raises(AuthFailed):
            deploy(oci_request(reg.ref("os/private:1")), t.disks)
    assert t.untouched()


@pytest.mark.parametrize(("url", "hosts", "match"), [
    ("oci://reg.example/OS:1", [], "bad repository"),
    ("https://reg.example/img", ["cdn.example"], "oci:// source only"),
    ("oci://reg.example/os:1", ["cdn.example:443"], "not a host name"),
    ("oci://reg.example/os:1", [f"h{i}.example" for i in range(17)], "at most 16"),
])
def test_bad_oci_parameters(url: str, hosts: list[str], match: str) -> None:
    req = oci_request(url, registry_hosts=hosts)
    if url.startswith("https"):
        req.digest.CopyFrom(common_pb2.Digest(algorithm="sha256", hex="0" * 64))
    with pytest.raises(InvalidParameters, match=match):
        DeployImage(disks=list).parse(req)


def test_redirect_to_blob_storage_only_where_the_request_allows(tmp_path: Path) -> None:
    """The registry's redirect middleware sends blob GETs to "blob storage" by the name
    localhost (another host than 127.0.0.1): refused with nothing written, then followed when
    the request lists it in registry_hosts (the registry's token never goes there)."""
    from tests.images.test_oci import serve_directory

    t = Target(tmp_path)
    img = sparse_image()
    storage = tmp_path / "blob-storage"
    storage.mkdir()
    server, port = serve_directory(storage)
    try:
        with Registry(tmp_path, storage=storage, redirect_to=f"http://localhost:{port}/") as reg:
            pushed = publish(reg, "os/r:1", image_file(tmp_path, img), chunks=True)
            with pytest.raises(oci.RegistryError, match="refused to connect to localhost"):
                deploy(oci_request(reg.ref("os/r:1")), t.disks)
            assert t.untouched()
            r = deploy(oci_request(reg.ref("os/r:1"), registry_hosts=["localhost"]), t.disks)
    finally:
        server.shutdown()
        server.server_close()
    assert t.data()[: len(img)] == img and r.resolved_manifest == pushed.manifest_digest


class CuttingProxy:
    """A TCP forwarder to the registry on 127.0.0.1 that cuts the first connection through
    which more than ``cut_after`` bytes came back (the blob's download), once; the first
    connection made after the cut waits ``hold`` seconds before it is forwarded (``on_cut``
    runs at the cut)."""

    def __init__(self, port: int, cut_after: int, hold: float = 0.0,
                 on_cut: Callable[[], None] | None = None) -> None:
        import socket
        import threading

        self.target, self.cut_after, self.cuts = port, cut_after, 0
        self.hold, self.on_cut, self.held = hold, on_cut, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                held = self.cuts > 0 and self.held == 0
                self.held += held
            threading.Thread(target=self._forward, args=(client, held), daemon=True).start()

    def _forward(self, client: object, held: bool) -> None:
        import socket
        import threading
        import time

        assert isinstance(client, socket.socket)
        if held:
            time.sleep(self.hold)
        upstream = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: object, dst: object, back: bool) -> None:
        import socket

        assert isinstance(src, socket.socket) and isinstance(dst, socket.socket)
        moved = 0
        try:
            while data := src.recv(1 << 16):
                moved += len(data)
                if back and moved > self.cut_after:
                    with self._lock:
                        cut, self.cuts = self.cuts == 0, self.cuts + 1
                    if cut:
                        if self.on_cut is not None:
                            self.on_cut()
                        dst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        dst.shutdown(socket.SHUT_RDWR)   # now, whatever the other direction's thread does
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.sock.close()


def test_a_dropped_blob_download_resumes_by_range(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "os/node:1", image_file(tmp_path, img))
        proxy = CuttingProxy(reg.port, cut_after=2 << 20)
        try:
            r = deploy(oci_request(f"oci+http://127.0.0.1:{proxy.port}/os/node:1"), t.disks)
        finally:
            proxy.close()
        gets = reg.blob_gets(pushed.disk.digest)
    assert t.data()[: len(img)] == img and r.resumes == 1 and proxy.cuts >= 1
    assert [status for status, _ in gets] == [200, 206]     # the resume: a Range request


def _token_deploy(tmp_path: Path, *, refuse_at_cut: bool) -> tuple[
        Target, bytes, oci.Pushed, list[int], CuttingProxy, int, object]:
    """A direct deploy from a node (no site; no credentials: anonymous pull through the token
    flow, tokens lasting 2 s) whose blob download is cut after 2 MiB, its resume held 3 s:
    the token has expired when the Range request reaches the registry. Returns the statuses of
    the registry's blob GETs (its access log), the tokens issued for the deploy, and the deploy's
    result or the exception it raised."""
    t = Target(tmp_path)
    img = sparse_image()
    with Registry(tmp_path, auth="token", anonymous_pull=True, token_seconds=2) as reg:
        token = reg.token
        assert token is not None
        pushed = publish(reg, "os/node:1", image_file(tmp_path, img))

        def refuse() -> None:
            token.refuse = refuse_at_cut      # from now on, tokens the registry does not take

        before = len(token.issued)
        proxy = CuttingProxy(reg.port, cut_after=2 << 20, hold=3.0, on_cut=refuse)
        outcome: object
        try:
            outcome = deploy(oci_request(f"oci+http://127.0.0.1:{proxy.port}/os/node:1"), t.disks)
        except Exception as exc:   # handed to the test
            outcome = exc
        finally:
            proxy.close()
        gets = [status for status, _ in reg.blob_gets(pushed.disk.digest)]
        return t, img, pushed, gets, proxy, len(token.issued) - before, outcome


def test_a_resume_after_the_token_expired_renews_it_once_and_goes_on(tmp_path: Path) -> None:
    t, img, pushed, gets, proxy, issued, r = _token_deploy(tmp_path, refuse_at_cut=False)
    assert isinstance(r, agent_pb2.DeployImageResult), r
    assert t.data()[: len(img)] == img and r.digest.hex == pushed.disk.hex
    assert r.resumes == 1 and proxy.cuts >= 1
    # The registry refused the resume's first Range request (the token expired), took the
    # renewed token's: one token at the start and one more at the resume.
    assert gets == [200, 401, 206]
    assert issued == 2


def test_a_renewed_token_refused_again_fails_the_deploy_without_a_loop(tmp_path: Path) -> None:
    t, img, _pushed, gets, _proxy, issued, r = _token_deploy(tmp_path, refuse_at_cut=True)
    assert isinstance(r, http.HttpError) and r.status == 401, r
    assert t.data()[: len(img)] != img
    assert gets == [200, 401, 401]
    assert issued == 2         # renewed once, not again


def _qcow2(tmp: Path, img: bytes, *opts: str) -> Path:
    raw, out = tmp / "q.raw", tmp / f"q{len(opts)}.qcow2"
    raw.write_bytes(img)
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", *opts, str(raw), str(out)],
                   check=True, stdin=subprocess.DEVNULL)
    return out


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
@pytest.mark.parametrize("opts", [(), ("-c",)], ids=["plain", "compressed"])
def test_qcow2_layer_streams_from_the_registry(tmp_path: Path, opts: tuple[str, ...]) -> None:
    """A qcow2 layer (pushed with its chunk manifest, which the streamed deploy leaves aside)
    deployed from the registry through its tables; the disk holds the raw image."""
    t = Target(tmp_path)
    img = bytearray(sparse_image())
    img[6 * MiB: 7 * MiB] = (b"compressible " * (MiB // 13 + 1))[:MiB]
    path = _qcow2(tmp_path, bytes(img), *opts)
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "os/q:1", path, chunks=True)
        r = deploy(oci_request(reg.ref("os/q:1")), t.disks)
    assert t.data()[: len(img)] == img
    assert r.format == Fmt.QCOW2 and r.verification == "digest"
    assert r.digest.hex == pushed.disk.hex == hashlib.sha256(path.read_bytes()).hexdigest()
    assert r.source_bytes == path.stat().st_size and r.resolved_manifest == pushed.manifest_digest


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
def test_tampered_qcow2_layer_refused(tmp_path: Path) -> None:
    t = Target(tmp_path)
    path = _qcow2(tmp_path, sparse_image())
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "os/q:2", path)
        stored = reg.blob_path(pushed.disk.digest)
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 1                   # inside a data cluster: the tables parse
        stored.write_bytes(bytes(data))
        with pytest.raises(ChecksumMismatch):
            deploy(oci_request(reg.ref("os/q:2")), t.disks)
    assert t.ends_cleared()                         # no half image can boot
