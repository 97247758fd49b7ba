"""Proxy routes with a manifest: the image served from the site's chunk store through the real
HTTP service, from a real loopback upstream, to real clients (agent/net/http.py and deploy.image
onto a file disk). Each data chunk is fetched once, verified, stored and only then served;
zeros are never fetched; a lying or dying upstream, a wrong manifest and a restart are
answered without a bad byte served or stored."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.errors import ChecksumMismatch, InvalidParameters, SourceFailed
from agent.net import http as agent_http
from agent.proto import site_pb2
from agent.site.chunkstore import StoreFull
from agent.site.serve.chunkroute import parse_range
from agent.site.services import ServiceSettings, SiteServices
from tests.commands.test_deploy import Target, deploy
from tests.commands.test_deploy_manifest import CHUNK, image_with_gaps, make_manifest, with_manifest
from tests.loopback_http import Fault, LoopbackServer
from tests.runtime.harness import wait_until
from tests.site.bmc.sushy import free_port

DATA_CHUNKS = (0, 3, 4, 8, 11, 12)   # image_with_gaps' data chunks (12: the odd tail)


@pytest.fixture
def image(tmp_path: Path) -> tuple[bytes, bytes]:
    """A 12 MiB + 100 image (5 data chunks of 1 MiB and a 100-byte tail) and its manifest."""
    img = image_with_gaps()
    m = make_manifest(tmp_path, img).SerializeToString()
    return img, m


def add_route(site: SiteServices, upstream_url: str, manifest_url: str, manifest: bytes,
              **fields: object) -> str:
    h = handler_for("site.httpProxy")
    assert h is not None
    msg = site_pb2.HttpProxyRequest(node_id="n1", upstream_url=upstream_url, **fields)  # type: ignore[arg-type]
    msg.manifest.url = manifest_url
    msg.manifest.digest.hex = hashlib.sha256(manifest).hexdigest()
    result = h.run(Context.local("site.httpProxy", site=site), h.parse(msg))
    assert isinstance(result, site_pb2.HttpProxyResult)
    return result.proxy_url


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=20)
    try:
        conn.request("GET", parts.path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def chunk_ranges(srv: LoopbackServer, path: str = "/img") -> list[str]:
    return [h.get("Range", "") for m, p, h in srv.requests if p == path and m == "GET"]


def digest_of(img: bytes, index: int) -> str:
    return hashlib.sha256(img[index * CHUNK:(index + 1) * CHUNK]).hexdigest()


@contextlib.contextmanager
def upstream_of(img: bytes, m: bytes) -> Iterator[LoopbackServer]:
    """A loopback upstream serving the image at /img and its manifest at /img.manifest."""
    with LoopbackServer() as srv:
        srv.add("/img", img)
        srv.add("/img.manifest", m)
        yield srv


@contextlib.contextmanager
def running(settings: ServiceSettings) -> Iterator[SiteServices]:
    """The site's services with ``settings``, installed as the process's, stopped after."""
    site = SiteServices(settings)
    site.start()
    try:
        yield site
    finally:
        site.stop()


def stored(site: SiteServices) -> list[str]:
    return sorted(p.name for p in site.store.root.iterdir())


def test_served_from_the_store_each_chunk_fetched_once(site: SiteServices,
                                                       image: tuple[bytes, bytes]) -> None:
    img, m = image
    with LoopbackServer() as srv:
        url = add_route(site, srv.add("/img", img), srv.add("/img.manifest", m), m)
        status, headers, body = get(url)
        assert status == 200 and body == img and headers["Content-Length"] == str(len(img))
        assert headers["Accept-Ranges"] == "bytes" and headers["ETag"].startswith('"m-')
        first = chunk_ranges(srv)
        wanted = [f"bytes={i * CHUNK}-{min((i + 1) * CHUNK, len(img)) - 1}" for i in DATA_CHUNKS]
        assert sorted(first) == sorted(wanted), "each data chunk once, by its own range; no zeros"
        assert srv.sent("/img") == 5 * CHUNK + 100
        # Again, and through agent/net/http.py with a Range in the middle of chunks: all from the store.
        assert get(url)[2] == img
        with agent_http.get(url, agent_http.HttpOptions(timeout=10), offset=CHUNK * 3 + 5,
                            length=2 * CHUNK) as dl:
            assert b"".join(dl.iter_chunks()) == img[CHUNK * 3 + 5: CHUNK * 5 + 5]
        assert chunk_ranges(srv) == first
    wait_until(lambda: len(stored(site)) == 6, 10, "the chunks stored")
    assert stored(site) == sorted(hashlib.sha256(img[i * CHUNK:(i + 1) * CHUNK]).hexdigest()
                                  for i in DATA_CHUNKS)
    mt = site.metrics
    assert mt.value("chunks_verified_total") == 6 and mt.value("chunks_rejected_total") == 0
    assert mt.value("upstream_bytes_fetched_total") == 5 * CHUNK + 100
    assert mt.value("store_bytes") == 5 * CHUNK + 100


def test_ranges(site: SiteServices, image: tuple[bytes, bytes]) -> None:
    img, m = image
    with LoopbackServer() as srv:
        url = add_route(site, srv.add("/img", img), srv.add("/img.manifest", m), m)
        status, headers, body = get(url, {"Range": f"bytes={CHUNK - 10}-{3 * CHUNK + 9}"})
        assert status == 206 and body == img[CHUNK - 10: 3 * CHUNK + 10]
        assert headers["Content-Range"] == f"bytes {CHUNK - 10}-{3 * CHUNK + 9}/{len(img)}"
        assert get(url, {"Range": "bytes=-50"})[2] == img[-50:]
        assert get(url, {"Range": f"bytes={len(img)}-"})[0] == 416
        assert get(url, {"Range": "bytes=0-1,5-6"})[0] == 200           # several: the whole image
        status, _, body = get(url, {"Range": "bytes=10-", "If-Range": '"another"'})
        assert status == 200 and body == img                               # another version
        tag = get(url, {"Range": "bytes=0-0"})[1]["ETag"]
        assert get(url, {"Range": "bytes=10-", "If-Range": tag})[0] == 206


@pytest.mark.parametrize(("header", "expected"), [
    (None, None), ("bytes=0-9", (0, 10)), ("bytes=5-", (5, 100)), ("bytes=-10", (90, 100)),
    ("bytes=-0", "unsatisfiable"), ("bytes=100-", "unsatisfiable"), ("bytes=90-200", (90, 100)),
    ("bytes=9-3", None), ("items=0-9", None), ("bytes=a-b", None), ("bytes=1-2,4-5", None),
    ("bytes=-", None),
])
def test_parse_range(header: str | None, expected: object) -> None:
    assert parse_range(header, 100) == expected


def test_concurrent_clients_share_one_fetch_per_chunk(site: SiteServices, image: tuple[bytes, bytes]) -> None:
    img, m = image
    with LoopbackServer() as srv:
        # Slow enough that the eight clients ask for chunks that are still being fetched.
        url = add_route(site, srv.add("/img", img, fault=Fault(delay=0.01)),
                        srv.add("/img.manifest", m), m)
        bodies: list[bytes] = []
        errors: list[BaseException] = []

        def client() -> None:
            try:
                bodies.append(get(url)[2])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and bodies == [img] * 8
        ranges = chunk_ranges(srv)
        assert len(ranges) == len(set(ranges)) == len(DATA_CHUNKS), ranges
    assert site.metrics.value("upstream_bytes_fetched_total") == 5 * CHUNK + 100


def test_deploy_through_the_route(tmp_path: Path, site: SiteServices, image: tuple[bytes, bytes]) -> None:
    """deploy.image with its own (signed) manifest, through a route with the same manifest: the
    ramdisk's Range requests of the data runs are answered from the store."""
    img, m = image
    with LoopbackServer() as srv:
        url = add_route(site, srv.add("/img", img), srv.add("/img.manifest", m), m)
        t = Target(tmp_path)
        r = deploy(with_manifest(url, m, tmp_path), t.disks)
        assert t.data()[: len(img)] == img and r.chunks_verified == 6
        (tmp_path / "second").mkdir()
        t2 = Target(tmp_path / "second")
        deploy(with_manifest(url, m, tmp_path), t2.disks)
        assert t2.data()[: len(img)] == img
        assert len(chunk_ranges(srv)) == len(DATA_CHUNKS), "the second deploy fetched nothing"


