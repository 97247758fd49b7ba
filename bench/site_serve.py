"""The site's own cost of serving a rack one image (issue 26): K clients read the data runs
of an image at once, straight from the upstream and through routes with its manifest, and the
CPU seconds each server spent are compared. bench/fleet_deploy.py times whole deploys; here
the clients only read (into one buffer each, as a ramdisk's Range requests would, one per run
of data chunks, on one kept-alive connection) so that the servers' CPU stands out.

Three passes a round: straight (the bench's upstream: Range, sendfile); through the site with
its store empty (each data chunk fetched from the upstream once, verified, stored, and served
to the K clients); through the site again (every chunk from the store). Figures: wall time,
the upstream's CPU seconds, the site daemon's, the clients' (this process: the gateway in it
is idle meanwhile), each pass.

Usage: python bench/site_serve.py [--k 8] [--rounds 3] [--size 2G] [--store DIR] [--work DIR]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import fleet_deploy as fleet  # noqa: E402  (the upstream, the agents, the images)


def data_runs(manifest_path: Path) -> list[tuple[int, int]]:
    """[start, end) of each run of data chunks, as the ramdisk's RangeReader asks for them."""
    from agent.images import manifest

    plan = manifest.parse(manifest_path.read_bytes(), manifest_path.name)
    runs, start = [], -1
    for seg in plan.segments:
        if seg.digest is not None and start < 0:
            start = seg.offset
        elif seg.digest is None and start >= 0:
            runs.append((start, seg.offset))
            start = -1
    if start >= 0:
        runs.append((start, plan.image_size))
    return runs


def read_runs(url: str, runs: list[tuple[int, int]], got: list[int]) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port)
    buf = memoryview(bytearray(16 << 20))
    n = 0
    try:
        for a, b in runs:
            conn.request("GET", parts.path, headers={"Range": f"bytes={a}-{b - 1}"})
            resp = conn.getresponse()
            if resp.status != 206:
                raise RuntimeError(f"{resp.status} for bytes {a}-{b - 1}")
            left = b - a
            while left:
                m = resp.readinto(buf[:min(left, len(buf))])
                if not m:
                    raise RuntimeError(f"the answer ended {left} bytes short")
                left -= m
                n += m
    finally:
        conn.close()
    got.append(n)


def read_all(urls: list[str], runs: list[tuple[int, int]]) -> tuple[float, float]:
    """Every client at once, each reading every run whole: (wall seconds, the clients' CPU
    seconds)."""
    got: list[int] = []
    threads = [threading.Thread(target=read_runs, args=(u, runs, got)) for u in urls]
    t0, c0 = time.monotonic(), os.times()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c1 = os.times()
    if got != [sum(b - a for a, b in runs)] * len(urls):
        raise RuntimeError(f"the clients read {got} bytes (a failure above?)")
    return time.monotonic() - t0, c1.user - c0.user + c1.system - c0.system


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=fleet.parse_size, default=fleet.parse_size("2G"))
    p.add_argument("--chunk", type=fleet.parse_size, default=fleet.parse_size("4M"))
    p.add_argument("--store", type=Path, help="the site's store (default: WORK/store, on disk)")
    p.add_argument("--work", type=Path)
    a = p.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="serve-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    from agent.gateway.certs import make_dev_pki
    from tests.runtime.harness import start_gateway

    pyz = work / "agent.pyz"
    subprocess.run([sys.executable, str(ROOT / "build" / "zipapp.py"), "--out", str(pyz)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    v1 = fleet.make_images(work, a.size, a.chunk)["v1"]
    runs = data_runs(work / "upstream" / v1["manifest"])
    nodes = [f"n{i:02d}" for i in range(a.k)]
    pki = make_dev_pki(work / "pki", nodes=(fleet.SITE, *nodes))
    gw = start_gateway(pki)
    upstream = fleet.Upstream(work / "upstream", work)
    store = a.store or work / "store"
    site = fleet.Agent(pyz, pki, gw.address, fleet.SITE, "site", work, (
        "--site-address", "127.0.0.1", "--site-http-port", str(fleet.free_port()),
        "--site-store-dir", str(store), "--site-upstream", "127.0.0.1"))
    print(f"{a.k} clients, {len(runs)} Range requests each, {a.size} bytes image; store {store}")
    print(f"{'pass':<14} {'wall s':>7} {'upstream CPU s':>15} {'site CPU s':>11} {'clients CPU s':>14}")
    try:
        for r in range(a.rounds):
            u0 = fleet.cpu_seconds(upstream.proc.pid)
            wall, clients = read_all([f"{upstream.base}/{v1['file']}"] * a.k, runs)
            print(f"{'straight':<14} {wall:>7.2f} {fleet.cpu_seconds(upstream.proc.pid) - u0:>15.2f}"
                  f" {'':>11} {clients:>14.2f}", flush=True)
            site.stop()
            shutil.rmtree(store, ignore_errors=True)
            site.start()
            gw.wait_node(fleet.SITE, 120, sessions=r + 1)
            urls = fleet.make_routes(gw, nodes, upstream.base, v1)
            for name in ("site, cold", "site, warm"):
                u0, s0 = fleet.cpu_seconds(upstream.proc.pid), site.cpu_seconds()
                wall, clients = read_all(urls, runs)
                print(f"{name:<14} {wall:>7.2f} {fleet.cpu_seconds(upstream.proc.pid) - u0:>15.2f}"
                      f" {site.cpu_seconds() - s0:>11.2f} {clients:>14.2f}", flush=True)
    finally:
        site.stop()
        upstream.stop()
        gw.stop()
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
