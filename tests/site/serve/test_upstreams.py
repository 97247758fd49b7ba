"""Which upstreams a proxy route may reach (issue 27, item 5): by default not loopback, not
link-local (the metadata address), not the site server itself, never the site's own HTTP
service (another route); the site setting ``site_upstreams`` lists what may be reached."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import settings
from agent.errors import InvalidParameters
from agent.site.serve.upstreams import UpstreamPolicy, local_addresses
from agent.site.services import ServiceSettings, SiteServices
from tests.loopback_http import LoopbackServer
from tests.site.boot.test_pxe import entry, prepare
from tests.site.serve.test_chunk_routes import add_route
from tests.site.serve.test_routes import request, route


def started(tmp_path: Path, *upstreams: str) -> SiteServices:
    """Not yet started: ``with started(...) as site``."""
    return SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                        upstreams=upstreams))


@pytest.fixture
def default_site(tmp_path: Path) -> Iterator[SiteServices]:
    with started(tmp_path) as site:
        yield site


def own_address() -> str:
    for address in sorted(local_addresses(), key=str):
        if not address.is_loopback and not address.is_link_local:
            return str(address)
    pytest.skip("this host has no address but loopback and link-local")


@pytest.mark.parametrize("url, why", [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://127.0.0.1:8080/x", "loopback"),
    ("http://127.1.2.3/x", "loopback"),
    ("http://localhost/x", "loopback"),
    ("http://[::1]/x", "loopback"),
    ("http://[::ffff:127.0.0.1]/x", "loopback"),
    ("http://[fe80::1]/x", "link-local"),
    ("http://0.0.0.0/x", "unspecified"),
    ("http://224.0.0.1/x", "multicast"),
])
def test_the_default_refuses_what_only_the_site_can_reach(default_site: SiteServices, url: str,
                                                          why: str) -> None:
    with pytest.raises(InvalidParameters, match=f"is a {why} address; list it in site_upstreams"):
        route(default_site, url)


def test_the_default_refuses_the_site_servers_own_addresses(default_site: SiteServices) -> None:
    with pytest.raises(InvalidParameters, match="site server's own"):
        route(default_site, f"http://{own_address()}/x")


def test_the_default_allows_any_other_address(default_site: SiteServices) -> None:
    assert route(default_site, "http://192.0.2.77/image").startswith(default_site.base_url + "/r/")
    assert route(default_site, "http://[2001:db8::7]/image")


def test_no_route_leads_to_a_route(tmp_path: Path) -> None:
    with started(tmp_path, "127.0.0.0/8") as site:
        with LoopbackServer() as upstream:
            first = route(site, upstream.add("/x", b"x"))  # loopback listed: allowed
        with pytest.raises(InvalidParameters, match="site's own HTTP service"):
            route(site, first)
        with pytest.raises(InvalidParameters, match="site's own HTTP service"):
            route(site, f"http://localhost:{site.http.port}/boot.ipxe")


def test_a_list_allows_only_what_it_names(tmp_path: Path) -> None:
    with started(tmp_path, "10.0.0.0/8", "mirror.example", "0.0.0.0/0") as site:
        assert route(site, "http://10.1.2.3/image")
        with pytest.raises(InvalidParameters, match="loopback"):  # 0.0.0.0/0 is not loopback's
            route(site, "http://127.0.0.1/x")
        with pytest.raises(InvalidParameters, match="link-local"):
            route(site, "http://169.254.169.254/x")
    with started(tmp_path, "10.0.0.0/8") as site, \
            pytest.raises(InvalidParameters, match="not in site_upstreams"):
        route(site, "http://192.0.2.77/image")


def test_an_address_in_a_refused_range_is_allowed_by_an_entry_inside_it() -> None:
    own = own_address()
    cases = [  # entries, address, allowed
        (["169.254.169.254"], "169.254.169.254", True),
        (["169.254.0.0/16"], "169.254.1.1", True),
        (["169.254.169.254"], "169.254.1.1", False),
        (["127.0.0.1"], "127.0.0.1", True),
        (["127.0.0.0/8"], "127.0.0.1", True),
        (["0.0.0.0/0"], "127.0.0.1", False),
        (["0.0.0.0/0"], own, False),
        ([own], own, True),
        (["::1"], "::1", True),
        (["::/0"], "::1", False),
    ]
    for entries, address, allowed in cases:
        policy = UpstreamPolicy.parse(entries, own={own}, own_port=8088)
        why = policy.refusal(address, ipaddress.ip_address(address), 80)
        assert (why == "") == allowed, (entries, address, why)
        # and never the site's own HTTP service
        assert "own HTTP" in policy.refusal(own, ipaddress.ip_address(own), 8088)


def test_it_is_checked_again_at_each_connection(site: SiteServices) -> None:
    """A route made under one list, served under another (a restart with a narrower list; or a
    name that resolves elsewhere now): the connection is refused, a 502 that says why."""
    with LoopbackServer() as upstream:
        url = route(site, upstream.add("/image", b"data"))
        assert request(url)[0] == 200
        site.routes.policy = UpstreamPolicy.parse([], own={"127.0.0.1"}, own_port=site.http.port)
        status, _, body = request(url)
        assert status == 502 and b"is a loopback address" in body
        assert len(upstream.requests) == 1


def test_the_setting_from_flags_file_and_kernel_line(tmp_path: Path) -> None:
    loaded = settings.load({"site_upstreams": ["10.0.0.0/8", "Mirror.Example."]})
    assert loaded.config.site_upstreams == ("10.0.0.0/8", "mirror.example")
    loaded = settings.load({}, cmdline_text="bc.site_upstreams=192.0.2.0/24,127.0.0.1")
    assert loaded.config.site_upstreams == ("192.0.2.0/24", "127.0.0.1")
    for bad in ("http://x/", "a b", "-x.example", "x" * 300):
        with pytest.raises(InvalidParameters, match="site_upstreams"):
            settings.load({"site_upstreams": [bad]})


def test_an_https_upstream_is_dialled_at_its_checked_address_and_verified(tmp_path: Path) -> None:
    """The connection goes to the address the policy checked, and TLS still checks the
    upstream's certificate (against the site's CA bundle, for the URL's host)."""
    from tests.loopback_http import self_signed_cert

    cert, key = self_signed_cert(str(tmp_path))
    with LoopbackServer(tls=(cert, key)) as upstream:
        url = upstream.add("/image", b"over tls")
        assert url.startswith("https://127.0.0.1:")
        for ca_file, expect in ((Path(cert), 200), (None, 502)):
            with SiteServices(ServiceSettings(
                    address="127.0.0.1", port=0, root=tmp_path / "site", upstreams=("127.0.0.0/8",),
                    ca_file=ca_file)) as site:
                status, _, body = request(route(site, url))
            assert status == expect, body
            assert body == b"over tls" if expect == 200 else b"CERTIFICATE_VERIFY_FAILED" in body


