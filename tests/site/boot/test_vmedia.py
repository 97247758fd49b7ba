"""Virtual-media boots at the site: the payload's checks, the config medium (a real ISO 9660
image, read back by xorriso), the sets on disk and their reconciliation, what the HTTP service
serves and for how long, clean-up; through the handlers where a handler decides."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.errors import ChecksumMismatch, InvalidParameters
from agent.proto import site_pb2
from agent.site.boot import vmedia
from agent.site.boot.vmedia import MediaRequest, MediaSets, iso9660
from agent.site.services import SiteServices
from tests.loopback_http import LoopbackServer, self_signed_cert
from tests.site.boot.test_pxe import MAC, cleanup, fetch, prepare

ISO = b"\x01CD001 the shared ramdisk ISO" * 1000
ISO_DIGEST = hashlib.sha256(ISO).hexdigest()


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    cert, _key = self_signed_cert(str(tmp_path_factory.mktemp("ca")))
    return Path(cert).read_text()


def request(ca: str, **fields: object) -> site_pb2.ProxyDhcpEntry:
    base: dict[str, object] = {
        "node_id": "n1", "mac_address": MAC, "boot_method": "virtual_media",
        "iso_url": "http://127.0.0.1:1/ramdisk.iso", "iso_digest": {"hex": ISO_DIGEST},
        "ttl_seconds": 60,
        "static_network": site_pb2.StaticNetwork(address="10.0.2.50", prefix_length=24,
                                                 default_route="10.0.2.1", dns=["10.0.2.3"]),
        "agent_gateway": "10.0.2.100:443", "ca_pem": ca,
        "kernel_cmdline": "bc.token=abc bc.trust=/etc/bettercompute/trust.pub"}
    base.update(fields)
    return site_pb2.ProxyDhcpEntry(**base)  # type: ignore[arg-type]


def read_iso(image: bytes, tmp_path: Path) -> dict[str, bytes]:
    """The files of an ISO image, as xorriso (libisofs, an independent reader) extracts them."""
    if shutil.which("xorriso") is None:
        pytest.skip("xorriso is not installed (apt-get install xorriso)")
    (tmp_path / "m.iso").write_bytes(image)
    out = tmp_path / "extracted"
    subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(tmp_path / "m.iso"), "-extract", "/",
                    str(out)], check=True, capture_output=True, timeout=60)
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_config_medium_holds_the_network_the_settings_and_the_ca(ca_pem: str, tmp_path: Path) -> None:
    req = MediaRequest.from_proto(request(ca_pem))
    started = time.perf_counter()
    image = iso9660(req.medium_files())
    assert time.perf_counter() - started < 1.0  # issue #29: the node's medium in under 1 s
    assert image[16 * 2048 + 1:16 * 2048 + 6] == b"CD001"
    assert image[16 * 2048 + 40:16 * 2048 + 72].rstrip() == b"BC_CONFIG"  # what /init looks for
    files = {k.lower().removesuffix(";1").removesuffix("."): v for k, v in read_iso(image, tmp_path).items()}
    assert files["network"] == (b"mac=52:54:00:12:34:56\naddress=10.0.2.50\nprefix=24\n"
                                b"gateway=10.0.2.1\ndns=10.0.2.3\n")
    assert files["cmdline"] == (b"bc.node=n1 bc.gateway=10.0.2.100:443 bc.ca=/run/bettercompute/media/"
                                b"ca.pem bc.token=abc bc.trust=/etc/bettercompute/trust.pub\n")
    assert files["ca.pem"] == ca_pem.encode()


def test_label_is_found_by_blkid(ca_pem: str, tmp_path: Path) -> None:
    if shutil.which("blkid") is None:
        pytest.skip("no blkid")
    path = tmp_path / "c.iso"
    path.write_bytes(iso9660(MediaRequest.from_proto(request(ca_pem)).medium_files()))
    out = subprocess.run(["blkid", "-o", "export", str(path)], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert "TYPE=iso9660" in out and "LABEL=BC_CONFIG" in out


@pytest.mark.parametrize(("fields", "message"), [
    ({"static_network": site_pb2.StaticNetwork(address="10.0.2.500", prefix_length=24)}, "address"),
    ({"static_network": site_pb2.StaticNetwork(address="10.0.2.5", prefix_length=33)}, "prefix_length"),
    ({"static_network": site_pb2.StaticNetwork(address="10.0.2.5", prefix_length=24,
                                               default_route="10.0.3.1")}, "not on"),
    ({"static_network": site_pb2.StaticNetwork(address="224.0.0.1", prefix_length=24)}, "not a host"),
    ({"static_network": site_pb2.StaticNetwork(address="10.0.2.5", prefix_length=24,
                                               dns=["1.1.1.1", "x"])}, "dns"),
    ({"iso_url": ""}, "iso_url"),
    ({"iso_url": "file:///etc/passwd"}, "iso_url"),
    ({"iso_digest": {}}, "iso_digest: required"),
    ({"iso_digest": {"hex": "ab"}}, "iso_digest"),
    ({"iso_digest": {"algorithm": "md5", "hex": "a" * 32}}, "iso_digest: sha256"),
    ({"kernel_url": "http://10.0.0.1/vmlinuz"}, "kernel_url"),
    ({"uki_url": "http://10.0.0.1/ramdisk.efi"}, "uki_url"),
    ({"boot_file": "ipxe.efi"}, "boot_file"),
    ({"agent_gateway": "10.0.2.100"}, "agent_gateway"),
    ({"agent_gateway": "10.0.2.100:443 bc.x=y"}, "agent_gateway"),
    ({"ca_pem": "not a certificate"}, "ca_pem"),
    ({"kernel_cmdline": "init=/bin/sh"}, "bc.NAME=VALUE"),
    ({"kernel_cmdline": "bc.token=a\nbc.x=1"}, "kernel_cmdline"),
    ({"boot_method": "floppy"}, "boot_method"),
    ({"mac_address": "01:00:5e:00:00:01"}, "multicast"),
])
def test_bad_payloads_refused_before_any_work(ca_pem: str, fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidParameters, match=message):
        msg = request(ca_pem, **fields)
        if vmedia.boot_method(msg) == vmedia.VIRTUAL_MEDIA:
            MediaRequest.from_proto(msg)


def test_no_static_network_refused(ca_pem: str) -> None:
    msg = request(ca_pem)
    msg.ClearField("static_network")
    with pytest.raises(InvalidParameters, match="static_network"):
        MediaRequest.from_proto(msg)


def test_ca_defaults_to_the_sites_own(ca_pem: str, tmp_path: Path) -> None:
    req = MediaRequest.from_proto(request(ca_pem, ca_pem=""))
    assert req.ca_pem == b""
    with pytest.raises(InvalidParameters, match="--ca"):
        req.with_ca(None)
    (tmp_path / "ca.pem").write_text(ca_pem)
    assert req.with_ca(tmp_path / "ca.pem").ca_pem == ca_pem.encode()
    (tmp_path / "bad.pem").write_text("junk")
    with pytest.raises(InvalidParameters, match="PEM"):
        req.with_ca(tmp_path / "bad.pem")


def gets(upstream: LoopbackServer, path: str) -> int:
    return sum(1 for method, p, _h in upstream.requests if method == "GET" and p == path)


def test_prepare_serves_both_media_until_clean_up(site: SiteServices, ca_pem: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    with LoopbackServer() as upstream:
        iso_url = upstream.add("/ramdisk.iso", ISO)
        result = prepare(site, request(ca_pem, iso_url=iso_url))
        assert gets(upstream, "/ramdisk.iso") == 1
        # A second node's set shares the cached ISO: no second download.
        other = prepare(site, request(ca_pem, iso_url=iso_url, node_id="n2", mac_address="52:54:00:00:00:02"))
        assert gets(upstream, "/ramdisk.iso") == 1
    assert result.entry_id and result.expires_at > time.time()
    assert result.ramdisk_media_url.startswith(f"{site.base_url}/vm/")
    token = result.ramdisk_media_url.split("/vm/")[1].split("/")[0]
    assert len(token) >= 32 and result.config_media_url == f"{site.base_url}/vm/{token}/config.iso"
    assert fetch(result.ramdisk_media_url) == (200, ISO)
    status, medium = fetch(result.config_media_url)
    assert status == 200 and medium[16 * 2048 + 40:16 * 2048 + 49] == b"BC_CONFIG"
    # No PXE entry: the proxy DHCP never answers this MAC.
    assert site.entries.get(MAC) is None
    for bad in ("/vm/" + "A" * 32 + "/config.iso", f"/vm/{token}/other.iso", f"/vm/{token}/../x",
                f"/vm/{token}/config.iso?x=1"):
        assert fetch(site.base_url + bad)[0] == 404, bad
    assert token not in caplog.text  # a capability, never logged
    removed = cleanup(site, "n1")
    assert f"media {MAC}" in removed
    assert fetch(result.config_media_url)[0] == 404
    assert fetch(other.ramdisk_media_url) == (200, ISO)  # still in use by n2
    assert any(r.startswith("media cache ") for r in cleanup(site, "n2"))
    assert fetch(other.ramdisk_media_url)[0] == 404
    assert not site.store.has(ISO_DIGEST)


def test_a_new_request_replaces_the_set_and_its_token(site: SiteServices, ca_pem: str) -> None:
    with LoopbackServer() as upstream:
        iso_url = upstream.add("/ramdisk.iso", ISO)
        first = prepare(site, request(ca_pem, iso_url=iso_url))
        second = prepare(site, request(ca_pem, iso_url=iso_url))
    assert fetch(first.config_media_url)[0] == 404
    assert fetch(second.config_media_url)[0] == 200


def test_expiry_and_reconcile(tmp_path: Path, ca_pem: str) -> None:
    with LoopbackServer() as upstream:
        iso_url = upstream.add("/ramdisk.iso", ISO)
        sets = MediaSets(tmp_path / "media", "http://10.0.0.2:8088")
        sets.reconcile()
        live = sets.register(MediaRequest.from_proto(request(ca_pem, iso_url=iso_url)))
        short = sets.register(MediaRequest.from_proto(request(ca_pem, iso_url=iso_url, node_id="n2",
                                                              mac_address="52:54:00:00:00:02")))
    assert sets.path(f"{live.token}/ramdisk.iso").read_bytes() == ISO
    # A restart finds both; a set whose time ran out while the daemon was away is dropped.
    path = tmp_path / "media/sets/525400000002.json"
    data = json.loads(path.read_text())
    data["expires_at"] = time.time() - 1
    path.write_text(json.dumps(data))
    (tmp_path / "media/sets/garbage.json").write_text("{")
    (tmp_path / "media/config/stray.iso").write_bytes(b"x")
    again = MediaSets(tmp_path / "media", "http://10.0.0.2:8088")
    assert again.reconcile() == ["52:54:00:00:00:02"]
    assert [m.mac for m in again.all()] == [MAC]
    assert sorted(p.name for p in (tmp_path / "media/config").iterdir()) == ["525400123456.iso"]
    assert again.path(f"{live.token}/config.iso").is_file()
    with pytest.raises(Exception, match="no such medium"):
        again.path(f"{short.token}/config.iso")
    assert again.expire(time.time() + 120) and not again.all()
    assert not list((tmp_path / "media/config").iterdir())


def test_the_iso_is_verified_before_it_is_kept(site: SiteServices, ca_pem: str) -> None:
    """An ISO whose bytes are not those of its digest is not kept, no set is made, and the
    command says why; the store keeps it by its content: another URL with the same bytes
    is not downloaded again."""
    with LoopbackServer() as upstream:
        changed = upstream.add("/ramdisk.iso", ISO + b"tampered")
        with pytest.raises(ChecksumMismatch, match=r"ramdisk ISO .* not cached"):
            prepare(site, request(ca_pem, iso_url=changed))
        assert not site.store.has(ISO_DIGEST) and site.media.all() == []
        result = prepare(site, request(ca_pem, iso_url=upstream.add("/v1/ramdisk.iso", ISO)))
        prepare(site, request(ca_pem, iso_url=upstream.add("/mirror/ramdisk.iso", ISO),
                              node_id="n2", mac_address="52:54:00:00:00:02"))
        assert gets(upstream, "/mirror/ramdisk.iso") == 0
    assert fetch(result.ramdisk_media_url) == (200, ISO)
    assert ISO_DIGEST in site._in_use(), "the store never evicts a live set's ISO"


def test_a_set_of_an_earlier_version_and_its_cache_by_url_are_dropped(tmp_path: Path,
                                                                     ca_pem: str) -> None:
    sets = MediaSets(tmp_path / "media", "http://10.0.0.2:8088")
    sets.reconcile()
    with LoopbackServer() as upstream:
        media = sets.register(MediaRequest.from_proto(
            request(ca_pem, iso_url=upstream.add("/ramdisk.iso", ISO))))
    path = tmp_path / "media/sets/525400123456.json"
    data = json.loads(path.read_text())
    del data["iso_digest"]                                   # as an earlier version wrote it
    path.write_text(json.dumps(data))
    (tmp_path / "media/cache").mkdir()
    (tmp_path / "media/cache" / hashlib.sha256(media.iso_url.encode()).hexdigest()).write_bytes(ISO)
    again = MediaSets(tmp_path / "media", "http://10.0.0.2:8088")
    again.reconcile()
    assert again.all() == [] and not path.exists()
    assert not (tmp_path / "media/cache").exists()
    with pytest.raises(Exception, match="no such medium"):
        again.path(f"{media.token}/ramdisk.iso")