def test_a_lying_upstream_is_never_passed_on(tmp_path: Path, site: SiteServices,
                                            image: tuple[bytes, bytes]) -> None:
    img, m = image
    bad = bytearray(img)
    bad[8 * CHUNK + 1234] ^= 0xFF
    with LoopbackServer() as srv:
        url = add_route(site, srv.add("/img", bytes(bad)), srv.add("/img.manifest", m), m)
        # A request that starts at the altered chunk: refused before the answer begins.
        status, _, body = get(url, {"Range": f"bytes={8 * CHUNK}-"})
        assert status == 502 and b"does not match the manifest" in body
        # One that reaches it later: cut before its Content-Length, never a short success.
        with pytest.raises(http.client.IncompleteRead) as info:
            get(url)
        assert info.value.partial == img[: 8 * CHUNK]
        # The deploy fails with the reason, and writes no partition table.
        t = Target(tmp_path)
        with pytest.raises(SourceFailed):
            deploy(with_manifest(url, m, tmp_path), t.disks)
        assert not t.data()[:CHUNK].strip(b"\0")
    assert digest_of(img, 8) not in stored(site)
    assert digest_of(bytes(bad), 8) not in stored(site)
    assert not [n for n in stored(site) if n.startswith(".")]
    assert site.metrics.value("chunks_rejected_total") >= 2


