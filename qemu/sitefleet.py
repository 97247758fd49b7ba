"""Several QEMU nodes through one site daemon at once (issue 26.4): each node's life as
qemu/sitelife.py runs it, in a thread of its own, with routes that serve the raw image from the
site's chunk store and the deploys started at the same moment.

    report = run_fleet(lab, lives, say)     # lives: one Lifecycle(chunk_store=True) per node
    report.upstream_bytes, report.distinct_data_bytes, report.chunks_verified ...

The nodes' images share most of their chunks (the same kernel, initramfs and agent; the node's
own settings and the file system's metadata differ), so the figure that proves the cache is
counted, not timed: the site fetched from the upstream each distinct data chunk of the three
manifests exactly once (its /metrics: chunks verified, upstream bytes), however many nodes
deploy it at once.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.images import manifest
from qemu.sitelab import SiteLab
from qemu.sitelife import Bmc, Lifecycle, Step, make_node

METRICS = "http://127.0.0.1:9108/metrics"   # the site daemon's default, in the lab's namespace
BARRIER_TIMEOUT = 1800.0


@dataclass
class FleetReport:
    nodes: int
    distinct_data_chunks: int = 0
    distinct_data_bytes: int = 0
    shared_data_chunks: int = 0            # in every node's image
    chunks_verified: int = 0               # by the site, of what it fetched
    upstream_bytes: int = 0                # the site fetched from the upstream
    store_bytes_served: int = 0
    errors: list[str] = field(default_factory=list)
    broken: str = ""                       # the broken node's name (qemu/sitebreak.py)
    broken_cause: str = ""                 # the cause the site named for it ("" for none)


def fleet_lives(lab: SiteLab, names: list[str], macs: list[str], username: str, password: str,
                credentials_ref: str) -> list[Lifecycle]:
    """A node, its ipmi_sim (the credentials in the site's secret store under
    ``credentials_ref``) and its Lifecycle with chunk-store routes, for each name."""
    from agent.site.bmc.client import Credentials
    from agent.site.bmc.secrets import SecretStore
    from qemu.ipmisim import start_ipmi_sim

    SecretStore(lab.secrets_dir).put(credentials_ref, Credentials(username, password))
    lives = []
    for name, mac in zip(names, macs, strict=True):
        node = make_node(lab, name, mac=mac)
        sim = lab.in_lan(start_ipmi_sim, lab.workdir / f"ipmi-{name}", node.power, username, password,
                         sol=lab.sol(node.power))
        lab.closers.append(sim.stop)
        lives.append(Lifecycle(lab, node, Bmc("ipmi", sim.address, credentials_ref), chunk_store=True))
    return lives


def site_metrics(lab: SiteLab) -> dict[str, float]:
    def scrape() -> str:
        with urllib.request.urlopen(METRICS, timeout=10) as resp:
            return str(resp.read().decode())

    values: dict[str, float] = {}
    for line in lab.in_lan(scrape).splitlines():
        m = re.fullmatch(r"bettercompute_site_(\w+) (\S+)", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def run_fleet(lab: SiteLab, lives: list[Lifecycle], say: Callable[[str], None],
              broken: Callable[[Lifecycle], str] | None = None) -> FleetReport:
    """Every node's life at once; the deploys wait for each other and start together.
    ``broken`` (qemu/sitebreak.py ``breaker``): the last node runs it instead of its life,
    and the others go on without it."""
    report = FleetReport(len(lives))
    if broken is not None:
        *lives, odd = lives
        report.broken = odd.node.name
    ready = threading.Barrier(len(lives), timeout=BARRIER_TIMEOUT)
    lock = threading.Lock()

    def broken_life(life: Lifecycle) -> None:
        assert broken is not None
        try:
            report.broken_cause = broken(life)
        except BaseException as exc:   # said, never the demo's failure: the node was broken
            say(f"{life.node.name}: the broken node's run ended early: {str(exc)[:2000]}")

    def life_of(life: Lifecycle) -> None:
        try:
            life.query()
            life.prepare_ramdisk()
            life.boot_device("pxe")
            life.power_on()
            life.pxe_join()
            life.http_proxy()
            ready.wait()
            life.deploy()
            life.clean_up()
            life.boot_device("disk")
            life.power_cycle()
            life.disk_join()
        except BaseException as exc:
            ready.abort()
            with lock:
                report.errors.append(f"{life.node.name}: {exc}"[:6000])

    for life in lives:
        name = life.node.name
        life.chunk_store = True

        def shown(step: Step, name: str = name) -> None:
            say(f"{name}: {step.name.upper()} ({step.seconds:.1f}s): {step.evidence}")

        life.on_step = shown
    started = time.monotonic()
    threads = [threading.Thread(target=life_of, args=(life,), name=life.node.name) for life in lives]
    if broken is not None:
        odd.on_step = lambda step: say(f"{odd.node.name}: {step.name.upper()} ({step.seconds:.1f}s): "
                                       f"{step.evidence}")
        threads.append(threading.Thread(target=broken_life, args=(odd,), name=odd.node.name))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    say(f"{len(threads)} nodes in {time.monotonic() - started:.0f}s")
    if report.errors:
        return report
    data = [{s.digest: s.length for s in manifest.from_proto(life.chunks).segments
             if s.digest is not None} for life in lives]
    distinct: dict[bytes, int] = {}
    for d in data:
        distinct.update(d)
    report.distinct_data_chunks = len(distinct)
    report.distinct_data_bytes = sum(distinct.values())
    report.shared_data_chunks = len(set.intersection(*(set(d) for d in data)))
    values = site_metrics(lab)
    report.chunks_verified = int(values.get("chunks_verified_total", 0))
    report.upstream_bytes = int(values.get("upstream_bytes_fetched_total", 0))
    report.store_bytes_served = int(values.get("store_bytes_served_total", 0))
    say(f"upstream: {report.upstream_bytes} bytes in {report.chunks_verified} chunks fetched "
        f"by the site; the {len(lives)} images hold {report.distinct_data_chunks} distinct data "
        f"chunks ({report.distinct_data_bytes} bytes, {report.shared_data_chunks} in every image); "
        f"{report.store_bytes_served} bytes served from the site's store")
    return report
