"""deploy.image and disk.wipe against dd, side by side on one target, median of several runs.

    python bench/disk_bench.py                       # 2 GiB images, 3 runs, file target in /var/tmp
    python bench/disk_bench.py --size 256M --runs 5  # quick
    python bench/disk_bench.py --target /dev/loop7   # a block device (its content is destroyed)

Scenarios (each: the agent's handler through Context.local, and the dd pipeline, alternating,
with the same target state before every run):

- dense:  raw image with no zero runs, checksum on   vs  dd if=img bs=4M oflag=direct
- gzip:   the same image gzip -1'd, checksum on      vs  gzip -dc img.gz | dd bs=4M oflag=direct
- sparse: raw image, 1 MiB data then 3 MiB zeros     vs  dd if=img bs=4M oflag=direct
- wipe:   disk.wipe OVERWRITE_ZEROS, sampled verify  vs  dd if=/dev/zero bs=4M oflag=direct

With a manifest (issue 18; `agent manifest` of each image, chunks of 4 MiB), on "sparse4", a
sparse file (holes) whose 4 MiB chunks are a quarter data (every fourth one), the rest zeros:

- dense-m:  dense raw with its manifest             vs  dd, qemu-img convert -t none
- sparse-m: sparse4 raw with its manifest           vs  dd, bmaptool copy (with its .bmap),
                                                        qemu-img convert -t none
- zstd:     sparse4 zstd -3'd, no manifest          vs  zstd -dc | dd
- zstd-m:   the same with its manifest              vs  zstd -dc | dd, bmaptool copy
- qcow2-m:  sparse4 as qcow2 with its manifest (read through its tables)
                                                    vs  qemu-img convert -O raw (-t none too)
- qcow2:    the same without a manifest (qemu-img convert by the agent)
                                                    vs  the same peers
- http-m:   sparse4 raw over HTTP on 127.0.0.1, with its manifest
                                                    vs  curl URL | dd; prints the bytes served

The path users take (issue 28): ``--target loop`` writes to a loop device over a file in
--workdir, detached and made again (a fresh sparse file) before every run of every contender;
``--via exec`` runs each deploy as ``python3 dist/agent.pyz exec deploy.image --role ramdisk
--confirm DISK`` (start-up included, as a console user sees it), ``--via run`` gives it to a
running ``agent run`` (the zipapp, role ramdisk) through the reference gateway, signed, start-up
excluded as in production (the time from send to result). ``--via inproc`` (the default) is
the handler in this process. Every contender's line gives its wall seconds and the CPU
seconds it took: user and system of its own process (this process's for inproc, the waited
children's for exec and the peers' pipelines, the ``agent run`` process's for run), and the
kernel's unbound workers' (``kworker/u*``: where the loop device's reads and writes of its
backing file run, beside anything else of the machine's that runs there), so where the time
goes is shown, not guessed.

dd runs with conv=fsync (and notrunc), as the agent fsyncs too. A file target is recreated
(sparse, same size) before each run; a block device target is used as it is. Images are read
from the page cache by both sides (generated once, read once before timing). The ratio is agent
throughput / dd throughput (higher is better for the agent): the median of the per-pair
ratios (dd and agent run back to back, alternating who goes first), which cancels the slow
drift of a shared virtual disk; the MB/s columns are medians of each side's runs.

Two ceilings are measured right after each pair, as dd's time over theirs (the best ratio
that part alone would allow): "hash only", SHA-256 of the published image with nothing else
(dense and sparse: a checksummed deploy cannot beat it, and SHA-256 runs on one core), and
"data-only writes", only the sparse image's non-zero chunks written, with no read and no hash.
"""

from __future__ import annotations

import argparse
import gzip  # noqa: F401  (documents that the gzip image is made by the gzip binary below)
import hashlib
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from google.protobuf import json_format
from google.protobuf.message import Message

from agent.commands.base import Context
from agent.commands.deploy import DeployImage
from agent.commands.wipe import Wipe
from agent.hw import block, diskio
from agent.proto import agent_pb2, common_pb2
from tests.diskfixtures import disk_for_path

