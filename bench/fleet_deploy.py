"""A simulated fleet deploying one image at once (issue 26.5): K real agents in role ramdisk
(the zipapp, each on a loop device of its own), all joined to the reference gateway, each given
a site route with the image's manifest and a deploy.image of the same image at the same moment,
against the same K deploys fetching straight from the upstream with no site in between.

Processes, as in a rack: the upstream (this script with --serve: the files of a directory,
Range honoured, every body byte counted per file), the site daemon (`agent.pyz run --role
site`, its chunk store on disk, emptied before each K), K ramdisk agents (`agent.pyz run`), and
this script (the gateway, in process, and the driver). Counted, not timed: the bytes the
upstream sent of the image (target: at most its data chunks plus 1%, for every K; straight it
is K times that), and of a second version with 10% of its data chunks changed, deployed to the
same K after the first (target: at most the changed chunks' bytes plus 1% of them). Timed: the wall time from
the first deploy sent to the last result, with the site and straight (target: the site no
slower at K = 8 and 32: a ratio site/straight at most 1), the site daemon's CPU seconds and
peak RSS (VmHWM). Every deploy must succeed with every data chunk verified by the ramdisk,
and one disk of each run is compared with the image byte for byte.

Every run starts on disks as new (their backing files' blocks punched out), each K begins
with one deploy straight that is not timed (the first run at a K pays for memory the machine
had not used lately, whichever path it is), and with ``--rounds R`` each K is timed R times
both ways, which goes first alternating: the ratio is the median of the rounds' ratios (one
run's swings by more than the paths differ). Each run also says where the CPU went: the
ramdisks', the upstream's, the site's, the kernel threads' (by name), and each CPU's idle time.

``--layout``: ``shared`` (default) runs everything on every CPU, so the site's own work (each
chunk fetched, hashed and stored once, and its requests' handling) competes with the
ramdisks'; ``rack`` puts the site's side (the upstream, the site daemon, this script's
gateway) on the first CPU and the ramdisks on the others, as a site server and its nodes are
separate machines.

``--direct-io``: the loop devices read and write their backing files with direct I/O (no page
cache of K disks, and their kworkers' CPU mostly gone). ``--uplink RATE`` (bytes a second):
every response of the upstream crosses one link of that rate, shared by all K deploys,
straight or through the site, as a rack's nodes share the site's uplink; without it the
upstream is loopback, free.

Usage (as root: loop devices): python bench/fleet_deploy.py [--size 2G] [--ks 1,8,32]
    [--rounds 3] [--layout shared|rack] [--direct-io] [--uplink 512M] [--chunk 4M]
    [--work DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SITE = "site-1"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the upstream (--serve) ------------------------------------------------------------------

class Uplink:
    """One link of ``rate`` bytes a second that every response crosses (0: no limit): each
    slice a response sends takes the link's next free time, first come first served, so K
    responses at once share the rate between them, as K nodes pulling through one site's
    uplink do."""

    SLICE = 1 << 20

    def __init__(self, rate: float) -> None:
        self.rate, self.next_free, self.lock = rate, 0.0, threading.Lock()

    def wait(self, n: int) -> None:
        """Block until ``n`` bytes may go out."""
        if not self.rate:
            return
        with self.lock:
            start = max(time.monotonic(), self.next_free)
            self.next_free = start + n / self.rate
        time.sleep(max(0.0, start - time.monotonic()))


def serve(directory: str, port_file: str, uplink: Uplink) -> int:
    """Serve the files of ``directory`` with Range (bytes=a-b, a-) across ``uplink``; GET
    /_sent answers the body bytes sent so far per file, as JSON."""
    sent: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            name = self.path.lstrip("/")
            if name == "_sent":
                with lock:
                    body = json.dumps(sent).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            path = Path(directory) / name
            if "/" in name or not path.is_file():
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            size = path.stat().st_size
            start, end = 0, size
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first)
                end = min(size, int(last) + 1) if last else size
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{int(path.stat().st_mtime_ns)}"')
            self.end_headers()
            with open(path, "rb") as f:
                done = 0
                try:
                    while done < end - start:
                        want = end - start - done
                        if uplink.rate:
                            want = min(uplink.SLICE, want)
                        uplink.wait(want)
                        n = self.connection.sendfile(f, offset=start + done, count=want)
                        if not n:
                            break
                        done += n
                finally:
                    with lock:
                        sent[name] = sent.get(name, 0) + done

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()
    return 0


def idle_seconds() -> list[float]:
    """The seconds each CPU has spent idle so far, idle and iowait (/proc/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    return [(int(f[4]) + int(f[5])) / tick for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("cpu") and line[3:4].isdigit() and (f := line.split())]


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's name and CPU seconds so far, kernel threads included (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (name, (int(rest[11]) + int(rest[12])) / tick)
    return out


def where_cpu_went(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                   known: dict[int, str]) -> dict[str, float]:
    """CPU seconds between two cpu_by_process() snapshots, by what ran: ``known`` names the
    bench's own processes, the rest go by their name with the digits taken out (kworker/uN:N).
    A process that ended in between is not counted."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        used = cpu - before.get(pid, (name, 0.0))[1]
        if used > 0:
            what = known.get(pid) or re.sub(r"\d+", "N", name)
            spent[what] = spent.get(what, 0.0) + used
    return {k: round(v, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Upstream:
    def __init__(self, directory: Path, work: Path, cpus: list[str] | None = None, uplink: int = 0) -> None:
        port_file = work / "upstream.port"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([*(cpus or []), sys.executable, __file__, "--serve", str(directory),
                                      "--port-file", str(port_file), "--uplink", str(uplink)])
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the upstream did not start")
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{port_file.read_text()}"

    def sent(self, name: str) -> int:
        with urllib.request.urlopen(self.base + "/_sent", timeout=10) as resp:
            return int(json.loads(resp.read()).get(name, 0))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- images ----------------------------------------------------------------------------------

def make_images(work: Path, size: int, chunk: int, seed: int = 26) -> dict[str, Any]:
    """v1: a quarter of its chunks random data, the rest zeros; v2: 10% of v1's data chunks
    changed. Each with its manifest (`agent manifest`'s code)."""
    from agent.images import manifest

    rng = random.Random(seed)
    count = size // chunk
    data = sorted(rng.sample(range(count), max(1, count // 4)))
    changed = sorted(rng.sample(data, max(1, len(data) // 10)))
    images = work / "upstream"
    images.mkdir(exist_ok=True)
    out: dict[str, Any] = {"chunks": count, "data_chunks": len(data), "changed_chunks": len(changed),
                           "data_bytes": len(data) * chunk, "changed_bytes": len(changed) * chunk}
    v1, v2 = images / "v1.img", images / "v2.img"
    with open(v1, "wb") as f:
        f.truncate(size)
        for i in data:
            f.seek(i * chunk)
            f.write(rng.randbytes(chunk))
    shutil.copyfile(v1, v2)
    with open(v2, "r+b") as f:
        for i in changed:
            f.seek(i * chunk)
            f.write(rng.randbytes(chunk))
    for name, path in (("v1", v1), ("v2", v2)):
        m_path, m_digest, _ = manifest.write(path, chunk_size=chunk)
        out[name] = {"file": path.name, "manifest": m_path.name, "manifest_sha256": m_digest,
                     "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return out


# -- loop devices ----------------------------------------------------------------------------

def backing_file(work: Path, i: int) -> Path:
    return work / "disks" / f"disk{i:02d}"


def fresh_disks(work: Path, devices: list[str], size: int) -> None:
    """Every disk as new before a run: its backing file's blocks given back (a hole again) and
    the loop device's buffers dropped. Otherwise whichever deploy comes first on a disk pays
    for the file system's allocation of its blocks and the next one only overwrites them."""
    for i, dev in enumerate(devices):
        subprocess.run(["fallocate", "--punch-hole", "--offset", "0", "--length", str(size),
                        str(backing_file(work, i))], check=True)
        subprocess.run(["blockdev", "--flushbufs", dev], check=True)


@contextlib.contextmanager
def loop_devices(work: Path, count: int, size: int, direct_io: bool) -> Iterator[list[str]]:
    devices: list[str] = []
    try:
        for i in range(count):
            backing = backing_file(work, i)
            backing.parent.mkdir(exist_ok=True)
            with open(backing, "wb") as f:
                f.truncate(size)
            dio = f"--direct-io={'on' if direct_io else 'off'}"
            dev = subprocess.run(["losetup", "--find", "--show", dio, str(backing)], check=True,
                                 capture_output=True, text=True).stdout.strip()
            devices.append(dev)
        yield devices
    finally:
        for dev in devices:
            subprocess.run(["losetup", "-d", dev], check=False)


# -- the agents ------------------------------------------------------------------------------

class Agent:
    def __init__(self, pyz: Path, pki: Any, gateway: str, node: str, role: str, work: Path,
                 extra: tuple[str, ...] = (), cpus: list[str] | None = None) -> None:
        self.node, self.dir = node, work / "agents" / node
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "cmdline").write_text("")
        self.argv = [*(cpus or []), sys.executable, str(pyz), "run", "--gateway", gateway, "--node", node,
                     "--role", role, "--ca", str(pki.ca), "--state-dir", str(self.dir / "state"),
                     "--trusted-key", str(pki.signing_pub), "--cmdline-file", str(self.dir / "cmdline"),
                     "--cert", str(pki.client_cert(node)), "--key", str(pki.client_key(node)),
                     "--reconnect-min", "0.05", "--reconnect-max", "0.5", *extra]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.dir / "agent.log", "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.dir)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    def peak_rss(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0


def layout(name: str) -> tuple[list[str], list[str], str]:
    """The ``taskset`` prefixes of the site's side (the upstream, the site daemon, this
    script's gateway) and of the nodes' side (the K ramdisks), and a line saying which CPUs.

    rack: as in a rack, the site daemon is a server of its own, not on the nodes' CPUs: the
    first CPU for the site's side, the others for the nodes (on a machine of two, one each).
    shared: every process on every CPU, the site's work on the nodes' CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if name == "shared" or len(cpus) < 2:
        return [], [], f"every process on CPUs {cpus}"
    site, nodes = cpus[:1], cpus[1:]
    os.sched_setaffinity(0, site)  # this script and the threads it starts: the gateway
    return (["taskset", "-c", ",".join(map(str, site))], ["taskset", "-c", ",".join(map(str, nodes))],
            f"the site's side (upstream, site daemon, gateway) on CPU {site}, the ramdisks on {nodes}")


def run_command(gw: Any, node: str, kind: str, payload: dict[str, Any], timeout: float) -> Any:
    cid = gw.send(node, kind, payload)
    body, result = gw.wait_result(cid, timeout)
    if result is None:
        raise RuntimeError(f"{kind} on {node} failed: {body}")
    return result


def make_routes(gw: Any, nodes: list[str], base: str, version: dict[str, Any]) -> list[str]:
    """A route with the image's manifest for each node, made by the site daemon."""
    return [run_command(gw, SITE, "site.httpProxy", {
        "node_id": n, "upstream_url": f"{base}/{version['file']}",
        "manifest": {"url": f"{base}/{version['manifest']}",
                     "digest": {"hex": version["manifest_sha256"]}}}, 120).proxy_url
        for n in nodes]


def deploy_all(gw: Any, nodes: list[str], devices: list[str], urls: list[str],
               manifest_url: str, manifest_sha: str, timeout: float) -> tuple[float, list[Any]]:
    """deploy.image to every node at the same moment; the wall time to the last result."""
    start = time.monotonic()
    cids = []
    for node, dev, url in zip(nodes, devices, urls, strict=True):
        payload = {"url": url, "target": {"name": Path(dev).name},
                   "manifest": {"url": manifest_url, "digest": {"algorithm": "sha256", "hex": manifest_sha}}}
        cids.append(gw.send(node, "deploy.image", payload))
    results = []
    for cid in cids:
        body, result = gw.wait_result(cid, timeout)
        if result is None:
            raise RuntimeError(f"a deploy failed: {body}")
        results.append(result)
    return time.monotonic() - start, results


def disk_matches(dev: str, image: Path) -> bool:
    h1, h2 = hashlib.sha256(), hashlib.sha256()
    size = image.stat().st_size
    with open(dev, "rb") as d, open(image, "rb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            h1.update(d.read(n))
            h2.update(f.read(n))
            left -= n
    return h1.digest() == h2.digest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_size, default=parse_size("2G"))
    p.add_argument("--ks", default="1,8,32")
    p.add_argument("--chunk", type=parse_size, default=parse_size("4M"))
    p.add_argument("--work", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--rounds", type=int, default=1,
                   help="straight and through the site this many times for each K, alternating "
                   "which goes first; the median of the rounds' ratios")
    p.add_argument("--layout", choices=("shared", "rack"), default="shared",
                   help="shared (default): every process on every CPU; rack: the site's side "
                   "on the first CPU and the ramdisks on the others, as a site server and its "
                   "nodes are separate machines")
    p.add_argument("--direct-io", action=argparse.BooleanOptionalAction, default=False,
                   help="the loop devices read and write their backing files with direct I/O")
    p.add_argument("--uplink", type=parse_size, default=0, metavar="BYTES_PER_S",
                   help="the upstream sends across one link of this many bytes a second that "
                   "every deploy shares, straight or through the site (default: no limit)")
    p.add_argument("--serve")
    p.add_argument("--port-file")
    a = p.parse_args()
    if a.serve:
        return serve(a.serve, a.port_file, Uplink(a.uplink))
    if os.geteuid() != 0:
        print("fleet_deploy: needs root (loop devices)", file=sys.stderr)
        return 2
    ks = [int(k) for k in a.ks.split(",")]
    work = a.work or Path(tempfile.mkdtemp(prefix="fleet-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    site_cpus, node_cpus, where = layout(a.layout)
    print(f"layout {a.layout}: {where}; loop devices with{'' if a.direct_io else 'out'} direct I/O; "
          f"uplink {f'{a.uplink >> 20} MiB/s' if a.uplink else 'without a limit'}", flush=True)
    from agent.gateway.certs import make_dev_pki
    from tests.runtime.harness import start_gateway

    pyz = work / "agent.pyz"
    subprocess.run([sys.executable, str(ROOT / "build" / "zipapp.py"), "--out", str(pyz)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    images = make_images(work, a.size, a.chunk)
    print(f"image {a.size} bytes, {images['chunks']} chunks of {a.chunk}, {images['data_chunks']} "
          f"data ({images['data_bytes']} bytes); v2 changes {images['changed_chunks']}", flush=True)
    nodes = [f"n{i:02d}" for i in range(max(ks))]
    pki = make_dev_pki(work / "pki", nodes=(SITE, *nodes))
    gw = start_gateway(pki)
    upstream = Upstream(work / "upstream", work, site_cpus, a.uplink)
    site_port, metrics_port = free_port(), free_port()
    store = work / "store"
    site = Agent(pyz, pki, gw.address, SITE, "site", work, (
        "--site-address", "127.0.0.1", "--site-http-port", str(site_port),
        "--site-store-dir", str(store), "--site-metrics-address", f"127.0.0.1:{metrics_port}",
        # The bench's upstream listens on loopback, which routes may not reach by default.
        "--site-upstream", "127.0.0.1"), site_cpus)
    agents = [Agent(pyz, pki, gw.address, n, "ramdisk", work, cpus=node_cpus) for n in nodes]
    rows: list[dict[str, Any]] = []
    site_starts: list[float] = []   # the site daemon's, each a new gateway session
    try:
        with loop_devices(work, len(nodes), a.size, a.direct_io) as devices:
            for agent in agents:
                agent.start()
            for n in nodes:
                gw.wait_node(n, 120)
            for k in ks:
                row: dict[str, Any] = {"k": k, "rounds": []}
                v1 = images["v1"]
                # Straight from the upstream, and through the site with its store empty, in
                # --rounds rounds; which goes first alternates from one round (and K) to the next.

                def measured(prefix: str, urls: list[str], version: dict[str, Any], k: int = k,
                             row: dict[str, Any] = row) -> None:
                    """The K deploys of ``version`` from ``urls``: wall time, upstream bytes, a disk."""
                    fresh_disks(work, devices[:k], a.size)
                    before, cpu0 = upstream.sent(version["file"]), cpu_seconds(upstream.proc.pid)
                    ramdisks0, idle0 = sum(x.cpu_seconds() for x in agents[:k]), idle_seconds()
                    procs0 = cpu_by_process()
                    started = time.monotonic()
                    wall, results = deploy_all(gw, nodes[:k], devices[:k], urls,
                                               f"{upstream.base}/{version['manifest']}",
                                               version["manifest_sha256"], a.timeout)
                    assert all(r.chunks_verified == images["data_chunks"] for r in results), results[0]
                    row[f"{prefix}_s"] = wall
                    # For a profile of the run (perf record -k CLOCK_MONOTONIC): when, and who.
                    row[f"{prefix}_window"] = [started, started + wall]
                    row[f"{prefix}_pids"] = {"ramdisks": [x.proc.pid for x in agents[:k] if x.proc],
                                             "site": site.proc.pid if site.proc else 0}
                    row[f"{prefix}_upstream_cpu_s"] = cpu_seconds(upstream.proc.pid) - cpu0
                    idle = [after - before for after, before in zip(idle_seconds(), idle0, strict=True)]
                    row[f"{prefix}_idle_s"] = sum(idle)
                    known = {os.getpid(): "bench (gateway)", upstream.proc.pid: "upstream"} | \
                        {x.proc.pid: "ramdisks" for x in agents if x.proc is not None} | \
                        ({site.proc.pid: "site"} if site.proc is not None else {})
                    row[f"{prefix}_cpu_by_process"] = where_cpu_went(procs0, cpu_by_process(), known)
                    row[f"{prefix}_idle_per_cpu_s"] = [round(x, 2) for x in idle]
                    row[f"{prefix}_ramdisks_cpu_s"] = sum(x.cpu_seconds() for x in agents[:k]) - ramdisks0
                    row[f"{prefix}_upstream_bytes"] = upstream.sent(version["file"]) - before
                    row[f"{prefix}_disk_ok"] = disk_matches(devices[k - 1],
                                                            work / "upstream" / version["file"])

                def straight(k: int = k, v1: dict[str, Any] = v1) -> None:
                    measured("straight", [f"{upstream.base}/{v1['file']}"] * k, v1)

                def through_site(k: int = k, row: dict[str, Any] = row, v1: dict[str, Any] = v1) -> None:
                    site.stop()
                    shutil.rmtree(store, ignore_errors=True)
                    site.start()
                    site_starts.append(time.monotonic())
                    gw.wait_node(SITE, 120, sessions=len(site_starts))
                    routes = make_routes(gw, nodes[:k], upstream.base, v1)
                    cpu0 = site.cpu_seconds()
                    measured("site", routes, v1)
                    row["site_cpu_s"] = site.cpu_seconds() - cpu0

                # Not timed: one deploy straight first. Whichever run comes first at a K uses
                # memory the machine has not used for a while, which costs its ramdisks up to
                # a fifth more CPU here (a VM whose freed memory goes back to its host), so the
                # path that went first was the slower one, both ways round.
                measured("warmup", [f"{upstream.base}/{v1['file']}"] * k, v1)
                for r in range(a.rounds):
                    first_straight = (len(rows) + r) % 2 == 0
                    for mode in ((straight, through_site) if first_straight else (through_site, straight)):
                        mode()
                    row["rounds"].append({key: row[key] for key in (
                        "straight_s", "site_s", "site_cpu_s", "straight_upstream_cpu_s",
                        "site_upstream_cpu_s", "site_upstream_bytes",
                        "straight_upstream_bytes", "site_disk_ok", "straight_disk_ok",
                        "straight_idle_s", "site_idle_s", "straight_ramdisks_cpu_s",
                        "site_ramdisks_cpu_s", "straight_idle_per_cpu_s", "site_idle_per_cpu_s",
                        "straight_cpu_by_process", "site_cpu_by_process", "straight_window",
                        "site_window", "straight_pids", "site_pids")}
                        | {"first": "straight" if first_straight else "site"})
                # The second version, to the same K, the store warm from the first.
                v2 = images["v2"]
                measured("v2", make_routes(gw, nodes[:k], upstream.base, v2), v2)
                row["site_peak_rss"] = site.peak_rss()
                rounds = row["rounds"]
                for key in ("straight_s", "site_s", "site_cpu_s", "straight_upstream_cpu_s",
                            "site_upstream_cpu_s", "straight_idle_s", "site_idle_s",
                            "straight_ramdisks_cpu_s", "site_ramdisks_cpu_s"):
                    row[key] = statistics.median(x[key] for x in rounds)
                for key in ("site_upstream_bytes", "straight_upstream_bytes"):
                    row[key] = max(x[key] for x in rounds)
                for key in ("site_disk_ok", "straight_disk_ok"):
                    row[key] = all(x[key] for x in rounds)
                row["ratios"] = [x["site_s"] / x["straight_s"] for x in rounds]
                row["ratio"] = statistics.median(row["ratios"])
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for agent in agents:
            agent.stop()
        site.stop()
        upstream.stop()
        gw.stop()
    data, changed = images["data_bytes"], images["changed_bytes"]
    print(f"\n{'K':>3} {'straight s':>10} {'site s':>8} {'site/straight':>13} {'upstream (site)':>16}"
          f" {'target':>10} {'straight upstream':>17} {'v2 upstream':>12} {'v2 target':>10}"
          f" {'site CPU s':>10} {'site peak RSS':>13} {'upstream CPU s straight/site':>28}"
          f" {'ramdisks CPU s straight/site':>28}")
    for row in rows:
        print(f"{row['k']:>3} {row['straight_s']:>10.1f} {row['site_s']:>8.1f} {row['ratio']:>13.2f}"
              f" {row['site_upstream_bytes']:>16} {int(data * 1.01):>10} {row['straight_upstream_bytes']:>17}"
              f" {row['v2_upstream_bytes']:>12} {int(changed * 1.01):>10} {row['site_cpu_s']:>10.1f}"
              f" {row['site_peak_rss'] >> 20:>10} MiB"
              f" {row['straight_upstream_cpu_s']:>20.1f} / {row['site_upstream_cpu_s']:.1f}"
              f" {row['straight_ramdisks_cpu_s']:>22.1f} / {row['site_ramdisks_cpu_s']:.1f}")
        if len(row["rounds"]) > 1:
            print("    rounds (first, straight s, site s, ratio): " + ", ".join(
                f"({x['first']}, {x['straight_s']:.1f}, {x['site_s']:.1f}, "
                f"{x['site_s'] / x['straight_s']:.2f})" for x in row["rounds"]))
    ok = all(r["site_upstream_bytes"] <= data * 1.01 and r["v2_upstream_bytes"] <= changed * 1.01
             and r["site_disk_ok"] and r["straight_disk_ok"] and r["v2_disk_ok"] for r in rows)
    print(f"bytes targets {'met' if ok else 'NOT met'}; every deploy verified every data chunk")
    if a.json:
        a.json.write_text(json.dumps({"images": images, "rows": rows, "size": a.size, "layout": where,
                                      "chunk": a.chunk, "direct_io": a.direct_io, "uplink": a.uplink},
                                     indent=2))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
