"""The site's virtual media over https, for the BMCs that mount https:// images only (bmcweb:
GH200, GB200): the HTTP service's TLS listener with the site's own certificate (a CA made here),
serving a media set's ISO to a real TLS client; none without the settings; and the GH200
profile of the project's Redfish emulator mounting the https twin of the site's media URL,
fetched from that listener with the CA, through bmc.storage insert_media."""

from __future__ import annotations

import hashlib
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import InvalidParameters, Unsupported
from agent.gateway.certs import DevPki
from agent.proto import site_pb2
from agent.site.services import ServiceSettings, SiteServices
from tests.loopback_http import LoopbackServer, self_signed_cert
from tests.site.bmc.redfish_emulator import PASSWORD, USER, RedfishEmulator
from tests.site.boot.test_pxe import prepare

ISO = b"\x01CD001 the shared ramdisk ISO" * 1000
ISO_DIGEST = hashlib.sha256(ISO).hexdigest()
MAC = "52:54:00:12:34:56"


def settings(root: Path, pki: DevPki | None) -> ServiceSettings:
    tls = {"https_port": 0, "tls_cert": pki.gateway_cert, "tls_key": pki.gateway_key} if pki else {}
    return ServiceSettings(address="127.0.0.1", port=0, root=root / "site", upstreams=("127.0.0.1",),
                           **tls)  # type: ignore[arg-type]


@pytest.fixture
def tls_site(tmp_path: Path, pki: DevPki) -> Iterator[SiteServices]:
    with SiteServices(settings(tmp_path, pki)) as running:
        yield running


def media_set(site: SiteServices, ca_pem: str) -> site_pb2.ProxyDhcpResult:
    with LoopbackServer() as upstream:
        iso_url = upstream.add("/ramdisk.iso", ISO)
        return prepare(site, site_pb2.ProxyDhcpEntry(
            node_id="n1", mac_address=MAC, boot_method="virtual_media", iso_url=iso_url,
            iso_digest={"hex": ISO_DIGEST}, ttl_seconds=60,
            static_network=site_pb2.StaticNetwork(address="10.0.2.50", prefix_length=24,
                                                  default_route="10.0.2.1"),
            agent_gateway="10.0.2.100:443", ca_pem=ca_pem))


def fetch(url: str, ca: Path | None = None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_https_listener_serves_a_media_iso_to_a_tls_client(tls_site: SiteServices, pki: DevPki) -> None:
    result = media_set(tls_site, pki.ca.read_text())
    assert tls_site.https is not None and tls_site.media.https_base_url.startswith("https://127.0.0.1:")
    secure = tls_site.media.over_https(result.ramdisk_media_url)
    token = result.ramdisk_media_url.split("/vm/")[1]
    assert secure == f"{tls_site.media.https_base_url}/vm/{token}"
    # Verified against the CA the certificate comes from, host name (127.0.0.1) included.
    assert fetch(secure, pki.ca) == (200, ISO)
    status, medium = fetch(tls_site.media.over_https(result.config_media_url), pki.ca)
    assert status == 200 and medium[16 * 2048 + 40:16 * 2048 + 49] == b"BC_CONFIG"
    assert fetch(result.ramdisk_media_url) == (200, ISO)   # the http listener still serves it
    # A client that does not trust the site's CA gets no byte.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(secure, Path(self_signed_cert(str(tls_site.settings.root))[0]))
    # Only virtual media over https: no boot scripts, no cache, no routes there.
    base = tls_site.media.https_base_url
    for path in ("/boot.ipxe", "/cache/" + "0" * 64, "/r/" + "A" * 43, "/vm/" + "A" * 32 + "/config.iso"):
        assert fetch(base + path, pki.ca)[0] == 404, path
    # Not a URL of the site's media: no twin.
    assert tls_site.media.over_https("http://10.9.9.9:8088/vm/x/ramdisk.iso") == ""
    assert tls_site.media.over_https(result.ramdisk_media_url + "?x") == ""


def test_the_tls_listener_is_under_the_same_admission(tls_site: SiteServices, pki: DevPki) -> None:
    """One InboundConnections for both listeners; a client that opens a TLS connection and never
    sends its handshake is closed at the head's deadline, counted while it sits."""
    assert tls_site.https is not None
    conns = tls_site.http.server.conns
    assert tls_site.https.server.conns is conns
    conns.head_seconds = 0.5
    with socket.create_connection(("127.0.0.1", tls_site.https.port), timeout=5) as idle:
        deadline = time.monotonic() + 5
        while conns.count("127.0.0.1") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert conns.count("127.0.0.1") == 1
        idle.settimeout(5)
        assert idle.recv(1) == b""          # shut down by the watch: the handshake never came
    deadline = time.monotonic() + 5
    while conns.count("127.0.0.1") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert conns.count("127.0.0.1") == 0


def test_no_https_listener_without_the_settings(tmp_path: Path) -> None:
    with SiteServices(settings(tmp_path, None)) as site:
        assert site.https is None and site.media.https_base_url == ""
        assert site.media.over_https(f"{site.base_url}/vm/{'A' * 32}/ramdisk.iso") == ""


@pytest.mark.parametrize("missing", ["https_port", "tls_cert", "tls_key"])
def test_half_the_https_settings_are_refused_naming_what_is_missing(tmp_path: Path, pki: DevPki,
                                                                    missing: str) -> None:
    given = {"https_port": 0, "tls_cert": pki.gateway_cert, "tls_key": pki.gateway_key}
    del given[missing]
    with pytest.raises(InvalidParameters, match=f"missing: site_{missing}"):
        SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path, **given))  # type: ignore[arg-type]


