"""The release gate's TPM part against a real TPM (swtpm, one per test): a clean TPM passes; an
NV index the owner defined, a persistent object, an owner password and a counted authorization
failure, planted with tpm2-tools, are each found, the first three with the remedy that asks the
firmware's PPI (a fake sysfs tree here) for a Clear; the EK certificates' indices are never
reported; the counted failure is reset (TPM2_DictionaryAttackLockReset through the tpm driver),
and after the Clear the firmware would make (tpm2_clear with the platform hierarchy) and a power
cycle, only the failure that power cycle counted is left, reset in its turn. A lockout
authorization the tenant set holds the reset back until the Clear."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.catalog import Role
from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.commands.inventory import InventoryRefresh
from agent.config import Config
from agent.errors import Unsupported
from agent.proto import agent_pb2
from tests.hw.fake_machine import build_machine
from tests.tpmsim import SimTpm, manufactured_tpm, need, sim

__all__ = ["manufactured_tpm", "sim"]

SWTPM_ECC_EK = 0x81010016          # where swtpm_setup persists its ECC EK (the baseline names it)
OWNER_INDEX = 0x01500001


class Machine:
    def __init__(self, root: Path, state_dir: Path, tpm: str) -> None:
        self.root = root
        self.ppi = root / "sys/class/tpm/tpm0/ppi"
        self.config = Config(state_dir=state_dir, role=Role.RAMDISK, tpm=tpm)

    def with_ppi(self, clear_status: int = 4) -> None:
        self.ppi.mkdir(parents=True)
        (self.ppi / "version").write_text("1.3\n")
        (self.ppi / "request").write_text("0\n")
        (self.ppi / "response").write_text("0 0: Success\n")
        (self.ppi / "tcg_operations").write_text(f"1 4: User not required\n5 {clear_status}: whatever\n")

    def check(self, tpm: dict[str, Any] | None = None) -> agent_pb2.InventoryRefreshResult:
        handler = InventoryRefresh()
        handler.root = self.root
        handler.kernel_log = lambda: []
        state = {"tpm": tpm if tpm is not None else {"persistent_handles": [SWTPM_ECC_EK]}}
        payload = json_format.ParseDict({"skip_gpus": True, "expect": {"state": state}},
                                        agent_pb2.InventoryRefreshRequest())
        result = handler.run(Context.local("inventory.refresh", self.config), handler.parse(payload))
        assert isinstance(result, agent_pb2.InventoryRefreshResult)
        return result

    def invoke(self, request: agent_pb2.DriverInvokeRequest) -> agent_pb2.DriverInvokeResult:
        handler = DriverInvoke()
        handler.root = self.root
        result = handler.run(Context.local("driver.invoke", self.config), handler.parse(request))
        assert isinstance(result, agent_pb2.DriverInvokeResult)
        return result


@pytest.fixture
def machine(tmp_path: Path, sim: SimTpm) -> Machine:
    return Machine(build_machine(tmp_path / "root", gpus=0, disks=1), tmp_path / "state",
                   f"tcp:127.0.0.1:{sim.port}")


def tpm2(sim: SimTpm, cwd: Path, *argv: str) -> None:
    need(argv[0])
    done = subprocess.run(list(argv), cwd=cwd, env=dict(os.environ, TPM2TOOLS_TCTI=sim.tcti),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stderr)


def found(result: agent_pb2.InventoryRefreshResult) -> set[tuple[str, str]]:
    return {(m.check, m.where) for m in result.conformance.mismatches}


def test_a_clean_tpm_passes(machine: Machine) -> None:
    machine.with_ppi()
    result = machine.check()
    assert list(result.conformance.mismatches) == [] and result.release.pool_ready
    assert list(result.release.checked) == ["tpm"] and "tpm" not in result.release.not_checked
    assert result.release.tpm_absent == ""


def test_the_ecc_ek_is_a_finding_unless_the_baseline_names_it(machine: Machine) -> None:
    """The EK at 0x81010001 is always expected; swtpm's second EK only where the baseline says."""
    machine.with_ppi()
    assert found(machine.check({})) == {("tpm.persistent_handle", f"{SWTPM_ECC_EK:#010x}")}