# -- what a command makes the site fetch itself: a route's manifest, a boot entry's files --------

def manifest_route(site: SiteServices, upstream_url: str, manifest_url: str) -> None:
    add_route(site, upstream_url, manifest_url, b"a manifest")


def test_a_routes_manifest_is_fetched_only_from_an_allowed_upstream(tmp_path: Path) -> None:
    with LoopbackServer() as srv, started(tmp_path, "192.0.2.0/24") as site:
        url = srv.add("/img.manifest", b"a manifest")
        with pytest.raises(InvalidParameters, match="is a loopback address; list it in site_upstreams"):
            manifest_route(site, "http://192.0.2.7/img", url)
        assert srv.server.requests == [] and site.routes.all() == []


def test_a_manifest_redirected_to_a_refused_address_is_not_followed(tmp_path: Path) -> None:
    with LoopbackServer() as srv, started(tmp_path, "127.0.0.1") as site:
        srv.redirect("/img.manifest", "http://127.0.0.2/elsewhere")
        with pytest.raises(InvalidParameters, match=r"upstream 127\.0\.0\.2.* refused"):
            manifest_route(site, srv.url("/img"), srv.url("/img.manifest"))
        assert len(srv.server.requests) == 1 and site.routes.all() == []


def test_a_boot_entrys_kernel_is_fetched_only_from_an_allowed_upstream(default_site: SiteServices) -> None:
    with LoopbackServer() as srv:
        kernel = srv.add("/vmlinuz", b"a kernel")
        with pytest.raises(InvalidParameters, match="is a loopback address; list it in site_upstreams"):
            prepare(default_site, entry(ipxe_script_url="", kernel_url=kernel,
                                        kernel_digest={"hex": "a" * 64}))
        assert srv.server.requests == [] and default_site.entries.all() == []
