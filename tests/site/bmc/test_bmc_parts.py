"""Inventory for break-fix (issue 54, item 6): bmc.query over Redfish reports every part the BMC
lists with its serial number (agent/site/bmc/redfish/hardware.py) and every FirmwareInventory
component's version, on each recorded tree through the project's emulator, checked against the
recording itself: every Chassis, NetworkAdapter, ComputerSystem, Processor and Drive recorded
with a serial number is reported with it, every firmware component with its version."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Config
from agent.site.bmc.redfish import hardware
from tests.site.bmc.redfish_emulator import RedfishEmulator, tree_names
from tests.site.bmc.redfish_emulator.handlers import run_kind

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


def test_the_hgx_parts_of_the_nvidia_trees(trees: Path, emulator_config: Config) -> None:
    """DGX H100: its eight GPUs and four NVSwitches (the recording gives the switches no serial:
    listed, serial empty), the GPUs' VBIOS; GB200: its HGX GPUs, CPUs and ERoTs, its backplane
    drives, and the HGX firmware components."""
    with RedfishEmulator.of("nvidia_dgxh100", trees) as dgx:
        parts = run_kind("bmc.query", emulator_config, dgx, "query").parts
    switches = [p for p in parts if p.kind == "nvswitch"]
    assert sorted(p.id for p in switches) == [f"HGX_NVSwitch_{n}" for n in range(4)]
    gpus = [p for p in parts if p.kind == "gpu" and p.uri.startswith("/redfish/v1/Systems/")]
    assert len(gpus) == 8 and all(p.serial and p.firmware_version for p in gpus)
    assert {p.serial for p in gpus} == {p.serial for p in parts if p.kind == "gpu" and "/Chassis/" in p.uri}
    with RedfishEmulator.of("nvidia_gb200", trees) as gb200:
        result = run_kind("bmc.query", emulator_config, gb200, "query")
    kinds = {p.kind for p in result.parts if p.serial}
    assert {"cpu", "erot", "irot", "drive", "nic"} <= kinds
    assert sum(p.kind == "drive" for p in result.parts) == 9
    hgx = {c.id for c in result.firmware_inventory if c.id.startswith("HGX_")}
    assert {f"HGX_FW_GPU_{n}" for n in range(4)} <= hgx and len(result.firmware_inventory) == 30
