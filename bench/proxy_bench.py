"""A 2 GiB image through a site.httpProxy route against the same fetch straight from the
upstream, on loopback (issue 17 target: through the route >= 0.9 of straight).

Three processes, as in a rack: the upstream (this script with --serve: a file served with
sendfile, Range honoured), the site's HTTP service (agent/site, in this process, a route made
by the real site.httpProxy handler) and the fetcher, each fetch its own process:

- read:   this script with --fetch: the body read with http.client into a 1 MiB buffer, as
          agent/net/download.py does for deploy.image, and its length checked; nothing else.
- deploy: this script with --deploy: deploy.image itself (the handler, through
          Context.local) to a file under --target-dir, the image's SHA-256 checked.

Each round fetches straight and through the route back to back, who goes first alternating;
the result is the median of the rounds' ratios (as bench/disk_bench.py does: it cancels the
machine's drift, which on these shared virtual machines moves a straight fetch by 20% from one
minute to the next), with the ratio of the medians beside it; also the relay's CPU per GiB,
and how many CPUs the fetcher, the upstream and the relay kept busy together (their CPU
seconds over the wall time).

Usage: python bench/proxy_bench.py [--size 2G] [--runs 9] [--fetchers read,deploy]
"""

from __future__ import annotations

import argparse
import hashlib
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


