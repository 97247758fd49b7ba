"""Every kept console's history on disk (agent/site/observe/consolestore.py): retention by time
under a clock the test controls, the per-node and the site-wide caps, a restart, a full disk
(a real one: a small tmpfs, as root), and queries across segments."""

from __future__ import annotations

import errno
import gzip
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.site.observe.console import Consoles
from agent.site.observe.consolestore import ConsoleStore
from agent.site.observe.timeline import Step

DAY = 86400.0
T0 = 1_790_000_000.0    # a moment the clock starts at (whole hours: 1790000000 % 3600 == 800)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _store(root: Path, clock: Clock, **kw: object) -> tuple[ConsoleStore, list[tuple[str, str, str]]]:
    said: list[tuple[str, str, str]] = []
    store = ConsoleStore(root, report=lambda n, s, t: said.append((n, s, t)), clock=clock,
                         **kw)  # type: ignore[arg-type]
    return store, said


def test_thirty_days_kept_then_the_oldest_segment_dropped_first(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path, clock, keep_seconds=30 * DAY, slice_seconds=86400)
    for day in range(40):       # a line every 6 hours for 40 days, the clock going with it
        for quarter in range(4):
            clock.t = T0 + day * DAY + quarter * 6 * 3600
            store.append("n1", clock.t, f"day {day} quarter {quarter}")
        store.flush()
    starts = store.segments("n1")
    # the segments whose day ended more than 30 days ago are gone, the rest are all there
    assert len(starts) in (30, 31)
    assert starts == sorted(starts) and starts[-1] == int(clock.t) - int(clock.t) % 86400
    cutoff = clock.t - 30 * DAY
    assert all(s + 86400 > cutoff for s in starts)
    oldest = store.oldest("n1")
    kept = store.read("n1")
    assert oldest == kept[0][0]                   # the moment reported is a line still there
    assert oldest <= cutoff + 86400 and clock.t - oldest <= 31 * DAY
    assert kept[-1] == (clock.t, "day 39 quarter 3")
    assert not (tmp_path / "n1" / f"{int(T0) - int(T0) % 86400}.gz").exists()


def test_the_node_cap_drops_its_oldest_segment_first(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path, clock, node_bytes=20_000, slice_seconds=3600)
    noise = os.urandom(3000).hex()        # each hour's segment ~3.4 KB compressed
    for hour in range(12):
        clock.t = T0 + hour * 3600
        store.append("n1", clock.t, f"hour {hour} {noise}")
        store.append("n2", clock.t, f"hour {hour}")
        store.flush()
    assert store.size("n1") <= 20_000
    hours = [int(text.split()[1]) for _, text in store.read("n1")]
    assert 3 <= len(hours) < 12 and hours == list(range(12 - len(hours), 12))   # the oldest went
    assert store.segments("n1") == [int(T0 + h * 3600) - int(T0 + h * 3600) % 3600 for h in hours]
    assert store.oldest("n1") == store.read("n1")[0][0]
    assert [text for _, text in store.read("n2")] == [f"hour {h}" for h in range(12)]   # untouched


