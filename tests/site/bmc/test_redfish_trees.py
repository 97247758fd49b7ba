"""Every recorded tree (../shared/vendor-trees) through the bmc.* handlers, as an operator would
drive it, counted: bmc.query (inventory, events), bmc.firmware status and bmc.storage list on
every tree; power (on, reset, off), boot (once, persistent, UEFI and Legacy) and virtual media
(the site's media prepared by boot.prepareRamdisk over the transport the BMC mounts, inserted as
answered, ejected) on each tree that offers them. docs/site.md records the count."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import Config
from agent.gateway.certs import DevPki, make_dev_pki
from agent.proto import site_pb2
from agent.site.services import SiteServices
from tests.loopback_http import LoopbackServer
from tests.site.bmc.redfish_emulator import RedfishEmulator, tree_names
from tests.site.bmc.redfish_emulator.handlers import run_kind
from tests.site.boot.test_media_https import prepare_for, settings

Doc = dict[str, object]
TREES = tree_names()


def offered(bmc: RedfishEmulator, tree: str) -> list[tuple[str, str, dict[str, str]]]:
    """What the tree offers an operator, read from the recording as a person reading it would."""
    docs = bmc.state.docs
    systems = [str(m["@odata.id"]) for m in docs["/redfish/v1/Systems"]["Members"]]
    system = docs[systems[0].rstrip("/")]
    ops: list[tuple[str, str, dict[str, str]]] = [
        ("bmc.query", "query", {}), ("bmc.query", "events", {}), ("bmc.firmware", "status", {}),
        ("bmc.storage", "list", {})]
    if isinstance(system.get("Actions"), dict) and "#ComputerSystem.Reset" in system["Actions"]:
        ops += [("bmc.power", "on", {}), ("bmc.power", "reset", {}),
                ("bmc.power", "off", {"graceful_timeout_seconds": "0"})]
    boot = system.get("Boot")
    boot = boot if isinstance(boot, dict) else {}
    targets = boot.get("BootSourceOverrideTarget@Redfish.AllowableValues")
    enabled = boot.get("BootSourceOverrideEnabled@Redfish.AllowableValues")
    modes = boot.get("BootSourceOverrideMode@Redfish.AllowableValues")
    if "BootSourceOverrideTarget" in boot:
        if not isinstance(targets, list) or "Pxe" in targets:
            ops.append(("bmc.boot", "set_boot_device", {"device": "pxe"}))
        if (not isinstance(enabled, list) or "Continuous" in enabled) and \
                (not isinstance(targets, list) or "Hdd" in targets):
            ops.append(("bmc.boot", "set_boot_device", {"device": "disk", "persistent": "true"}))
        if "BootSourceOverrideMode" in boot or isinstance(modes, list):
            ops.append(("bmc.boot", "set_boot_device", {"device": "pxe", "mode": "uefi"}))
        if isinstance(modes, list) and "Legacy" in modes:
            ops.append(("bmc.boot", "set_boot_device", {"device": "pxe", "mode": "legacy"}))
    slots = [d for p, d in docs.items() if "/VirtualMedia/" in p and "CD" in (d.get("MediaTypes") or [])]
    if slots:     # the site's media prepared for this BMC, inserted as answered (PREPARED)
        ops += [("boot.prepareRamdisk", "virtual_media", {}),
                ("bmc.storage", "insert_media", {"image_url": PREPARED}),
                ("bmc.storage", "eject_media", {})]
    return ops


PREPARED = "<the ramdisk URL boot.prepareRamdisk answered>"


CHECKS: dict[str, Callable[[site_pb2.BmcOperationResult, dict[str, str]], bool]] = {
    "query": lambda r, p: bool(r.power_state) and bool(r.firmware_inventory),
    "events": lambda r, p: r.state.endswith("entries"),
    "status": lambda r, p: bool(r.firmware_inventory),
    "list": lambda r, p: bool(r.storage) or bool(r.virtual_media),
    "on": lambda r, p: r.power_state == "on",
    "reset": lambda r, p: r.power_state == "on",
    "off": lambda r, p: r.power_state == "off",
    "set_boot_device": lambda r, p: r.boot.device == p["device"] and "mode" not in r.not_kept,
    "insert_media": lambda r, p: any(m.inserted for m in r.virtual_media),
    "eject_media": lambda r, p: r.state == "done",
}


@pytest.mark.slow
def test_every_recorded_tree_answers_every_operation_it_offers(tmp_path: Path,
                                                               emulator_config: Config) -> None:
    """The site runs with its TLS listener (a CA made here): each BMC with a CD slot is handed
    media URLs over the transport it mounts, and an https one is fetched by the emulator,
    verified with that CA, as it is mounted."""
    config = emulator_config
    pki = make_dev_pki(tmp_path / "pki", hosts=("127.0.0.1",))
    done: dict[str, int] = {}
    failed: list[str] = []
    with SiteServices(settings(tmp_path, pki)) as site, LoopbackServer() as upstream:
        for tree in TREES:
            with RedfishEmulator.of(tree, tmp_path / "trees") as bmc:
                bmc.state.media_ca = pki.ca
                drive(tree, bmc, config, site, pki, upstream, tmp_path, done, failed)
    print(f"\nrecorded trees: {sum(done.values())} operations succeeded, {len(failed)} failed: {done}")
    assert not failed, failed
    assert len(done) == len(TREES) == 9
    assert sum(done.values()) == EXPECTED


def drive(tree: str, bmc: RedfishEmulator, config: Config, site: SiteServices, pki: DevPki,
          upstream: LoopbackServer, tmp_path: Path, done: dict[str, int], failed: list[str]) -> None:
    """Every operation ``tree`` offers, in order, counted in ``done`` or named in ``failed``."""
    prepared = ""
    for kind, operation, params in offered(bmc, tree):
        params = {k: prepared if v == PREPARED else v for k, v in params.items()}
        try:
            if kind == "boot.prepareRamdisk":
                media = prepare_for(site, bmc, pki.ca.read_text(), tmp_path, upstream)
                prepared, said = media.ramdisk_media_url, f"{media.media_scheme} {media.ramdisk_media_url}"
                ok = media.media_scheme in ("http", "https") and prepared.startswith(f"{media.media_scheme}://")
            else:
                result = run_kind(kind, config, bmc, operation, **params)
                ok, said = CHECKS[operation](result, params), result.state
        except Exception as exc:     # counted, named below
            ok, said = False, f"{type(exc).__name__}: {exc}"
        if ok:
            done[tree] = done.get(tree, 0) + 1
        else:
            failed.append(f"{tree} {kind} {operation} {params}: {said}")
    assert not bmc.state.sessions, f"{tree}: sessions left open"


# What the nine recordings offer, as ``offered`` reads them: 4 reads on each (36), power on
# 9 trees (27), boot on 9 (24: once everywhere, persistent on 7, UEFI on 7, Legacy on 1), virtual
# media on 7 (21: the site's media prepared for the BMC, inserted, ejected; BlueField-3 has
# none, DGX H100 an empty collection). A change here is a tree or a reading of it changing:
# docs/site.md ("Vendors") quotes it.
EXPECTED = 108