def test_planted_residue_is_each_found_and_the_ppi_clear_puts_it_back(machine: Machine, sim: SimTpm,
                                                                      tmp_path: Path) -> None:
    machine.with_ppi()
    index = f"{OWNER_INDEX:#x}"
    tpm2(sim, tmp_path, "tpm2_nvdefine", index, "-C", "o", "-s", "32", "-p", "secret",
         "-a", "ownerwrite|ownerread|authwrite|authread")
    done = subprocess.run(["tpm2_nvread", index, "-P", "wrong", "-s", "1"], cwd=tmp_path, capture_output=True,
                          env=dict(os.environ, TPM2TOOLS_TCTI=sim.tcti), timeout=60)
    assert done.returncode != 0                       # a failed authorization: the lockout counter
    tpm2(sim, tmp_path, "tpm2_createprimary", "-C", "o", "-c", "primary.ctx")
    tpm2(sim, tmp_path, "tpm2_evictcontrol", "-C", "o", "-c", "primary.ctx", "0x81000001")
    tpm2(sim, tmp_path, "tpm2_changeauth", "-c", "owner", "tenant-password")

    result = machine.check()
    assert found(result) == {("tpm.nv_index", "0x01500001"), ("tpm.persistent_handle", "0x81000001"),
                             ("tpm.owner_auth", "owner"), ("tpm.lockout_counter", "")}
    assert not any(m.where.startswith("0x01c0") for m in result.conformance.mismatches)  # EK certificates
    report = result.release
    assert not report.pool_ready and not report.cannot_restore
    remedies = {m.check: (m.remedy.driver, m.remedy.operation) for m in report.restorable}
    assert remedies.pop("tpm.lockout_counter") == ("tpm", "reset_lockout")
    assert set(remedies.values()) == {("tpm-ppi", "clear")} and len(report.restorable) == 4
    (counter,) = [m for m in report.restorable if m.check == "tpm.lockout_counter"]
    assert "1 authorization failure(s)" in counter.message and "every 1000 s" in counter.message  # swtpm's

    clear = next(m.remedy for m in report.restorable if m.remedy.driver == "tpm-ppi")
    done_clear = machine.invoke(clear)
    assert b"pending" in done_clear.stdout
    assert (machine.ppi / "request").read_text().strip() == "5"
    assert found(machine.check()) == found(result)    # nothing changes until the firmware acts
    assert machine.invoke(counter.remedy).stdout == b"lockout counter reset: 1 -> 0\n"
    assert found(machine.check()) == found(result) - {("tpm.lockout_counter", "")}

    # The firmware at the next boot: the PPI request carried out with the platform hierarchy.
    tpm2(sim, tmp_path, "tpm2_clear", "-c", "p")
    sim.restart()
    machine.config = dataclasses.replace(machine.config, tpm=f"tcp:127.0.0.1:{sim.port}")
    after = machine.check({})                          # the Clear took the persisted EKs too
    # A power cycle without TPM2_Shutdown counts as one failure (the TPM's dictionary-attack
    # rule): what is left is that count, which the reset puts back.
    (counter,) = after.release.restorable
    assert (counter.check, counter.found, counter.remedy.driver) == ("tpm.lockout_counter", "1", "tpm")
    machine.invoke(counter.remedy)
    assert machine.check({}).release.pool_ready


def fail_authorizations(sim: SimTpm, cwd: Path, count: int) -> None:
    """``count`` wrong passwords given for an owner NV index (each counts once), the index gone after."""
    for _ in range(count):
        tpm2(sim, cwd, "tpm2_nvdefine", f"{OWNER_INDEX:#x}", "-C", "o", "-s", "8", "-p", "pw",
             "-a", "ownerwrite|ownerread|authwrite|authread")
        done = subprocess.run(["tpm2_nvread", f"{OWNER_INDEX:#x}", "-P", "wrong", "-s", "1"], cwd=cwd,
                              capture_output=True, env=dict(os.environ, TPM2TOOLS_TCTI=sim.tcti), timeout=60)
        assert done.returncode != 0
        tpm2(sim, cwd, "tpm2_nvundefine", f"{OWNER_INDEX:#x}", "-C", "o")


def test_a_lockout_counter_behind_a_lockout_password_waits_for_the_clear(machine: Machine, sim: SimTpm,
                                                                         tmp_path: Path) -> None:
    """The reset needs the lockout authorization: with a tenant's set, nothing is sent (a wrong one
    would count against the lockout hierarchy) and the firmware's Clear comes first."""
    machine.with_ppi()
    tpm2(sim, tmp_path, "tpm2_changeauth", "-c", "lockout", "tenant")
    fail_authorizations(sim, tmp_path, 2)
    report = machine.check().release
    (counter,) = [m for m in report.cannot_restore if m.check == "tpm.lockout_counter"]
    assert counter.found == "2" and "Clear has emptied it" in counter.message
    reset = agent_pb2.DriverInvokeRequest(driver="tpm", operation="reset_lockout")
    with pytest.raises(Unsupported, match="lockout authorization is set"):
        machine.invoke(reset)
    status = machine.invoke(agent_pb2.DriverInvokeRequest(driver="tpm", operation="status")).stdout
    assert b'"lockout_counter": 2' in status and b'"lockout_auth_set": true' in status
    tpm2(sim, tmp_path, "tpm2_clear", "-c", "p")      # the firmware's Clear at the next boot
    # swtpm's (libtpms') TPM2_Clear zeroes the counter too; a TPM that keeps it gets the reset.
    assert machine.check({}).release.pool_ready
    fail_authorizations(sim, tmp_path, 3)
    (counter,) = machine.check({}).release.restorable
    assert (counter.check, counter.found, counter.remedy.driver, counter.remedy.operation) == (
        "tpm.lockout_counter", "3", "tpm", "reset_lockout")
    assert machine.invoke(counter.remedy).stdout == b"lockout counter reset: 3 -> 0\n"
    assert machine.check({}).release.pool_ready


