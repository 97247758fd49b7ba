"""Boot entries: validation, TTL, replacement, state on disk and its reconciliation, clean-up,
the scripts and cache the HTTP service serves; through the handlers where a handler decides."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.errors import InvalidParameters, Unsupported
from agent.proto import site_pb2
from agent.site.boot.fields import parse_mac
from agent.site.boot.pxe import BootEntries, BootEntry, BootFile, BootSpec, EntryRequest, grub_http_device
from agent.site.services import SiteServices
from tests.loopback_http import LoopbackServer

MAC = "52:54:00:12:34:56"
D = {"hex": "a" * 64}
K = {"ipxe_script_url": "", "kernel_url": "http://h/k", "kernel_digest": D}
U = {"ipxe_script_url": "", "boot_file": "ipxe.efi", "uki_url": "http://h/ramdisk.efi", "uki_digest": D}


def entry(**fields: object) -> site_pb2.ProxyDhcpEntry:
    base: dict[str, object] = {"node_id": "n1", "mac_address": MAC, "boot_file": "undionly.kpxe",
                               "ipxe_script_url": "http://10.0.0.1/ramdisk.ipxe",
                               "ttl_seconds": 60}
    base.update(fields)
    return site_pb2.ProxyDhcpEntry(**base)  # type: ignore[arg-type]


def prepare(site: SiteServices | None, msg: site_pb2.ProxyDhcpEntry) -> site_pb2.ProxyDhcpResult:
    h = handler_for("boot.prepareRamdisk")
    assert h is not None
    result = h.run(Context.local("boot.prepareRamdisk", site=site), h.parse(msg))
    assert isinstance(result, site_pb2.ProxyDhcpResult)
    return result


def cleanup(site: SiteServices, node_id: str, macs: tuple[str, ...] = (), keep: bool = False) -> list[str]:
    h = handler_for("boot.cleanUp")
    assert h is not None
    msg = site_pb2.BootCleanUpRequest(node_id=node_id, mac_addresses=macs, keep_ramdisk_cache=keep)
    result = h.run(Context.local("boot.cleanUp", site=site), h.parse(msg))
    assert isinstance(result, site_pb2.BootCleanUpResult)
    return list(result.removed)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("mac", ["52:54:00:12:34:5", "52:54:00:12:34:567", "zz:54:00:12:34:56",
                                 "52:54:00-12:34:56", "01:00:5e:00:00:01", "", "52 54 00 12 34 56"])
def test_malformed_mac_refused(mac: str) -> None:
    with pytest.raises(InvalidParameters):
        parse_mac(mac)


def test_mac_normalised() -> None:
    assert parse_mac("52-54-00-AB-CD-EF") == "52:54:00:ab:cd:ef"


@pytest.mark.parametrize("fields, words", [
    ({"mac_address": "nope"}, "malformed MAC"),
    ({"boot_file": "pxelinux.0"}, "not served"),
    ({"boot_file": "../../etc/passwd"}, "not served"),
    ({"boot_file": ""}, "not served"),
    ({"ipxe_script_url": "tftp://10.0.0.1/x"}, "http or https"),
    ({"ipxe_script_url": "file:///etc/passwd"}, "http or https"),
    ({"ipxe_script_url": "http://10.0.0.1/a b"}, "whitespace"),
    ({"ipxe_script_url": "http://10.0.0.1/x\nshell"}, "whitespace"),
    ({"ipxe_script_url": "http://10.0.0.1/${net0/ip}"}, "iPXE script"),
    ({"ipxe_script_url": "http://10.0.0.1/x||shell"}, "iPXE script"),
    ({"ipxe_script_url": "", "kernel_url": ""}, "needs ipxe_script_url, kernel_url or uki_url"),
    ({**U, "uki_digest": {}}, "uki_digest: required"),
    ({**U, "boot_file": "undionly.kpxe"}, "UEFI firmware only"),
    ({**U, "kernel_url": "http://h/k", "kernel_digest": D}, "uki_url alone"),
    ({**U, "ipxe_script_url": "http://h/s.ipxe"}, "uki_url alone"),
    ({**U, "uki_url": "http://h/${x}"}, "iPXE script"),
    ({**U, "kernel_cmdline": "bc.node=n1 || shell"}, "kernel_cmdline"),
    ({"uki_digest": D}, "uki_digest without a uki_url"),
    ({"boot_file": "grubaa64.efi"}, "boots a uki_url"),
    ({**K, "boot_file": "grubaa64.efi"}, "boots a uki_url"),
    ({**K, "boot_file": "bootaa64.efi"}, "(arm64 UEFI, the site's UKI) boots a uki_url"),
    ({**K, "kernel_cmdline": "a\nshell"}, "kernel_cmdline"),
    ({**K, "kernel_cmdline": "x || shell"}, "kernel_cmdline"),
    ({**K, "kernel_cmdline": "x=${y}"}, "kernel_cmdline"),
    ({**K, "kernel_cmdline": 'a="b c"'}, "kernel_cmdline"),
    ({**K, "kernel_cmdline": "a;b"}, "kernel_cmdline"),
    ({"kernel_url": "http://h/k"}, "either ipxe_script_url or kernel_url"),
    ({"ipxe_script_url": "", "kernel_url": "http://h/k"}, "kernel_digest: required"),
    ({"ipxe_script_url": "", "kernel_url": "http://h/k", "kernel_digest": D,
      "initrd_url": "http://h/i"}, "initrd_digest: required"),
    ({"ipxe_script_url": "", "kernel_url": "http://h/k", "kernel_digest": {"hex": "ab"}},
     "kernel_digest"),
    ({"ipxe_script_url": "", "kernel_url": "http://h/k",
      "kernel_digest": {"algorithm": "sha512", "hex": "a" * 128}}, "keyed by sha256"),
    ({"ipxe_script_url": "", "kernel_url": "http://h/k", "kernel_digest": D,
      "initrd_digest": D}, "initrd_digest without an initrd_url"),
    ({"kernel_digest": D}, "either ipxe_script_url or kernel_url"),
    ({"node_id": ""}, "node_id"),
    ({"node_id": "../x"}, "node_id"),
    ({"ttl_seconds": 30 * 24 * 3600}, "at most"),
])
def test_bad_entries_refused_before_anything(fields: dict[str, object], words: str) -> None:
    h = handler_for("boot.prepareRamdisk")
    assert h is not None
    with pytest.raises(InvalidParameters) as info:
        h.parse(entry(**fields))
    assert words in info.value.message


def test_handlers_say_when_the_service_is_not_running() -> None:
    with pytest.raises(Unsupported, match="not running"):
        prepare(None, entry())


def test_register_writes_host_file_and_script(site: SiteServices) -> None:
    result = prepare(site, entry())
    root = site.settings.root / "boot"
    assert (root / "hosts" / "525400123456").read_text() == f"{MAC}\n"
    assert json.loads((root / "entries" / "525400123456.json").read_text())["entry_id"] == result.entry_id
    status, body = fetch(f"{site.base_url}/boot.ipxe")
    assert status == 200 and b"chain " + site.base_url.encode() + b"/pxe/${mac:hexhyp}.ipxe" in body
    status, body = fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")
    assert status == 200
    assert body.startswith(b"#!ipxe\n") and b"chain http://10.0.0.1/ramdisk.ipxe || goto failed" in body
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-57.ipxe")[0] == 404
    assert fetch(f"{site.base_url}/pxe/..%2Fentries%2F525400123456.json")[0] == 404
    assert fetch(f"{site.base_url}/etc/passwd")[0] == 404


def test_reregistering_replaces(site: SiteServices) -> None:
    first = prepare(site, entry())
    second = prepare(site, entry(boot_file="ipxe.efi", ipxe_script_url="http://10.0.0.9/other.ipxe"))
    assert first.entry_id != second.entry_id
    assert [e.entry_id for e in site.entries.all()] == [second.entry_id]
    root = site.settings.root / "boot"
    assert (root / "hosts" / "525400123456").read_text() == f"{MAC}\n"
    assert json.loads((root / "entries" / "525400123456.json").read_text())["boot_file"] == "ipxe.efi"
    assert b"other.ipxe" in fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")[1]


def test_entry_expires_by_itself(site: SiteServices) -> None:
    prepare(site, entry(ttl_seconds=1))
    root = site.settings.root / "boot"
    assert (root / "hosts" / "525400123456").exists()
    deadline = time.monotonic() + 5
    while ((root / "hosts" / "525400123456").read_text()
           or (root / "entries" / "525400123456.json").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)  # the host file is emptied first, the entry file removed after it
    assert (root / "hosts" / "525400123456").read_text() == "", "emptied, not removed (dnsmasq)"
    assert not (root / "entries" / "525400123456.json").exists()
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")[0] == 404


def test_reconcile_keeps_live_drops_expired_and_strays(tmp_path: Path) -> None:
    store = BootEntries(tmp_path, "http://10.0.0.2:8088")
    store.reconcile()
    store.register(EntryRequest.from_proto(entry(ttl_seconds=600)))
    store.register(EntryRequest.from_proto(entry(mac_address="52:54:00:00:00:02", ttl_seconds=1)))
    (tmp_path / "hosts" / "deadbeef0000").write_text("de:ad:be:ef:00:00\n")
    (tmp_path / "entries" / "garbage.json").write_text("{not json")
    (tmp_path / "scripts" / "52-54-00-12-34-56.ipxe").unlink()
    time.sleep(1.1)
    again = BootEntries(tmp_path, "http://10.0.0.2:8088")
    assert again.reconcile() == ["52:54:00:00:00:02"]
    assert [e.mac for e in again.all()] == [MAC]
    assert sorted(p.name for p in (tmp_path / "hosts").iterdir()) == ["525400123456"]
    assert sorted(p.name for p in (tmp_path / "entries").iterdir()) == ["525400123456.json"]
    assert (tmp_path / "scripts" / "52-54-00-12-34-56.ipxe").is_file()


def test_an_entry_on_disk_keeps_its_shape(tmp_path: Path) -> None:
    """entries/<mac hex>.json as the daemon has always written it: read back at a restart."""
    store = BootEntries(tmp_path, "http://10.0.0.2:8088")
    store.reconcile()
    written = store.register(EntryRequest.from_proto(entry(ttl_seconds=600)))
    on_disk = json.loads((tmp_path / "entries" / "525400123456.json").read_text())
    assert sorted(on_disk) == ["boot_file", "cmdline", "entry_id", "expires_at", "initrd_digest",
                               "initrd_url", "kernel_digest", "kernel_url", "mac", "node_id",
                               "script_url", "uki_digest", "uki_url"]
    # An entry written before kernels carried digests, or UKIs were served, reads back as it was.
    del on_disk["kernel_digest"], on_disk["initrd_digest"], on_disk["uki_url"], on_disk["uki_digest"]
    on_disk["entry_id"] = "525400123456-0badf00d"
    (tmp_path / "entries" / "525400123456.json").write_text(json.dumps(on_disk))
    again = BootEntries(tmp_path, "http://10.0.0.2:8088")
    assert again.reconcile() == []
    (kept,) = again.all()
    assert kept.entry_id == "525400123456-0badf00d" and kept.expires_at == written.expires_at
    assert (kept.mac, kept.script_url, kept.boot_file) == (written.mac, written.script_url, written.boot_file)


def test_kernel_and_initrd_cached_shared_and_cleaned(site: SiteServices) -> None:
    with LoopbackServer() as upstream:
        upstream.add("/vmlinuz", b"K" * 1000)
        upstream.add("/initrd", b"I" * 3000)
        cmdline = "console=ttyS0,115200 bc.gateway=10.0.0.1:8443"
        k, i = sha256(b"K" * 1000), sha256(b"I" * 3000)
        kernel = {"ipxe_script_url": "", "kernel_url": upstream.url("/vmlinuz"),
                  "initrd_url": upstream.url("/initrd"), "kernel_cmdline": cmdline,
                  "kernel_digest": {"hex": k}, "initrd_digest": {"hex": i}}
        prepare(site, entry(**kernel))
        prepare(site, entry(node_id="n2", mac_address="52:54:00:00:00:02", **kernel))
        gets = [r for r in upstream.requests if r[0] == "GET"]
        assert len(gets) == 2, "each file fetched once, shared by the two entries"
    _, script = fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")
    line = f"kernel --name vmlinuz {site.base_url}/cache/{k} {cmdline} initrd=initrd.img"
    assert line.encode() in script
    assert f"initrd --name initrd.img {site.base_url}/cache/{i}".encode() in script
    assert fetch(f"{site.base_url}/cache/{k}") == (200, b"K" * 1000)
    assert fetch(f"{site.base_url}/cache/{'0' * 64}")[0] == 404
    # n1 leaves; n2 still uses the cache.
    assert cleanup(site, "n1") == [f"entry {MAC}"]
    assert fetch(f"{site.base_url}/cache/{k}")[0] == 200
    # n2 leaves, keeping the cache; then a later clean-up without keep removes it.
    assert cleanup(site, "n2", keep=True) == ["entry 52:54:00:00:00:02"]
    assert fetch(f"{site.base_url}/cache/{i}")[0] == 200
    assert sorted(cleanup(site, "n2")) == sorted([f"cache {i}", f"cache {k}"])
    assert fetch(f"{site.base_url}/cache/{k}")[0] == 404


def test_a_uki_entry_chains_it_with_nothing_passed_and_serves_the_node_settings(site: SiteServices) -> None:
    """One UKI for the site's nodes, cached by digest; iPXE names the image U+0001 so that
    systemd-stub keeps its embedded command line; the node's settings at /pxe/<mac>.cmdline."""
    uki = b"MZ a UKI" * 100
    u = sha256(uki)
    settings = "bc.node=n1 bc.gateway=10.0.0.1:8443 bc.token=t0k3n"
    with LoopbackServer() as upstream:
        upstream.add("/ramdisk.efi", uki)
        fields = {**U, "uki_url": upstream.url("/ramdisk.efi"), "uki_digest": {"hex": u},
                  "kernel_cmdline": settings}
        prepare(site, entry(**fields))
        prepare(site, entry(**{**fields, "node_id": "n2", "mac_address": "52:54:00:00:00:02",
                               "kernel_cmdline": "bc.node=n2"}))
        assert len([r for r in upstream.requests if r[0] == "GET"]) == 1, "one build, fetched once"
    status, script = fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")
    assert status == 200
    lines = script.decode().splitlines()
    at = lines.index("set bc-name:hex 01")
    assert lines[at + 1] == f"chain --name ${{bc-name:string}} {site.base_url}/cache/{u} || goto failed"
    assert "bc.node" not in script.decode() and "t0k3n" not in script.decode()
    assert fetch(f"{site.base_url}/cache/{u}") == (200, uki)
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.cmdline") == (200, f"{settings}\n".encode())
    assert fetch(f"{site.base_url}/pxe/52-54-00-00-00-02.cmdline") == (200, b"bc.node=n2\n")
    assert fetch(f"{site.base_url}/pxe/52-54-00-00-00-03.cmdline")[0] == 404
    assert fetch(f"{site.base_url}/pxe/..%2F52-54-00-12-34-56.cmdline")[0] == 404
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.cmdline?x")[0] == 404
    assert cleanup(site, "n1") == [f"entry {MAC}"]
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.cmdline")[0] == 404
    assert fetch(f"{site.base_url}/cache/{u}")[0] == 200, "n2 still boots it"
    assert sorted(cleanup(site, "n2")) == ["cache " + u, "entry 52:54:00:00:00:02"]
    assert fetch(f"{site.base_url}/cache/{u}")[0] == 404


