"""The release gate (inventory.refresh's expect.state) on a fake server: UEFI variables in
efivarfs-format files, GPUs in the fake NVML, NICs in the fake mstconfig, NVMe drives in the
fake nvme-cli. A clean node passes with nothing reported; every planted item is found; the
remedies, run through driver.invoke as the control plane would send them, put back what can
be put back, and what cannot stays named."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.catalog import Role
from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.commands.inventory import InventoryRefresh, release
from agent.config import Config
from agent.errors import InvalidParameters
from agent.hw import efivars
from agent.proto import agent_pb2
from tests.fakes.nvml.fakenvml import FakeMachine
from tests.hw.fake_machine import build_machine

FAKES = Path(__file__).resolve().parent.parent / "fakes"
GIB = 2**30
NICS = ("0000:3b:00.0", "0000:3b:00.1", "0000:3c:00.0", "0000:3c:00.1")
PROFILE = {"SRIOV_EN": ["False(0)", "False(0)", "False(0)"], "NUM_OF_VFS": ["0", "0", "0"],
           "LINK_TYPE_P1": ["ETH(2)", "ETH(2)", "ETH(2)"]}
SECURE_BOOT = {"PK": (efivars.GLOBAL, b"platform key"), "KEK": (efivars.GLOBAL, b"key exchange keys"),
               "db": (efivars.IMAGE_SECURITY, b"allowed"), "dbx": (efivars.IMAGE_SECURITY, b"revoked")}


def plant(directory: Path, name: str, value: bytes, guid: str = efivars.GLOBAL) -> None:
    (directory / f"{name}-{guid}").write_bytes(struct.pack("<I", 7) + value)


class Node:
    """A fake server with every area the release checks, and its baseline."""

    def __init__(self, tmp_path: Path, library: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = build_machine(tmp_path / "root", gpus=8, disks=4)
        self.efivars = self.root / "sys/firmware/efi/efivars"
        assert self.efivars.is_dir() and not any(self.efivars.iterdir())
        plant(self.efivars, "Boot0000", efivars.load_option("UEFI PXEv4"))
        plant(self.efivars, "Boot0001", efivars.load_option("debian"))
        plant(self.efivars, "BootOrder", struct.pack("<2H", 0, 1))
        plant(self.efivars, "SecureBoot", b"\x01")
        plant(self.efivars, "SetupMode", b"\x00")
        for name, (guid, value) in SECURE_BOOT.items():
            plant(self.efivars, name, value, guid)
        plant(self.efivars, "MemoryOverwriteRequestControl", b"\x01", efivars.MOR)
        self.gpus = FakeMachine(tmp_path / "gpus.json", count=8)
        for i in range(8):
            self.gpus.set(i, pci_bus=0x18 + 0x10 * i)
        self.nic_state = tmp_path / "nics.json"
        self.nics: dict[str, Any] = {a: json.loads(json.dumps(PROFILE)) for a in NICS}
        self.nvme_state = tmp_path / "nvme.json"
        self.nvme: dict[str, Any] = {}
        for c in ("nvme0", "nvme1"):
            (self.root / "sys/class/nvme" / c).mkdir(parents=True)
            self.nvme[c] = {"tnvmcap": 3840 * GIB, "namespaces": {"1": {"size": 3840 * GIB, "flbas": 0}}}
        self.save()
        bindir = tmp_path / "bin"
        bindir.mkdir()
        for tool, fake in (("nvidia-smi", "nvidia-smi"), ("mstconfig", "mstconfig"), ("nvme", "nvme")):
            (bindir / tool).symlink_to(FAKES / fake)
        monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
        monkeypatch.setenv("FAKE_NVML_CONFIG", str(self.gpus.path))
        monkeypatch.setenv("FAKE_MSTCONFIG_STATE", str(self.nic_state))
        monkeypatch.setenv("FAKE_NVME_STATE", str(self.nvme_state))
        monkeypatch.setenv("FAKE_NVME_SYSFS", str(self.root / "sys"))
        self.config = Config(state_dir=tmp_path / "state", nvml_library=library)

    def save(self) -> None:
        self.nic_state.write_text(json.dumps(self.nics))
        self.nvme_state.write_text(json.dumps(self.nvme))

    def firmware_boot(self) -> None:
        """What a reboot does to the NICs: every next-boot value becomes current."""
        self.nics = json.loads(self.nic_state.read_text())
        self.nvme = json.loads(self.nvme_state.read_text())      # what the remedies changed
        for params in self.nics.values():
            for values in params.values():
                values[1] = values[2]
        self.save()

    def baseline(self) -> dict[str, Any]:
        entries = [{"number": n, "sha256": hashlib.sha256(efivars.load_option(d)).hexdigest(),
                    "description": d} for n, d in ((0, "UEFI PXEv4"), (1, "debian"))]
        uefi: dict[str, Any] = {"boot_entries": entries, "boot_order": [0, 1], "secure_boot": True,
                                "setup_mode": False, "memory_overwrite_request_control": 1}
        for name, (_, value) in SECURE_BOOT.items():
            uefi[f"{name.lower()}_sha256"] = hashlib.sha256(value).hexdigest()
        return {"uefi": uefi, "gpus": {"at_defaults": True, "persistence_mode": True},
                "nics": [{"match": "15b3:101d", "config": {"SRIOV_EN": "False", "NUM_OF_VFS": "0",
                                                           "LINK_TYPE_P1": "ETH(2)"}}],
                "nvme": {"namespaces": 1, "full_capacity": True, "lba_data_size": 512}}

    def check(self, state: dict[str, Any] | None = None,
              role: Role = Role.RAMDISK) -> agent_pb2.InventoryRefreshResult:
        handler = InventoryRefresh()
        handler.root = self.root
        handler.kernel_log = lambda: []
        payload = json_format.ParseDict({"expect": {"state": state or self.baseline()}},
                                        agent_pb2.InventoryRefreshRequest())
        config = Config(**{**self.config.__dict__, "role": role})
        result = handler.run(Context.local("inventory.refresh", config), handler.parse(payload))
        assert isinstance(result, agent_pb2.InventoryRefreshResult)
        return result

    def put_back(self, report: agent_pb2.ReleaseReport) -> None:
        """Run every remedy as the control plane would: driver.invoke, one each."""
        handler = DriverInvoke()
        handler.root = self.root
        sent = set()
        for m in report.restorable:
            if m.remedy.SerializeToString(deterministic=True) in sent:
                continue                                   # one remedy for several findings: once
            sent.add(m.remedy.SerializeToString(deterministic=True))
            result = handler.run(Context.local("driver.invoke", self.config), handler.parse(m.remedy))
            assert isinstance(result, agent_pb2.DriverInvokeResult)
            assert result.exit_code == 0, (m.check, result.stderr)


def found(result: agent_pb2.InventoryRefreshResult) -> set[tuple[str, str]]:
    return {(m.check, m.where) for m in result.conformance.mismatches}


@pytest.fixture
def node(tmp_path: Path, nvml_library: str, monkeypatch: pytest.MonkeyPatch) -> Node:
    return Node(tmp_path, nvml_library, monkeypatch)


def test_a_clean_node_passes_with_nothing_reported(node: Node) -> None:
    result = node.check()
    assert list(result.conformance.mismatches) == [] and result.conformance.passed
    report = result.release
    assert report.pool_ready and not report.restorable and not report.cannot_restore
    assert list(report.checked) == ["uefi", "gpus", "nics", "nvme"]
    assert list(report.not_checked) == []
    assert list(report.checked_elsewhere) == ["bios", "bmc_accounts"]      # at the site
    assert report.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def plant_residue(node: Node) -> None:
    plant(node.efivars, "Boot0003", efivars.load_option("tenant iPXE"))
    plant(node.efivars, "BootOrder", struct.pack("<3H", 3, 0, 1))
    plant(node.efivars, "db", b"allowed and the tenant's own key", efivars.IMAGE_SECURITY)
    plant(node.efivars, "MemoryOverwriteRequestControl", b"\x00", efivars.MOR)
    node.gpus.set(1, mig_mode=True)
    node.gpus.set(2, power_limit_mw=450000)
    node.gpus.set(3, app_clock_graphics=1410, app_clock_memory=2619)
    node.gpus.set(4, ecc_uncorrected_volatile=2, persistence_mode=False)
    node.gpus.set(5, remap_pending=True)
    node.gpus.set(6, remap_failure=True)
    node.nics["0000:3b:00.0"]["SRIOV_EN"] = ["False(0)", "False(0)", "True(1)"]    # set for the next boot
    node.nics["0000:3c:00.1"]["NUM_OF_VFS"] = ["0", "16", "16"]
    node.nvme["nvme1"]["namespaces"] = {"1": {"size": 1000 * GIB, "flbas": 1},
                                        "2": {"size": 1000 * GIB, "flbas": 0}}
    node.save()
    for c in ("nvme0n1", "nvme1n1"):
        assert (node.root / "sys/block" / c).exists()       # attached namespaces: id-ns reads them


PLANTED = {
    ("uefi.boot_entry", "Boot0003"), ("uefi.boot_order", "BootOrder"), ("uefi.db", "db"),
    ("uefi.memory_overwrite", "MemoryOverwriteRequestControl"),
    ("gpu.mig_mode", "0000:28:00.0"), ("gpu.power_limit", "0000:38:00.0"), ("gpu.app_clocks", "0000:48:00.0"),
    ("gpu.ecc_volatile", "0000:58:00.0"), ("gpu.persistence_mode", "0000:58:00.0"),
    ("gpu.remap_pending", "0000:68:00.0"), ("gpu.remap_failure", "0000:78:00.0"),
    ("nic.config", "0000:3b:00.0 SRIOV_EN"), ("nic.config", "0000:3c:00.1 NUM_OF_VFS"),
    ("nvme.namespaces", "nvme1"), ("nvme.capacity", "nvme1"), ("nvme.lba_size", "nvme1n1"),
}
CANNOT = {("uefi.db", "db"), ("gpu.remap_failure", "0000:78:00.0")}


def test_every_planted_item_is_found_and_what_can_be_is_put_back(node: Node) -> None:
    plant_residue(node)
    result = node.check()
    assert found(result) == PLANTED and not result.conformance.passed
    report = result.release
    assert not report.pool_ready
    assert {(m.check, m.where) for m in report.cannot_restore} == CANNOT
    assert {(m.check, m.where) for m in report.restorable} == PLANTED - CANNOT
    remedies = {m.check: (m.remedy.driver, m.remedy.operation) for m in report.restorable}
    assert remedies["uefi.boot_entry"] == ("efivars", "delete_boot_entry")
    assert remedies["gpu.mig_mode"] == ("nvidia-smi", "set_mig_mode")
    assert remedies["nic.config"] == ("mstconfig", "set")
    assert remedies["nvme.namespaces"] == remedies["nvme.lba_size"] == ("nvme", "factory_layout")

    # As the control plane does: send the remedies, check again, until none is left.
    for _ in range(3):
        node.put_back(report)
        node.firmware_boot()
        report = node.check().release
        if not report.restorable:
            break
    assert not report.restorable
    assert {(m.check, m.where) for m in report.cannot_restore} == CANNOT and not report.pool_ready
    v = efivars.Efivars(node.efivars)
    assert [e.number for e in v.boot_entries()] == [0, 1] and v.boot_order() == [0, 1]
    assert v.flag("MemoryOverwriteRequestControl", efivars.MOR) == 1
    gpus = node.gpus.read()["gpus"]
    assert gpus[1]["mig_mode"] is False and gpus[2]["power_limit_mw"] == 700000
    assert gpus[4]["ecc_uncorrected_volatile"] == 0 and gpus[4]["persistence_mode"] is True
    nvme1 = json.loads(node.nvme_state.read_text())["nvme1"]["namespaces"]
    assert nvme1 == {"1": {"size": 3840 * GIB, "flbas": 0, "detached": False}}


def test_in_setup_mode_the_secure_boot_findings_name_the_ramdisks_enrollment(node: Node) -> None:
    """A tenant left the node in setup mode (PK deleted, a key of theirs in db, Secure Boot off):
    each finding names efivars.enroll_keys, the one remedy the control plane completes with the
    fleet's signed writes; in user mode the same db is reported for an operator."""
    plant(node.efivars, "db", b"allowed and the tenant's own key", efivars.IMAGE_SECURITY)
    plant(node.efivars, "SecureBoot", b"\x00")
    user_mode = node.check().release
    assert {(m.check, m.where) for m in user_mode.cannot_restore} == {
        ("uefi.db", "db"), ("uefi.secure_boot", "secure_boot")} and not user_mode.restorable
    plant(node.efivars, "SetupMode", b"\x01")
    (node.efivars / f"PK-{efivars.GLOBAL}").unlink()
    report = node.check().release
    assert not report.cannot_restore and not report.pool_ready
    assert {(m.check, m.where, m.remedy.driver, m.remedy.operation, len(m.remedy.arguments))
            for m in report.restorable} == {
        (check, where, "efivars", "enroll_keys", 0) for check, where in (
            ("uefi.db", "db"), ("uefi.pk", "pk"), ("uefi.secure_boot", "secure_boot"),
            ("uefi.setup_mode", "setup_mode"))}
    assert all("efivars.enroll_keys" in m.message for m in report.restorable)


