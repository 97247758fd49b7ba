"""The site daemon driving a fleet of emulated Redfish BMCs at once (issue 25, part 5).

The site daemon is an Agent in role site in this process (its real bmc.* and
inventory.refresh handlers, its scheduler, journal and trust); the BMCs are qemu/bmcfleet.py
in a process of its own (one event loop, one TLS port per BMC), so that this process's
figures are the daemon's alone (its state directory, the journal, on tmpfs as the daemon's
default /run/bettercompute-agent is) and the emulators' CPU time is read from /proc apart (the
daemon's own CPU seconds too: on a loaded machine they say more than the wall time).

For each N (16, 64, 256 by default) the bench gives every BMC ``bmc.power status``, then
``bmc.power on``, then ``bmc.boot set_boot_device pxe`` (all 3N commands submitted at once; a
BMC's three run in order; each BMC is its node's, one node per BMC, so its first command is the
site's first contact with that node), counts the requests each BMC answered and the
connections (TLS handshakes) it accepted for them, and again for the same three commands sent
to the same BMCs a second time (untimed), and reports the wall time from the first submit to the last result
against the same three commands for one BMC alone (on a daemon that has already driven
another BMC once: its first commands' imports and TLS context are not counted in either), the
daemon's peak RSS, threads and open
files (sampled every 20 ms), and the emulators' CPU seconds. Then the head-of-line figure: N
BMCs that hang (accept, never answer), one bmc.power status on each, and while they hang an
inventory.refresh and a bmc.power status on a healthy BMC: the time from submit to start.

Usage: python bench/site_fleet.py [--sizes 16,64,256] [--hang 256] [--latency SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.cli.app import SWITCH_INTERVAL_SECONDS  # noqa: E402
from agent.config import Config  # noqa: E402
from agent.proto import session_pb2, site_pb2  # noqa: E402
from agent.runtime.core import Agent  # noqa: E402
from agent.site.bmc.client import Credentials  # noqa: E402
from agent.site.bmc.secrets import SecretStore  # noqa: E402
from tests.runtime.core_harness import Frames, World  # noqa: E402
from tests.site.test_site_agent import site_agent as tests_site_agent  # noqa: E402

USER, PASSWORD, REF = "admin", "Fleet-Bench-7qP", "fleet"
# The daemon's state (its journal) on tmpfs, as its default /run/bettercompute-agent is.
STATE_ON = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
SEQUENCE: tuple[tuple[str, str, dict[str, str]], ...] = (("bmc.power", "status", {}), ("bmc.power", "on", {}),
            ("bmc.boot", "set_boot_device", {"device": "pxe"}))


class Sampler:
    """Peak RSS (MB), threads and open files of this process, every ``interval`` seconds."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.rss_mb = self.threads = self.files = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        status = Path("/proc/self/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                self.rss_mb = max(self.rss_mb, int(line.split()[1]) / 1024)
            elif line.startswith("Threads:"):
                self.threads = max(self.threads, int(line.split()[1]))
        self.files = max(self.files, len(os.listdir("/proc/self/fd")))

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._sample()