def test_an_arm64_uki_entry_gets_a_grub_script_chainloading_it_with_no_arguments(
        site: SiteServices) -> None:
    """arm64 UEFI (boot_file grubaa64.efi, the site's GRUB): /boot.grub runs the node's GRUB
    script by the MAC GRUB booted from; that script chainloads the UKI from the store with
    nothing after its path (no LoadOptions: the UKI's own command line, PCR 12 empty); the
    settings come from /pxe/<mac>.cmdline as on x86."""
    uki = b"MZ an arm64 UKI" * 100
    u = sha256(uki)
    settings = "bc.node=n1 bc.gateway=10.0.0.1:8443 bc.token=t0k3n"
    with LoopbackServer() as upstream:
        upstream.add("/ramdisk.efi", uki)
        prepare(site, entry(**{**U, "boot_file": "grubaa64.efi", "uki_url": upstream.url("/ramdisk.efi"),
                               "uki_digest": {"hex": u}, "kernel_cmdline": settings}))
    port = site.base_url.rsplit(":", 1)[1]
    server = f"(http,127.0.0.1:{port})"
    status, chain = fetch(f"{site.base_url}/boot.grub")
    assert status == 200
    lines = chain.decode().splitlines()
    assert f"configfile {server}/pxe/${{net_default_mac}}.grub" in lines
    assert lines[-1] == "exit"  # no entry: back to the firmware, the next boot device
    # GRUB asks by its MAC with colons; hyphens are taken too.
    for name in ("52:54:00:12:34:56.grub", "52-54-00-12-34-56.grub"):
        status, script = fetch(f"{site.base_url}/pxe/{name}")
        assert status == 200, name
    text = script.decode()
    assert f"chainloader {server}/cache/{u}" in text.splitlines()
    assert f"set root={server}" in text.splitlines()  # the chainloaded image's device
    assert text.splitlines()[text.splitlines().index(f"chainloader {server}/cache/{u}") + 1] == "boot"
    assert "bc.node" not in text and "t0k3n" not in text and ";" not in text
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")[0] == 404  # not iPXE's
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.cmdline") == (200, f"{settings}\n".encode())
    assert fetch(f"{site.base_url}/cache/{u}") == (200, uki)
    root = site.settings.root / "boot"
    assert sorted(p.name for p in (root / "scripts").iterdir()) == ["52-54-00-12-34-56.grub"]
    # Registered again as an x86 entry: iPXE's script replaces GRUB's.
    prepare(site, entry())
    assert sorted(p.name for p in (root / "scripts").iterdir()) == ["52-54-00-12-34-56.ipxe"]
    assert fetch(f"{site.base_url}/pxe/52:54:00:12:34:56.grub")[0] == 404
    assert cleanup(site, "n1")[0] == f"entry {MAC}"
    assert list((root / "scripts").iterdir()) == []


