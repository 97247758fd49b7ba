"""A PXE storm on the provisioning network of tests/site/netns.py: 32 nodes' NICs registered
with boot.prepareRamdisk (each its own kernel and initrd), then 32 scripted UEFI PXE/iPXE
clients (tests/site/boot/pxe_storm.py) booting at the same moment from the client namespace, five
storms in a row. Every client gets its proxy offer, its boot file by TFTP, the site's iPXE
script, its own script and its own kernel and initrd over the site's HTTP service, byte-exact;
none gets another's; no failure in any storm."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from tests.site.boot.test_ipxe_qemu import SiteDaemon
from tests.site.netns import IPXE, SITE, Net, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
NODES = 32
STORMS = 5
UPSTREAM = 9000


@pytest.fixture
def site_daemon(net: Net, tmp_path: Path) -> Iterator[SiteDaemon]:
    """The site daemon serving each script to any address: the storm's 32 clients are one NIC
    (one link-layer address) playing 32 MACs, which the site rightly refuses elsewhere (a
    node's script goes to that node's address only: tests/site/boot/test_pxe.py,
    test_ipxe_qemu.py); here the load is what is tested."""
    daemon = SiteDaemon(net, tmp_path, untied_scripts=True)
    try:
        wait_listening(net)
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def upstream(net: Net, tmp_path: Path) -> Iterator[dict[str, bytes]]:
    """Each node's kernel and initrd (distinct bytes), served inside the site namespace, where
    the site daemon fetches them from when the entry is made."""
    files = tmp_path / "upstream"
    files.mkdir()
    blobs: dict[str, bytes] = {}
    for n in range(NODES):
        for what, size in (("vmlinuz", 96 * 1024), ("initrd", 160 * 1024)):
            data = os.urandom(size)
            (files / f"{what}-{n:02d}").write_bytes(data)
            blobs[f"{what}-{n:02d}"] = data
    server = proc.spawn([*net.exec(net.site), sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                         "--directory", str(files), str(UPSTREAM)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            probe = proc.run([*net.exec(net.site), "ss", "-Hltn", "sport", "=", f":{UPSTREAM}"], check=False)
            if probe.text.strip():
                break
            proc.run(["sleep", "0.1"])
        yield blobs
    finally:
        proc.kill_group(server)


def mac_of(n: int) -> str:
    return f"52:54:00:5e:00:{n:02x}"


def test_32_nodes_boot_at_once_five_times_without_a_miss(
        net: Net, site_daemon: SiteDaemon, upstream: dict[str, bytes]) -> None:
    for n in range(NODES):
        site_daemon.send("boot.prepareRamdisk", {
            "node_id": f"storm-{n:02d}", "mac_address": mac_of(n), "boot_file": "ipxe.efi",
            "kernel_url": f"http://127.0.0.1:{UPSTREAM}/vmlinuz-{n:02d}",
            "initrd_url": f"http://127.0.0.1:{UPSTREAM}/initrd-{n:02d}",
            "kernel_digest": {"hex": hashlib.sha256(upstream[f"vmlinuz-{n:02d}"]).hexdigest()},
            "initrd_digest": {"hex": hashlib.sha256(upstream[f"initrd-{n:02d}"]).hexdigest()},
            "kernel_cmdline": f"console=ttyS0 bc.node=storm-{n:02d}", "ttl_seconds": 3600})
    efi_sha = hashlib.sha256((IPXE / "ipxe.efi").read_bytes()).hexdigest()
    macs = ",".join(mac_of(n) for n in range(NODES))
    times = []
    for storm in range(STORMS):
        ran = proc.run([*net.exec(net.cli), sys.executable, str(HERE / "pxe_storm.py"), "--iface", "eth0",
                        "--site", SITE, "--macs", macs], timeout=300)
        report = json.loads(ran.text)
        failed = {m: c for m, c in report["clients"].items() if "failed" in c}
        assert not failed, f"storm {storm}: {len(failed)} of {NODES} failed: {failed}"
        for n in range(NODES):
            got = report["clients"][mac_of(n)]
            assert got["boot_file"] == "ipxe.efi" and got["boot_file_sha256"] == efi_sha
            assert f"node storm-{n:02d}," in got["script"] and f"bc.node=storm-{n:02d}" in got["script"]
            assert got["kernel_sha256"] == hashlib.sha256(upstream[f"vmlinuz-{n:02d}"]).hexdigest()
            assert got["initrd_sha256"] == hashlib.sha256(upstream[f"initrd-{n:02d}"]).hexdigest()
        times.append(report["seconds"])
    assert " exited (" not in site_daemon.log(), "dnsmasq died during the storms"
    # The site's counters saw them: a PXE and an iPXE offer and a boot file per client and storm.
    counters = site_daemon.send("counters", {})["result"]
    assert counters["pxe_offers"] >= 2 * NODES * STORMS, counters
    assert counters["tftp_files"] >= NODES * STORMS, counters
    print(f"PXE storms of {NODES} clients, first DISCOVER to last initrd byte (s): "
          + ", ".join(f"{t:.2f}" for t in times))