class Fleet:
    """qemu/bmcfleet.py as a child process."""

    def __init__(self, workdir: Path, count: int, hang: int = 0, latency: float = 0.0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        secret = workdir / "password"
        secret.write_text(PASSWORD)
        secret.chmod(0o600)
        self.child = subprocess.Popen(
            [sys.executable, "-m", "qemu.bmcfleet", "--count", str(count), "--hang", str(hang),
             "--username", USER, "--password-file", str(secret), "--dir", str(workdir),
             "--latency", str(latency)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        if not line:
            raise SystemExit("the BMC fleet did not start")
        self.bmcs: list[dict[str, str]] = json.loads(line)["bmcs"]

    def counts(self) -> dict[str, list[int]]:
        """Each BMC's requests answered and connections accepted (TLS handshakes) so far."""
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write("counts\n")
        self.child.stdin.flush()
        got: dict[str, list[int]] = json.loads(self.child.stdout.readline())
        return got

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(30)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def site_agent(world: World, tmp: Path) -> tuple[Agent, Frames]:
    store = SecretStore(tmp / "secrets")
    store.put(REF, Credentials(USER, PASSWORD))
    return tests_site_agent(world, Config(state_dir=tmp / "state", secrets_dir=store.root),
                            kinds=("bmc.power", "bmc.boot", "inventory.refresh"))


def command(world: World, cid: str, kind: str, address: str, operation: str,
            parameters: dict[str, str], timeout: int = 0) -> session_pb2.SignedCommand:
    # One node per BMC, as a site has: the first command naming a node keeps its console from
    # then on (docs/site.md), so a node id per command would measure a first contact each time.
    payload = site_pb2.BmcOperationRequest(node_id=f"node@{address}", bmc_address=address, protocol="redfish",
                                           operation=operation, credentials_ref=REF,
                                           parameters=parameters, verify_tls=False)
    return world.command(cid, kind, payload, timeout=timeout)


def submit(agent: Agent, cmd: session_pb2.SignedCommand) -> None:
    answer = agent.submit(cmd)
    if not isinstance(answer, session_pb2.Accept):
        raise SystemExit(f"refused: {answer}")


def drive(agent: Agent, frames: Frames, world: World, bmcs: list[dict[str, str]],
          tag: str) -> tuple[float, float]:
    """All three commands of every BMC at once; seconds until the last result, and seconds
    until the last was admitted (Agent.submit, one after the other, as a session's are)."""
    commands = [(f"{tag}-{i}-{step}", command(world, f"{tag}-{i}-{step}", kind, bmc["address"],
                                               operation, parameters))
                for i, bmc in enumerate(bmcs) for step, (kind, operation, parameters) in enumerate(SEQUENCE)]
    started = time.monotonic()
    ids = []
    for cid, cmd in commands:
        submit(agent, cmd)
        ids.append(cid)
    admitted = time.monotonic() - started
    failed = []
    for cid in ids:
        result = frames.result(cid, timeout=900)
        if result.status != session_pb2.SUCCEEDED:
            failed.append(f"{cid}: {result.reason} {result.message}")
    if failed:
        raise SystemExit(f"{len(failed)} command(s) failed: {failed[:5]}")
    return time.monotonic() - started, admitted


def fleet_run(n: int, tmp: Path, latency: float = 0.0) -> dict[str, Any]:
    (tmp / "world").mkdir()
    world = World(tmp / "world")
    fleet = Fleet(tmp / "fleet", n + 2, latency=latency)
    try:
        agent, frames = site_agent(world, tmp)
        drive(agent, frames, world, fleet.bmcs[n + 1:], "warm")   # the daemon's first commands
        one, _ = drive(agent, frames, world, fleet.bmcs[n:n + 1], "one")   # another BMC, alone
        counted = [fleet.counts()]
        cpu_before, own_before = fleet.cpu_seconds(), _own_cpu()
        with Sampler() as sampled:
            wall, admitted = drive(agent, frames, world, fleet.bmcs[:n], "all")
        cpu, own = fleet.cpu_seconds() - cpu_before, _own_cpu() - own_before
        counted.append(fleet.counts())
        drive(agent, frames, world, fleet.bmcs[:n], "again")   # the same BMCs' next three commands
        counted.append(fleet.counts())
        counters = agent.scheduler.keyed

        def per_bmc(what: str, i: int) -> tuple[int, int]:
            """(fewest, most) of ``what`` a BMC of the N saw in round ``i`` (0: first, 1: again)."""
            got = [b - a for a, b in zip(counted[i][what][:n], counted[i + 1][what][:n], strict=True)]
            return min(got), max(got)

        return {"n": n, "one_s": one, "all_s": wall, "admitted_s": admitted, "ratio": wall / one,
                "rss_mb": sampled.rss_mb,
                "threads": sampled.threads, "files": sampled.files, "emulator_cpu_s": cpu,
                "daemon_cpu_s": own,
                "peak_in_flight": counters.peak_in_flight,
                "requests": per_bmc("requests", 0), "requests_again": per_bmc("requests", 1),
                "connections": per_bmc("connections", 0), "connections_again": per_bmc("connections", 1)}
    finally:
        for a in world.agents:
            a.stop(timeout=5)
        fleet.close()


def head_of_line(n: int, tmp: Path) -> dict[str, float]:
    (tmp / "world").mkdir()
    world = World(tmp / "world")
    fleet = Fleet(tmp / "fleet", 1, hang=n)
    try:
        agent, frames = site_agent(world, tmp)
        healthy, hung = fleet.bmcs[0], fleet.bmcs[1:]
        for i, bmc in enumerate(hung):
            submit(agent, command(world, f"h{i}", "bmc.power", bmc["address"], "status", {}, timeout=120))
        deadline = time.monotonic() + 60
        while agent.scheduler.keyed.in_flight < n and time.monotonic() < deadline:
            time.sleep(0.05)
        waits = {}
        for cid, cmd in (("inv", world.command("inv", "inventory.refresh")),
                         ("ok", command(world, "ok", "bmc.power", healthy["address"], "status", {}))):
            sent_ms = time.time() * 1000
            submit(agent, cmd)
            result = frames.result(cid, timeout=60)
            if result.status != session_pb2.SUCCEEDED:
                raise SystemExit(f"{cid}: {result.reason} {result.message}")
            waits[cid] = (result.started_at_unix_ms - sent_ms) / 1000
        return {"hung": agent.scheduler.keyed.in_flight, "inventory_start_s": waits["inv"],
                "healthy_bmc_start_s": waits["ok"]}
    finally:
        for a in world.agents:
            a.stop(timeout=5)
        fleet.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,64,256", help="BMC counts, comma separated")
    p.add_argument("--hang", type=int, default=256, help="hung BMCs for the head-of-line figure")
    p.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                   help="every BMC answers each request after this long, as a real BMC does "
                   "(0: at once, so that the figures are the daemon's CPU)")
    a = p.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)   # as `agent run` does
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} "
          f"on {os.cpu_count()} CPUs; the BMCs answer after {a.latency:g} s")
    print("| N | one BMC (s) | all N (s) | all admitted (s) | ratio | peak RSS (MB) | threads | open files | "
          "daemon's CPU (s) | emulators' CPU (s) | peak in flight | requests a BMC: first, again | "
          "connections a BMC: first, again |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def span(lo_hi: tuple[int, int]) -> str:
        return f"{lo_hi[0]}" if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}-{lo_hi[1]}"

    for n in (int(x) for x in a.sizes.split(",")):
        with tempfile.TemporaryDirectory(dir=STATE_ON) as tmp:
            r = fleet_run(n, Path(tmp), a.latency)
        print(f"| {n} | {r['one_s']:.2f} | {r['all_s']:.2f} | {r['admitted_s']:.2f} | {r['ratio']:.1f} | "
              f"{r['rss_mb']:.0f} | "
              f"{r['threads']:.0f} | {r['files']:.0f} | {r['daemon_cpu_s']:.1f} | "
              f"{r['emulator_cpu_s']:.1f} | "
              f"{r['peak_in_flight']:.0f} | {span(r['requests'])}, {span(r['requests_again'])} | "
              f"{span(r['connections'])}, {span(r['connections_again'])} |", flush=True)
    if a.hang:
        with tempfile.TemporaryDirectory(dir=STATE_ON) as tmp:
            h = head_of_line(a.hang, Path(tmp))
        print(f"head of line: {h['hung']:.0f} BMC operations hung; inventory.refresh started "
              f"{max(0, h['inventory_start_s']) * 1000:.0f} ms after its submit, bmc.power status on a "
              f"healthy BMC {max(0, h['healthy_bmc_start_s']) * 1000:.0f} ms (ms clock)")
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