def test_an_upstream_dying_mid_chunk(site: SiteServices, image: tuple[bytes, bytes]) -> None:
    img, m = image
    with LoopbackServer() as srv:
        # Once: the chunk is asked for again, and the client never sees the failure.
        url = add_route(site, srv.add("/img", img, fault=Fault(reset_after=CHUNK // 2, times=1)),
                        srv.add("/img.manifest", m), m)
        assert get(url)[2] == img
    with LoopbackServer() as srv:
        # Always: the client gets a 502, and nothing partial is stored.
        url = add_route(site, srv.add("/img2", img, fault=Fault(truncate_after=CHUNK // 2)),
                        srv.add("/img.manifest", m), m)
        site.store.remove(digest_of(img, 0))
        status, _, body = get(url)
        assert status == 502 and b"ended chunk 0" in body
    assert digest_of(img, 0) not in stored(site)
    assert not [n for n in stored(site) if n.startswith(".")]


def test_route_manifest_checked_when_the_route_is_made(site: SiteServices, tmp_path: Path,
                                                       image: tuple[bytes, bytes]) -> None:
    img, m = image
    with LoopbackServer() as srv:
        murl = srv.add("/img.manifest", m)
        h = handler_for("site.httpProxy")
        assert h is not None
        msg = site_pb2.HttpProxyRequest(node_id="n1", upstream_url=srv.add("/img", img))
        msg.manifest.url = murl
        msg.manifest.digest.hex = hashlib.sha256(b"the signed manifest").hexdigest()
        with pytest.raises(ChecksumMismatch):
            h.run(Context.local("site.httpProxy", site=site), h.parse(msg))
        msg.manifest.ClearField("digest")
        with pytest.raises(InvalidParameters, match="digest is required"):
            h.parse(msg)
        msg.manifest.local_path = "/etc/passwd"
        msg.manifest.digest.hex = "a" * 64
        with pytest.raises(InvalidParameters, match="fetched by its url"):
            h.parse(msg)
        # A .bmap, or a manifest of a compressed file, is not a route's.
        gz = make_manifest(tmp_path, img, published=gzip.compress(img, 1),
                           name="gz").SerializeToString()
        with pytest.raises(InvalidParameters, match="gzip file"):
            add_route(site, srv.url("/img"), srv.add("/gz.manifest", gz), gz)
        with pytest.raises(InvalidParameters, match="not an image manifest"):
            add_route(site, srv.url("/img"), srv.add("/junk", b"junk"), b"junk")
    assert site.routes.all() == []
    assert [p.name for p in site.routes.root.iterdir()] == []


def test_a_route_manifest_of_another_image_fails_the_deploy_not_the_disk(
        tmp_path: Path, site: SiteServices, image: tuple[bytes, bytes]) -> None:
    """The route's manifest is not the deploy's signed one: the site serves what its manifest
    says (here: another image, which the upstream really serves), and the ramdisk refuses it."""
    _img, m = image
    other = image_with_gaps()
    om = make_manifest(tmp_path, other, name="other").SerializeToString()
    with LoopbackServer() as srv:
        url = add_route(site, srv.add("/other", other), srv.add("/other.manifest", om), om)
        t = Target(tmp_path)
        with pytest.raises(ChecksumMismatch, match="chunk 0 at offset 0"):
            deploy(with_manifest(url, m, tmp_path), t.disks)
        assert not t.data()[:CHUNK].strip(b"\0")


def test_max_bytes_holds_across_a_restart_without_a_save_per_request(
        tmp_path: Path, image: tuple[bytes, bytes]) -> None:
    img, m = image
    settings = ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0, root=tmp_path / "site")
    limit = 3 * len(img) // 2
    with upstream_of(img, m) as srv:
        with running(settings) as site:
            saves: list[int] = []
            real = site.routes.save_mark

            def counted(route: object, mark: int) -> None:
                saves.append(mark)
                real(route, mark)  # type: ignore[arg-type]

            site.routes.save_mark = counted  # type: ignore[method-assign]
            url = add_route(site, srv.url("/img"), srv.url("/img.manifest"), m, max_bytes=limit)
            token = url.rsplit("/", 1)[1]
            for i in range(100):  # 100 small requests: a few saves, not 100
                assert get(url, {"Range": f"bytes={i * 1000}-{i * 1000 + 999}"})[0] == 206
            assert get(url)[0] == 200
            assert 1 <= len(saves) <= 20, saves
            route = site.routes.lookup(token)
            assert route is not None and route.bytes_used == 100_000 + len(img)
            on_disk = json.loads((site.routes.root / f"{route.id}.json").read_text())
            assert on_disk["bytes_used"] >= route.bytes_used
        # After the restart the count is at least what was delivered: nothing past max_bytes.
        with running(settings) as site:
            again = site.routes.lookup(token)
            assert again is not None and again.plan is not None
            assert again.bytes_used >= 100_000 + len(img)
            assert get(url.replace(url.split("/r/")[0], site.base_url))[0] == 403


def test_a_restart_keeps_the_store_and_the_route(tmp_path: Path, image: tuple[bytes, bytes]) -> None:
    img, m = image
    settings = ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0, root=tmp_path / "site")
    with upstream_of(img, m) as srv:
        with running(settings) as site:
            url = add_route(site, srv.url("/img"), srv.url("/img.manifest"), m)
            assert get(url)[2] == img
        fetched = len(chunk_ranges(srv))
        store = tmp_path / "site" / "store"
        (store / f".{'b' * 64}.1234.tmp").write_bytes(b"half a chunk")   # a crash mid-write
        (store / "stray").write_bytes(b"x")
        with running(settings) as site:
            url = site.base_url + "/r/" + url.rsplit("/", 1)[1]
            assert get(url)[2] == img
            assert len(chunk_ranges(srv)) == fetched, "all from the store after the restart"
            assert len(stored(site)) == 6 and site.store.size == 5 * CHUNK + 100
        # A route whose kept manifest was altered is dropped at the restart, not served.
        (man,) = (tmp_path / "site" / "routes").glob("*.manifest")
        man.write_bytes(m[:-1] + bytes([m[-1] ^ 1]))
        with running(settings) as site:
            assert site.routes.all() == []


def test_store_budget_smaller_than_the_image(tmp_path: Path, image: tuple[bytes, bytes]) -> None:
    """A store that holds two chunks still serves the whole image, evicting as it goes."""
    img, m = image
    settings = ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0, root=tmp_path / "site",
                               store_bytes=2 * CHUNK + 100)
    with upstream_of(img, m) as srv, running(settings) as site:
        url = add_route(site, srv.url("/img"), srv.url("/img.manifest"), m)
        assert get(url)[2] == img
        # A chunk is stored after it is served: the last ones may still be on their way.
        wait_until(lambda: site.metrics.value("store_evictions_total") >= 3, 10, "evictions")
        assert site.store.size <= 2 * CHUNK + 100


def test_metrics_endpoint(tmp_path: Path, image: tuple[bytes, bytes]) -> None:
    img, m = image
    settings = ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0, root=tmp_path / "site",
                               metrics="127.0.0.1:0")
    with upstream_of(img, m) as srv, running(settings) as site:
        url = add_route(site, srv.url("/img"), srv.url("/img.manifest"), m)
        get(url)
        get(url)
        wait_until(lambda: site.store.size == 5 * CHUNK + 100, 10, "the chunks stored")
        assert site.metrics_service is not None
        status, headers, body = get(f"http://127.0.0.1:{site.metrics_service.port}/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = body.decode()
        for line in (f"bettercompute_site_upstream_bytes_fetched_total {5 * CHUNK + 100}",
                     f"bettercompute_site_store_bytes_served_total {5 * CHUNK + 100}",
                     "bettercompute_site_chunks_verified_total 6",
                     "bettercompute_site_chunks_rejected_total 0",
                     "bettercompute_site_routes_open 1",
                     f"bettercompute_site_store_bytes {5 * CHUNK + 100}",
                     f"bettercompute_site_zero_bytes_served_total {2 * 7 * CHUNK}",
                     "# TYPE bettercompute_site_store_hits_total counter"):
            assert line in text.splitlines(), line
        assert get(f"http://127.0.0.1:{site.metrics_service.port}/other")[0] == 404
    with pytest.raises(InvalidParameters, match="site_metrics_address"):
        SiteServices(ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0,
                                     root=tmp_path / "x",
                                     metrics="localhost"))