def test_an_unusable_certificate_is_refused(tmp_path: Path, pki: DevPki) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(InvalidParameters, match=r"junk\.pem"):
        SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path, https_port=0,
                                     tls_cert=tmp_path / "junk.pem", tls_key=pki.gateway_key))


def insert(site: SiteServices, bmc: RedfishEmulator, image_url: str,
           tmp_path: Path) -> site_pb2.BmcOperationResult:
    from agent.commands import handler_for
    from agent.commands.base import Context
    from tests.site.bmc.test_bmc_redfish import REF, config_with

    handler = handler_for("bmc.storage")
    assert handler is not None
    payload = site_pb2.BmcOperationRequest(
        node_id="n1", bmc_address=bmc.address, protocol="redfish", operation="insert_media",
        credentials_ref=REF, verify_tls=False, parameters={"image_url": image_url, "media_type": "CD"})
    context = Context.local("bmc.storage", config_with(tmp_path, USER, PASSWORD), timeout=60, site=site)
    result = handler.run(context, handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


def test_gh200_mounts_the_sites_media_over_https(tls_site: SiteServices, pki: DevPki, tmp_path: Path) -> None:
    """The control plane hands the site's http media URL; the GH200 (https and smb only) is
    given its https twin, and fetches the ISO from the TLS listener, verified with the CA."""
    result = media_set(tls_site, pki.ca.read_text())
    secure = tls_site.media.over_https(result.ramdisk_media_url)
    with RedfishEmulator.of("nvidia_gh200", tmp_path / "trees") as bmc:
        bmc.state.media_ca = pki.ca
        answer = insert(tls_site, bmc, result.ramdisk_media_url, tmp_path)
        inserts = [b for _, _, b in bmc.writes("POST", "InsertMedia")] + \
            [b for _, _, b in bmc.writes("PATCH") if "Image" in b]
        assert [b["Image"] for b in inserts] == [secure]
        assert bmc.state.fetched == [(secure, ISO[:2048])]
    (media,) = answer.virtual_media
    assert media.inserted and media.image == secure


def test_gh200_without_the_sites_tls_is_refused_saying_to_configure_it(tmp_path: Path, pki: DevPki) -> None:
    with SiteServices(settings(tmp_path, None)) as site:
        result = media_set(site, pki.ca.read_text())
        with RedfishEmulator.of("nvidia_gh200", tmp_path / "trees") as bmc:
            with pytest.raises(Unsupported, match="configure its TLS: site_https_port, site_tls_cert"):
                insert(site, bmc, result.ramdisk_media_url, tmp_path)
            assert not bmc.writes("POST", "InsertMedia") and not bmc.writes("PATCH")


def test_a_vendor_that_mounts_http_keeps_the_http_url(tls_site: SiteServices, pki: DevPki,
                                                      tmp_path: Path) -> None:
    result = media_set(tls_site, pki.ca.read_text())
    with RedfishEmulator.of("dell_r750", tmp_path / "trees") as bmc:
        (media,) = insert(tls_site, bmc, result.ramdisk_media_url, tmp_path).virtual_media
    assert media.image == result.ramdisk_media_url


def test_the_settings_rows_reach_the_listener(tmp_path: Path, pki: DevPki) -> None:
    """site_https_port, site_tls_cert and site_tls_key (agent/cli/settings.py) make the listener
    through ServiceSettings.from_config; the default (0) makes none."""
    from agent.cli import settings as cli_settings

    loaded = cli_settings.load({"site_address": "127.0.0.1", "state_dir": str(tmp_path),
                                "site_https_port": "8443", "site_tls_cert": str(pki.gateway_cert),
                                "site_tls_key": str(pki.gateway_key)})
    got = ServiceSettings.from_config(loaded.config)
    assert (got.https_port, got.tls_cert, got.tls_key) == (8443, pki.gateway_cert, pki.gateway_key)
    plain = ServiceSettings.from_config(cli_settings.load({"site_address": "127.0.0.1"}).config)
    assert (plain.https_port, plain.tls_cert, plain.tls_key) == (None, None, None)


# -- boot.prepareRamdisk asks the node's BMC which transport it mounts ---------------------


def prepare_for(site: SiteServices, bmc: RedfishEmulator, ca_pem: str, tmp_path: Path,
                upstream: LoopbackServer) -> site_pb2.ProxyDhcpResult:
    """boot.prepareRamdisk of a virtual-media boot naming the node's BMC (the emulator)."""
    from agent.commands import handler_for
    from agent.commands.base import Context
    from tests.site.bmc.test_bmc_redfish import REF, config_with

    handler = handler_for("boot.prepareRamdisk")
    assert handler is not None
    msg = site_pb2.ProxyDhcpEntry(
        node_id="n1", mac_address=MAC, boot_method="virtual_media",
        iso_url=upstream.add("/ramdisk.iso", ISO), iso_digest={"hex": ISO_DIGEST}, ttl_seconds=60,
        static_network=site_pb2.StaticNetwork(address="10.0.2.50", prefix_length=24),
        agent_gateway="10.0.2.100:443", ca_pem=ca_pem,
        media_bmc=site_pb2.MediaBmc(bmc_address=bmc.address, credentials_ref=REF))
    params = handler.parse(msg)
    assert handler.serial_key(params) == f"bmc:{bmc.address}"    # in turn with the BMC's bmc.*
    context = Context.local("boot.prepareRamdisk", config_with(tmp_path, USER, PASSWORD), timeout=60,
                            site=site)
    result = handler.run(context, params)
    assert isinstance(result, site_pb2.ProxyDhcpResult)
    return result


@pytest.mark.parametrize("tree", ["nvidia_gh200", "nvidia_gb200"])
def test_prepare_ramdisk_hands_an_https_only_bmc_https_urls(tls_site: SiteServices, pki: DevPki,
                                                           tmp_path: Path, tree: str) -> None:
    """bmcweb mounts https:// and smb:// only: the media URLs answered are the TLS listener's,
    and inserted as they are, the BMC fetches the ISO from there with the site's CA."""
    with RedfishEmulator.of(tree, tmp_path / "trees") as bmc, LoopbackServer() as upstream:
        bmc.state.media_ca = pki.ca
        result = prepare_for(tls_site, bmc, pki.ca.read_text(), tmp_path, upstream)
        base = f"{tls_site.media.https_base_url}/vm/"
        assert result.media_scheme == "https"
        assert result.ramdisk_media_url.startswith(base) and result.config_media_url.startswith(base)
        assert fetch(result.config_media_url, pki.ca)[0] == 200
        (media,) = insert(tls_site, bmc, result.ramdisk_media_url, tmp_path).virtual_media
        assert media.inserted and media.image == result.ramdisk_media_url
        assert [i for i, _ in bmc.state.fetched] == [result.ramdisk_media_url]
        assert not bmc.state.sessions                        # its session closed after the ask


def test_prepare_ramdisk_for_an_https_only_bmc_without_the_sites_tls_is_refused_first(
        tmp_path: Path, pki: DevPki) -> None:
    """Refused naming the settings, before the ISO is fetched or any set is made."""
    with SiteServices(settings(tmp_path, None)) as site, \
            RedfishEmulator.of("nvidia_gh200", tmp_path / "trees") as bmc, LoopbackServer() as upstream:
        with pytest.raises(Unsupported, match="site_https_port, site_tls_cert and site_tls_key"):
            prepare_for(site, bmc, pki.ca.read_text(), tmp_path, upstream)
        assert site.media.all() == [] and not upstream.requests
        assert not [w for w in bmc.writes() if w[0] != "GET" and "Session" not in w[1]]


@pytest.mark.parametrize("tree", ["dell_r750", "supermicro_sys821", "lenovo_sr670"])
def test_prepare_ramdisk_hands_a_bmc_that_mounts_http_the_http_urls(tls_site: SiteServices, pki: DevPki,
                                                                   tmp_path: Path, tree: str) -> None:
    with RedfishEmulator.of(tree, tmp_path / "trees") as bmc, LoopbackServer() as upstream:
        result = prepare_for(tls_site, bmc, pki.ca.read_text(), tmp_path, upstream)
    assert result.media_scheme == "http"
    assert result.ramdisk_media_url.startswith(f"{tls_site.media.base_url}/vm/")


def test_the_slots_own_transfer_protocols_decide_over_the_vendor_row(tls_site: SiteServices, pki: DevPki,
                                                                     tmp_path: Path) -> None:
    """A slot that lists TransferProtocolType@Redfish.AllowableValues (HTTPS and NFS here) is
    taken at its word, though its vendor's row (Dell) mounts anything."""
    with RedfishEmulator.of("dell_r750", tmp_path / "trees") as bmc, LoopbackServer() as upstream:
        for path, doc in bmc.state.docs.items():
            if "/VirtualMedia/" in path and "MediaTypes" in doc:
                doc["TransferProtocolType@Redfish.AllowableValues"] = ["HTTPS", "NFS"]
        result = prepare_for(tls_site, bmc, pki.ca.read_text(), tmp_path, upstream)
    assert result.media_scheme == "https"


def test_media_bmc_is_checked_in_parse() -> None:
    from agent.commands import handler_for

    handler = handler_for("boot.prepareRamdisk")
    assert handler is not None
    msg = site_pb2.ProxyDhcpEntry(
        node_id="n1", mac_address=MAC, boot_method="virtual_media", iso_url="http://127.0.0.1:9/r.iso",
        iso_digest={"hex": ISO_DIGEST}, agent_gateway="10.0.2.100:443",
        static_network=site_pb2.StaticNetwork(address="10.0.2.50", prefix_length=24),
        media_bmc=site_pb2.MediaBmc(bmc_address="127.0.0.1:443", credentials_ref="../etc/passwd"))
    with pytest.raises(InvalidParameters, match="media_bmc"):
        handler.parse(msg)
    msg.media_bmc.credentials_ref, msg.media_bmc.vendor = "rack1-n01", "acme"
    with pytest.raises(InvalidParameters, match=r"media_bmc: .*vendor"):
        handler.parse(msg)


def test_the_insert_actions_action_info_is_read_for_its_transfer_protocols(
        tls_site: SiteServices, pki: DevPki, tmp_path: Path) -> None:
    """Supermicro names its InsertMedia parameters in an ActionInfo; where that lists
    TransferProtocolType values (HTTPS and CIFS here), they decide."""
    with RedfishEmulator.of("supermicro_sys821", tmp_path / "trees") as bmc, LoopbackServer() as upstream:
        infos = [d for p, d in bmc.state.docs.items() if p.endswith("/InsertMediaActionInfo")]
        assert infos
        for info in infos:
            for param in info["Parameters"]:
                if param["Name"] == "TransferProtocolType":
                    param["AllowableValues"] = ["HTTPS", "CIFS"]
        result = prepare_for(tls_site, bmc, pki.ca.read_text(), tmp_path, upstream)
    assert result.media_scheme == "https"
