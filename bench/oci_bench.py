"""deploy.image from an OCI registry against the same image over plain HTTP from the same
machine (issue 42 target: at most 1.05x the time), and the registry's bytes when K ramdisk
deploys take one image through one site route (target: the image's data once).

Both on loopback, everything real: Debian's docker-registry (tests/images/registry.py starts it
with a temporary config), the image pushed by our own push (agent/images/oci.py); the plain
HTTP server is bench/proxy_bench.py's upstream (sendfile, Range honoured) serving the very
blob file the registry stores. Each deploy is deploy.image itself in a process of its own, to
a fresh sparse file under --target-dir, checked by the image's sha256: from the registry by
``oci+http://`` (the tag resolved, the layer's digest checked), over HTTP with the digest in the
request. Rounds alternate who goes first; the result is the median of the rounds' ratios (the
machine's drift cancels), with each side's median time beside it.

K deploys: the site's services in this process, a route made by the real site.httpProxy
handler from the registry reference (the artifact carrying its chunk manifest layer), K
deploy.image handlers at once (threads) from the route's URL with the layer's digest and the
chunk manifest; the registry's bytes are read from its own access log.

Usage: python bench/oci_bench.py [--size 2G] [--runs 5] [--k 8] [--k-size 512M]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))
from proxy_bench import parse_size  # noqa: E402


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


def timed(argv: list[str]) -> float:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


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
            ratios, reg_times, http_times = [], [], []
            server_cpu: dict[str, list[float]] = {"oci": [], "http": []}
            pids = {"oci": reg.proc.pid, "http": upstream.pid}
            for i in range(runs):
                order = ["oci", "http"] if i % 2 == 0 else ["http", "oci"]
                got: dict[str, float] = {}
                for which in order:
                    before = cpu_seconds(pids[which])
                    if which == "oci":
                        got[which] = timed([__file__, "--deploy-oci", reg.ref("bench/image:1"), str(size),
                                            str(target)])
                    else:
                        got[which] = timed([str(ROOT / "bench/proxy_bench.py"), "--deploy", http_url,
                                            str(size), sha, str(target)])
                    server_cpu[which].append(cpu_seconds(pids[which]) - before)
                reg_times.append(got["oci"])
                http_times.append(got["http"])
                ratios.append(got["oci"] / got["http"])
                print(f"round {i + 1}: registry {got['oci']:.2f} s, http {got['http']:.2f} s, "
                      f"ratio {ratios[-1]:.3f}", flush=True)
            target.unlink(missing_ok=True)
        finally:
            upstream.terminate()
            upstream.wait()
    gib = size / (1 << 30)
    reg_s, http_s = statistics.median(reg_times), statistics.median(http_times)
    print(f"\n{gib:g} GiB, {runs} rounds: registry {reg_s:.2f} s ({gib / reg_s:.2f} GiB/s), plain HTTP "
          f"{http_s:.2f} s ({gib / http_s:.2f} GiB/s); registry/http: median of ratios "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), ratio of "
          f"medians {reg_s / http_s:.3f}; the server's CPU per deploy (median): registry "
          f"{statistics.median(server_cpu['oci']):.2f} s, plain HTTP "
          f"{statistics.median(server_cpu['http']):.2f} s")


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
    p.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
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
