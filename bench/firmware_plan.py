"""What computing a firmware set's plan costs the site (issue 54, items 1, 2 and 7), against the
largest recorded FirmwareInventory: the DGX H100's, 66 components (../shared/vendor-trees).

    compare       fwsets.plan + step_message for a set naming every component by Id (a third
                  of them behind) and one SoftwareId rule: the comparison alone, per BMC
    parse         fwsets.parse of that set's JSON (the file is read at each plan)
    read + plan   firmware.inventory through the project's emulator on loopback (TLS, one GET
                  per component, as a real BMC is read) then the comparison: what bmc.firmware
                  plan and the release gate spend per node, less the BMC's own latency

Usage: .venv/bin/python bench/firmware_plan.py [--runs 200] [--reads 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.site.bmc.client import CallContext, Pacing  # noqa: E402
from agent.site.bmc.redfish import firmware, fwsets  # noqa: E402
from agent.site.bmc.redfish.client import RedfishClient  # noqa: E402
from tests.site.bmc.redfish_emulator import RedfishEmulator  # noqa: E402

TREE = "nvidia_dgxh100"


def timed(n: int, work: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        work()
        out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


def summary(name: str, ms: list[float]) -> None:
    p95 = ms[max(0, int(len(ms) * 0.95) - 1)]
    print(f"  {name:<14} median {statistics.median(ms):8.3f} ms   p95 {p95:8.3f} ms   (n={len(ms)})")


def the_set(inventory: list[Any]) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, c in enumerate(inventory):
        if c.id in seen or not c.id:
            continue
        seen.add(c.id)
        entries.append({"match": {"id": c.id}, "version": c.version + ("-new" if n % 3 == 0 else ""),
                        "image": {"sha256": f"{n:064x}"}, "order": n % 4 * 10})
    entries.append({"match": {"software_id": "0x0010", "manufacturer": "NVIDIA"}, "version": "x",
                    "image": {"sha256": "f" * 64}})
    return {"profiles": {"dgx-h100": entries}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reads", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, RedfishEmulator.of(TREE, Path(tmp)) as bmc:
        def read() -> list[Any]:
            call = CallContext(threading.Event(), time.monotonic() + 120, Pacing(0.05, 0.1, 1.5))
            client = RedfishClient(bmc.target(), call)
            try:
                return firmware.inventory(client)
            finally:
                client.close()

        inventory = read()
        doc = the_set(inventory)
        fwset = fwsets.parse(doc)["dgx-h100"]
        planned = fwsets.plan(fwset, inventory)
        print(f"{TREE}: {len(inventory)} components, a set of {len(fwset.entries)} entries,"
              f" {len(planned.steps)} steps")
        summary("compare", timed(args.runs, lambda: [fwsets.step_message(s) for s in
                                                     fwsets.plan(fwset, inventory).steps]))
        text = json.dumps(doc)
        summary("parse", timed(args.runs, lambda: fwsets.parse(json.loads(text))))
        summary("read + plan", timed(args.reads, lambda: fwsets.plan(fwset, read())))


if __name__ == "__main__":
    main()