def test_kernel_and_initrd_verified_before_they_are_cached(site: SiteServices) -> None:
    h = handler_for("boot.prepareRamdisk")
    assert h is not None
    kernel = os.urandom(5000)
    with LoopbackServer() as srv:
        msg = site_pb2.ProxyDhcpEntry(node_id="n1", mac_address="52:54:00:12:34:56",
                                      boot_file="undionly.kpxe", kernel_url=srv.add("/k", kernel),
                                      ttl_seconds=60)
        msg.kernel_digest.hex = hashlib.sha256(b"another kernel").hexdigest()
        with pytest.raises(ChecksumMismatch, match=r"kernel .* not cached"):
            h.run(Context.local("boot.prepareRamdisk", site=site), h.parse(msg))
        assert stored(site) == [] and site.entries.all() == []
        msg.kernel_digest.hex = hashlib.sha256(kernel).hexdigest()
        h.run(Context.local("boot.prepareRamdisk", site=site), h.parse(msg))
    assert stored(site) == [hashlib.sha256(kernel).hexdigest()]
    assert get(f"{site.base_url}/cache/{hashlib.sha256(kernel).hexdigest()}")[2] == kernel
    # What a live entry boots is never evicted, even past the budget.
    site.store.budget = len(kernel)
    with pytest.raises(StoreFull, match="taken by files in use"):
        site.store.put(hashlib.sha256(b"chunk").hexdigest(), b"chunk")
    assert stored(site) == [hashlib.sha256(kernel).hexdigest()]


