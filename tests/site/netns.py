"""A provisioning network in network namespaces, for the site's boot tests.

    lan   br0 ── p-site ── site: eth0 10.99.0.2  the site's dnsmasq (proxy DHCP, TFTP), HTTP
              ├─ p-dhcp ── dhcp: eth0 10.99.0.1  plain dnsmasq: addresses 10.99.0.100-200
              ├─ p-cli  ── cli:  eth0 10.99.0.50 a scripted PXE client
              └─ tap0 (in lan)                   a QEMU node, when one is asked for

Nothing leaves the namespaces; ``down`` removes them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent import proc

IPXE = Path("/usr/lib/ipxe")
SITE, DHCP, CLIENT = "10.99.0.2", "10.99.0.1", "10.99.0.50"


def need() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    for tool in ("ip", "dnsmasq"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install iproute2 dnsmasq-base)")
    if not (IPXE / "undionly.kpxe").is_file():
        pytest.skip("Debian's ipxe package is not installed")


class Net:
    def __init__(self) -> None:
        tag = f"bcs{os.getpid() % 100000}"
        self.lan, self.site, self.dhcp, self.cli = (f"{tag}-{n}" for n in ("lan", "site", "dhcp", "cli"))
        self.made: list[str] = []

    def ip(self, *args: str) -> None:
        proc.run(["ip", *args], timeout=10)

    def up(self) -> None:
        for ns in (self.lan, self.site, self.dhcp, self.cli):
            self.ip("netns", "add", ns)
            self.made.append(ns)
        self.ip("-n", self.lan, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.lan, "link", "set", "br0", "up")
        for name, ns, addr in (("site", self.site, SITE), ("dhcp", self.dhcp, DHCP),
                               ("cli", self.cli, CLIENT)):
            self.ip("-n", self.lan, "link", "add", f"p-{name}", "type", "veth", "peer", "name",
                    "eth0", "netns", ns)
            self.ip("-n", self.lan, "link", "set", f"p-{name}", "master", "br0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)

    def tap(self, name: str = "tap0") -> str:
        """A tap device on the bridge (in the lan namespace) for a QEMU node."""
        self.ip("-n", self.lan, "tuntap", "add", "dev", name, "mode", "tap")
        self.ip("-n", self.lan, "link", "set", name, "master", "br0", "up")
        return name

    def exec(self, ns: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", ns)


def wait_listening(net: Net, ns: str = "") -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = proc.run([*net.exec(ns or net.site), "ss", "-Hlun", "sport", "=", ":67"], check=False).text
        if out.strip():
            return
        time.sleep(0.1)
    raise AssertionError(f"dnsmasq did not start listening on port 67 in {ns or net.site}")