MiB = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def keystream(n: int, seed: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    return Cipher(algorithms.AES(hashlib.sha256(seed).digest()), modes.CTR(bytes(16))).encryptor().update(
        bytes(n)
    )


def make_sparse4(work: Path, size: int) -> Path:
    """A sparse file (holes, as a filesystem image is published): every fourth 4 MiB chunk
    random data, the others never written."""
    path = work / "sparse4.img"
    with path.open("wb") as f:
        f.truncate(size)
        for off in range(0, size, 16 * MiB):
            f.seek(off)
            f.write(keystream(4 * MiB, b"s4" + off.to_bytes(8, "big")))
    return path


def make_images(work: Path, size: int) -> dict[str, Path]:
    """dense: every 4 KiB block half random, half text (compresses about 2:1, no zero runs);
    sparse: 1 MiB of random data then 3 MiB of zeros, repeated."""
    dense, sparse = work / "dense.img", work / "sparse.img"
    chunk = 64 * MiB
    text = (b"bettercompute deploy benchmark line of text 0123456789\n" * 40)[:2048]
    zeros3 = bytes(3 * MiB)
    with dense.open("wb") as d, sparse.open("wb") as s:
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            rnd = keystream(n, off.to_bytes(8, "big"))
            d.write(b"".join(rnd[i : i + 2048] + text for i in range(0, n, 4096)))
            s.write(b"".join(rnd[i : i + MiB] + zeros3 for i in range(0, n, 4 * MiB)))
    gz = work / "dense.img.gz"
    with gz.open("wb") as out:
        subprocess.run(["gzip", "-1", "-c", str(dense)], stdout=out, check=True)
    for p in (dense, sparse, gz):  # into the page cache for both sides
        with p.open("rb") as f:
            while f.read(16 * MiB):
                pass
    return {"dense": dense, "sparse": sparse, "gzip": gz}


def sha256(path: Path) -> str:
    """SHA-256 of a file from a mapping of it, in the deploy's buffer-sized steps (no copy)."""
    h = hashlib.sha256()
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            for off in range(0, len(m), diskio.BUFFER):
                h.update(view[off : off + diskio.BUFFER])
        finally:
            view.release()
    return h.hexdigest()


def sha256_speed() -> float:
    """GB/s of hashlib's sha256 right now: the floor of a checksummed deploy's CPU time."""
    data = bytes(8 * MiB)
    t = time.perf_counter()
    h = hashlib.sha256()
    for _ in range(32):
        h.update(data)
    return 32 * len(data) / (time.perf_counter() - t) / 1e9


CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent
PYZ = ROOT / "dist" / "agent.pyz"
TARGET = "@TARGET@"   # in a peer's command: the target's path at that run


def kworker_seconds() -> float:
    """CPU seconds so far of the kernel's unbound workers (kworker/u*), where a loop device's
    I/O on its backing file runs (with whatever else of the machine's runs there)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if not raw[raw.index("(") + 1 : raw.rindex(")")].startswith("kworker/u"):
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def process_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its waited children, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return ((int(fields[11]) + int(fields[13])) / CLK_TCK, (int(fields[12]) + int(fields[14])) / CLK_TCK)


@dataclass(frozen=True)
class Sample:
    """One run of one contender: wall seconds and CPU seconds."""

    wall: float
    user: float
    system: float
    kworkers: float

    @staticmethod
    def median(samples: list[Sample]) -> Sample:
        return Sample(*(statistics.median(getattr(x, f) for x in samples)
                        for f in ("wall", "user", "system", "kworkers")))

    def cpu(self) -> str:
        return f"user {self.user:.2f} sys {self.system:.2f} kworkers {self.kworkers:.2f}"


class LoopTarget:
    """A loop device over a sparse file, detached and made again (a fresh file) by ``fresh``."""

    def __init__(self, work: Path, size: int) -> None:
        self.backing, self.size = work / "loop-backing.img", size
        self.dev: Path | None = None

    def fresh(self) -> Path:
        self.close()
        self.backing.unlink(missing_ok=True)
        with self.backing.open("wb") as f:
            f.truncate(self.size)
        out = subprocess.run(["losetup", "--find", "--show", str(self.backing)], check=True,
                             capture_output=True, text=True)
        self.dev = Path(out.stdout.strip())
        return self.dev

    def close(self) -> None:
        if self.dev is not None:
            subprocess.run(["losetup", "-d", str(self.dev)], check=False)
            self.dev = None


class RunningAgent:
    """``agent run`` (the zipapp, role ramdisk) serving the reference gateway, for --via run."""

    def __init__(self, work: Path) -> None:
        from tests.runtime.harness import AgentProcess, make_pki, start_gateway

        self.pki = make_pki(work / "pki")
        self.gateway = start_gateway(self.pki)
        AgentProcess.entry = (str(PYZ),)
        (work / "agent").mkdir()
        self.agent = AgentProcess(self.pki, self.gateway, work / "agent").start()
        self.gateway.wait_node("node-1", 120)

    @property
    def pid(self) -> int:
        assert self.agent.proc is not None
        return self.agent.proc.pid

    def execute(self, kind: str, req: Message) -> Message:
        from agent.proto import session_pb2

        cid = self.gateway.send("node-1", kind, req)
        body, result = self.gateway.wait_result(cid, 3600)
        ok = body.status == session_pb2.SUCCEEDED and result is not None
        assert ok, (body.message, self.agent.logs()[-2000:])
        assert result is not None
        return result

    def close(self) -> None:
        self.agent.terminate()
        self.gateway.stop()


class Bench:
    def __init__(self, target: Path | LoopTarget, size: int, runs: int, via: str = "inproc",
                 work: Path | None = None) -> None:
        self.loop = target if isinstance(target, LoopTarget) else None
        self.target = target.fresh() if isinstance(target, LoopTarget) else target
        self.size, self.runs, self.via = size, runs, via
        self.is_file = self.loop is None and (not self.target.exists() or self.target.is_file())
        self.disk_size = size if self.is_file else disk_for_path(self.target).size
        self.running = RunningAgent(work or Path(tempfile.mkdtemp())) if via == "run" else None
        self.digests: dict[Path, str] = {}   # each image's sha256 (main sets them)

    def close(self) -> None:
        if self.running is not None:
            self.running.close()
        if self.loop is not None:
            self.loop.close()

    def reset(self) -> None:
        if self.loop is not None:
            self.target = self.loop.fresh()
        elif self.is_file:
            self.target.unlink(missing_ok=True)
            with self.target.open("wb") as f:
                f.truncate(self.disk_size)
        subprocess.run(["sync"], check=True)

    def disks(self) -> list[block.Disk]:
        return [disk_for_path(self.target)]

    def _own(self, agent: bool) -> tuple[float, float]:
        """CPU (user, system) so far of what a contender runs in."""
        if agent and self.running is not None:
            return process_seconds(self.running.pid)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        user, system = children.ru_utime, children.ru_stime
        if agent and self.via == "inproc":
            me = resource.getrusage(resource.RUSAGE_SELF)
            user, system = user + me.ru_utime, system + me.ru_stime
        return user, system

    def measure(self, fn: Callable[[], object], *, agent: bool) -> Sample:
        self.reset()
        u0, s0 = self._own(agent)
        k0 = kworker_seconds()
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
        u1, s1 = self._own(agent)
        return Sample(wall, u1 - u0, s1 - s0, kworker_seconds() - k0)

    def dd(self, cmd: str) -> Sample:
        return self.measure(lambda: subprocess.run(["sh", "-c", cmd.replace(TARGET, str(self.target))],
                                                   check=True, stderr=subprocess.DEVNULL), agent=False)

    def agent(self, fn: Callable[[], object]) -> Sample:
        return self.measure(fn, agent=True)

    def execute(self, kind: str, req: Message) -> Message:
        """The request run as --via says: the handler here, `agent exec`, or `agent run`."""
        result_cls = agent_pb2.DeployImageResult if kind == "deploy.image" else agent_pb2.WipeResult
        if self.via == "inproc":
            h = DeployImage(disks=self.disks) if kind == "deploy.image" else Wipe(disks=self.disks)
            return h.run(Context.local(kind), h.parse(req))  # type: ignore[arg-type]  # the kind's own request
        if self.via == "run":
            assert self.running is not None
            return self.running.execute(kind, req)
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        out = subprocess.run([python, str(PYZ), "exec", kind, "--role", "ramdisk", "--confirm",
                              self.disks()[0].name, "--payload", json_format.MessageToJson(req)],
                             capture_output=True, text=True, check=False)
        doc: dict[str, Any] = (json.loads(out.stdout) if out.stdout.startswith("{")
                               else {"status": out.stderr[-2000:]})
        assert doc["status"] == "SUCCEEDED", doc
        return json_format.ParseDict(doc["result"], result_cls())

    def deploy(self, image: Path) -> Callable[[], object]:
        def go() -> object:
            req = agent_pb2.DeployImageRequest(
                local_path=str(image),
                digest=common_pb2.Digest(algorithm="sha256", hex=self.digests[image]),
                target=common_pb2.DiskHints(name=self.disks()[0].name),
            )
            self.last = self.execute("deploy.image", req)
            return self.last
        return go

    def hash_only(self, image: Path) -> Callable[[], object]:
        """SHA-256 of the page-cached image and nothing else: no copy, no write. dd's time over
        this one is the best ratio any deploy that checks this image's digest could reach on
        this CPU."""
        return lambda: sha256(image)

    def data_only(self, image: Path) -> Callable[[], object]:
        """The floor of any zero-skipping writer on this target: only the image's non-zero
        1 MiB chunks are written (O_DIRECT, two threads, then fsync), with no read of the image
        and no hash. dd's time over this one is the best ratio a deploy could reach here."""
        chunks = []
        with image.open("rb") as f:
            while data := f.read(MiB):
                if data.count(0) != len(data):
                    chunks.append(f.tell() - len(data))
        buf = mmap.mmap(-1, MiB)
        buf.write(os.urandom(MiB))

        def go() -> object:
            fd = os.open(self.target, os.O_WRONLY | os.O_DIRECT)
            todo = list(reversed(chunks))
            lock = threading.Lock()

            def writer() -> None:
                while True:
                    with lock:
                        if not todo:
                            return
                        offset = todo.pop()
                    os.pwrite(fd, buf, offset)

            try:
                threads = [threading.Thread(target=writer) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                os.fsync(fd)
            finally:
                os.close(fd)
            return None
        return go

    def wipe(self) -> object:
        req = agent_pb2.WipeRequest(disks=[common_pb2.DiskHints(name=self.disks()[0].name)],
                                    method=agent_pb2.OVERWRITE_ZEROS)
        r = self.execute("disk.wipe", req)
        assert isinstance(r, agent_pb2.WipeResult) and r.certificates[0].verified, r
        self.last = r
        return r

    def deploy_manifest(self, image: Path, manifest: Path, url: str = "", ca_pem: str = ""
                        ) -> Callable[[], object]:
        def go() -> object:
            data = manifest.read_bytes()
            req = agent_pb2.DeployImageRequest(target=common_pb2.DiskHints(name=self.disks()[0].name),
                                               ca_bundle_pem=ca_pem)
            if url:
                req.url = url
            else:
                req.local_path = str(image)
            req.manifest.local_path = str(manifest)
            req.manifest.digest.algorithm = "sha256"
            req.manifest.digest.hex = hashlib.sha256(data).hexdigest()
            r = self.execute("deploy.image", req)
            assert isinstance(r, agent_pb2.DeployImageResult) and r.verification == "manifest", r
            self.last = r
            return r
        return go

    def group(self, name: str, agent_fn: Callable[[], object], peers: dict[str, str], nbytes: int,
              target: str = "") -> list[dict[str, object]]:
        """The agent and each peer command, one run of each per round, the order rotated every
        round; per peer, the median of the per-round ratios (peer seconds / agent seconds)."""
        names = list(peers)
        agent_runs: list[Sample] = []
        runs: dict[str, list[Sample]] = {k: [] for k in names}
        for i in range(self.runs):
            order = ["agent", *names]
            k = i % len(order)
            for who in order[k:] + order[:k]:
                if who == "agent":
                    agent_runs.append(self.agent(agent_fn))
                else:
                    runs[who].append(self.dd(peers[who]))
        ag = Sample.median(agent_runs)
        last = getattr(self, "last", None)
        extra = ""
        if isinstance(last, agent_pb2.DeployImageResult):
            extra = (f" written={last.bytes_written} skipped={last.bytes_skipped}"
                     f" source_bytes={last.source_bytes} verification={last.verification or 'digest'}"
                     f" chunks={last.chunks_verified}"
                     f" zero_chunks={last.zero_chunks} handler={last.seconds:.2f}s")
        print(f"{name:8s} agent {nbytes / ag.wall / 1e6:8.1f} MB/s {ag.wall:.2f} s, {ag.cpu()}"
              f" (seconds {[round(x.wall, 2) for x in agent_runs]}){extra}", flush=True)
        rows = []
        for peer in names:
            ratio = statistics.median(p.wall / a.wall for p, a in zip(runs[peer], agent_runs, strict=True))
            pt = Sample.median(runs[peer])
            print(f"{'':8s}   vs {peer:28s} {nbytes / pt.wall / 1e6:8.1f} MB/s {pt.wall:.2f} s, {pt.cpu()}"
                  f"  agent is {ratio:.2f}x (seconds {[round(x.wall, 2) for x in runs[peer]]})", flush=True)
            rows.append({"scenario": name, "peer": peer, "agent_MBps": nbytes / ag.wall / 1e6,
                         "peer_MBps": nbytes / pt.wall / 1e6, "ratio": ratio,
                         "target": target if peer == names[0] else "", "agent": ag, "peer_sample": pt})
        return rows

    def pair(self, name: str, dd_cmd: str, agent_fn: Callable[[], object], nbytes: int,
             ceilings: dict[str, Callable[[], object]] | None = None) -> dict[str, Any]:
        """Runs dd and the agent back to back, alternating who goes first. The disk's speed
        drifts (a virtual disk shares its host), so the ratio is the median of the per-pair
        ratios, each pair measured within seconds. Each of ``ceilings`` (see hash_only and
        data_only) runs right after each pair too: dd's time over its time is the best ratio
        that part alone allows."""
        ceilings = ceilings or {}
        dd_runs: list[Sample] = []
        agent_runs: list[Sample] = []
        ratios = []
        ceiling_ratios: dict[str, list[float]] = {k: [] for k in ceilings}
        for i in range(self.runs):
            if i % 2 == 0:
                d, a = self.dd(dd_cmd), self.agent(agent_fn)
            else:
                a, d = self.agent(agent_fn), self.dd(dd_cmd)
            dd_runs.append(d)
            agent_runs.append(a)
            ratios.append(d.wall / a.wall)
            for k, fn in ceilings.items():
                ceiling_ratios[k].append(d.wall / self.measure(fn, agent=False).wall)
        dd_s, ag_s = Sample.median(dd_runs), Sample.median(agent_runs)
        dd_t, ag_t = dd_s.wall, ag_s.wall
        dd_times, agent_times = [x.wall for x in dd_runs], [x.wall for x in agent_runs]
        row: dict[str, Any] = {
            "scenario": name,
            "dd_MBps": nbytes / dd_t / 1e6,
            "agent_MBps": nbytes / ag_t / 1e6,
            "ratio": statistics.median(ratios),
            "dd_runs": [round(x, 2) for x in dd_times],
            "agent_runs": [round(x, 2) for x in agent_times],
            "ceilings": {k: statistics.median(v) for k, v in ceiling_ratios.items()},
            "agent": ag_s, "peer_sample": dd_s,
        }
        extra = ""
        last = getattr(self, "last", None)
        if isinstance(last, agent_pb2.DeployImageResult):
            extra = f" written={last.bytes_written} skipped={last.bytes_skipped} direct={last.direct_io}"
        for k, v in ceiling_ratios.items():
            extra += f" ceiling {k}: {row['ceilings'][k]:.2f} ({[round(x, 2) for x in v]})"
        print(f"{name:7s} dd {row['dd_MBps']:8.1f} MB/s  agent {row['agent_MBps']:8.1f} MB/s"
              f"  ratio {row['ratio']:.2f}  (seconds: dd {row['dd_runs']} agent {row['agent_runs']}){extra}"
              f"\n{'':7s} CPU seconds (medians): agent {ag_s.cpu()}; dd {dd_s.cpu()}", flush=True)
        return row


def main() -> int:
    # As `agent run` does (agent/cli/app.py): a short GIL switch interval, so a thread coming back
    # from a write or a hash gets the interpreter sooner.
    from agent.cli.app import SWITCH_INTERVAL_SECONDS

    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="image size (default 2G)")
    ap.add_argument("--runs", type=int, default=3, help="runs per side (median; default 3)")
    ap.add_argument("--target", default="", help="file or block device (default: a file in --workdir);"
                    " 'loop': a loop device over a file in --workdir, made again before every run")
    ap.add_argument("--via", choices=("inproc", "exec", "run"), default="inproc",
                    help="how the agent is run: its handler in this process (default), the zipapp's"
                    " `agent exec`, or a running `agent run` through the reference gateway")
    ap.add_argument("--workdir", default="/var/tmp", help="where images (and the file target) go")
    ap.add_argument("--only", default="dense,gzip,sparse,wipe,dense-m,sparse-m,zstd,zstd-m,qcow2-m,qcow2,"
                    "http-m,https-m", help="comma-separated scenarios")
    args = ap.parse_args()
    if args.via != "inproc" and not PYZ.exists():
        subprocess.run([sys.executable, str(ROOT / "build" / "zipapp.py")], check=True,
                       stdout=subprocess.DEVNULL)
    size = parse_size(args.size)
    size -= size % (4 * MiB)
    work = Path(tempfile.mkdtemp(prefix="disk-bench-", dir=args.workdir))
    try:
        target: Path | LoopTarget = (LoopTarget(work, size) if args.target == "loop" else
                                     Path(args.target) if args.target else work / "target.disk")
        t = time.perf_counter()
        images = make_images(work, size)
        print(f"images: {size / MiB:.0f} MiB each, made in {time.perf_counter() - t:.1f}s; "
              f"gzip {images['gzip'].stat().st_size / MiB:.0f} MiB;"
              f" target {'a loop device' if isinstance(target, LoopTarget) else target}; "
              f"{os.cpu_count()} CPUs; sha256 {sha256_speed():.2f} GB/s; "
              f"load average {os.getloadavg()[0]:.1f}; via {args.via}", flush=True)
        b = Bench(target, size, args.runs, args.via, work)
        b.digests = {p: sha256(p) for p in images.values()}
        dd = f"of={TARGET} bs=4M oflag=direct conv=fsync,notrunc"
        rows = []
        only = args.only.split(",")
        if "dense" in only:
            rows.append(b.pair("dense", f"dd if={images['dense']} {dd}", b.deploy(images["dense"]), size,
                               ceilings={"hash only": b.hash_only(images["dense"])}))
        if "gzip" in only:
            rows.append(b.pair("gzip", f"gzip -dc {images['gzip']} | dd iflag=fullblock {dd}",
                               b.deploy(images["gzip"]), size))
        if "sparse" in only:
            rows.append(b.pair("sparse", f"dd if={images['sparse']} {dd}", b.deploy(images["sparse"]), size,
                               ceilings={"hash only": b.hash_only(images["sparse"]),
                                         "data-only writes": b.data_only(images["sparse"])}))
        if "wipe" in only:
            count = b.disk_size // (4 * MiB)
            rows.append(b.pair("wipe", f"dd if=/dev/zero count={count} {dd}", b.wipe, b.disk_size))
        groups = manifest_scenarios(b, work, images, size, dd, only)
        names = list(dict.fromkeys(k for r in rows for k in r["ceilings"]))  # in the order measured
        where = "loop device" if isinstance(target, LoopTarget) else f"target {target}"
        where += f", via {args.via}"
        if rows:
            print(f"\n{where}; CPU seconds: user / system of the contender, kworkers (medians)")
            print("\n| scenario | dd MB/s (median) | agent MB/s (median) | agent/dd (median of pairs) | "
                  + " | ".join(f"ceiling: {n}" for n in names)
                  + " | agent s (user/sys/kw) | dd s (user/sys/kw) |")
            print("|---|---|---|---|" + "---|" * len(names) + "---|---|")
            for r in rows:
                cells = [f"{r['ceilings'][n]:.2f}" if n in r["ceilings"] else "" for n in names]
                print(f"| {r['scenario']} | {r['dd_MBps']:.0f} | {r['agent_MBps']:.0f} | {r['ratio']:.2f} | "
                      + " | ".join(cells) + f" | {cpu_cell(r['agent'])} | {cpu_cell(r['peer_sample'])} |")
        if groups:
            print(f"\n{where}; CPU seconds: user / system of the contender, kworkers (medians)")
            print("\n| scenario | agent MB/s (median) | agent s (user/sys/kw) | peer | peer MB/s (median) |"
                  " peer s (user/sys/kw) | agent speed-up over the peer (median of rounds) | target |")
            print("|---|---|---|---|---|---|---|---|")
            for g in groups:
                peer = str(g["peer"]).replace("|", "\\|")
                print(f"| {g['scenario']} | {g['agent_MBps']:.0f} | {cpu_cell(g['agent'])} | {peer} |"
                      f" {g['peer_MBps']:.0f} | {cpu_cell(g['peer_sample'])} | {g['ratio']:.2f} |"
                      f" {g['target']} |")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        if "b" in locals():
            b.close()
        elif isinstance(target, LoopTarget):
            target.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def cpu_cell(sample: object) -> str:
    assert isinstance(sample, Sample)
    return f"{sample.wall:.2f} ({sample.user:.2f}/{sample.system:.2f}/{sample.kworkers:.2f})"


def manifest_scenarios(b: Bench, work: Path, images: dict[str, Path], size: int,
                       dd: str, only: list[str]) -> list[dict[str, object]]:
    """The issue-18 scenarios: manifests, and the peers side by side."""
    from agent.images import manifest

    wanted = [k for k in ("dense-m", "sparse-m", "zstd", "zstd-m", "qcow2-m", "qcow2", "http-m", "https-m")
              if k in only]
    if not wanted:
        return []
    t = time.perf_counter()
    sparse4 = make_sparse4(work, size)
    zst = work / "sparse4.img.zst"
    subprocess.run(["zstd", "-q", "-3", "-f", str(sparse4), "-o", str(zst)], check=True)
    qcow = work / "sparse4.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(sparse4), str(qcow)], check=True)
    bmap = work / "sparse4.img.bmap"
    with bmap.open("wb") as f:
        subprocess.run(["bmaptool", "create", str(sparse4)], stdout=f, check=True)
    mf = {p: manifest.write(p)[0] for p in (images["dense"], sparse4, zst)}
    for p in (sparse4, zst, qcow):
        with p.open("rb") as f:
            while f.read(16 * MiB):
                pass
    b.digests[zst] = sha256(zst)
    b.digests[qcow] = sha256(qcow)
    print(f"manifest images made in {time.perf_counter() - t:.1f}s:"
          f" sparse4.zst {zst.stat().st_size / MiB:.0f} MiB, qcow2 {qcow.stat().st_size / MiB:.0f} MiB",
          flush=True)
    qemu = f"qemu-img convert -O raw -n -t none {{}} {TARGET}"
    qemu_default = f"qemu-img convert -O raw -n {{}} {TARGET}"   # its default zero detection, the page cache
    bmaptool = f"bmaptool -q copy --bmap {bmap} {{}} {TARGET}"
    rows: list[dict[str, object]] = []
    if "dense-m" in wanted:
        d = images["dense"]
        rows += b.group("dense-m", b.deploy_manifest(d, mf[d]),
                        {"dd": f"dd if={d} {dd}", "qemu-img convert -t none": qemu.format(f"-f raw {d}")},
                        size, ">= 0.95")
    if "sparse-m" in wanted:
        rows += b.group("sparse-m", b.deploy_manifest(sparse4, mf[sparse4]),
                        {"qemu-img convert -O raw": qemu_default.format(f"-f raw {sparse4}"),
                         "dd": f"dd if={sparse4} {dd}", "bmaptool copy": bmaptool.format(sparse4),
                         "qemu-img convert -t none": qemu.format(f"-f raw {sparse4}")},
                        size, ">= 1 (qemu-img convert -O raw), >= 3.5 (dd), >= 2 (bmaptool)")
    if "zstd" in wanted:
        rows += b.group("zstd", b.deploy(zst),
                        {"zstd -dc | dd": f"zstd -dc -q {zst} | dd iflag=fullblock {dd}"},
                        size, "decompressor's speed")
    if "zstd-m" in wanted:
        rows += b.group("zstd-m", b.deploy_manifest(zst, mf[zst]),
                        {"zstd -dc | dd": f"zstd -dc -q {zst} | dd iflag=fullblock {dd}",
                         "bmaptool copy": bmaptool.format(zst)},
                        size, ">= 3")
    if "qcow2-m" in wanted:
        rows += b.group("qcow2-m", b.deploy_manifest(qcow, mf[sparse4]),
                        {"qemu-img convert -t none": qemu.format(f"-f qcow2 {qcow}"),
                         "qemu-img convert -O raw": qemu_default.format(f"-f qcow2 {qcow}")},
                        size, ">= 1 (qemu-img convert -t none)")
    if "qcow2" in wanted:
        rows += b.group("qcow2", b.deploy(qcow),
                        {"qemu-img convert -O raw": qemu_default.format(f"-f qcow2 {qcow}"),
                         "qemu-img convert -t none": qemu.format(f"-f qcow2 {qcow}")},
                        size, ">= 1 (qemu-img)")
    for scenario in ("http-m", "https-m"):
        if scenario in wanted:
            rows += http_scenario(b, work, scenario, sparse4, mf[sparse4], size, dd)
    return rows


def http_scenario(b: Bench, work: Path, scenario: str, image: Path, manifest_path: Path, size: int,
                  dd: str) -> list[dict[str, object]]:
    """The sparse image over HTTP (http-m) or HTTPS (https-m, a self-signed CA given in the
    request) from a loopback server, with its manifest: the bytes served and the TCP
    connections (over TLS: handshakes) the agent's deploys took."""
    from agent.images import manifest
    from tests.loopback_http import LoopbackServer, self_signed_cert

    tls = self_signed_cert(str(work)) if scenario == "https-m" else None
    ca = Path(tls[0]).read_text() if tls else ""
    with LoopbackServer(tls) as srv:
        url = srv.add("/sparse4.img", image.read_bytes())
        counted: list[int] = []
        deploy = b.deploy_manifest(image, manifest_path, url, ca)

        def agent() -> object:
            before = srv.connections
            r = deploy()
            counted.append(srv.connections - before)
            return r

        curl = f"curl -s {'--cacert ' + tls[0] if tls else ''} {url} | dd iflag=fullblock {dd}"
        rows = b.group(scenario, agent, {"curl | dd": curl}, size, ">= 2.5")
        data = sum(s_.length for s_ in manifest.parse(manifest_path.read_bytes()).segments if s_.digest)
        last = b.last
        assert isinstance(last, agent_pb2.DeployImageResult)
        print(f"{scenario}: served {srv.sent('/sparse4.img')} bytes in {b.runs * 2} downloads (curl and"
              f" agent); the agent's last: {last.source_bytes} bytes for {data} bytes of data chunks"
              f" ({last.source_bytes / data - 1:+.2%}); TCP connections per agent deploy: {counted}",
              flush=True)
    return rows

if __name__ == "__main__":
    sys.exit(main())
