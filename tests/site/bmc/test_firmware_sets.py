"""Firmware sets (agent/site/bmc/redfish/fwsets.py), their plan and apply (fwapply.py) and the
release gate's comparison (agent/site/bmc/fwrelease.py), on the eight recorded trees served by
the project's emulator: each BMC's own inventory read, a set made from it, the differing steps
put in order, and carried out through the way each BMC offers (multipart, HttpPushUri,
SimpleUpdate) with the images from a real content store; the failure answers (a task that ends
in Exception, a version not reached, a push whose answer is lost) stop the rest, and no push is
ever sent twice."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import InvalidParameters
from agent.proto import site_pb2
from agent.site.bmc.client import CallContext, Pacing, PowerAction
from agent.site.bmc.redfish import firmware, fwapply, fwsets
from agent.site.bmc.redfish.client import RedfishClient
from agent.site.chunkstore import ChunkStore
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.test_bmc_redfish import REF, config_with

TREES = ("dell_r750", "hpe_dl385", "lenovo_sr670", "supermicro_sys821", "nvidia_dgxh100",
         "nvidia_gh200", "nvidia_gb200", "nvidia_bluefield3")


def quick(seconds: float) -> CallContext:
    return CallContext(threading.Event(), time.monotonic() + seconds, Pacing(0.05, 0.1, 1.5))


def two_components(inventory: list[site_pb2.BmcFirmwareComponent]) -> list[site_pb2.BmcFirmwareComponent]:
    """Two components of distinct Ids, each alone under its Id."""
    ids = [c.id for c in inventory]
    once = [c for c in inventory if c.id and ids.count(c.id) == 1 and c.uri]
    assert len(once) >= 2
    return once[:2]


def entry(c: site_pb2.BmcFirmwareComponent, version: str, digest: str, order: int,
          **more: Any) -> dict[str, Any]:
    return {"match": {"id": c.id}, "version": version, "image": {"sha256": digest}, "order": order, **more}


def own_set(inventory: list[site_pb2.BmcFirmwareComponent]) -> dict[str, Any]:
    """Every component by its Id at the version it runs."""
    seen: dict[str, str] = {}
    for c in inventory:
        if c.id and c.version:
            seen.setdefault(c.id, c.version)
    return {"profiles": {"node": [entry_by_id(i, v) for i, v in seen.items()]}}


def entry_by_id(cid: str, version: str) -> dict[str, Any]:
    return {"match": {"id": cid}, "version": version, "image": {"sha256": "0" * 64}}


# -- the file ---------------------------------------------------------------------------------

GOOD = {"match": {"id": "BMC"}, "version": "1.2", "image": {"sha256": "a" * 64}}


@pytest.mark.parametrize(("doc", "words"), [
    ([], 'one key, "profiles"'),
    ({"profiles": {}}, "1 to 256 profiles"),
    ({"profiles": {"bad name": [GOOD]}}, "profile 'bad name'"),
    ({"profiles": {"p": []}}, "profiles.p: a list of 1 to"),
    ({"profiles": {"p": [{**GOOD, "colour": 1}]}}, "profiles.p[0]: unknown field 'colour'"),
    ({"profiles": {"p": [{k: v for k, v in GOOD.items() if k != "version"}]}},
     "profiles.p[0]: version is required"),
    ({"profiles": {"p": [{**GOOD, "match": {}}]}}, "profiles.p[0].match: an object of"),
    ({"profiles": {"p": [{**GOOD, "match": {"id": "A", "name": "B"}}]}}, "id names one component"),
    ({"profiles": {"p": [{**GOOD, "image": {"sha256": "xyz"}}]}}, "profiles.p[0].image.sha256: 64"),
    ({"profiles": {"p": [{**GOOD, "image": {"sha256": "a" * 64, "url": "ftp://x"}}]}}, "image.url: an http"),
    ({"profiles": {"p": [{**GOOD, "method": "fax"}]}}, "profiles.p[0].method: one of simple_update"),
    ({"profiles": {"p": [{**GOOD, "apply_time": "Later"}]}}, "apply_time: one of Immediate, OnReset"),
    ({"profiles": {"p": [{**GOOD, "after": "prayer"}]}}, "after: one of none, reboot, ac_cycle"),
    ({"profiles": {"p": [{**GOOD, "order": -1}]}}, "order: a whole number"),
    ({"profiles": {"p": [{**GOOD, "settle_seconds": "soon"}]}}, "settle_seconds: a number"),
    ({"profiles": {"p": [{**GOOD, "method": "simple_update"}]}}, "image.url is required"),
    ({"profiles": {"p": [GOOD, GOOD]}}, "component id BMC named by two entries"),
])
def test_every_bad_field_is_named(doc: Any, words: str, tmp_path: Path) -> None:
    path = tmp_path / "sets.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidParameters, match=None) as caught:
        fwsets.load(path)
    assert words in caught.value.message and str(path) in caught.value.message


def test_a_good_file_loads_with_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "sets.json"
    path.write_text(json.dumps({"profiles": {"gb200": [
        GOOD, {"match": {"software_id": "0x0010", "manufacturer": "NVIDIA"}, "version": "2",
               "image": {"sha256": "b" * 64, "url": "https://up/fw.tar"}, "method": "multipart",
               "order": 30, "after": "ac_cycle", "settle_seconds": 120}]}}))
    loaded = fwsets.load(path)["gb200"]
    first, second = loaded.entries
    assert (first.method, first.order, first.after, first.apply_time) == (None, 100, fwsets.After.NONE,
                                                                         fwsets.ApplyTime.IMMEDIATE)
    assert second.match == fwsets.Match(software_id="0x0010", manufacturer="NVIDIA")
    assert (second.after, second.settle_seconds, second.image.url) == (fwsets.After.AC_CYCLE, 120.0,
                                                                       "https://up/fw.tar")
    with pytest.raises(InvalidParameters, match="not JSON"):
        (tmp_path / "bad.json").write_text("{")
        fwsets.load(tmp_path / "bad.json")


# -- plan, on each recorded tree ----------------------------------------------------------------


@pytest.mark.parametrize("tree", TREES)
def test_plan_on_each_recorded_tree(trees: Path, tree: str) -> None:
    with RedfishEmulator.of(tree, trees) as bmc:
        client = RedfishClient(bmc.target(), quick(30))
        try:
            inventory = firmware.inventory(client)
        finally:
            client.close()
    assert inventory and all(c.uri for c in inventory)
    same = fwsets.parse(own_set(inventory))["node"]
    at_set = fwsets.plan(same, inventory)
    assert not at_set.steps and not at_set.missing and len(at_set.matched) == len(inventory)
    a, b = two_components(inventory)
    changed = fwsets.parse({"profiles": {"node": [
        entry(a, "9.9.1", "1" * 64, 20), entry(b, "9.9.2", "2" * 64, 10, after="reboot", settle_seconds=5),
        entry_by_id("NO_SUCH_COMPONENT", "1")]}})["node"]
    planned = fwsets.plan(changed, inventory)
    assert [s.entry.version for s in planned.steps] == ["9.9.2", "9.9.1"]        # order, not the file's
    assert [[c.id for c in s.components] for s in planned.steps] == [[b.id], [a.id]]
    assert [e.match.id for e in planned.missing] == ["NO_SUCH_COMPONENT"]
    msg = fwsets.step_message(planned.steps[0], "multipart")
    assert (msg.after, msg.settle_seconds, msg.found, msg.expected, msg.method) == (
        "reboot", 5.0, [b.version], "9.9.2", "multipart")


def test_a_rule_matches_every_component_of_its_software_id(trees: Path) -> None:
    """GB200 lists components by SoftwareId and Manufacturer: one rule, one image, all of them."""
    with RedfishEmulator.of("nvidia_gb200", trees) as bmc:
        client = RedfishClient(bmc.target(), quick(30))
        try:
            inventory = firmware.inventory(client)
        finally:
            client.close()
    group = [c for c in inventory if (c.software_id, c.manufacturer) == ("0x0010", "NVIDIA")]
    assert len(group) > 1
    rule = fwsets.parse({"profiles": {"gb200": [
        {"match": {"software_id": "0x0010", "manufacturer": "NVIDIA"}, "version": "new",
         "image": {"sha256": "3" * 64}}]}})["gb200"]
    (step,) = fwsets.plan(rule, inventory).steps
    assert sorted(c.id for c in step.components) == sorted(c.id for c in group)


# -- apply, through the way each BMC offers -----------------------------------------------------


def stored(store: ChunkStore, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    store.put(digest, data)
    return digest


def power_never(after: fwsets.After) -> None:
    raise AssertionError(f"no step asked for {after}")


class Bench:
    """One recorded BMC, its two components, two images in a real content store."""

    def __init__(self, bmc: RedfishEmulator, tmp: Path) -> None:
        self.bmc = bmc
        self.client = RedfishClient(bmc.target(), quick(60))
        self.inventory = firmware.inventory(self.client)
        self.a, self.b = two_components(self.inventory)
        self.store = ChunkStore(tmp / "store", 1 << 30)
        self.store.reconcile()
        self.image_a = stored(self.store, b"image A " * 999)
        self.image_b = stored(self.store, b"image B " * 999)
        bmc.state.images[self.image_a] = [(self.a.uri.rstrip("/"), "9.9.1")]
        bmc.state.images[self.image_b] = [(self.b.uri.rstrip("/"), "9.9.2")]

    def set(self, **a_more: Any) -> fwsets.FirmwareSet:
        return fwsets.parse({"profiles": {"p": [entry(self.a, "9.9.1", self.image_a, 10, **a_more),
                                               entry(self.b, "9.9.2", self.image_b, 20)]}})["p"]

    def apply(self, fwset: fwsets.FirmwareSet) -> list[site_pb2.BmcFirmwareStep]:
        planned = fwsets.plan(fwset, firmware.inventory(self.client))
        return fwapply.apply(self.client, planned, fwapply.Images(self.store), power=power_never,
                             settle=lambda s: None)


def push_path(bmc: RedfishEmulator) -> str:
    service = bmc.doc("/redfish/v1/UpdateService")
    return str(service.get("MultipartHttpPushUri") or service.get("HttpPushUri")).rstrip("/")


@pytest.mark.parametrize("tree", TREES)
def test_apply_on_each_recorded_tree(trees: Path, tree: str, tmp_path: Path) -> None:
    with RedfishEmulator.of(tree, trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        try:
            done = bench.apply(bench.set())
            after = fwsets.plan(bench.set(), firmware.inventory(bench.client))
        finally:
            bench.client.close()
        assert [s.state for s in done] == ["done", "done"]
        assert not after.steps                                    # the inventory now matches
        assert len(bmc.writes("POST", push_path(bmc))) == 2       # one push per step
        if bmc.doc("/redfish/v1/UpdateService").get("MultipartHttpPushUri"):
            assert [p["Targets"] for p in bmc.state.pushed] == [[bench.a.uri], [bench.b.uri]]
            assert done[0].method == "multipart"
        else:
            assert done[0].method == "http_push"


def test_simple_update_hands_the_url_to_the_bmc(trees: Path, tmp_path: Path) -> None:
    url = "https://127.0.0.1:9/bios.exe"
    with RedfishEmulator.of("dell_r750", trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        bmc.state.images[url] = [(bench.a.uri.rstrip("/"), "9.9.1")]
        fwset = fwsets.parse({"profiles": {"p": [
            {"match": {"id": bench.a.id}, "version": "9.9.1", "method": "simple_update",
             "image": {"sha256": "4" * 64, "url": url}}]}})["p"]
        try:
            (step,) = bench.apply(fwset)
        finally:
            bench.client.close()
        assert (step.state, step.method) == ("done", "simple_update")
        assert [b for _, _, b in bmc.writes("POST", "SimpleUpdate")] == [
            {"ImageURI": url, "TransferProtocol": "HTTPS"}]
        assert not bmc.writes("POST", push_path(bmc))


@pytest.mark.parametrize("tree", ["nvidia_gb200", "hpe_dl385"])
def test_a_task_that_fails_stops_the_rest(trees: Path, tree: str, tmp_path: Path) -> None:
    with RedfishEmulator.of(tree, trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        bmc.state.failing[bench.image_a] = "image signature verification failed"
        try:
            stopped = r"step 1 of 2.*signature verification failed"
            with pytest.raises(fwapply.ApplyStopped, match=stopped) as e:
                bench.apply(bench.set())
            now = {c.id: c.version for c in firmware.inventory(bench.client)}
        finally:
            bench.client.close()
        assert "not_started" in e.value.details["steps"] and "failed" in e.value.details["steps"]
        assert len(bmc.writes("POST", push_path(bmc))) == 1        # B never pushed
        assert now[bench.a.id] == bench.a.version and now[bench.b.id] == bench.b.version


def test_a_version_not_reached_is_named_and_the_rest_stopped(trees: Path, tmp_path: Path) -> None:
    with RedfishEmulator.of("nvidia_dgxh100", trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        bmc.state.images[bench.image_a] = [(bench.a.uri.rstrip("/"), "9.9.0")]    # an older image
        try:
            words = re.escape(f"not reached: {bench.a.id} reports 9.9.0")
            with pytest.raises(fwapply.ApplyStopped, match=words):
                bench.apply(bench.set())
        finally:
            bench.client.close()
        assert len(bmc.writes("POST", push_path(bmc))) == 1


@pytest.mark.parametrize("tree", ["nvidia_gb200", "hpe_dl385"])
def test_a_push_whose_answer_is_lost_is_never_sent_again(trees: Path, tree: str, tmp_path: Path) -> None:
    with RedfishEmulator.of(tree, trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        bmc.state.cut.add(push_path(bmc))
        try:
            with pytest.raises(fwapply.ApplyStopped, match="step 1 of 2"):
                bench.apply(bench.set())
        finally:
            bench.client.close()
        assert len(bmc.writes("POST", push_path(bmc))) == 1


def test_an_image_neither_held_nor_fetchable_is_named_before_anything_is_sent(trees: Path,
                                                                               tmp_path: Path) -> None:
    with RedfishEmulator.of("nvidia_gb200", trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        bench.store.remove(bench.image_a)
        try:
            with pytest.raises(fwapply.ApplyStopped, match="not in the site's content store"):
                bench.apply(bench.set())
        finally:
            bench.client.close()
        assert not bmc.writes("POST", push_path(bmc))


# -- through the handlers: bmc.firmware plan, the release gate (bmc.query baseline) -------------


def run_kind(config: Config, kind: str, operation: str, address: str, *,
             expect: dict[str, Any] | None = None, **parameters: str) -> site_pb2.BmcOperationResult:
    payload = site_pb2.BmcOperationRequest(
        node_id="n01", bmc_address=address, protocol="redfish", operation=operation,
        credentials_ref=REF, verify_tls=False, parameters=parameters)
    if expect is not None:
        json_format.ParseDict(expect, payload.expect)
    handler = handler_for(kind)
    assert handler is not None
    result = handler.run(Context.local(kind, config, timeout=120), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


def test_plan_and_the_release_gate_through_the_handlers(trees: Path, tmp_path: Path) -> None:
    with RedfishEmulator.of("nvidia_gb200", trees) as bmc:
        client = RedfishClient(bmc.target(), quick(30))
        try:
            inventory = firmware.inventory(client)
        finally:
            client.close()
        a, b = two_components(inventory)
        sets = tmp_path / "firmware-sets.json"
        sets.write_text(json.dumps({"profiles": {
            "gb200": [entry(a, a.version, "1" * 64, 10), entry(b, "9.9.2", "2" * 64, 20, after="ac_cycle"),
                      entry_by_id("NO_SUCH_TRAY", "1")],
            "clean": [entry(a, a.version, "1" * 64, 10)]}}))
        config = dataclasses.replace(config_with(tmp_path, bmc.user, bmc.password), site_firmware_sets=sets)

        plan = run_kind(config, "bmc.firmware", "plan", bmc.address, profile="gb200")
        assert plan.state == "1 step(s)" and plan.values["missing"] == "id=NO_SUCH_TRAY"
        (step,) = plan.firmware_plan
        assert (list(step.component_ids), step.expected, step.after, step.method, step.state) == (
            [b.id], "9.9.2", "ac_cycle", "multipart", "planned")
        assert not bmc.writes("POST", push_path(bmc))               # a plan sends nothing

        gate = run_kind(config, "bmc.query", "baseline", bmc.address,
                        expect={"firmware": {"profile": "gb200"}})
        report = gate.release
        assert not report.pool_ready and list(report.checked) == ["firmware"]
        assert [(v.component_id, v.version, v.expected, v.ok) for v in report.firmware] == [
            *sorted([(a.id, a.version, a.version, True), (b.id, b.version, "9.9.2", False)],
                    key=lambda v: [c.id for c in inventory].index(str(v[0]))),
            ("", "", "1", False)]
        (behind,) = report.restorable
        assert (behind.check, behind.where, behind.bmc_remedy.kind, behind.bmc_remedy.operation,
                dict(behind.bmc_remedy.parameters)) == ("firmware.version", b.id, "bmc.firmware", "apply",
                                                        {"profile": "gb200"})
        assert [m.check for m in report.cannot_restore] == ["firmware.missing"]

        clean = run_kind(config, "bmc.query", "baseline", bmc.address,
                         expect={"firmware": {"profile": "clean"}})
        assert clean.release.pool_ready and clean.state == "pool_ready"

        with pytest.raises(InvalidParameters, match="no profile 'dgx'"):
            run_kind(config, "bmc.query", "baseline", bmc.address, expect={"firmware": {"profile": "dgx"}})
        bare = config_with(tmp_path / "bare", bmc.user, bmc.password)
        with pytest.raises(InvalidParameters, match="set site_firmware_sets"):
            run_kind(bare, "bmc.firmware", "plan", bmc.address, profile="gb200")


def test_a_step_that_needs_a_reboot_gets_it_and_its_settle_wait_before_the_read_back(
        trees: Path, tmp_path: Path) -> None:
    """Dell: the first step needs a host reboot and 5 s to settle; the reboot is sent through
    ComputerSystem.Reset, the wait asked for, both before the step's versions are read back."""
    with RedfishEmulator.of("dell_r750", trees, task_polls=1) as bmc:
        bench = Bench(bmc, tmp_path)
        events: list[str] = []

        def power(after: fwsets.After) -> None:
            events.append(f"power {after}")
            bench.client.set_power(PowerAction.RESET, graceful_timeout=0.0)

        fwset = bench.set(after="reboot", settle_seconds=5)
        planned = fwsets.plan(fwset, firmware.inventory(bench.client))
        try:
            done = fwapply.apply(bench.client, planned, fwapply.Images(bench.store), power=power,
                                 settle=lambda s: events.append(f"settle {s:g}"))
        finally:
            bench.client.close()
        assert [s.state for s in done] == ["done", "done"]
        assert events == ["power reboot", "settle 5"]
        assert len(bmc.writes("POST", "ComputerSystem.Reset")) == 1


