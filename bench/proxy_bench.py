"""A 2 GiB image through a site.httpProxy route against the same fetch straight from the
upstream, on loopback (issue 17 target: through the route >= 0.9 of straight).

Three processes, as in a rack: the upstream (this script with --serve: a file served with
sendfile, Range honoured), the site's HTTP service (agent/site, in this process, a route made
by the real site.httpProxy handler) and the fetcher (this script with --fetch: reads the body
with http.client into a 1 MiB buffer, as agent/http.py does for deploy.image, and checks the
length). Runs alternate straight / through, so a noisy neighbour hits both; the medians and
their ratio are printed.

Usage: python bench/proxy_bench.py [--size 2G] [--runs 5]
"""

from __future__ import annotations

import argparse
import http.client
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUFFER = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


# -- the upstream (--serve) ------------------------------------------------------------------

def serve(path: str, port_file: str) -> int:
    size = os.path.getsize(path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            with open(path, "rb") as f:
                self.connection.sendfile(f, offset=start)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()
    return 0


# -- the fetcher (--fetch) -------------------------------------------------------------------

def fetch(url: str, expect: int) -> int:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    t0 = time.perf_counter()
    conn.request("GET", parts.path)
    resp = conn.getresponse()
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    got = 0
    while n := resp.readinto(view):
        got += n
    seconds = time.perf_counter() - t0
    if resp.status != 200 or got != expect:
        print(f"FAILED: status {resp.status}, {got} of {expect} bytes", file=sys.stderr)
        return 1
    print(f"{seconds:.6f}")
    return 0


def _cpu() -> float:
    """CPU seconds (user + system) of this process: the site's HTTP service's threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_fetch(url: str, size: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--fetch", url, str(size)], check=True,
                         capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="2G", help="image size (default 2G)")
    p.add_argument("--runs", type=int, default=5, help="fetches of each kind (default 5)")
    p.add_argument("--serve", nargs=2, metavar=("FILE", "PORTFILE"), help=argparse.SUPPRESS)
    p.add_argument("--fetch", nargs=2, metavar=("URL", "SIZE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        return serve(*a.serve)
    if a.fetch:
        return fetch(a.fetch[0], int(a.fetch[1]))

    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.proto import site_pb2
    from agent.site import services
    from agent.site.services import ServiceSettings, SiteServices

    size = parse_size(a.size)
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        image = Path(tmp) / "image.raw"
        with open(image, "wb") as f:
            block = os.urandom(BUFFER)
            for _ in range(size // BUFFER):
                f.write(block)
            f.write(block[: size % BUFFER])
        port_file = Path(tmp) / "port"
        upstream = subprocess.Popen([sys.executable, __file__, "--serve", str(image), str(port_file)])
        try:
            deadline = time.monotonic() + 10
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline:
                    raise SystemExit("the upstream did not start")
                time.sleep(0.05)
            straight = f"http://127.0.0.1:{port_file.read_text()}/image.raw"
            socket.create_connection(("127.0.0.1", int(port_file.read_text())), 5).close()
            services.install(SiteServices(ServiceSettings(
                address="127.0.0.1", port=0, root=Path(tmp) / "site")))
            try:
                h = handler_for("site.httpProxy")
                assert h is not None
                result = h.run(Context.local("site.httpProxy"), h.parse(site_pb2.HttpProxyRequest(
                    node_id="bench", upstream_url=straight, ttl_seconds=3600)))
                assert isinstance(result, site_pb2.HttpProxyResult)
                through = result.proxy_url
                timed_fetch(straight, size)  # warm the page cache
                times: dict[str, list[float]] = {"straight": [], "through the route": []}
                site_cpu = 0.0
                for i in range(a.runs):
                    order = [("straight", straight), ("through the route", through)]
                    for name, url in order if i % 2 == 0 else reversed(order):
                        cpu0 = _cpu()
                        seconds = timed_fetch(url, size)
                        if name != "straight":
                            site_cpu += _cpu() - cpu0
                        times[name].append(seconds)
                        print(f"run {i + 1}: {name:18} {seconds:7.2f} s  "
                              f"{size / seconds / (1 << 20):8.0f} MiB/s", flush=True)
            finally:
                services.stop()
        finally:
            upstream.terminate()
            upstream.wait(10)
    print()
    print("| path | runs | median (s) | median (MiB/s) |")
    print("|---|---|---|---|")
    rates = {}
    for name, values in times.items():
        median = statistics.median(values)
        rates[name] = size / median / (1 << 20)
        print(f"| {name} | {len(values)} | {median:.2f} | {rates[name]:.0f} |")
    ratio = rates["through the route"] / rates["straight"]
    per_gib = site_cpu / a.runs / (size / (1 << 30))
    print(f"\nthe site's HTTP service used {per_gib:.2f} CPU-seconds per GiB relayed "
          f"({os.cpu_count()} CPUs here, load average {os.getloadavg()[0]:.1f})")
    print(f"{a.size} image, {a.runs} runs each: through / straight = {ratio:.2f} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