def test_an_entry_for_the_sites_own_uki_boot_file_names_the_uki_the_tftp_serves(
        site: SiteServices) -> None:
    """boot_file bootaa64.efi (arm64 under Secure Boot: the firmware starts the UKI the site's
    TFTP serves, no script runs): refused where the site serves none or another build than the
    entry's uki_digest, nothing registered; registered where they agree, its settings served."""
    uki = b"MZ the site's signed arm64 UKI" * 100
    u = sha256(uki)
    settings = "bc.node=n1 bc.gateway=10.0.0.1:8443 bc.token=t0k3n"
    with LoopbackServer() as upstream:
        upstream.add("/ramdisk.efi", uki)
        msg = entry(**{**U, "boot_file": "bootaa64.efi", "uki_url": upstream.url("/ramdisk.efi"),
                       "uki_digest": {"hex": u}, "kernel_cmdline": settings})
        with pytest.raises(InvalidParameters, match="this site serves no arm64 UKI"):
            prepare(site, msg)
        site.entries.served_uki = lambda: "b" * 64
        wrong = f"serves the UKI with sha256 {'b' * 64}, not the entry's {u}"
        with pytest.raises(InvalidParameters, match=wrong):
            prepare(site, msg)
        assert site.entries.all() == []
        site.entries.served_uki = lambda: u
        prepare(site, msg)
    (registered,) = site.entries.all()
    assert registered.boot_file is BootFile.UEFI_ARM64_UKI
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.cmdline") == (200, f"{settings}\n".encode())
    assert fetch(f"{site.base_url}/pxe/52:54:00:12:34:56.grub")[0] == 404
    assert cleanup(site, "n1")[0] == f"entry {MAC}"


