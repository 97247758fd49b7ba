"""deploy.image from an OCI registry against the same image over plain HTTP from the same
machine (issue 42 target: at most 1.05x the time), and the registry's bytes when K ramdisk
deploys take one image through one site route (target: the image's data once).

Both on loopback, everything real: Debian's docker-registry (tests/images/registry.py starts it
with a temporary config), the image pushed by our own push (agent/images/oci.py); the plain
HTTP server is bench/proxy_bench.py's upstream (sendfile, Range honoured) serving the very
blob file the registry stores. Each deploy is deploy.image itself in a process of its own, to
a fresh sparse file under --target-dir, checked by the image's sha256: from the registry by
``oci+http://`` (the tag resolved, the layer's digest checked), over HTTP with the digest in the
request. One warm-up deploy of each first (not counted: the page cache, the imports), then
rounds that alternate who goes first; the result is the median of the rounds' ratios (the
machine's drift cancels), with each side's median time beside it. Around each deploy the
bench records the load average, the CPU seconds of the deploy's process, of the server it read
from (the registry's apart from the sendfile server's) and of the rest of the machine (from
/proc/stat: the other work on a shared machine), and gives the median ratio over the quiet
rounds (the rest of the machine under QUIET of a core during both deploys) beside the one over
all rounds.

K deploys: the site's services in this process, a route made by the real site.httpProxy
handler from the registry reference (the artifact carrying its chunk manifest layer), K
deploy.image handlers at once (threads) from the route's URL with the layer's digest and the
chunk manifest; the registry's bytes are read from its own access log.

Usage: python bench/oci_bench.py [--size 2G] [--runs 9] [--k 8] [--k-size 512M]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_bench import parse_size  # noqa: E402

QUIET = 0.25     # a round is quiet when the rest of the machine used less than this many cores


def make_image(path: Path, size: int) -> str:
    """A dense image (random data: nothing for zero skipping to skip); its sha256."""
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 8 << 20))
            f.write(block)
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def deploy_oci(ref: str, size: int, target: str) -> int:
    """deploy.image from ``ref`` (no digest in the request: the layer's) to the file ``target``."""
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
    request = agent_pb2.DeployImageRequest(url=ref, target=common_pb2.DiskHints(name=disk.name))
    t0 = time.perf_counter()
    result = handler.run(Context.local("deploy.image"), handler.parse(request))
    seconds = time.perf_counter() - t0
    if result.verification != "digest" or result.image_bytes != size or not result.resolved_manifest:
        print(f"FAILED: {result}", file=sys.stderr)
        return 1
    print(f"{seconds:.6f}")
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds the whole machine has spent not idle (every core, every process) so far."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]                  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    """One deploy: its wall time, and the CPU seconds spent meanwhile by the deploy's process,
    by the server it read from, and by everything else on the machine (the other engineers'
    work: what makes a round noisy), all over the child's whole life."""

    wall: float          # the deploy itself, as the child timed it
    elapsed: float       # the child's whole life (its start, imports, the target's set-up)
    client: float
    server: float
    others: float


def timed(argv: list[str], server_pid: int) -> Run:
    """``argv`` run as a child that prints its wall seconds last; the CPU around it."""
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    server0, busy0, t0 = cpu_seconds(server_pid), machine_busy(), time.perf_counter()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    busy, server = machine_busy() - busy0, cpu_seconds(server_pid) - server0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {done.stderr[-2000:]}")
    client = (children.ru_utime - children0.ru_utime) + (children.ru_stime - children0.ru_stime)
    return Run(float(done.stdout.strip().splitlines()[-1]), elapsed, client, server,
               max(0.0, busy - client - server))


def ratio(work: Path, size: int, runs: int, target_dir: Path) -> None:
    from agent.images import oci
    from tests.images.registry import Registry

    image = work / "image.raw"
    sha = make_image(image, size)
    with Registry(work) as reg:
        client = oci.Registry(oci.parse(reg.ref("bench/image:1")))
        pushed = oci.push(client, image, arch=oci.node_arch(), index=True)
        assert pushed.disk.hex == sha
        image.unlink()                       # the registry's own copy is served by both
        blob = reg.blob_path(pushed.disk.digest)
        port_file = work / "port"
        upstream = subprocess.Popen([sys.executable, str(ROOT / "bench/proxy_bench.py"), "--serve",
                                     str(blob), str(port_file)])
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            http_url = f"http://127.0.0.1:{port_file.read_text()}/blob"
            target = target_dir / "oci-bench.disk"
            argv = {"oci": [__file__, "--deploy-oci", reg.ref("bench/image:1"), str(size), str(target)],
                    "http": [str(ROOT / "bench/proxy_bench.py"), "--deploy", http_url, str(size), sha,
                             str(target)]}
            pids = {"oci": reg.proc.pid, "http": upstream.pid}
            for which in ("oci", "http"):    # a warm-up of each, not counted (the page cache, imports)
                timed(argv[which], pids[which])
            rounds: list[dict[str, Run]] = []
            for i in range(runs):
                load = os.getloadavg()[0]
                got = {which: timed(argv[which], pids[which])
                       for which in (("oci", "http") if i % 2 == 0 else ("http", "oci"))}
                rounds.append(got)
                o, h = got["oci"], got["http"]
                print(f"round {i + 1}: load {load:.2f}; registry {o.wall:.2f} s (deploy CPU {o.client:.2f},"
                      f" registry CPU {o.server:.2f}, others {o.others / o.elapsed:.2f} core), http"
                      f" {h.wall:.2f} s (deploy CPU {h.client:.2f}, server CPU {h.server:.2f}, others"
                      f" {h.others / h.elapsed:.2f} core); ratio {o.wall / h.wall:.3f}", flush=True)
            target.unlink(missing_ok=True)
        finally:
            upstream.terminate()
            upstream.wait()
    summarize(size, rounds)


def summarize(size: int, rounds: list[dict[str, Run]]) -> None:
    """The medians; the ratio over the rounds where the rest of the machine stayed quiet (less
    than QUIET of a core's worth of others' CPU during either deploy) beside the one over all."""
    def med(which: str, field: str) -> float:
        return statistics.median(float(getattr(r[which], field)) for r in rounds)

    gib = size / (1 << 30)
    ratios = [r["oci"].wall / r["http"].wall for r in rounds]
    quiet = [r["oci"].wall / r["http"].wall for r in rounds
             if all(r[w].others < QUIET * r[w].elapsed for w in r)]
    reg_s, http_s = med("oci", "wall"), med("http", "wall")
    print(f"\n{gib:g} GiB, {len(rounds)} rounds: registry {reg_s:.2f} s ({gib / reg_s:.2f} GiB/s), "
          f"plain HTTP {http_s:.2f} s ({gib / http_s:.2f} GiB/s); registry/http: median of ratios "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), ratio of "
          f"medians {reg_s / http_s:.3f}")
    print(f"quiet rounds (others < {QUIET:g} core): {len(quiet)}" + (
        f", median of their ratios {statistics.median(quiet):.3f} (min {min(quiet):.3f},"
        f" max {max(quiet):.3f})" if quiet else ""))
    print(f"CPU per deploy (medians): the deploy's process {med('oci', 'client'):.2f} s from the registry,"
          f" {med('http', 'client'):.2f} s over HTTP; the server {med('oci', 'server'):.2f} s (registry),"
          f" {med('http', 'server'):.2f} s (sendfile); the rest of the machine meanwhile"
          f" {med('oci', 'others'):.2f} s / {med('http', 'others'):.2f} s"
          f" ({statistics.median(r[w].others / r[w].elapsed for r in rounds for w in r):.2f} core)")