def test_the_lockout_reset_without_a_tpm_is_unsupported(tmp_path: Path) -> None:
    machine = Machine(build_machine(tmp_path / "root", gpus=0, disks=1), tmp_path / "state", "")
    with pytest.raises(Unsupported, match="no TPM"):
        machine.invoke(agent_pb2.DriverInvokeRequest(driver="tpm", operation="reset_lockout"))


def test_an_endorsement_password_is_found(machine: Machine, sim: SimTpm, tmp_path: Path) -> None:
    machine.with_ppi()
    tpm2(sim, tmp_path, "tpm2_changeauth", "-c", "endorsement", "tenant")
    tpm2(sim, tmp_path, "tpm2_changeauth", "-c", "lockout", "tenant")
    assert found(machine.check()) == {("tpm.endorsement_auth", "endorsement"),
                                      ("tpm.lockout_auth", "lockout")}


def test_an_index_the_baseline_keeps_is_not_reported(machine: Machine, sim: SimTpm, tmp_path: Path) -> None:
    machine.with_ppi()
    tpm2(sim, tmp_path, "tpm2_nvdefine", f"{OWNER_INDEX:#x}", "-C", "o", "-s", "8")
    result = machine.check({"persistent_handles": [SWTPM_ECC_EK], "nv_indices": [OWNER_INDEX]})
    assert list(result.conformance.mismatches) == []


@pytest.mark.parametrize(("ppi", "why"), [(None, "no TPM Physical Presence Interface"),
                                          (2, "blocks Clear requests from the OS"),
                                          (0, "not implemented")])
def test_without_a_ppi_that_clears_the_findings_cannot_be_put_back(machine: Machine, sim: SimTpm,
                                                                     tmp_path: Path, ppi: int | None,
                                                                     why: str) -> None:
    if ppi is not None:
        machine.with_ppi(ppi)
    tpm2(sim, tmp_path, "tpm2_changeauth", "-c", "owner", "tenant-password")
    report = machine.check().release
    assert not report.restorable and [m.check for m in report.cannot_restore] == ["tpm.owner_auth"]
    assert why in report.cannot_restore[0].message
    with pytest.raises(Unsupported, match=why):
        machine.invoke(json_format.ParseDict({"driver": "tpm-ppi", "operation": "clear"},
                                             agent_pb2.DriverInvokeRequest()))


def test_a_ppi_that_needs_a_person_says_so(machine: Machine) -> None:
    machine.with_ppi(3)
    out = machine.invoke(agent_pb2.DriverInvokeRequest(driver="tpm-ppi", operation="clear")).stdout
    assert b"confirm" in out and (machine.ppi / "request").read_text().strip() == "5"
    status = machine.invoke(agent_pb2.DriverInvokeRequest(driver="tpm-ppi", operation="status")).stdout
    assert b'"request": "5"' in status and b'"clear_status": 3' in status


def test_no_tpm_is_stated_not_a_finding(tmp_path: Path) -> None:
    machine = Machine(build_machine(tmp_path / "root", gpus=0, disks=1), tmp_path / "state", "")
    report = machine.check().release
    assert report.pool_ready and report.tpm_absent == "no TPM: the kernel offers no /dev/tpmrm0"
    assert "tpm" in report.not_checked and "tpm" not in report.checked
    machine.config = dataclasses.replace(machine.config, tpm="none")
    assert machine.check().release.tpm_absent == "no TPM: disabled by the setting bc.tpm=none"


def test_a_tpm_that_cannot_be_reached_is_a_finding(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                 # nothing listens there once closed
    machine = Machine(build_machine(tmp_path / "root", gpus=0, disks=1), tmp_path / "state",
                      f"tcp:127.0.0.1:{port}")
    report = machine.check().release
    assert [m.check for m in report.cannot_restore] == ["tpm.unreadable"] and not report.pool_ready
    assert "could not be reached" in report.cannot_restore[0].message
