"""The journal: replay, torn and corrupt records, compaction, fsync before return."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.hw import sysfs
from agent.runtime import journal as journal_module
from agent.runtime.journal import MAGIC, Entry, Journal, Known, State, encode_record, scan


def fill(j: Journal) -> None:
    """a: acked, b: finished unacked, c: started, d: accepted, e: awaiting rejoin."""
    for cid in "abcde":
        j.accepted(cid, "inventory.refresh", f"digest-{cid}", f"command-{cid}".encode())
    for cid in "abce":
        j.started(cid, "boot-1")
    j.progress("c", {"fraction": 0.5, "message": "half"})
    j.result("a", b"result-a", "SUCCEEDED")
    j.result("b", b"result-b", "FAILED")
    j.acked("a")
    j.awaiting_rejoin("e", {"old_boot_id": "boot-1"})


def summary(j: Journal) -> dict[str, object]:
    return {
        "entries": {cid: e.to_json() for cid, e in sorted(j.entries.items())},
        "known": dict(j.known),
    }


def open_journal(path: Path, **kwargs: object) -> Journal:
    j = Journal(path, **kwargs)  # type: ignore[arg-type]
    j.open()
    return j


def test_replay_gives_state_of_every_id(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    fill(j)
    before = summary(j)
    j.close()
    again = open_journal(path)
    assert summary(again) == before
    assert again.known["a"] == Known("a", "inventory.refresh", "digest-a", "SUCCEEDED")
    assert again.entries["b"].state is State.FINISHED and again.entries["b"].result == b"result-b"
    assert again.entries["b"].command == b""  # a finished command is never run again
    assert again.entries["c"].state is State.STARTED and again.entries["c"].attempts == 1
    assert again.entries["c"].command == b"command-c"
    assert again.entries["c"].progress == {"fraction": 0.5, "message": "half"}
    assert again.entries["d"].state is State.ACCEPTED
    assert again.entries["e"].state is State.AWAITING_REJOIN
    assert again.entries["e"].proof == {"old_boot_id": "boot-1"}
    assert isinstance(again.lookup("a"), Known) and isinstance(again.lookup("d"), Entry)
    assert again.lookup("zzz") is None


def test_torn_tail_at_every_offset_is_ignored_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    fill(j)
    j.close()
    full = path.read_bytes()
    reference = open_journal(tmp_path / "reference")
    fill(reference)
    reference.close()
    last_start = full.rfind(MAGIC)
    # The state without the last record (the "rejoin" of e): e is still STARTED.
    prefix = tmp_path / "prefix"
    prefix.write_bytes(full[:last_start])
    expected = summary(open_journal(prefix))
    assert expected["entries"]["e"]["state"] == "started"  # type: ignore[index]
    for cut in range(last_start, len(full)):
        path.write_bytes(full[:cut])
        torn = open_journal(path)
        assert summary(torn) == expected, f"cut at {cut}"
        # the torn bytes are gone before anything is appended
        assert path.stat().st_size == last_start
        torn.acked("b")
        torn.close()
        after = open_journal(path)
        assert "b" in after.known and "b" not in after.entries
        assert after.last_scan is not None and after.last_scan.torn_tail == 0
        after.close()


def test_garbage_tail_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    fill(j)
    j.close()
    expected = summary(open_journal(path))
    with open(path, "ab") as f:
        f.write(os.urandom(100) + MAGIC + b"\xff\xff\xff\xff")
    assert summary(open_journal(path)) == expected


def test_corrupt_middle_record_is_skipped_and_file_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    j.accepted("x", "disk.wipe", "dx", b"cmd-x")
    j.accepted("y", "disk.wipe", "dy", b"cmd-y")
    j.started("y", "boot-1")
    j.accepted("z", "inventory.refresh", "dz", b"cmd-z")
    j.close()
    data = bytearray(path.read_bytes())
    # flip a byte inside the payload of the third record ("accepted y", after "state" and "accepted x")
    second = data.find(MAGIC, data.find(MAGIC, 1) + 1)
    data[second + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    j2 = open_journal(path)
    assert j2.last_scan is not None and j2.last_scan.skipped > 0
    # x and z survive; y is known from its "started" record, with its digest, never re-runnable
    assert j2.entries["x"].state is State.ACCEPTED and j2.entries["z"].command == b"cmd-z"
    assert j2.entries["y"].state is State.STARTED and j2.entries["y"].digest == "dy"
    assert j2.entries["y"].command == b""
    j2.close()
    # the file was rewritten: no corrupt bytes remain
    j3 = open_journal(path)
    assert j3.last_scan is not None and j3.last_scan.skipped == 0 and j3.last_scan.torn_tail == 0
    assert summary(j3) == summary(j2)


def test_corrupt_length_field_resyncs(tmp_path: Path) -> None:
    good = [encode_record({"t": "acked", "id": str(i)}) for i in range(5)]
    broken = bytearray(good[2])
    broken[4:8] = b"\x7f\xff\xff\xff"  # an absurd length
    image = good[0] + good[1] + bytes(broken) + good[3] + good[4]
    result = scan(image)
    assert [r["id"] for r in result.records] == ["0", "1", "3", "4"]
    assert result.skipped == len(broken) and result.torn_tail == 0


def test_empty_and_missing_journal(tmp_path: Path) -> None:
    j = open_journal(tmp_path / "sub" / "journal")
    assert j.entries == {} and not j.known
    (tmp_path / "empty").write_bytes(b"")
    assert open_journal(tmp_path / "empty").entries == {}
    (tmp_path / "noise").write_bytes(os.urandom(4096))
    noisy = open_journal(tmp_path / "noise")
    assert noisy.entries == {}
    noisy.accepted("n", "inventory.refresh", "dn", b"c")
    noisy.close()
    assert set(open_journal(tmp_path / "noise").entries) == {"n"}


def test_compaction_keeps_state_and_bounds_size(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    # fsync is beside the point here (and slow on a busy disk): it is tested on its own below
    j = open_journal(path, compact_bytes=16 * 1024, max_known=50, fsync=lambda fd: None)
    fill(j)
    sizes = []
    for i in range(2000):
        cid = f"bulk-{i}"
        j.accepted(cid, "logs.collect", f"d{i}", b"x" * 64)
        j.started(cid, "boot-1")
        j.progress(cid, {"fraction": 0.5})
        j.result(cid, b"r" * 64, "SUCCEEDED")
        j.acked(cid)
        sizes.append(j.size())
    assert j.compactions > 10
    assert max(sizes) < 64 * 1024
    assert len(j.known) == 50 and "bulk-1999" in j.known and "bulk-0" not in j.known
    # the live entries of fill() survive every compaction untouched
    state = summary(j)
    assert set(state["entries"]) == {"b", "c", "d", "e"}  # type: ignore[arg-type]
    j.close()
    assert summary(open_journal(path, compact_bytes=16 * 1024, max_known=50)) == state
    assert not (tmp_path / ".journal.compact").exists()


def test_explicit_compaction_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    fill(j)
    before = summary(j)
    size = j.size()
    j.compact()
    assert summary(j) == before
    j.accepted("f", "inventory.refresh", "df", b"cf")
    j.close()
    after = open_journal(path)
    assert after.entries["f"].state is State.ACCEPTED
    del after.entries["f"]
    assert summary(after) == before
    assert size > 0


def test_fsync_before_return(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    synced: list[int] = []

    def fsync(fd: int) -> None:
        os.fsync(fd)
        synced.append(os.fstat(fd).st_size)

    j = open_journal(path, fsync=fsync)
    for op in (
        lambda: j.accepted("a", "disk.wipe", "da", b"cmd"),
        lambda: j.started("a", "boot-1"),
        lambda: j.result("a", b"res", "SUCCEEDED"),
        lambda: j.acked("a"),
        lambda: j.awaiting_rejoin("a", {"old_boot_id": "b"}),
        lambda: j.completion("a", b"done", "SUCCEEDED"),
    ):
        synced.clear()
        op()
        # by the time the call returns, the whole file including this record was fsync'ed
        assert synced and synced[-1] == path.stat().st_size
    synced.clear()
    j.progress("a", {"fraction": 0.1})
    assert synced == []  # progress markers acknowledge nothing


def test_record_checksum_covers_length() -> None:
    rec = bytearray(encode_record({"t": "acked", "id": "q"}))
    rec[7] ^= 0x01  # length changed, payload intact
    assert scan(bytes(rec)).records == []
    with pytest.raises(ValueError):
        Entry.from_json({"id": "x", "state": "nonsense"})


def test_a_record_whose_fsync_failed_is_not_replayed(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    failing = {"on": False}

    def fsync(fd: int) -> None:
        if failing["on"]:
            raise OSError(5, "Input/output error")
        os.fsync(fd)

    j = open_journal(path, fsync=fsync)
    j.accepted("ok", "inventory.refresh", "d1", b"c1")
    failing["on"] = True
    with pytest.raises(OSError):
        j.accepted("lost", "disk.wipe", "d2", b"c2")
    assert "lost" not in j.entries
    failing["on"] = False
    j.acked("ok")
    j.close()
    again = open_journal(path)
    assert "lost" not in again.entries and "ok" in again.known
    assert again.last_scan is not None and again.last_scan.skipped == 0


def test_failed_compaction_keeps_the_record_and_the_journal_usable(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    broken = {"on": True}

    def fsync(fd: int) -> None:
        if broken["on"] and os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):   # the compaction's
            raise OSError(28, "No space left on device")
        os.fsync(fd)

    j = open_journal(path, fsync=fsync, compact_bytes=2048)
    for i in range(40):
        j.accepted(f"c{i}", "inventory.refresh", f"d{i}", b"x" * 100)  # never raises
    assert j.compactions == 0 and list(tmp_path.glob(".journal.*")) == []
    broken["on"] = False
    for i in range(40, 80):
        j.accepted(f"c{i}", "inventory.refresh", f"d{i}", b"x" * 100)
    assert j.compactions >= 1
    j.close()
    assert set(open_journal(path).entries) == {f"c{i}" for i in range(80)}


_OPS = ("accepted", "started", "progress", "result", "acked", "rejoin", "completion")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(st.sampled_from(_OPS), st.integers(0, 5)), min_size=1, max_size=30),
    damage=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=4),
    cut=st.floats(0, 1),
)
def test_any_damage_is_never_fatal(tmp_path: Path, ops: list[tuple[str, int]],
                                   damage: list[tuple[float, int]], cut: float) -> None:
    path = tmp_path / f"journal-{os.urandom(4).hex()}"
    j = open_journal(path, fsync=lambda fd: None)
    for op, n in ops:
        cid = f"c{n}"
        if op == "accepted":
            j.accepted(cid, "inventory.refresh", f"d{n}", b"cmd")
        elif op == "started":
            j.started(cid, "boot")
        elif op == "progress":
            j.progress(cid, {"fraction": 0.5})
        elif op == "result":
            j.result(cid, b"res", "SUCCEEDED")
        elif op == "acked":
            j.acked(cid)
        elif op == "rejoin":
            j.awaiting_rejoin(cid, {"old_boot_id": "boot"})
        else:
            j.completion(cid, b"done", "SUCCEEDED")
    j.close()
    data = bytearray(path.read_bytes())
    for where, xor in damage:
        if data:
            data[min(len(data) - 1, int(where * len(data)))] ^= xor
    path.write_bytes(bytes(data[: int(cut * len(data)) if damage else len(data)]))
    again = open_journal(path, fsync=lambda fd: None)  # never raises
    for entry in again.entries.values():
        assert isinstance(entry.state, State)
    again.accepted("after", "inventory.refresh", "dz", b"z")  # and stays writable
    again.close()
    assert "after" in open_journal(path).entries


def test_an_id_is_remembered_while_its_signature_could_be_valid(tmp_path: Path) -> None:
    """Beyond max_known the oldest acknowledged ids are forgotten, but never one whose signed
    expiry has not passed: forgetting it would let the same signed bytes run again."""
    path = tmp_path / "journal"
    now = [1_000_000]
    j = open_journal(path, compact_bytes=1024, max_known=3, fsync=lambda fd: None, clock=lambda: now[0])
    for i in range(10):
        cid = f"live-{i}"
        j.accepted(cid, "disk.wipe", f"d{i}", b"cmd", expires_ms=now[0] + 900_000)
        j.result(cid, b"r", "SUCCEEDED")
        j.acked(cid)
    assert set(j.known) == {f"live-{i}" for i in range(10)}
    assert j.compactions > 0  # they survive compaction, with their expiry
    j.close()
    j = open_journal(path, compact_bytes=1024, max_known=3, clock=lambda: now[0])
    assert len(j.known) == 10 and all(k.expires_ms == 1_900_000 for k in j.known.values())
    now[0] += 900_001  # every signature has expired: the bound applies again
    for i in range(2):
        j.accepted(f"late-{i}", "inventory.refresh", "d", b"cmd")  # unsigned, no expiry
        j.result(f"late-{i}", b"r", "SUCCEEDED")
        j.acked(f"late-{i}")
    assert list(j.known) == ["live-9", "late-0", "late-1"]
    j.close()


def test_the_state_id_is_kept_with_the_journal_and_new_with_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    first = j.state_id
    assert len(first) == 32 and int(first, 16) >= 0
    j.accepted("x", "disk.wipe", "dx", b"cmd-x")
    j.compact()
    j.close()
    again = open_journal(path)                       # reopened, compacted: the same state
    assert again.state_id == first and "x" in again.entries
    again.close()
    path.unlink()                                    # the journal lost (e.g. /run removed)
    fresh = open_journal(path)
    assert fresh.state_id and fresh.state_id != first and not fresh.entries
    fresh.accepted("y", "disk.wipe", "dy", b"cmd-y")
    fresh.close()
    # The state record corrupted: the ids are kept, but the state is not vouched for: a new id.
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    mended = open_journal(path)
    assert "y" in mended.entries and mended.state_id not in ("", fresh.state_id)
    mended.close()
    assert open_journal(path).state_id == mended.state_id


def test_on_tmpfs_a_record_is_written_without_fsync_elsewhere_fsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync on tmpfs does nothing but cost a system call (and Python's GIL again): the journal
    skips it there, as it is wherever the agent runs by default (/run), and keeps it on disk."""
    shm = Path("/dev/shm")
    if sysfs.filesystem_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    calls: list[int] = []
    monkeypatch.setattr(journal_module.os, "fsync", calls.append)
    on_disk = tmp_path / "disk"
    assert sysfs.filesystem_type(tmp_path) not in journal_module.IN_MEMORY_FILESYSTEMS
    j = journal_module.Journal(on_disk / "journal")
    j.open()
    j.accepted("c1", "inventory.refresh", "d", b"x")
    j.close()
    assert calls, "a journal on disk fsyncs its records"
    calls.clear()
    with tempfile.TemporaryDirectory(dir=shm) as d:
        j = journal_module.Journal(Path(d) / "state" / "journal")
        j.open()
        j.accepted("c1", "inventory.refresh", "d", b"x")
        j.result("c1", b"r", "SUCCEEDED")
        j.close()
        again = journal_module.Journal(Path(d) / "state" / "journal")
        again.open()
        assert again.entries["c1"].state is State.FINISHED   # written whole, read back
        again.close()
    assert calls == []


def test_a_compaction_cut_short_by_a_crash_leaves_nothing_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = open_journal(path)
    j.accepted("c1", "inventory.refresh", "d1", b"x")
    j.close()
    dead = tmp_path / ".journal.999999999.0123abcd.tmp"    # no such process: its writer is gone
    dead.write_bytes(b"half a compaction")
    assert set(open_journal(path).entries) == {"c1"}
    assert not dead.exists()
