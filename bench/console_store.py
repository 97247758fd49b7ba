"""256 consoles kept on disk at once through the site's console store (issue 53, item 3).

Each console is a thread of its own, as a console session is in the site daemon, handing its
lines to a Ring (agent/site/observe/console.py) whose lines go to the one ConsoleStore
(agent/site/observe/consolestore.py): the path every console line takes. A line is 60 to 140
characters of kernel-log-like text (compressible as a real console is, not random bytes); each
console writes ``--rate`` lines a second (default 20: a node booting or a busy tenant's log;
a quiet node writes far fewer), for ``--seconds``. Measured: the process's CPU seconds (user +
system, from os.times) per console-hour, its peak RSS and open file descriptors (sampled every
50 ms), the bytes on disk per console-hour, and the lines written against the lines read back.

Usage: python bench/console_store.py [--consoles 256] [--rate 20] [--seconds 30] [--no-ring]
       [--baseline] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.site.observe.console import Ring  # noqa: E402
from agent.site.observe.consolestore import ConsoleStore  # noqa: E402

WORDS = ("usb", "pci", "0000:00:1f.2", "eth0", "link", "up", "nvme0n1", "systemd[1]:", "Started",
         "Reached", "target", "ACPI:", "irq", "mlx5_core", "firmware", "version", "gpu", "NVRM:",
         "loading", "module", "bc-init", "agent", "connected", "dhcp", "lease", "renewed")


def _line(rng: random.Random, t: float) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
    return f"[{t % 100000:12.6f}] {words}"


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consoles", type=int, default=256)
    parser.add_argument("--rate", type=float, default=20.0, help="lines a second per console")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--no-ring", action="store_true",
                        help="lines to the store alone (the store's own cost, without the ring's)")
    parser.add_argument("--baseline", action="store_true",
                        help="lines made and dropped: the bench's own cost, to subtract")
    parser.add_argument("--dir", type=Path, default=None, help="where the store and rings go")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        store = ConsoleStore(root / "store")
        rss0, fds0 = _rss_kb(), len(os.listdir("/proc/self/fd"))
        peak = {"rss": rss0, "fds": fds0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.05):
                peak["rss"] = max(peak["rss"], _rss_kb())
                peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))

        written = [0] * args.consoles

        def console(i: int, start: float) -> None:
            rng = random.Random(i)
            name = f"node-{i:03d}"
            ring = Ring(root / "rings" / name, 4 << 20, lambda t, line: store.append(name, t, line))
            append = (lambda t, line: store.append(name, t, line)) if args.no_ring else ring.append
            if args.baseline:
                append = lambda t, line: None  # noqa: E731
            n = 0
            while time.monotonic() - start < args.seconds:
                due = start + n / args.rate + rng.random() / args.rate
                time.sleep(max(0.0, due - time.monotonic()))
                append(time.time(), _line(rng, time.time()))
                n += 1
            written[i] = n

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0, wall0 = os.times(), time.monotonic()
        threads = [threading.Thread(target=console, args=(i, wall0)) for i in range(args.consoles)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        store.close()
        cpu1, wall = os.times(), time.monotonic() - wall0
        stop.set()
        sampler.join()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        read_back = sum(len(store.read(f"node-{i:03d}")) for i in range(args.consoles))
        hours = args.consoles * wall / 3600
        ring_bytes = sum(p.stat().st_size for p in root.glob("rings/*/*") if p.is_file())
        print(json.dumps({
            "consoles": args.consoles, "ring": not args.no_ring,
            "baseline": args.baseline, "rate_lines_per_s": args.rate,
            "wall_s": round(wall, 1),
            "lines_written": sum(written), "lines_read_back": read_back,
            "cpu_s": round(cpu, 2), "cpu_s_per_console_hour": round(cpu / hours, 2),
            "cpu_share_of_one_core": round(cpu / wall, 3),
            "rss_mb_before": round(rss0 / 1024, 1), "rss_mb_peak": round(peak["rss"] / 1024, 1),
            "fds_before": fds0, "fds_peak": peak["fds"],
            "store_bytes": store.size(), "store_bytes_per_console_hour": int(store.size() / hours),
            "ring_bytes": ring_bytes,
        }, indent=1))


if __name__ == "__main__":
    main()
