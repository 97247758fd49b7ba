"""Routes to an OCI registry (site.httpProxy with an oci:// upstream) against a real registry
(docker-registry on 127.0.0.1): the site resolves the reference with its secret store's
credentials and adds the registry's authorization to its requests (the ramdisk's carry none);
with a chunk manifest layer, K ramdisk deploys at once fetch each data chunk from the registry
once (counted in the registry's own access log); a token that expires is renewed; a route
survives a restart of the site."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.errors import InvalidParameters, NotFound
from agent.images import manifest, oci
from agent.net import http
from agent.proto import agent_pb2, common_pb2, site_pb2
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.services import ServiceSettings, SiteServices
from tests.commands.test_deploy import Target, deploy, sparse_image
from tests.images.registry import PASSWORD, USER, Registry
from tests.site.serve.test_chunk_routes import get, running

K = 8


def settings_for(tmp: Path, reg: Registry, **more: object) -> ServiceSettings:
    secrets = tmp / "secrets"
    SecretStore(secrets).put("registry1", Credentials(USER, PASSWORD))
    ca = None
    if reg.ca_pem:
        ca = tmp / "registry-ca.pem"
        ca.write_text(reg.ca_pem)
    return ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0, root=tmp / "site",
                           secrets_dir=secrets, ca_file=ca, **more)  # type: ignore[arg-type]


def publish(reg: Registry, name: str, path: Path, *, chunks: bool = True) -> oci.Pushed:
    client = oci.Registry(oci.parse(reg.ref(name)), http.HttpOptions(ca_pem=reg.ca_pem),
                          credentials=reg.credentials)
    return oci.push(client, path, manifest.write(path)[0] if chunks else None, arch="amd64")


def add_registry_route(site: SiteServices, ref: str, **fields: object) -> site_pb2.HttpProxyResult:
    h = handler_for("site.httpProxy")
    assert h is not None
    msg = site_pb2.HttpProxyRequest(node_id="n1", upstream_url=ref, **fields)  # type: ignore[arg-type]
    result = h.run(Context.local("site.httpProxy", site=site), h.parse(msg))
    assert isinstance(result, site_pb2.HttpProxyResult)
    return result


def ramdisk_request(route: site_pb2.HttpProxyResult, name: str = "disk") -> agent_pb2.DeployImageRequest:
    """What a control plane sends the ramdisk: the route, the layer's digest, its chunk manifest
    (no credentials)."""
    return agent_pb2.DeployImageRequest(url=route.proxy_url, digest=route.disk_digest,
                                        manifest_inline=route.chunk_manifest,
                                        target=common_pb2.DiskHints(name=name))


def k_deploys_at_once(tmp_path: Path, route: site_pb2.HttpProxyResult,
                      ) -> tuple[list[Target], list[agent_pb2.DeployImageResult | BaseException]]:
    """K ramdisks deploying through ``route`` at once, each to a disk of its own under
    tmp_path/n<i>: their targets, and each one's result or what it raised."""
    for i in range(K):
        (tmp_path / f"n{i}").mkdir()
    targets = [Target(tmp_path / f"n{i}") for i in range(K)]
    results: list[agent_pb2.DeployImageResult | BaseException] = [ValueError()] * K

    def one(i: int) -> None:
        try:
            results[i] = deploy(ramdisk_request(route), targets[i].disks)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(K)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return targets, results


def test_k_deploys_fetch_each_chunk_from_the_registry_once(tmp_path: Path) -> None:
    img = sparse_image(24 << 20)
    path = tmp_path / "node.raw"
    path.write_bytes(img)
    plan = manifest.parse(manifest.build(path).SerializeToString())
    data_bytes = sum(s.length for s in plan.segments if s.digest is not None)
    with Registry(tmp_path, auth="htpasswd") as reg:
        pushed = publish(reg, "fleet/node:1", path)
        with running(settings_for(tmp_path, reg)) as site:
            route = add_registry_route(site, reg.ref("fleet/node:1"), credentials_ref="registry1")
            assert route.resolved_manifest == pushed.manifest_digest
            assert route.disk_digest.hex == pushed.disk.hex and route.chunk_manifest
            targets, results = k_deploys_at_once(tmp_path, route)
        gets = reg.blob_gets(pushed.disk.digest)
    for i, r in enumerate(results):
        assert isinstance(r, agent_pb2.DeployImageResult), r
        assert r.verification == "manifest" and targets[i].data()[: len(img)] == img
    # The registry sent each data chunk once, by its own Range request, for all K deploys.
    assert all(status == 206 for status, _ in gets), gets
    assert sum(n for _, n in gets) == data_bytes < len(img)
    assert len(gets) == sum(1 for s in plan.segments if s.digest is not None)


