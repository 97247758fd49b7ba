"""inventory.refresh timing: a fake 8-GPU / 30-disk server tree, and this machine.

    python bench/inventory_bench.py [--runs 10] [--gpus 8] [--disks 30]

Builds the fake sysfs/procfs tree of tests/hw/fake_machine.py in a temporary directory and
times agent.commands.inventory.collect over it (GPUs from the PCI ids in sysfs, and, when a C
compiler is there, through pynvml against the fake libnvidia-ml.so.1 of tests/fakes/nvml), then
the inventory of this machine itself (without LLDP). The target (issue 7) is "well under the
2-minute limit"; LLDP listening (up to 30 s, only when asked) is not included.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.commands import inventory  # noqa: E402
from tests.hw.fake_machine import build_machine  # noqa: E402

NO_NVML = "/nonexistent/libnvidia-ml.so.1"


def timed(fn: Callable[[], object], runs: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def row(label: str, times: list[float], detail: str) -> str:
    return (
        f"| {label} | {len(times)} | {times[0] * 1000:.1f} | {statistics.median(times) * 1000:.1f} | "
        f"{max(times) * 1000:.1f} | {detail} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--disks", type=int, default=30)
    args = p.parse_args()
    print("| case | runs | first (ms) | median (ms) | max (ms) | found |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = build_machine(Path(tmp) / "root", gpus=args.gpus, disks=args.disks)
        times, inv = timed(lambda: inventory.collect(root, nvml_library=NO_NVML), args.runs)
        assert isinstance(inv, inventory.agent_pb2.Inventory)
        print(row(
            "fake server, GPUs from sysfs", times,
            f"{len(inv.gpus)} GPUs, {len(inv.disks)} disks, {len(inv.nics)} NICs, "
            f"{len(inv.infiniband)} IB ports, {len(inv.memory.dimms)} DIMMs",
        ))  # fmt: skip
        try:
            from tests.fakes.nvml.fakenvml import FakeMachine, build_library

            library = build_library(Path(tmp) / "nvml")
            machine = FakeMachine(Path(tmp) / "gpus.json", count=args.gpus)
            os.environ["FAKE_NVML_CONFIG"] = str(machine.path)
        except Exception as exc:
            print(f"| fake server, GPUs through NVML | - | - | - | - | skipped: {exc} |")
        else:
            times, inv = timed(lambda: inventory.collect(root, nvml_library=str(library)), args.runs)
            assert isinstance(inv, inventory.agent_pb2.Inventory)
            sources = {g.source for g in inv.gpus}
            print(row("fake server, GPUs through NVML (fake library)", times,
                      f"{len(inv.gpus)} GPUs ({', '.join(sorted(sources))}), {len(inv.disks)} disks"))
    times, inv = timed(lambda: inventory.collect(), args.runs)
    assert isinstance(inv, inventory.agent_pb2.Inventory)
    print(row("this machine", times, f"{len(inv.gpus)} GPUs, {len(inv.disks)} disks, {len(inv.nics)} NICs"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
