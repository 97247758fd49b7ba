"""The site relay under many downloads at once, and under many small requests (issue 27, item 6).

Three processes, as in a rack: the upstream (bench/proxy_bench.py --serve: a file served with
sendfile), the site's HTTP service (this script with --site: agent/site in its own process,
a route made by the real site.httpProxy handler, so its memory is its own), and the fetchers
(threads of this process).

- memory: ``--concurrent N`` downloads of ``--size`` each through the route at once, each
  read slowly enough that every relay holds its buffer at the same time; the site's RSS is
  sampled every 20 ms: before, at its peak, and after. Beside it the bound docs/site.md
  promises for the relay's buffers: 256 MiB, plus 1 MiB for each request past the budget.
- small: ``--requests K`` GETs of ``--small-size`` bytes, one after the other on one
  kept-alive connection through the route, with the site's TCP_NODELAY on and off
  (``--nagle``), alternating rounds; the median time per request of each.

Usage: python bench/relay_bench.py [--concurrent 48] [--size 24M] [--requests 200]
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_bench import parse_size, start_upstream  # noqa: E402

MIB = 1 << 20


def site(upstream: str, url_file: str, nagle: str) -> int:
    """The site's HTTP service with one route to ``upstream``; the route's URL into
    ``url_file``; serves until killed."""
    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.proto import site_pb2
    from agent.site.serve import web
    from agent.site.services import ServiceSettings, SiteServices

    web._Handler.disable_nagle_algorithm = nagle == "off"
    with tempfile.TemporaryDirectory(prefix="relay-bench-site-") as tmp:
        site = SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=Path(tmp),
                                            upstreams=("127.0.0.1",)))
        site.start()
        h = handler_for("site.httpProxy")
        assert h is not None
        msg = site_pb2.HttpProxyRequest(node_id="bench", upstream_url=upstream, ttl_seconds=3600)
        result = h.run(Context.local("site.httpProxy", site=site), h.parse(msg))
        assert isinstance(result, site_pb2.HttpProxyResult)
        Path(url_file + ".tmp").write_text(result.proxy_url)
        os.rename(url_file + ".tmp", url_file)
        threading.Event().wait()
    return 0


def start_site(upstream: str, tmp: Path, nagle: str) -> tuple[subprocess.Popen[bytes], str]:
    url_file = tmp / f"site-url-{upstream.rsplit(':', 1)[1].split('/')[0]}-{nagle}"
    proc = subprocess.Popen([sys.executable, __file__, "--site", upstream, str(url_file), nagle])
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the site did not start")
        time.sleep(0.05)
    return proc, url_file.read_text()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def download(url: str, expect: int, chunk: int, pause: float, errors: list[str]) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    try:
        conn.request("GET", parts.path)
        resp = conn.getresponse()
        got = 0
        while data := resp.read(chunk):
            got += len(data)
            time.sleep(pause)
        if resp.status != 200 or got != expect:
            errors.append(f"status {resp.status}, {got} of {expect} bytes")
    except (OSError, http.client.HTTPException) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def memory(url: str, pid: int, concurrent: int, size: int) -> dict[str, float]:
    before = rss(pid)
    peak = before
    errors: list[str] = []
    threads = [threading.Thread(target=download, args=(url, size, MIB, 0.0, errors))
               for _ in range(concurrent)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(pid))
        time.sleep(0.02)
    for t in threads:
        t.join()
    time.sleep(0.5)
    after = rss(pid)
    if errors:
        raise SystemExit(f"{len(errors)} downloads failed: {errors[0]}")
    return {"before": before / MIB, "peak": peak / MIB, "after": after / MIB}


def small(url: str, requests: int) -> float:
    """Seconds per request, the median, of ``requests`` GETs on one connection."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    times = []
    try:
        for _ in range(requests):
            t0 = time.perf_counter()
            conn.request("GET", parts.path)
            resp = conn.getresponse()
            body = resp.read()
            times.append(time.perf_counter() - t0)
            if resp.status != 200 or len(body) != 4096:
                raise SystemExit(f"small request: status {resp.status}, {len(body)} bytes")
    finally:
        conn.close()
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrent", type=int, default=48, help="downloads at once (default 48)")
    p.add_argument("--size", default="24M", help="each download's size (default 24M)")
    p.add_argument("--requests", type=int, default=200, help="small requests a round (default 200)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of small requests (default 3)")
    p.add_argument("--only", choices=("memory", "small"), help="one of the two")
    p.add_argument("--site", nargs=3, metavar=("UPSTREAM", "URLFILE", "NAGLE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.site:
        return site(*a.site)
    size = parse_size(a.size)
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmpdir:
        tmp = Path(tmpdir)
        image = tmp / "image.raw"
        image.write_bytes(os.urandom(size))
        upstream, straight = start_upstream(image, tmp)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            if a.only in (None, "memory"):
                proc, url = start_site(straight, tmp, "off")
                procs.append(proc)
                m = memory(url, proc.pid, a.concurrent, size)
                bound = 256 + max(0, a.concurrent - 256 * MIB // min(16 * MIB, size))
                print(f"memory: {a.concurrent} downloads of {size / MIB:g} MiB at once: site RSS "
                      f"{m['before']:.0f} MiB before, {m['peak']:.0f} MiB at the peak "
                      f"(+{m['peak'] - m['before']:.0f} MiB; the buffers' bound {bound} MiB), "
                      f"{m['after']:.0f} MiB after")
            if a.only in (None, "small"):
                (tmp / "small").mkdir()
                four_k = tmp / "small" / "image.raw"
                four_k.write_bytes(os.urandom(4096))
                small_upstream, small_url = start_upstream(four_k, tmp / "small")
                procs.append(small_upstream)
                sites = {nagle: start_site(small_url, tmp, nagle) for nagle in ("on", "off")}
                procs += [proc for proc, _ in sites.values()]
                per: dict[str, list[float]] = {"on": [], "off": []}
                for i in range(a.rounds):
                    for nagle in ("on", "off") if i % 2 == 0 else ("off", "on"):
                        per[nagle].append(small(sites[nagle][1], a.requests))
                for nagle, values in per.items():
                    print(f"small: {a.requests} GETs of 4 KiB on one connection, Nagle {nagle:3}: "
                          f"median {statistics.median(values) * 1000:.2f} ms per request "
                          f"(rounds {' '.join(f'{v * 1000:.2f}' for v in values)})")
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(10)
            upstream.terminate()
            upstream.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
