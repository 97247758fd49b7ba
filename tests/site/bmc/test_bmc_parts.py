"""Inventory for break-fix (issue 54, item 6): bmc.query over Redfish reports every part the BMC
lists with its serial number (agent/site/bmc/redfish/hardware.py) and every FirmwareInventory
component's version, on each recorded tree through the project's emulator, checked against the
recording itself: every Chassis, NetworkAdapter, ComputerSystem, Processor and Drive recorded
with a serial number is reported with it, every firmware component with its version."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc.partstable import PartsTable
from agent.site.bmc.redfish import hardware
from agent.site.services import ServiceSettings, SiteServices
from tests.site.bmc.redfish_emulator import RedfishEmulator, tree_names
from tests.site.bmc.redfish_emulator.handlers import run_kind
from tests.site.bmc.test_bmc_redfish import REF

PART_TYPES = ("#Chassis.", "#Processor.", "#Drive.", "#NetworkAdapter.", "#ComputerSystem.")
FIRMWARE = "/redfish/v1/UpdateService/FirmwareInventory"


def recorded_serials(bmc: RedfishEmulator) -> set[str]:
    """The serial number of every part the recording gives one (settings objects, which repeat
    their resource's, left out)."""
    return {str(doc["SerialNumber"]).strip() for path, doc in bmc.state.docs.items()
            if str(doc.get("@odata.type", "")).startswith(PART_TYPES) and not path.endswith("/Settings")
            and isinstance(doc.get("SerialNumber"), str)
            and str(doc["SerialNumber"]).strip().lower() not in hardware._NOT_A_VALUE}


def listed_versions(bmc: RedfishEmulator) -> set[tuple[str, str]]:
    """(Id, Version) of every component the recorded FirmwareInventory lists."""
    docs = bmc.state.docs
    members = [str(m["@odata.id"]).rstrip("/") for m in docs.get(FIRMWARE, {}).get("Members", [])]
    return {(str(docs[m].get("Id")), str(docs[m].get("Version") or "")) for m in members if m in docs}


@pytest.mark.parametrize("tree", tree_names())
def test_every_serial_and_firmware_version_of_each_recorded_tree(trees: Path, tree: str,
                                                                 emulator_config: Config) -> None:
    with RedfishEmulator.of(tree, trees) as bmc:
        result = run_kind("bmc.query", emulator_config, bmc, "query")
        want = recorded_serials(bmc)
        versions = listed_versions(bmc)
    got = {p.serial for p in result.parts}
    assert want and want <= got, sorted(want - got)[:5]
    assert all(p.kind and p.uri for p in result.parts)
    assert len({p.uri for p in result.parts}) == len(result.parts)           # each part once
    reported = {(c.id, c.version) for c in result.firmware_inventory}
    assert versions <= reported, sorted(versions - reported)[:5]


def _query(kind: str, config: Config, bmc: RedfishEmulator, node: str,
           site: SiteServices) -> site_pb2.BmcOperationResult:
    """bmc.query query for ``node`` through the real handler, in the site daemon's context."""
    handler = handler_for(kind)
    assert handler is not None
    payload = site_pb2.BmcOperationRequest(node_id=node, bmc_address=bmc.address, protocol="redfish",
                                           operation="query", credentials_ref=REF)
    result = handler.run(Context.local(kind, config, timeout=60, site=site), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


def test_the_hgx_parts_of_the_nvidia_trees_and_the_sites_inventory_of_them(
        trees: Path, emulator_config: Config, tmp_path: Path) -> None:
    """DGX H100: its eight GPUs and four NVSwitches (the recording gives the switches no serial:
    listed, serial empty), the GPUs' VBIOS; GB200: its HGX GPUs, CPUs and ERoTs, its backplane
    drives, and the HGX firmware components. Read by the site daemon's bmc.query, the site's
    inventory.refresh (its real handler) then lists, per node, what the node's last bmc.query
    query read: every part with its serial and firmware version, and every FirmwareInventory
    version; the table outlives a restart of the daemon, and a report past its byte budget
    names how many nodes did not fit."""
    with SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site")) as site:
        with RedfishEmulator.of("nvidia_dgxh100", trees) as dgx:
            dgx_result = _query("bmc.query", emulator_config, dgx, "dgx-1", site)
        with RedfishEmulator.of("nvidia_gb200", trees) as gb200:
            result = _query("bmc.query", emulator_config, gb200, "gb200-1", site)
        handler = handler_for("inventory.refresh")
        assert handler is not None
        ctx = Context.local("inventory.refresh", emulator_config, timeout=120, site=site)
        inventory = handler.run(ctx, handler.parse(agent_pb2.InventoryRefreshRequest(skip_gpus=True)))
    parts = dgx_result.parts
    switches = [p for p in parts if p.kind == "nvswitch"]
    assert sorted(p.id for p in switches) == [f"HGX_NVSwitch_{n}" for n in range(4)]
    gpus = [p for p in parts if p.kind == "gpu" and p.uri.startswith("/redfish/v1/Systems/")]
    assert len(gpus) == 8 and all(p.serial and p.firmware_version for p in gpus)
    assert {p.serial for p in gpus} == {p.serial for p in parts if p.kind == "gpu" and "/Chassis/" in p.uri}
    kinds = {p.kind for p in result.parts if p.serial}
    assert {"cpu", "erot", "irot", "drive", "nic"} <= kinds
    assert sum(p.kind == "drive" for p in result.parts) == 9
    hgx = {c.id for c in result.firmware_inventory if c.id.startswith("HGX_")}
    assert {f"HGX_FW_GPU_{n}" for n in range(4)} <= hgx and len(result.firmware_inventory) == 30

    assert isinstance(inventory, agent_pb2.InventoryRefreshResult)
    assert [n.node_id for n in inventory.node_parts] == ["gb200-1", "dgx-1"]    # the latest read first
    assert inventory.node_parts_left_out == 0
    read = {"dgx-1": dgx_result, "gb200-1": result}
    for entry in inventory.node_parts:
        listed = site_pb2.BmcOperationResult.FromString(entry.bmc_parts)
        want = read[entry.node_id]
        assert entry.read_unix_ms > 0 and entry.bmc_address
        assert [(p.kind, p.id, p.serial, p.firmware_version) for p in listed.parts] == [
            (p.kind, p.id, p.serial, p.firmware_version) for p in want.parts]
        assert sum(bool(p.serial) for p in listed.parts) > 10
        assert [(c.id, c.version) for c in listed.firmware_inventory] == [
            (c.id, c.version) for c in want.firmware_inventory]
        assert listed.system.serial == want.system.serial and not listed.power_state   # parts only
    again = PartsTable(tmp_path / "site" / "parts")        # the daemon restarted
    kept = agent_pb2.InventoryRefreshResult()
    again.report(kept)
    assert [(n.node_id, n.bmc_parts) for n in kept.node_parts] == [
        (n.node_id, n.bmc_parts) for n in inventory.node_parts]
    small = agent_pb2.InventoryRefreshResult()
    again.report(small, budget=inventory.node_parts[0].ByteSize())
    assert [n.node_id for n in small.node_parts] == ["gb200-1"] and small.node_parts_left_out == 1
