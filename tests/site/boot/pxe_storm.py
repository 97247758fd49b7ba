"""A PXE storm: many scripted UEFI PXE/iPXE clients (tests/site/boot/dhcp_client.py's packets) that
boot at the same moment, one thread each, from one network namespace.

    ip netns exec CLI python tests/site/boot/pxe_storm.py --iface eth0 --site 10.99.0.2 \
        --macs 52:54:00:..,52:54:00:.. [--boot-file ipxe.efi]

Each client does what a UEFI firmware and then iPXE do: DHCPDISCOVER as a PXE ROM (arch 7),
waiting for the proxy offer of the site (its boot file); the boot file by TFTP; DHCPDISCOVER
as iPXE, waiting for the offer of the site's /boot.ipxe; that script, then its own script
(/pxe/<mac>.ipxe), then the kernel and initrd that script names, over HTTP. It prints one JSON
object: per MAC what it got (the boot file's sha256, its script, the kernel's and initrd's
sha256 and size) or the step that failed, and the storm's time from the first DISCOVER to the
last initrd byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dhcp_client import client_socket, discover, gather, tftp_get

ARCH_EFI = 7


def offer(iface: str, mac: str, site: str, *, ipxe: bool, wait: float) -> dict[str, Any]:
    """The site's proxy offer to ``mac`` (re-sending DISCOVER each second, as firmware does)."""
    raw = bytes.fromhex(mac.replace(":", ""))
    xid = int.from_bytes(os.urandom(4), "big")
    with client_socket(iface) as s:
        got = gather(s, discover(raw, xid, ARCH_EFI, ipxe), xid, wait, first_from=site)
    if not got:
        raise TimeoutError(f"no proxy offer from {site} in {wait:g} s")
    return got[0]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        data: bytes = resp.read()
        return data


def boot(iface: str, mac: str, site: str, go: threading.Barrier, out: dict[str, Any],
         times: dict[str, float]) -> None:
    step = "start"
    try:
        go.wait()
        times[f"{mac} first"] = time.monotonic()
        step = "pxe offer"
        first = offer(iface, mac, site, ipxe=False, wait=20)
        step = "tftp"
        got = tftp_get(site, str(first["file"]), timeout=10)
        if "error" in got:
            raise RuntimeError(f"TFTP {first['file']}: {got['error']}")
        step = "ipxe offer"
        chained = offer(iface, mac, site, ipxe=True, wait=20)
        step = "boot.ipxe"
        chain = get(str(chained["file"])).decode()
        found = re.search(r"chain (\S+)/pxe/\$\{mac:hexhyp\}\.ipxe", chain)
        if found is None:
            raise RuntimeError(f"boot.ipxe chains nothing: {chain!r}")
        step = "node script"
        script = get(f"{found.group(1)}/pxe/{mac.replace(':', '-')}.ipxe").decode()
        kernel = re.search(r"^kernel --name vmlinuz (\S+)", script, re.M)
        initrd = re.search(r"^initrd --name initrd.img (\S+)", script, re.M)
        if kernel is None or initrd is None:
            raise RuntimeError(f"the script names no kernel and initrd: {script!r}")
        step = "kernel"
        k = get(kernel.group(1))
        step = "initrd"
        i = get(initrd.group(1))
        times[f"{mac} last"] = time.monotonic()
        out[mac] = {"boot_file": first["file"], "boot_file_sha256": got["sha256"], "script": script,
                    "kernel_sha256": hashlib.sha256(k).hexdigest(), "kernel_size": len(k),
                    "initrd_sha256": hashlib.sha256(i).hexdigest(), "initrd_size": len(i)}
    except Exception as exc:
        out[mac] = {"failed": step, "error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iface", required=True)
    p.add_argument("--site", required=True)
    p.add_argument("--macs", required=True, help="comma separated")
    a = p.parse_args()
    macs = a.macs.split(",")
    go = threading.Barrier(len(macs))
    out: dict[str, Any] = {}
    times: dict[str, float] = {}
    threads = [threading.Thread(target=boot, args=(a.iface, m, a.site, go, out, times)) for m in macs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    firsts = [v for k, v in times.items() if k.endswith(" first")]
    lasts = [v for k, v in times.items() if k.endswith(" last")]
    storm = max(lasts) - min(firsts) if firsts and len(lasts) == len(macs) else -1.0
    json.dump({"clients": out, "seconds": storm}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