def test_the_site_cap_drops_the_sites_oldest_segment_first(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path, clock, site_bytes=40_000, slice_seconds=3600)
    noise = os.urandom(2500).hex()
    for hour in range(8):
        for node in ("n1", "n2", "n3"):
            clock.t = T0 + hour * 3600 + {"n1": 1, "n2": 2, "n3": 3}[node]
            store.append(node, clock.t, f"{node} hour {hour} {noise}")
        store.flush()
    assert store.size() <= 40_000
    firsts = {n: store.read(n)[0][0] for n in ("n1", "n2", "n3")}
    # the oldest went across the nodes: no node keeps an hour that another lost
    hours = {n: int((t - T0) // 3600) for n, t in firsts.items()}
    assert max(hours.values()) - min(hours.values()) <= 1 and min(hours.values()) > 0
    for n in ("n1", "n2", "n3"):
        assert store.oldest(n) == firsts[n]
        assert store.read(n)[-1][1].startswith(f"{n} hour 7 ")


def test_the_timer_writes_a_quiet_consoles_lines_and_drops_by_time(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path, clock, flush_seconds=0.2, flush_bytes=1 << 20)
    store.append("quiet", T0, "a last line before the node went quiet")
    store.tick()
    assert store.segments("quiet") == []                                # held, not yet due
    time.sleep(0.3)
    store.tick()
    assert store.segments("quiet") == [int(T0) - int(T0) % 3600]      # written, not held
    assert ConsoleStore(tmp_path, clock=clock).read("quiet") == [
        (T0, "a last line before the node went quiet")]
    clock.t = T0 + 31 * DAY          # nothing written for a month: the timer alone drops it
    store.tick()
    assert store.segments("quiet") == [] and store.oldest("quiet") == 0.0 and store.size() == 0


def test_a_restart_keeps_and_serves_what_was_written(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path, clock, slice_seconds=3600)
    for i in range(10):
        store.append("n1", T0 + i * 1000, f"before {i}")
    store.close()
    again, _ = _store(tmp_path, clock, slice_seconds=3600)
    assert [text for _, text in again.read("n1")] == [f"before {i}" for i in range(10)]
    assert again.oldest("n1") == T0
    again.append("n1", T0 + 20_000, "after")
    again.close()
    kept = ConsoleStore(tmp_path, clock=clock, slice_seconds=3600).read("n1")
    assert kept[-1] == (T0 + 20_000, "after") and len(kept) == 11
    # a segment is plain gzip: gzip -dc reads every member of it
    seg = sorted((tmp_path / "n1").iterdir())[0]
    assert gzip.decompress(seg.read_bytes()).decode().startswith(f"{int(T0 * 1000)} before 0\n")


def test_a_query_across_segments_returns_each_line_once_in_order(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path, clock, slice_seconds=600, flush_bytes=512)
    lines = [(T0 + i * 7.25, f"line {i}") for i in range(2000)]    # ~4 hours, 25 segments
    for t, text in lines:
        store.append("n1", t, text)
    assert len(store.segments("n1")) > 20
    since, until = lines[100][0], lines[1700][0]
    assert store.read("n1", since, until) == lines[100:1701]      # held lines flushed first
    assert store.read("n1") == lines


def test_consoles_read_takes_from_the_store_what_the_ring_no_longer_holds(tmp_path: Path) -> None:
    clock = Clock(T0)
    store, _ = _store(tmp_path / "store", clock)
    consoles = Consoles(tmp_path / "rings", tmp_path / "secrets", report=lambda *a: None,
                        ring_bytes=8192, history=store)
    ring = consoles.ring("n1")
    lines = [(T0 + i, f"console line {i:04d}") for i in range(2000)]
    for t, text in lines:
        ring.append(t, text)
    assert ring.oldest() > T0 + 1000                        # the ring kept the last few only
    assert consoles.read("n1") == lines                     # each once, in order
    assert consoles.read("n1", T0 + 10, T0 + 20) == lines[10:21]
    assert consoles.oldest("n1") == T0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("a small tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_stops_writing_says_so_and_the_console_goes_on(small_disk: Path, tmp_path: Path) -> None:
    clock = Clock(T0)
    store, said = _store(small_disk / "store", clock, flush_bytes=4096, retry_seconds=0.0)
    consoles = Consoles(tmp_path / "rings", tmp_path / "secrets", report=lambda *a: None,
                        history=store)
    ring = consoles.ring("n1")
    ballast = small_disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError) as full_disk:
            while True:           # the disk filled by something else
                os.write(fd, os.urandom(4096))
        assert full_disk.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    for i in range(100):
        ring.append(T0 + i, f"line {i} {os.urandom(500).hex()}")
    full = [s for s in said if s[0] == "n1"]
    assert full == [("n1", Step.CONSOLE, "not stored: the disk is full; kept in memory, "
                     "tried again every 0s")]                           # said once
    assert ring.read()[-1][1].startswith("line 99 ")                  # the console goes on
    assert consoles.read("n1")[-1][1].startswith("line 99 ")
    assert store.size("n1") == 0            # nothing written, nothing torn left behind
    assert all(p.stat().st_size == 0 for p in (small_disk / "store").rglob("*.gz"))
    ballast.unlink()                                                   # room again
    for i in range(100, 110):
        ring.append(T0 + i, f"line {i}")
    store.flush()
    assert said[-1] == ("n1", Step.CONSOLE, "stored again")
    assert [text for _, text in store.read("n1")] == [f"line {i}" for i in range(100, 110)]
    again = ConsoleStore(small_disk / "store", clock=clock)            # and after a restart
    assert [text for _, text in again.read("n1")] == [f"line {i}" for i in range(100, 110)]
