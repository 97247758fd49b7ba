"""The site's content store on real files: verified before named, least recently used evicted
within the budget (never a pinned or protected file), reconciled at start, and a full disk
answered with StoreFull and nothing left behind."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent.errors import ChecksumMismatch
from agent.site.chunkstore import TOUCH_SECONDS, ChunkStore, StoreFull
from agent.site.metrics import Metrics


def key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files(store: ChunkStore) -> list[str]:
    return sorted(p.name for p in store.root.iterdir())


def blobs(n: int, size: int = 1000) -> list[bytes]:
    return [bytes([i]) * size for i in range(n)]


def test_put_read_and_verification(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "s", 10_000)
    store.reconcile()
    a = b"a" * 1000
    store.put(key(a), a)
    assert store.read(key(a), 1000) == a and store.size == 1000
    assert store.read(key(b"nothing"), 7) is None
    with pytest.raises(ChecksumMismatch, match="expected sha256:"):
        store.put(key(b"what the manifest says"), b"what the upstream sent")
    assert files(store) == [key(a)], "a mismatch leaves nothing, not even a temporary file"
    with pytest.raises(ValueError, match="sha256"):
        store.put("../../etc/passwd", b"x")
    assert oct((tmp_path / "s").stat().st_mode & 0o777) == "0o700"


def test_least_recently_used_evicted_first(tmp_path: Path) -> None:
    m = Metrics()
    store = ChunkStore(tmp_path / "s", 3000, metrics=m)
    store.reconcile()
    a, b, c, d = blobs(4)
    for x in (a, b, c):
        store.put(key(x), x)
    assert store.read(key(a), 1000) == a      # a is now the most recently used
    store.put(key(d), d)                      # b goes
    assert files(store) == sorted(key(x) for x in (a, c, d))
    assert store.size == 3000 and m.value("store_evictions_total") == 1


def test_pinned_and_protected_files_are_not_evicted(tmp_path: Path) -> None:
    kept: set[str] = set()
    store = ChunkStore(tmp_path / "s", 2000, protected=lambda: set(kept))
    store.reconcile()
    a, b, c = blobs(3)
    store.put(key(a), a)
    store.put(key(b), b)
    kept.add(key(a))
    with store.open(key(b)) as f:
        assert f is not None
        with pytest.raises(StoreFull, match="taken by files in use"):
            store.put(key(c), c)
        assert f.read() == b
    assert files(store) == sorted([key(a), key(b)])
    store.put(key(c), c)                      # b is no longer read: it goes
    assert files(store) == sorted([key(a), key(c)])


def test_a_hit_sets_the_recency_on_disk_once_a_minute(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = ChunkStore(root, 10_000)
    store.reconcile()
    old, recent = blobs(2)
    store.put(key(old), old)
    store.put(key(recent), recent)
    long_ago, a_moment_ago = time.time() - TOUCH_SECONDS - 5, time.time() - 5
    os.utime(root / key(old), (long_ago, long_ago))
    os.utime(root / key(recent), (a_moment_ago, a_moment_ago))
    assert store.read(key(old), len(old)) == old
    assert store.read(key(recent), len(recent)) == recent
    assert (root / key(old)).stat().st_mtime > a_moment_ago, "an old recency is refreshed"
    assert (root / key(recent)).stat().st_mtime == a_moment_ago, "a recent one is left as it is"


def test_reconcile_removes_temporaries_and_recounts(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = ChunkStore(root, 10_000)
    store.reconcile()
    a, b, c = blobs(3)
    for i, x in enumerate((a, b, c)):
        store.put(key(x), x)
        os.utime(root / key(x), (time.time() - 100 + i, time.time() - 100 + i))
    (root / f".{key(b'd')}.abcd.tmp").write_bytes(b"partial")   # a crash while writing
    (root / "not-a-digest").write_bytes(b"stray")
    (root / "adir").mkdir()
    again = ChunkStore(root, 2000)                               # a smaller budget now
    assert again.reconcile() == (2, 2)
    assert files(again) == sorted(["adir", key(b), key(c)]), "the oldest (a) evicted"
    assert again.size == 2000


@pytest.mark.root
def test_a_full_disk_is_store_full_and_leaves_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        store = ChunkStore(mnt / "s", 1 << 30)
        store.reconcile()
        big = os.urandom(1 << 20)
        with pytest.raises(StoreFull, match="disk is full"):
            store.put(key(big), big)
        assert files(store) == [] and store.size == 0
        small = b"s" * 1000
        store.put(key(small), small)
        assert store.read(key(small), 1000) == small
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