def test_mig_is_set_off_then_taken_up_by_a_reset(node: Node) -> None:
    node.gpus.set(1, mig_mode=True)
    first = node.check().release.restorable
    assert [(m.check, m.remedy.operation) for m in first] == [("gpu.mig_mode", "set_mig_mode")]
    node.put_back(node.check().release)
    second = node.check().release.restorable
    assert [(m.check, m.found, m.remedy.operation) for m in second] == [
        ("gpu.mig_mode", "current on, pending off", "reset")]
    node.put_back(node.check().release)
    assert node.check().release.pool_ready


def test_what_cannot_be_read_is_not_passed(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")               # no mstconfig, no nvme-cli
    for path in node.efivars.iterdir():
        path.unlink()
    node.efivars.rmdir()
    node.gpus.update(init_error=9)                             # the driver is not loaded
    result = node.check()
    assert {m.check for m in result.release.cannot_restore} == {
        "uefi.unreadable", "gpu.unreadable", "nic.unreadable", "nvme.unreadable"}
    assert not result.release.pool_ready


def test_the_bmcs_half_is_accepted_and_left_to_the_site(node: Node) -> None:
    """bios and bmc_accounts are the site's (bmc.query baseline): the ramdisk takes a state that
    sets them, reads nothing for them, and says in its report that the site checks them."""
    state = {**node.baseline(), "bios": {"attributes": {"LogicalProc": "Enabled"}},
             "bmcAccounts": {"accounts": [{"userName": "root", "role": "Administrator"}]}}
    result = node.check(state)
    report = result.release
    assert report.pool_ready and list(report.checked) == ["uefi", "gpus", "nics", "nvme"]
    assert list(report.checked_elsewhere) == list(release.CHECKED_AT_SITE) == ["bios", "bmc_accounts"]
    assert "bios" not in report.not_checked and "bmc_accounts" not in report.not_checked
    assert not any(m.check.startswith(("bios.", "bmc.")) for m in result.conformance.mismatches)


def test_the_site_role_does_not_read_a_nodes_state(node: Node) -> None:
    with pytest.raises(InvalidParameters, match="ramdisk and node roles"):
        node.check(role=Role.SITE)


def test_a_remedy_survives_the_wire_as_the_control_plane_signs_it(node: Node) -> None:
    node.gpus.set(2, power_limit_mw=450000)
    (m,) = node.check().release.restorable
    again = agent_pb2.DriverInvokeRequest.FromString(m.remedy.SerializeToString())
    params = DriverInvoke().parse(again)
    assert (params.driver, params.tail) == ("nvidia-smi", ("--id=2", "--power-limit=700"))


def test_a_detached_namespace_is_found(node: Node) -> None:
    """What QEMU 7.2 can plant (detach-ns): the namespace is allocated but has no block device."""
    shutil.rmtree(node.root / "sys/block/nvme0n1")
    (m,) = node.check({"nvme": {"namespaces": 1}}).release.cannot_restore
    assert (m.check, m.where, m.found) == ("nvme.namespaces", "nvme0", "1, 1 detached (1)")


def test_a_drive_without_namespace_management_lists_its_attached_namespaces(node: Node) -> None:
    node.nvme["nvme1"]["namespace_management"] = False
    node.save()
    assert node.check().release.pool_ready
    node.nvme["nvme1"]["namespaces"]["2"] = {"size": 0, "flbas": 0}
    node.save()
    (m,) = node.check().release.cannot_restore
    assert (m.check, m.where, m.found) == ("nvme.namespaces", "nvme1", "2, 1 detached (2)")
