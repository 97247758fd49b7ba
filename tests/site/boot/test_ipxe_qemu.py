"""A QEMU node's own iPXE on the provisioning network: the site daemon's services (in the
site namespace, their own process) answer it only while its MAC has an entry.

The node is QEMU (TCG) with a virtio NIC whose option ROM is iPXE, on a tap device on the
bridge; it has no disk. With an entry, the proxy DHCP sends it to the site's /boot.ipxe, which
chains its own script /pxe/<mac>.ipxe, which chains the entry's script URL: the site's HTTP
log shows the three requests. After boot.cleanUp the same node gets its address from the plain
DHCP server and nothing from the site: no request reaches the site's HTTP service.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from agent import proc
from tests.runtime.harness import wait_until
from tests.site.netns import SITE, Net, wait_listening

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.qemu]

HERE = Path(__file__).resolve().parent
MAC = "52:54:00:be:00:01"
PORT = 8088
# An HTTP GET that prints the status and the body (a stranger's fetch, from another namespace).
STRANGER = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        print(r.status, r.read().decode(errors="replace"))
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode(errors="replace"))
"""


class SiteDaemon:
    def __init__(self, net: Net, workdir: Path, *, untied_scripts: bool = False) -> None:
        self.log_path = workdir / "site.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = proc.spawn(
            [*net.exec(net.site), sys.executable, str(HERE.parent / "site_daemon.py"),
             "--root", str(workdir / "site"), "--address", SITE, "--port", str(PORT),
             "--interface", "eth0", *(["--untied-scripts"] if untied_scripts else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log.fileno())
        assert self._recv().get("ready"), self.log()

    def _recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the site daemon exited:\n{self.log()}")
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer

    def send(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        stdin.write((json.dumps({"kind": kind, "payload": payload}) + "\n").encode())
        stdin.flush()
        answer = self._recv()
        assert answer["ok"], answer
        return answer

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill_group(self.proc)
        self._log.close()


@pytest.fixture
def site_daemon(net: Net, tmp_path: Path) -> Iterator[SiteDaemon]:
    daemon = SiteDaemon(net, tmp_path)
    try:
        wait_listening(net)
        yield daemon
    finally:
        daemon.stop()


def boot_node(net: Net, tap: str, workdir: Path) -> subprocess.Popen[bytes]:
    return proc.spawn(
        [*net.exec(net.lan), "qemu-system-x86_64", "-nodefaults", "-display", "none",
         "-machine", "pc", "-m", "128", "-boot", "n", "-no-reboot",
         "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
         "-device", f"virtio-net-pci,netdev=n0,mac={MAC},bootindex=1",
         "-serial", f"file:{workdir / 'console.log'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_node_ipxe_boots_through_the_site_only_while_registered(
        net: Net, site_daemon: SiteDaemon, tmp_path: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86 not installed")
    tap = net.tap()
    entry_script = f"http://{SITE}:{PORT}/ramdisk.of.the.test.ipxe"
    result = site_daemon.send("boot.prepareRamdisk", {
        "node_id": "qemu-node", "mac_address": MAC, "boot_file": "undionly.kpxe",
        "ipxe_script_url": entry_script, "ttl_seconds": 600})
    assert result["result"]["entry_id"]

    node = boot_node(net, tap, tmp_path)
    try:
        wait_until(lambda: "/ramdisk.of.the.test.ipxe" in site_daemon.log(), 180,
                   "the node to chain the entry's script through the site", interval=0.5)
    finally:
        proc.kill_group(node)
    log = site_daemon.log()
    assert re.search(r"GET /boot\.ipxe -> 200", log), log
    assert re.search(r"GET /pxe/52-54-00-be-00-01\.ipxe -> 200", log), log
    # A stranger on the provisioning network (the scripted client's namespace, 10.99.0.50) asks
    # for the node's script, its MAC seen in the broadcasts: refused, the token not in the answer.
    stranger = proc.run([*net.exec(net.cli), sys.executable, "-c", STRANGER,
                         f"http://{SITE}:{PORT}/pxe/52-54-00-be-00-01.ipxe"], timeout=30).text
    assert stranger.startswith("403 ") and "10.99.0." in stranger and "chain" not in stranger, stranger
    assert re.search(r"GET /pxe/52-54-00-be-00-01\.ipxe -> 403", site_daemon.log())

    site_daemon.send("boot.cleanUp", {"node_id": "qemu-node"})
    mark = len(site_daemon.log())
    plain_log = tmp_path / "plain-dhcp.log"
    acks = plain_log.read_text().count("DHCPACK(eth0)")
    node = boot_node(net, tap, tmp_path)
    try:
        # The node's iPXE has its address (the plain server acknowledged it again) ...
        wait_until(lambda: plain_log.read_text().count("DHCPACK(eth0)") > acks, 180,
                   "the plain DHCP server to give the node its address", interval=0.5)
        time.sleep(5)  # ... and had the time to ask the site for a boot file, had it been told to.
    finally:
        proc.kill_group(node)
    after = site_daemon.log()[mark:]
    assert "GET /" not in after, after
    assert " exited (" not in site_daemon.log(), "dnsmasq died"
    # The site's timeline of the node (agent/site/observe/), from dnsmasq's log and its HTTP
    # service: the registered boot, then the unregistered one named at once.
    answer = site_daemon.send("timeline", {"node_id": "qemu-node"})
    attempts = answer["result"]
    first = [e["step"] for e in attempts[0]["events"]]
    assert first[0] == "prepared" and "dhcp_offer" in first, first
    assert first.index("dhcp_offer") < first.index("chain_script") < first.index("node_script"), first
    assert first[-1] == "cleaned"
    assert first.count("node_script") == 1, first   # the stranger's fetch is not the node's
    assert attempts[-1]["trigger"] == "a PXE request seen", attempts[-1]
    assert attempts[-1]["cause"] == "not_registered", attempts[-1]