def deploy(url: str, size: int, sha256: str, target: str) -> int:
    """deploy.image itself, as a ramdisk runs it: the image (``size`` bytes) from ``url`` to the
    file ``target``, its SHA-256 checked; the target is made anew (sparse) before the clock."""
    from agent.commands.base import Context
    from agent.commands.deploy import DeployImage
    from agent.hw import block
    from agent.proto import agent_pb2, common_pb2

    path = Path(target)
    path.unlink(missing_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    subprocess.run(["sync"], check=True)
    disk = block.file_disk(path)
    handler = DeployImage(disks=lambda: [disk])
    request = agent_pb2.DeployImageRequest(
        url=url, digest=common_pb2.Digest(algorithm="sha256", hex=sha256),
        target=common_pb2.DiskHints(name=disk.name))
    t0 = time.perf_counter()
    result = handler.run(Context.local("deploy.image"), handler.parse(request))
    seconds = time.perf_counter() - t0
    if result.verification != "digest" or result.image_bytes != size:
        print(f"FAILED: {result}", file=sys.stderr)
        return 1
    print(f"{seconds:.6f}")
    return 0


def _cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process (the site's HTTP service's threads), or of
    process ``pid`` (the upstream)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    """CPU seconds of the fetchers that have ended (each fetch is a child process)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(args: list[str]) -> float:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True,
                         text=True, timeout=600)
    return float(out.stdout.strip())


def start_upstream(image: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "port"
    upstream = subprocess.Popen([sys.executable, __file__, "--serve", str(image), str(port_file)])
    deadline = time.monotonic() + 10
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline:
            raise SystemExit("the upstream did not start")
        time.sleep(0.05)
    socket.create_connection(("127.0.0.1", int(port_file.read_text())), 5).close()
    return upstream, f"http://127.0.0.1:{port_file.read_text()}/image.raw"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="2G", help="image size (default 2G)")
    p.add_argument("--runs", type=int, default=9, help="rounds: fetches of each kind (default 9)")
    p.add_argument("--fetchers", default="read,deploy",
                   help="comma-separated: read (the body read, nothing else), deploy (deploy.image)")
    p.add_argument("--target-dir", default="/var/tmp",
                   help="where deploy.image writes its target file (default /var/tmp)")
    p.add_argument("--serve", nargs=2, metavar=("FILE", "PORTFILE"), help=argparse.SUPPRESS)
    p.add_argument("--fetch", nargs=2, metavar=("URL", "SIZE"), help=argparse.SUPPRESS)
    p.add_argument("--deploy", nargs=4, metavar=("URL", "SIZE", "SHA256", "TARGET"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        return serve(*a.serve)
    if a.fetch:
        return fetch(a.fetch[0], int(a.fetch[1]))
    if a.deploy:
        return deploy(a.deploy[0], int(a.deploy[1]), a.deploy[2], a.deploy[3])
    fetchers = a.fetchers.split(",")
    if not set(fetchers) <= {"read", "deploy"}:
        p.error(f"--fetchers: read and/or deploy, not {a.fetchers}")

    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.proto import site_pb2
    from agent.site.services import ServiceSettings, SiteServices

    size = parse_size(a.size)
    target = Path(a.target_dir) / f"proxy-bench-target-{os.getpid()}.raw"
    results: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, float] = {}
    busy: dict[str, list[float]] = {}  # CPUs kept busy by the fetcher, upstream and relay
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmpdir:
        tmp = Path(tmpdir)
        image = tmp / "image.raw"
        digest = hashlib.sha256()
        with open(image, "wb") as f:
            block = os.urandom(BUFFER)
            for _ in range(size // BUFFER):
                f.write(block)
                digest.update(block)
            f.write(block[: size % BUFFER])
            digest.update(block[: size % BUFFER])
        upstream, straight = start_upstream(image, tmp)
        try:
            site = SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp / "site",
                                                upstreams=("127.0.0.1",)))
            site.start()
            try:
                h = handler_for("site.httpProxy")
                assert h is not None
                result = h.run(Context.local("site.httpProxy", site=site), h.parse(site_pb2.HttpProxyRequest(
                    node_id="bench", upstream_url=straight, ttl_seconds=3600)))
                assert isinstance(result, site_pb2.HttpProxyResult)
                paths = {"straight": straight, "through the route": result.proxy_url}
                timed(["--fetch", straight, str(size)])  # the page cache holds the image
                for fetcher in fetchers:
                    times = results[fetcher] = {name: [] for name in paths}
                    for i in range(a.runs):
                        for name in list(paths) if i % 2 == 0 else reversed(paths):
                            url = paths[name]
                            args = (["--fetch", url, str(size)] if fetcher == "read" else
                                    ["--deploy", url, str(size), digest.hexdigest(), str(target)])
                            key = f"{fetcher}, {name}"
                            relayed = name != "straight"  # the site's service: this process
                            relay0 = _cpu() if relayed else 0.0
                            all0 = _children_cpu() + _cpu(upstream.pid) + relay0
                            seconds = timed(args)
                            relay1 = _cpu() if relayed else 0.0
                            all1 = _children_cpu() + _cpu(upstream.pid) + relay1
                            if relayed:
                                cpu[key] = cpu.get(key, 0.0) + relay1 - relay0
                            busy.setdefault(key, []).append((all1 - all0) / seconds)
                            times[name].append(seconds)
                            print(f"{fetcher} run {i + 1}: {name:20} {seconds:7.2f} s  "
                                  f"{size / seconds / (1 << 20):8.0f} MiB/s", flush=True)
            finally:
                site.stop()
        finally:
            target.unlink(missing_ok=True)
            upstream.terminate()
            upstream.wait(10)
    gib = size / (1 << 30)
    summary = []
    for fetcher, times in results.items():
        print(f"\n{fetcher}: {'the body read, nothing else' if fetcher == 'read' else 'deploy.image'}")
        print("| path | runs | median (s) | median (MiB/s) | relay CPU-s/GiB | CPUs busy |")
        print("|---|---|---|---|---|---|")
        for name, values in times.items():
            median = statistics.median(values)
            key = f"{fetcher}, {name}"
            relay_cpu = f"{cpu[key] / a.runs / gib:.2f}" if key in cpu else ""
            print(f"| {name} | {len(values)} | {median:.2f} | {size / median / (1 << 20):.0f} "
                  f"| {relay_cpu} | {statistics.median(busy[key]):.2f} |")
        pairs = [s_ / r for s_, r in zip(times["straight"], times["through the route"], strict=True)]
        of_medians = statistics.median(times["straight"]) / statistics.median(times["through the route"])
        print(f"per round, through / straight: {' '.join(f'{x:.2f}' for x in pairs)}")
        summary.append(f"{fetcher}: through the route / straight = {statistics.median(pairs):.2f} "
                       f"(median of the rounds; of the medians {of_medians:.2f})")
    print(f"\n{os.cpu_count()} CPUs here, load average {os.getloadavg()[0]:.1f}")
    print(f"{a.size} image, {a.runs} rounds; " + "; ".join(summary) + "; target >= 0.9")
    return 0


if __name__ == "__main__":
    sys.exit(main())