@pytest.mark.root
def test_a_full_disk_serves_verified_chunks_without_storing(tmp_path: Path,
                                                          image: tuple[bytes, bytes]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    img, m = image
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(small)], check=True)
    try:
        settings = ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0,
                                   root=tmp_path / "site",
                                   store_dir=small / "store")
        with upstream_of(img, m) as srv, running(settings) as site:
            url = add_route(site, srv.url("/img"), srv.url("/img.manifest"), m)
            assert get(url)[2] == img
            assert site.metrics.value("store_write_failures_total") >= 4
            # The store's writes run behind the answers (nobody waits for them): one may still
            # be at its temporary file when the body ends. Each failed write removes its own.
            def settled() -> tuple[list[str]] | None:
                names = stored(site)
                return None if any(n.startswith(".") for n in names) else (names,)

            (names,) = wait_until(settled, 10, "the store's writes to end, no temporary file left")
            assert len(names) <= 2
            for name in names:
                assert key_of(site.store.root / name) == name
    finally:
        subprocess.run(["umount", str(small)], check=True)


def key_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_daemon_killed_with_chunks_in_flight(tmp_path: Path, image: tuple[bytes, bytes]) -> None:
    """SIGKILL while chunks are being fetched and served; restarted on the same state: the
    client's download resumes by Range and completes, and the store holds only verified files."""
    img, m = image
    port = free_port()
    root = tmp_path / "site"
    daemon = Path(__file__).parents[1] / "site_daemon.py"

    def start() -> subprocess.Popen[str]:
        with open(tmp_path / "daemon.log", "a") as log:
            p = subprocess.Popen([sys.executable, str(daemon), "--root", str(root), "--address",
                                  "127.0.0.1", "--port", str(port)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, text=True)
        assert p.stdout is not None and json.loads(p.stdout.readline())["ready"]
        return p

    with LoopbackServer() as srv:
        srv.add("/img", img, fault=Fault(delay=0.03))
        srv.add("/img.manifest", m)
        first = start()
        try:
            assert first.stdin is not None and first.stdout is not None
            first.stdin.write(json.dumps({"kind": "site.httpProxy", "payload": {
                "node_id": "n1", "upstream_url": srv.url("/img"),
                "manifest": {"url": srv.url("/img.manifest"),
                             "digest": {"hex": hashlib.sha256(m).hexdigest()}}}}) + "\n")
            first.stdin.flush()
            answer = json.loads(first.stdout.readline())
            assert answer["ok"], answer
            url = answer["result"]["proxy_url"]
            with agent_http.get(url, agent_http.HttpOptions(timeout=10, max_retries=8)) as dl:
                got = bytearray(dl.read(256 << 10))
                first.kill()
                first.wait(10)
                second = start()
                try:
                    while chunk := dl.read(1 << 20):
                        got += chunk
                    assert dl.resumes >= 1
                finally:
                    assert second.stdin is not None
                    second.stdin.close()
                    second.wait(20)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(10)
    assert bytes(got) == img
    store = root / "store"
    names = sorted(p.name for p in store.iterdir())
    assert names and not [n for n in names if n.startswith(".")]
    for name in names:
        assert key_of(store / name) == name


def test_entries_registered_at_once_download_their_kernel_once(site: SiteServices) -> None:
    h = handler_for("boot.prepareRamdisk")
    assert h is not None
    kernel = os.urandom(300_000)
    with LoopbackServer() as srv:
        url = srv.add("/k", kernel, fault=Fault(delay=0.05))
        errors: list[BaseException] = []

        def register(i: int) -> None:
            msg = site_pb2.ProxyDhcpEntry(node_id=f"n{i}", mac_address=f"52:54:00:00:00:0{i}",
                                          boot_file="undionly.kpxe", kernel_url=url, ttl_seconds=60)
            msg.kernel_digest.hex = hashlib.sha256(kernel).hexdigest()
            try:
                h.run(Context.local("boot.prepareRamdisk", site=site), h.parse(msg))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=register, args=(i,)) for i in range(1, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors and len(site.entries.all()) == 3
        assert len([r for r in srv.requests if r[1] == "/k"]) == 1


def test_head_answers_without_fetching(site: SiteServices, image: tuple[bytes, bytes]) -> None:
    img, m = image
    with upstream_of(img, m) as srv:
        url = add_route(site, srv.url("/img"), srv.url("/img.manifest"), m)
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        try:
            conn.request("HEAD", parts.path)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Content-Length") == str(len(img))
            assert resp.read() == b""
        finally:
            conn.close()
        assert chunk_ranges(srv) == []
