"""The site's on-disk table with a time to live (agent/site/ttltable.py): the crash and restart
cases, on a record of its own and on each of its three uses (boot entries, routes, media sets)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.proto import site_pb2
from agent.site.boot.pxe import BootEntries, EntryRequest
from agent.site.boot.vmedia import MediaSet, MediaSets
from agent.site.serve.routes import RouteRequest, RouteTable
from agent.site.serve.upstreams import UpstreamPolicy
from agent.site.ttltable import MacRecord, TtlTable


@dataclass(frozen=True)
class Lease:
    key: str
    expires_at: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Lease:
        data = json.loads(text)
        if not isinstance(data.get("key"), str) or not data["key"].isalnum():
            raise ValueError("no key")
        return cls(data["key"], float(data["expires_at"]))


def table(folder: Path) -> TtlTable[Lease]:
    return TtlTable(folder, "lease", name=lambda r: r.key, parse=Lease.from_json, dump=Lease.to_json)


def test_a_saved_record_is_loaded_back(tmp_path: Path) -> None:
    t = table(tmp_path / "leases")
    t.load()
    t.save(Lease("a", time.time() + 60))
    assert oct((tmp_path / "leases").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "leases" / "a.json").stat().st_mode & 0o777) == "0o600"
    loaded = table(tmp_path / "leases").load()
    assert [r.key for r in loaded.live] == ["a"] and loaded.dropped == []


def test_a_half_written_temporary_file_is_removed_and_the_record_kept(tmp_path: Path) -> None:
    t = table(tmp_path)
    t.load()
    t.save(Lease("a", time.time() + 60))
    # A crash in the middle of the next write of "a": its temporary file, half of it.
    (tmp_path / ".a.json.4242.0badf00d.tmp").write_text('{"key": "a", "expi')
    loaded = table(tmp_path).load()
    assert [r.key for r in loaded.live] == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_record_past_its_ttl_at_start_is_dropped(tmp_path: Path) -> None:
    t = table(tmp_path)
    t.load()
    t.save(Lease("old", time.time() - 1))
    t.save(Lease("new", time.time() + 60))
    loaded = table(tmp_path).load()
    assert [r.key for r in loaded.live] == ["new"]
    assert [r.key for r in loaded.dropped] == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json"]


def test_an_unparseable_record_is_removed(tmp_path: Path) -> None:
    tmp_path.joinpath("bad.json").write_text("{not json")
    tmp_path.joinpath("nokey.json").write_text('{"expires_at": 1e12}')
    table(tmp_path).save(Lease("a", time.time() + 60))
    loaded = table(tmp_path).load()
    assert [r.key for r in loaded.live] == ["a"] and loaded.dropped == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_record_in_a_file_not_named_after_it_is_dropped(tmp_path: Path) -> None:
    tmp_path.joinpath("b.json").write_text(Lease("a", time.time() + 60).to_json())
    loaded = table(tmp_path).load()
    assert loaded.live == [] and [r.key for r in loaded.dropped] == ["a"]
    assert list(tmp_path.iterdir()) == []


def test_check_refuses_or_fails(tmp_path: Path) -> None:
    t = table(tmp_path)
    for key in ("keep", "refuse", "fail"):
        t.save(Lease(key, time.time() + 60))

    def check(r: Lease) -> bool:
        if r.key == "fail":
            raise OSError("its companion file is gone")
        return r.key != "refuse"

    loaded = t.load(check=check)
    assert [r.key for r in loaded.live] == ["keep"]
    assert [r.key for r in loaded.dropped] == ["refuse"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]


def test_due_and_remove(tmp_path: Path) -> None:
    t = table(tmp_path)
    now = time.time()
    leases = [Lease("a", now - 1), Lease("b", now + 60), Lease("c", now)]
    for lease in leases:
        t.save(lease)
    assert [r.key for r in t.due(leases, now)] == ["a", "c"]
    t.remove(leases[0])
    t.remove(leases[0])  # gone already: no error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "c.json"]


@dataclass(frozen=True)
class Tag(MacRecord):
    mac: str
    note: str
    expires_at: float

    @classmethod
    def from_json(cls, text: str) -> Tag:
        return cls(**json.loads(text))


def test_a_record_kept_under_its_mac_is_named_by_it_and_saved_as_its_fields(tmp_path: Path) -> None:
    now = time.time()
    tag = Tag("52:54:00:12:34:56", "rack 3", now + 60)
    assert tag.mac_hex == "525400123456"
    assert json.loads(tag.to_json()) == {"mac": "52:54:00:12:34:56", "note": "rack 3",
                                          "expires_at": now + 60}
    assert list(json.loads(tag.to_json())) == ["expires_at", "mac", "note"]   # the same text each time
    assert not tag.expired(now + 59.9) and tag.expired(now + 60) and tag.expired(now + 61)
    t: TtlTable[Tag] = TtlTable(tmp_path, "tag", name=lambda r: r.mac_hex, parse=Tag.from_json,
                                dump=Tag.to_json)
    t.save(tag)
    assert [p.name for p in tmp_path.iterdir()] == ["525400123456.json"]
    assert t.load(now).live == [tag]
    assert t.load(now + 60).dropped == [tag] and not list(tmp_path.iterdir())


# -- its three uses ------------------------------------------------------------------------

class Use:
    """One use of the table: a fresh one over ``root``; a record saved that expires at a time
    (returns its key); the keys of the live records."""

    def __init__(self, make: Callable[[Path], Any], save: Callable[[Any, float, int], str],
                 keys: Callable[[Any], list[str]]) -> None:
        self.make, self.save, self.keys = make, save, keys


def _entry(store: BootEntries, expires: float, i: int) -> str:
    mac = f"52:54:00:00:00:0{i}"
    entry = store.register(EntryRequest.from_proto(site_pb2.ProxyDhcpEntry(
        node_id="n1", mac_address=mac, boot_file="undionly.kpxe",
        ipxe_script_url="http://10.0.0.1/ramdisk.ipxe", ttl_seconds=60)))
    store.table.save(dataclasses.replace(entry, expires_at=expires))
    return mac


def _route(routes: RouteTable, expires: float, i: int) -> str:
    route, _ = routes.add(RouteRequest(f"n{i}", "http://127.0.0.1:1/image.raw",
                                       frozenset({"GET"}), 60, 0))  # type: ignore[arg-type]
    route.expires_at = expires
    routes.table.save(route)
    return route.node_id


def _media(sets: MediaSets, expires: float, i: int) -> str:
    media = MediaSet("n1", f"52:54:00:00:00:0{i}", "http://10.0.0.1/ramdisk.iso", "ab" * 32,
                     f"token{i}", expires)
    (sets.config_dir / f"{media.mac_hex}.iso").write_bytes(b"medium")
    sets.table.save(media)
    return media.mac


USES = {
    "boot entries": Use(lambda root: BootEntries(root, "http://10.0.0.2:8088"), _entry,
                        lambda s: [e.mac for e in s.all()]),
    "routes": Use(lambda root: RouteTable(root, "http://s", UpstreamPolicy.parse(["127.0.0.1"])), _route,
                  lambda t: sorted(r.node_id for r in t.all())),
    "media sets": Use(lambda root: MediaSets(root, "http://10.0.0.2:8088"), _media,
                      lambda s: [m.mac for m in s.all()]),
}


@pytest.mark.parametrize("name", sorted(USES))
def test_each_use_reconciles_a_crash_at_restart(tmp_path: Path, name: str) -> None:
    use = USES[name]
    first = use.make(tmp_path)
    first.reconcile()
    live = use.save(first, time.time() + 600, 1)
    use.save(first, time.time() - 1, 2)        # past its time to live when the daemon starts
    folder = first.table.folder
    (folder / "junk.json").write_text("{not json")                       # unparseable
    (folder / ".x.json.4242.0badf00d.tmp").write_text('{"half": ')      # a write cut short
    again = use.make(tmp_path)
    again.reconcile()
    assert use.keys(again) == [live]
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".json", ".tmp"))
    assert names == [again.table.path(r).name for r in again.table.load().live]
    assert len(names) == 1