def test_k_deploys_of_a_blob_without_chunk_manifest_fetch_it_once(tmp_path: Path) -> None:
    """No chunk manifest: the route serves the whole blob from the store by its digest; the
    registry sends it once for K deploys at once (its own access log)."""
    img = sparse_image(8 << 20)
    path = tmp_path / "node.raw"
    path.write_bytes(img)
    with Registry(tmp_path, auth="htpasswd") as reg:
        pushed = publish(reg, "fleet/whole:1", path, chunks=False)
        with running(settings_for(tmp_path, reg)) as site:
            route = add_registry_route(site, reg.ref("fleet/whole:1"), credentials_ref="registry1")
            assert not route.chunk_manifest
            targets, results = k_deploys_at_once(tmp_path, route)
            assert site.store.has(pushed.disk.hex)
            status, headers, body = get(route.proxy_url, {"Range": "bytes=100-199"})
            assert status == 206 and body == img[100:200] and headers["ETag"].startswith('"b-')
        gets = reg.blob_gets(pushed.disk.digest)
    for i, r in enumerate(results):
        assert isinstance(r, agent_pb2.DeployImageResult), r
        assert r.digest.hex == pushed.disk.hex and targets[i].data()[: len(img)] == img
    assert gets == [(200, len(img))]


def test_blob_not_matching_is_not_stored_nor_served(tmp_path: Path) -> None:
    img = sparse_image(4 << 20)
    path = tmp_path / "node.raw"
    path.write_bytes(img)
    with Registry(tmp_path) as reg:
        pushed = publish(reg, "fleet/bad:1", path, chunks=False)
        stored = reg.blob_path(pushed.disk.digest)
        data = bytearray(stored.read_bytes())
        data[7] ^= 1
        stored.write_bytes(bytes(data))
        with running(settings_for(tmp_path, reg)) as site:
            route = add_registry_route(site, reg.ref("fleet/bad:1"))
            status, _headers, body = get(route.proxy_url)
            assert status == 502 and b"not served" in body
            assert not site.store.has(pushed.disk.hex)


def test_relay_over_tls_with_a_token_that_expires_and_a_restart(tmp_path: Path) -> None:
    """A blob larger than the store's budget is relayed; the token service's tokens last 2 s,
    so the second download needs a new one, which the site gets itself; after a restart the
    route makes its authorization again from its credentials_ref."""
    img = sparse_image(4 << 20)
    path = tmp_path / "node.raw"
    path.write_bytes(img)
    with Registry(tmp_path, auth="token", tls=True, token_seconds=2) as reg:
        pushed = publish(reg, "fleet/relay:1", path, chunks=False)
        settings = settings_for(tmp_path, reg, store_bytes=1 << 20)
        assert reg.token is not None
        with running(settings) as site:
            route = add_registry_route(site, reg.ref("fleet/relay:1"), credentials_ref="registry1")
            assert not route.chunk_manifest and route.disk_digest.hex == pushed.disk.hex
            status, _headers, body = get(route.proxy_url)
            assert status == 200 and body == img
            issued = len(reg.token.issued)
            time.sleep(3)                          # the token has expired
            status, _headers, body = get(route.proxy_url, {"Range": "bytes=10-19"})
            assert status == 206 and body == img[10:20]
            assert len(reg.token.issued) == issued + 1
        with running(settings) as site:
            t = Target(tmp_path)
            req = ramdisk_request(route)
            req.url = route.proxy_url.replace(route.proxy_url.split("/r/")[0], site.base_url)
            r = deploy(req, t.disks)
            assert r.digest.hex == pushed.disk.hex and t.data()[: len(img)] == img


def test_the_stores_download_renews_an_expired_token_at_its_resume(tmp_path: Path) -> None:
    """The site's download of a whole blob into its store is cut after 2 MiB by a forwarder in
    front of the registry, its resume held 3 s, and the token service's tokens last 2 s: the
    registry answers the Range request 401, the site answers the challenge once more and the
    blob is stored and served whole."""
    from tests.commands.test_deploy_oci import CuttingProxy

    img = sparse_image(8 << 20)
    path = tmp_path / "node.raw"
    path.write_bytes(img)
    with Registry(tmp_path, auth="token", token_seconds=2) as reg:
        pushed = publish(reg, "fleet/long:1", path, chunks=False)
        assert reg.token is not None
        proxy = CuttingProxy(reg.port, cut_after=2 << 20, hold=3.0)
        try:
            with running(settings_for(tmp_path, reg)) as site:
                route = add_registry_route(site, f"oci+http://127.0.0.1:{proxy.port}/fleet/long:1",
                                           credentials_ref="registry1")
                issued = len(reg.token.issued)
                status, _headers, body = get(route.proxy_url)
                assert status == 200 and body == img and proxy.cuts >= 1, body[:300]
                assert site.store.has(pushed.disk.hex)
                assert len(reg.token.issued) == issued + 1
        finally:
            proxy.close()
        gets = [status for status, _ in reg.blob_gets(pushed.disk.digest)]
    assert gets == [200, 401, 206]