def test_an_arm64_entry_survives_a_restart(tmp_path: Path) -> None:
    """Reconciled at start, its GRUB script is written again and kept (not taken for a stray)."""
    first = BootEntries(tmp_path / "boot", "http://10.0.0.2:8088")
    first.reconcile()
    req = EntryRequest.from_proto(entry(**{**U, "boot_file": "grubaa64.efi"}))
    first.table.save(  # as register() keeps it, without fetching the UKI
        BootEntry(**{f.name: getattr(req, f.name) for f in dataclasses.fields(BootSpec)},
                               entry_id="e1", expires_at=time.time() + 60))
    again = BootEntries(tmp_path / "boot", "http://10.0.0.2:8088")
    assert again.reconcile() == []
    script = (tmp_path / "boot" / "scripts" / "52-54-00-12-34-56.grub").read_text()
    assert f"chainloader (http,10.0.0.2:8088)/cache/{'a' * 64}" in script
    assert again.script_path("52:54:00:12:34:56.grub") == tmp_path / "boot/scripts/52-54-00-12-34-56.grub"


def test_grub_reaches_the_site_over_http_only(tmp_path: Path) -> None:
    assert grub_http_device("http://10.0.0.2:8088/") == "(http,10.0.0.2:8088)"
    assert grub_http_device("http://site.example") == "(http,site.example)"
    for bad in ("https://10.0.0.2:8443", "http://10.0.0.2:8088/x", "http://h;reboot"):
        with pytest.raises(InvalidParameters, match="http://host"):
            grub_http_device(bad)
    entries = BootEntries(tmp_path / "boot", "https://10.0.0.2:8443")
    entries.reconcile()
    with pytest.raises(InvalidParameters, match="http://host"):
        entries.register(EntryRequest.from_proto(entry(**{**U, "boot_file": "grubaa64.efi"})))
    assert entries.all() == []