def test_an_id_pattern_leaves_dells_previous_image_out(trees: Path) -> None:
    """Dell lists its BIOS three times (Current-159-1.8.2..., Installed-159-1.8.2..., and
    Previous-159-1.2.4..., the image before): a SoftwareId rule matches the previous one too and
    would never be at the set; an id_pattern matches the running ones alone."""
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        client = RedfishClient(bmc.target(), quick(30))
        try:
            inventory = firmware.inventory(client)
        finally:
            client.close()
    image = {"sha256": "5" * 64}
    by_software_id = fwsets.parse({"profiles": {"r750": [
        {"match": {"software_id": "159"}, "version": "1.8.2", "image": image}]}})["r750"]
    (step,) = fwsets.plan(by_software_id, inventory).steps
    assert [c.id for c in step.components] == ["Previous-159-1.2.4__BIOS.Setup.1-1"]
    running = fwsets.parse({"profiles": {"r750": [
        {"match": {"id_pattern": "(Current|Installed)-159-.*"}, "version": "1.8.2",
         "image": image}]}})["r750"]
    planned = fwsets.plan(running, inventory)
    assert not planned.steps and len(planned.matched) == 2
    with pytest.raises(InvalidParameters, match=r"match\.id_pattern: not a regular expression"):
        fwsets.parse({"profiles": {"r750": [{"match": {"id_pattern": "(("}, "version": "1",
                                             "image": image}]}})
