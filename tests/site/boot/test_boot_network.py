"""The boot service on a real network: the site's dnsmasq in proxy-DHCP mode and a plain DHCP
server (a second dnsmasq) on a bridge in network namespaces made here, asked by a scripted
PXE/iPXE client (tests/site/boot/dhcp_client.py) from a third namespace.

    lan   br0 ── p-site ── site: eth0 10.99.0.2  the site daemon's dnsmasq (proxy DHCP, TFTP)
              ├─ p-dhcp ── dhcp: eth0 10.99.0.1  plain dnsmasq: addresses 10.99.0.100-200
              └─ p-cli  ── cli:  eth0 10.99.0.50 the PXE client

Nothing leaves the namespaces; they are removed at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.commands import handler_for
from agent.commands.base import Context
from agent.proto import site_pb2
from agent.site.services import ServiceSettings, SiteServices
from tests.loopback_http import LoopbackServer
from tests.site.conftest import stray_children
from tests.site.netns import CLIENT, DHCP, IPXE, SITE, Net, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


@pytest.fixture
def site(net: Net, tmp_path: Path) -> Iterator[SiteServices]:
    with SiteServices(ServiceSettings(
            address=SITE, port=0, bind="127.0.0.1", root=tmp_path / "site", interface="eth0",
            dnsmasq_argv_prefix=net.exec(net.site))) as running:
        wait_listening(net)
        yield running


def ask(net: Net, mac: str, *, arch: int = 0, ipxe: bool = False) -> list[dict[str, object]]:
    argv = [*net.exec(net.cli), sys.executable, str(HERE / "dhcp_client.py"), "--iface", "eth0",
            "--mac", mac, "--arch", str(arch), "--ciaddr", CLIENT, "--wait", "2.5"]
    if ipxe:
        argv.append("--ipxe")
    offers = json.loads(proc.run(argv, timeout=30).text)
    assert isinstance(offers, list)
    return offers


def proxy_offers(offers: list[dict[str, object]]) -> list[dict[str, object]]:
    return [o for o in offers if o["server"] == SITE]


def plain_offers(offers: list[dict[str, object]]) -> list[dict[str, object]]:
    return [o for o in offers if o["server"] == DHCP]


def prepare(site: SiteServices, mac: str, boot_file: str = "undionly.kpxe", ttl: int = 600) -> None:
    h = handler_for("boot.prepareRamdisk")
    assert h is not None
    h.run(Context.local("boot.prepareRamdisk", site=site), h.parse(site_pb2.ProxyDhcpEntry(
        node_id="n1", mac_address=mac, boot_file=boot_file, ttl_seconds=ttl,
        ipxe_script_url="http://10.99.0.9/ramdisk.ipxe")))


def test_registered_macs_get_the_boot_offer_others_fall_through(net: Net, site: SiteServices) -> None:
    bios, efi, stranger = "52:54:00:00:00:01", "52:54:00:00:00:02", "52:54:00:00:00:03"
    prepare(site, bios)
    prepare(site, efi, "ipxe.efi")

    offers = ask(net, bios)
    assert plain_offers(offers), "the plain DHCP server hands out the address"
    proxy = proxy_offers(offers)
    assert proxy, f"no proxy offer for a registered MAC: {offers}"
    # The proxy never hands out an address; its boot server gives the BIOS binary.
    assert all(o["yiaddr"] in ("0.0.0.0", CLIENT) for o in proxy)
    discover = [o for o in proxy if not o.get("boot_server")]
    assert discover and discover[0]["yiaddr"] == "0.0.0.0"
    assert bytes.fromhex(str(discover[0]["options"]["60"])) == b"PXEClient"  # type: ignore[index]
    boot = [o for o in proxy if o.get("boot_server")]
    assert boot and boot[0]["file"] == "undionly.kpxe" and boot[0]["siaddr"] == SITE

    # UEFI gets its binary in the proxy offer itself (no boot menu for UEFI in dnsmasq).
    efi_offers = proxy_offers(ask(net, efi, arch=7))
    assert efi_offers and efi_offers[0]["file"] == "ipxe.efi", json.dumps(efi_offers)
    assert efi_offers[0]["yiaddr"] == "0.0.0.0" and efi_offers[0]["siaddr"] == SITE

    # iPXE, once chained, is sent to the site's HTTP script.
    chained = [o for o in proxy_offers(ask(net, bios, ipxe=True)) if not o.get("boot_server")]
    assert chained and chained[0]["file"] == f"{site.base_url}/boot.ipxe"
    chained = proxy_offers(ask(net, efi, arch=7, ipxe=True))
    assert chained and chained[0]["file"] == f"{site.base_url}/boot.ipxe"

    offers = ask(net, stranger)
    assert plain_offers(offers) and not proxy_offers(offers), "an unregistered MAC gets no boot offer"

    # TFTP serves the binaries and nothing else.
    for name in ("undionly.kpxe", "ipxe.efi"):
        got = json.loads(proc.run([*net.exec(net.cli), sys.executable, str(HERE / "dhcp_client.py"),
                                   "--tftp", SITE, name], timeout=60).text)
        assert got["sha256"] == hashlib.sha256((IPXE / name).read_bytes()).hexdigest(), got
    for name in ("snponly.efi", "../dnsmasq.conf", "/etc/passwd"):
        got = json.loads(proc.run([*net.exec(net.cli), sys.executable, str(HERE / "dhcp_client.py"),
                                   "--tftp", SITE, name], timeout=30).text)
        assert "error" in got, name


def test_expired_and_removed_entries_get_no_offer(net: Net, site: SiteServices) -> None:
    mac, other = "52:54:00:00:00:11", "52:54:00:00:00:12"
    prepare(site, mac, ttl=2)
    prepare(site, other)
    assert proxy_offers(ask(net, mac))
    time.sleep(2.5)
    assert not proxy_offers(ask(net, mac)), "an expired entry still gets a boot offer"
    h = handler_for("boot.cleanUp")
    assert h is not None
    h.run(Context.local("boot.cleanUp", site=site), h.parse(site_pb2.BootCleanUpRequest(node_id="n1")))
    assert not proxy_offers(ask(net, other)), "a cleaned-up entry still gets a boot offer"
    assert site.dnsmasq is not None and site.dnsmasq.restarts == 0, "dnsmasq died on a reload"


def test_the_sites_timeline_names_a_boot_loader_it_does_not_serve(net: Net, site: SiteServices) -> None:
    """What dnsmasq logs feeds the node's timeline (agent/site/observe/): the proxy offer, the
    boot server's answer (the client's address), and a TFTP read of a file the site does not
    serve (a firmware of another architecture): named no_boot_loader at once, with the file."""
    mac = "52:54:00:00:00:21"
    prepare(site, mac)
    assert proxy_offers(ask(net, mac))
    got = json.loads(proc.run([*net.exec(net.cli), sys.executable, str(HERE / "dhcp_client.py"),
                               "--tftp", SITE, "snponly.efi"], timeout=30).text)
    assert "error" in got
    deadline = time.monotonic() + 10
    while (site.observe.timelines.last("n1") or pytest.fail("no timeline")).cause != "no_boot_loader":
        assert time.monotonic() < deadline, site.observe.timelines.last("n1")
        time.sleep(0.2)
    a = site.observe.timelines.last("n1")
    assert a is not None and "snponly.efi" in a.cause_detail
    steps = [e.step for e in a.events]
    assert steps[0] == "prepared" and "dhcp_offer" in steps and steps[-1] == "tftp_missing", steps


def test_dnsmasq_restarted_and_no_stray_left(net: Net, tmp_path: Path) -> None:
    settings = ServiceSettings(address=SITE, port=0, bind="127.0.0.1", root=tmp_path / "site",
                               interface="eth0", dnsmasq_argv_prefix=net.exec(net.site))
    first = SiteServices(settings)
    first.start()
    try:
        prepare(first, "52:54:00:00:00:21")
        assert first.dnsmasq is not None
        pid = first.dnsmasq.pid
        assert pid is not None
        os.kill(pid, 9)
        deadline = time.monotonic() + 10
        while (first.dnsmasq.pid in (None, pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        restarted = first.dnsmasq.pid
        assert restarted not in (None, pid) and first.dnsmasq.restarts == 1
        wait_listening(net)
        assert proxy_offers(ask(net, "52:54:00:00:00:21")), "the restarted dnsmasq answers"
        # The daemon dies without stopping its child: the next start kills the stray.
        first.dnsmasq._stopping.set()
        first.http.stop()
    except BaseException:
        first.stop()  # a failure here must not leave this dnsmasq behind
        raise
    assert restarted is not None
    second = SiteServices(settings)
    second.start()
    try:
        assert stray_children(second.dnsmasq.settings, [restarted]) == []  # type: ignore[union-attr]
        wait_listening(net)
        assert proxy_offers(ask(net, "52:54:00:00:00:21")), "the entry survived the restart"
        last = second.dnsmasq.pid  # type: ignore[union-attr]
    finally:
        second.stop()
    assert last is not None and stray_children(second.dnsmasq.settings, [last]) == []  # type: ignore[union-attr]


def test_an_arm64_uefi_client_gets_the_sites_grub(net: Net, tmp_path: Path) -> None:
    """Client architecture 11 (arm64 UEFI) with an arm64 UKI entry gets grubaa64.efi, the site's
    GRUB, in the proxy offer, and TFTP serves it byte for byte, where site_ipxe_dir holds it."""
    ipxe = tmp_path / "ipxe"
    ipxe.mkdir()
    for name in ("undionly.kpxe", "ipxe.efi"):
        shutil.copyfile(IPXE / name, ipxe / name)
    (ipxe / "grubaa64.efi").write_bytes(b"MZ the site's arm64 GRUB" * 100)
    uki = b"MZ an arm64 UKI" * 100
    mac = "52:54:00:00:00:31"
    with SiteServices(ServiceSettings(
            address=SITE, port=0, bind="127.0.0.1", root=tmp_path / "site", interface="eth0",
            ipxe_dir=ipxe, upstreams=("127.0.0.1",),
            dnsmasq_argv_prefix=net.exec(net.site))) as site, LoopbackServer() as upstream:
        wait_listening(net)
        upstream.add("/ramdisk.efi", uki)
        h = handler_for("boot.prepareRamdisk")
        assert h is not None
        h.run(Context.local("boot.prepareRamdisk", site=site), h.parse(site_pb2.ProxyDhcpEntry(
            node_id="n1", mac_address=mac, boot_file="grubaa64.efi", ttl_seconds=600,
            uki_url=upstream.url("/ramdisk.efi"),
            uki_digest={"hex": hashlib.sha256(uki).hexdigest()}, kernel_cmdline="bc.node=n1")))
        offers = proxy_offers(ask(net, mac, arch=11))
        assert offers and offers[0]["file"] == "grubaa64.efi", json.dumps(offers)
        assert offers[0]["yiaddr"] == "0.0.0.0" and offers[0]["siaddr"] == SITE
        got = json.loads(proc.run([*net.exec(net.cli), sys.executable, str(HERE / "dhcp_client.py"),
                                   "--tftp", SITE, "grubaa64.efi"], timeout=60).text)
        assert got["sha256"] == hashlib.sha256((ipxe / "grubaa64.efi").read_bytes()).hexdigest(), got