def test_registry_route_refusals(tmp_path: Path) -> None:
    with Registry(tmp_path, auth="htpasswd") as reg:
        (tmp_path / "x.raw").write_bytes(sparse_image(2 << 20))
        publish(reg, "fleet/x:1", tmp_path / "x.raw")
        with running(settings_for(tmp_path, reg)) as site:
            with pytest.raises(NotFound, match="no such entry"):
                add_registry_route(site, reg.ref("fleet/x:1"), credentials_ref="nobody")
            with pytest.raises(oci.RegistryError, match="no whole-disk entry for architecture arm64"):
                add_registry_route(site, reg.ref("fleet/x:1"), credentials_ref="registry1",
                                   architecture="arm64")
            with pytest.raises(InvalidParameters, match="amd64 or arm64"):
                add_registry_route(site, reg.ref("fleet/x:1"), architecture="sparc")
            with pytest.raises(InvalidParameters, match="for an oci:// upstream"):
                add_registry_route(site, "http://127.0.0.1/img", credentials_ref="registry1")
            assert site.routes.all() == []


def test_a_new_version_fetches_only_what_changed(tmp_path: Path) -> None:
    """Version 2 of an image differs from version 1 in one chunk: through the site, the
    registry sends version 2's other chunks never again (the store holds them by digest)."""
    v1 = bytearray(sparse_image(16 << 20))
    v2 = bytearray(v1)
    v2[5 << 20: (5 << 20) + 4096] = b"\x01" * 4096          # one 4 MiB chunk changed
    paths = []
    for name, data in (("v1.raw", v1), ("v2.raw", v2)):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(bytes(data))
    with Registry(tmp_path) as reg:
        first = publish(reg, "fleet/node:1", paths[0])
        second = publish(reg, "fleet/node:2", paths[1])
        with running(settings_for(tmp_path, reg)) as site:
            for tag, data in (("1", v1), ("2", v2)):
                route = add_registry_route(site, reg.ref(f"fleet/node:{tag}"))
                (tmp_path / f"t{tag}").mkdir()
                t = Target(tmp_path / f"t{tag}")
                deploy(ramdisk_request(route), t.disks)
                assert t.data()[: len(data)] == data
        sent_v1 = sum(n for _, n in reg.blob_gets(first.disk.digest))
        sent_v2 = sum(n for _, n in reg.blob_gets(second.disk.digest))
    assert sent_v1 > 4 << 20
    assert sent_v2 == 4 << 20               # the changed chunk only


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
def test_a_qcow2_layer_through_a_route_streams_by_its_digest(tmp_path: Path) -> None:
    """A qcow2 layer pushed with its chunk manifest: the route serves the whole blob from the
    store, the result gives no chunk manifest, and two ramdisks write the raw image through
    the qcow2 file's tables; the registry sends the blob once."""
    img = sparse_image(8 << 20)
    (tmp_path / "node.raw").write_bytes(img)
    path = tmp_path / "node.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(tmp_path / "node.raw"), str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    with Registry(tmp_path, auth="htpasswd") as reg:
        pushed = publish(reg, "fleet/q:1", path)
        with running(settings_for(tmp_path, reg)) as site:
            route = add_registry_route(site, reg.ref("fleet/q:1"), credentials_ref="registry1")
            assert not route.chunk_manifest and route.disk_digest.hex == pushed.disk.hex
            results = []
            for i in range(2):
                (tmp_path / f"n{i}").mkdir()
                t = Target(tmp_path / f"n{i}")
                results.append(deploy(ramdisk_request(route), t.disks))
                assert t.data()[: len(img)] == img
        gets = reg.blob_gets(pushed.disk.digest)
    assert all(r.format == agent_pb2.ImageFormat.QCOW2 and r.verification == "digest" for r in results)
    assert gets == [(200, path.stat().st_size)]