def test_a_kernel_entry_has_no_settings_route(site: SiteServices) -> None:
    """Its settings are in its script already: /pxe/<mac>.cmdline answers UKI entries only."""
    prepare(site, entry())
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.cmdline")[0] == 404


def test_cleanup_idempotent_and_by_mac(site: SiteServices) -> None:
    prepare(site, entry())
    prepare(site, entry(mac_address="52:54:00:00:00:02"))
    prepare(site, entry(node_id="other", mac_address="52:54:00:00:00:03"))
    assert cleanup(site, "n1", ("52:54:00:00:00:02",)) == ["entry 52:54:00:00:00:02"]
    assert cleanup(site, "n1") == [f"entry {MAC}"]
    assert cleanup(site, "n1") == []
    assert cleanup(site, "nobody") == []
    assert [e.mac for e in site.entries.all()] == ["52:54:00:00:00:03"]
    h = handler_for("boot.cleanUp")
    assert h is not None
    with pytest.raises(InvalidParameters):
        h.parse(site_pb2.BootCleanUpRequest(node_id="n1", mac_addresses=["bad"]))


def test_the_cache_by_url_of_earlier_versions_is_removed(tmp_path: Path) -> None:
    (tmp_path / "cache" / "sub").mkdir(parents=True)
    (tmp_path / "cache" / ("a" * 64)).write_bytes(b"a kernel cached by its URL's digest")
    BootEntries(tmp_path, "http://10.0.0.2:8088").reconcile()
    assert not (tmp_path / "cache").exists() and (tmp_path / "store").is_dir()