def fleet(work: Path, size: int, k: int, target_dir: Path) -> None:
    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.commands.deploy import DeployImage
    from agent.hw import block
    from agent.images import manifest, oci
    from agent.proto import agent_pb2, common_pb2, site_pb2
    from agent.site.services import ServiceSettings, SiteServices
    from tests.images.registry import Registry

    image = work / "fleet.raw"
    make_image(image, size)
    chunks = manifest.write(image)[0]
    with Registry(work) as reg:
        pushed = oci.push(oci.Registry(oci.parse(reg.ref("bench/fleet:1"))), image, chunks, arch="amd64")
        image.unlink()
        site = SiteServices(ServiceSettings(upstreams=("127.0.0.1",), address="127.0.0.1", port=0,
                                            root=work / "site"))
        site.start()
        try:
            h = handler_for("site.httpProxy")
            assert h is not None
            route = h.run(Context.local("site.httpProxy", site=site), h.parse(site_pb2.HttpProxyRequest(
                node_id="n1", upstream_url=reg.ref("bench/fleet:1"))))
            assert isinstance(route, site_pb2.HttpProxyResult)
            errors: list[BaseException] = []

            def one(i: int) -> None:
                path = target_dir / f"oci-fleet-{i}.disk"
                path.unlink(missing_ok=True)
                with path.open("wb") as f:
                    f.truncate(size)
                disk = block.file_disk(path)
                try:
                    handler = DeployImage(disks=lambda: [disk])
                    handler.run(Context.local("deploy.image"), handler.parse(agent_pb2.DeployImageRequest(
                        url=route.proxy_url, digest=route.disk_digest, manifest_inline=route.chunk_manifest,
                        target=common_pb2.DiskHints(name=disk.name))))
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    path.unlink(missing_ok=True)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - t0
        finally:
            site.stop()
        gets = reg.blob_gets(pushed.disk.digest)
    if errors:
        raise SystemExit(f"{len(errors)} deploys failed: {errors[0]}")
    sent = sum(n for _, n in gets)
    print(f"\nK = {k} deploys of {size / (1 << 20):g} MiB through one site route in {seconds:.1f} s: the "
          f"registry sent {sent} bytes in {len(gets)} blob requests ({sent / size:.3f} of the image, "
          f"{sent / (k * size):.3f} of K images)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2G", help="image size for the ratio (default 2G)")
    p.add_argument("--runs", type=int, default=9, help="rounds (default 9)")
    p.add_argument("--k", type=int, default=8, help="deploys at once through the site (default 8; 0: none)")
    p.add_argument("--k-size", default="512M", help="image size for the K deploys (default 512M)")
    p.add_argument("--target-dir", default="/var/tmp", help="where the target files go")
    p.add_argument("--deploy-oci", nargs=3, metavar=("REF", "SIZE", "TARGET"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.deploy_oci:
        ref, size, target = args.deploy_oci
        return deploy_oci(ref, int(size), target)
    with tempfile.TemporaryDirectory(prefix="oci-bench-", dir=args.target_dir) as tmp:
        if args.runs:
            ratio(Path(tmp), parse_size(args.size), args.runs, Path(args.target_dir))
        if args.k:
            fleet(Path(tmp), parse_size(args.k_size), args.k, Path(args.target_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