def test_a_nodes_script_goes_to_the_address_its_dhcp_exchange_tied_to_its_mac(site: SiteServices) -> None:
    """A MAC is seen in every DHCP broadcast, and a node's script holds its join token: where the
    site runs its proxy DHCP, the script (and a UKI entry's settings) go to the address the
    site's DHCP exchange tied to the MAC only. A stranger asking is refused (403, logged), and
    its fetch is no step of the registered node's timeline; the node's own fetch is served."""
    prepare(site, entry(node_id="n1"))
    prepare(site, entry(node_id="n2", mac_address="52:54:00:00:00:02", boot_file="ipxe.efi"))
    site.entries.clients_tied = True            # what a site running dnsmasq sets
    site.entries.arp = lambda ip: ""            # loopback: no neighbour entry
    # dnsmasq's boot server answer: the node booted from 10.99.0.50, not from here (127.0.0.1)
    site._dnsmasq_line(f"dnsmasq-dhcp[1]: 2353434870 PXE(eth0) 10.99.0.50 {MAC} undionly.kpxe")
    site._dnsmasq_line("dnsmasq-dhcp[1]: 7 PXE(eth0) 10.99.0.51 52:54:00:00:00:02 ipxe.efi")
    status, body = fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")
    assert status == 403 and b"10.99.0.50" in body and b"ramdisk.ipxe" not in body, body
    assert fetch(f"{site.base_url}/pxe/52-54-00-00-00-02.cmdline")[0] == 403   # checked first
    assert fetch(f"{site.base_url}/pxe/52-54-00-00-00-02.ipxe")[0] == 403
    # an unregistered MAC tied elsewhere: refused before its entry is looked up (nothing of it filed)
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-57.ipxe")[0] == 403
    for node in ("n1", "n2"):
        a = site.observe.timelines.last(node)
        assert a is not None and not [e for e in a.events if e.step == "node_script"], a.events
    # the neighbour table holding the client for another NIC: refused, whatever DHCP tied
    site._dnsmasq_line("dnsmasq-dhcp[1]: 9 PXE(eth0) 52:54:00:00:00:03 proxy")
    site.entries.arp = lambda ip: "52:54:00:00:00:09"
    assert fetch(f"{site.base_url}/pxe/52-54-00-00-00-03.ipxe")[0] == 403
    site._dnsmasq_line(f"dnsmasq-dhcp[1]: 11 PXE(eth0) 127.0.0.1 {MAC} http://x/boot.ipxe")
    refused = fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")
    assert refused[0] == 403 and b"neighbour table holds" in refused[1], refused
    # the node itself, at the address its DHCP exchange gave (no neighbour entry: loopback):
    # served, and in its timeline
    site.entries.arp = lambda ip: ""
    status, body = fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")
    assert status == 200 and b"ramdisk.ipxe" in body
    deadline = time.monotonic() + 10    # the service tells the timeline after its answer
    while not [e for e in (site.observe.timelines.last("n1") or pytest.fail()).events
               if e.step == "node_script"]:
        assert time.monotonic() < deadline, "the node's own fetch is not in its timeline"
        time.sleep(0.05)
    a = site.observe.timelines.last("n1")
    assert a is not None and [e.status for e in a.events if e.step == "node_script"] == [200]
    # the neighbour table holding the client for the node's NIC (its ramdisk on another lease,
    # the site's GRUB on arm64, which never asks the boot server): served
    site.entries.arp = lambda ip: MAC
    site._dnsmasq_line(f"dnsmasq-dhcp[1]: 12 PXE(eth0) 10.99.0.77 {MAC} http://x/boot.ipxe")
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")[0] == 200
