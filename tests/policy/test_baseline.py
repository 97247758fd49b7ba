"""agent.policy.release: the expected state checked at the edge, and the checks the fake
server of tests/commands/test_release.py does not reach (a NIC's firmware version, values
written in mlxconfig's several ways, a GPU that cannot be read)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from agent.errors import InvalidParameters
from agent.hw.gpu import GpuState
from agent.policy.release import gate
from agent.policy.release.nics import same_value
from agent.policy.release.state import ExpectedState, NicConfig, Observed, TpmState, UefiState
from agent.proto import agent_pb2


def expected(state: dict[str, Any]) -> ExpectedState:
    return ExpectedState.from_proto(json_format.ParseDict(state, agent_pb2.ExpectedState()))


@pytest.mark.parametrize("state", [
    {"uefi": {"boot_entries": [{"number": 70000, "sha256": "0" * 64}]}},
    {"uefi": {"boot_entries": [{"number": 1, "sha256": "not hex"}]}},
    {"uefi": {"boot_entries": [{"number": 1, "sha256": "0" * 64}, {"number": 1, "sha256": "1" * 64}]}},
    {"uefi": {"boot_order": [65536]}},
    {"uefi": {"db_sha256": "abc"}},
    {"uefi": {"memory_overwrite_request_control": 2}},
    {"nics": [{"match": "mellanox"}]},
    {"nics": [{"config": {"SRIOV_EN": "1 NUM_OF_VFS=64"}}]},
    {"nics": [{"config": {"_SRIOV_EN": "1"}}]},      # a name starts with a letter (lower case is one)
    {"nvme": {"lba_data_size": 1024}},
    {"tpm": {"persistent_handles": [0x01500001]}},
    {"tpm": {"nv_indices": [0x81000001]}},
])  # fmt: skip
def test_what_cannot_be_meant_is_refused(state: dict[str, Any]) -> None:
    with pytest.raises(InvalidParameters, match=r"expect\.state"):
        expected(state)


def test_unset_fields_are_not_checked() -> None:
    e = expected({"uefi": {"secure_boot": False}, "gpus": {}})
    assert e.areas == ["uefi"] and e.uefi is not None
    assert e.uefi.secure_boot is False and e.uefi.setup_mode is None and e.uefi.memory_overwrite is None
    seen = Observed(uefi=UefiState({}, None, 0, 1, {}, None))
    assert gate.check(e, seen) == []


def test_nic_values_compare_by_their_number_and_firmware_exactly() -> None:
    assert same_value("True(1)", "1") and same_value("true", "True(1)")
    assert same_value("ETH(2)", "2") and not same_value("IB(1)", "ETH(2)")
    e = expected({"nics": [{"match": "15b3:101d", "config": {"LINK_TYPE_P1": "ETH(2)"},
                            "firmware_version": "22.39.1002"}]})
    seen = Observed(nics=[
        NicConfig("0000:3b:00.0", "15b3:101d", "22.39.1002", "mlxconfig",
                           {"LINK_TYPE_P1": ("2", "2")}),
        NicConfig("0000:3c:00.0", "15b3:101d", "22.41.1000", "mlxconfig",
                           {"LINK_TYPE_P1": ("IB(1)", "ETH(2)")}),
        NicConfig("0000:5e:00.0", "8086:1593", "4.40", "mlxconfig", {}),   # no profile matches
    ])
    found = gate.check(e, seen)
    assert [(m.check, m.where, m.found) for m in found] == [
        ("nic.firmware_version", "0000:3c:00.0", "22.41.1000"),
        ("nic.config", "0000:3c:00.0 LINK_TYPE_P1", "current IB(1), next boot ETH(2)")]
    assert not found[0].HasField("remedy")
    remedy = found[1].remedy
    value = remedy.arguments["value"].string_value
    assert (remedy.driver, remedy.operation, value) == ("mlxconfig", "set", "2")


def test_a_parameter_the_nic_lacks_is_named_without_a_remedy() -> None:
    e = expected({"nics": [{"config": {"NUM_OF_VFS": "0"}}]})
    seen = Observed(nics=[NicConfig("0000:3b:00.0", "15b3:1017", "", "mstconfig", {})])
    (m,) = gate.check(e, seen)
    assert (m.check, m.found) == ("nic.config", "current absent, next boot absent")
    assert not m.HasField("remedy")


def test_a_lost_gpu_is_unreadable_not_passed() -> None:
    e = expected({"gpus": {"at_defaults": True}})
    seen = Observed(gpus=[GpuState(index=0, pci_bus_id="00000000:18:00.0", lost=True)])
    assert [(m.check, m.where) for m in gate.check(e, seen)] == [("gpu.unreadable", "0000:18:00.0")]


def test_the_tpms_own_and_the_platforms_nv_indices_are_never_findings() -> None:
    """An EK certificate's index even where the owner defined it (some TPMs do), the platform's
    anywhere; an owner's index elsewhere is a finding, without a remedy where PPI cannot clear."""
    e = expected({"tpm": {"nv_indices": [0x01500002]}})
    nv = {0x01C00002: False, 0x01C0000A: False, 0x01C00100: False, 0x01C08000: True, 0x01400001: True,
          0x01500001: False, 0x01500002: False}
    seen = Observed(tpm=TpmState(nv, (0x81010001,), 0, 0, 1000, "no PPI"))
    found = gate.check(e, seen)
    assert [(m.check, m.where) for m in found] == [("tpm.nv_index", "0x01500001")]
    assert not found[0].HasField("remedy") and "no PPI" in found[0].message


def test_no_tpm_is_not_a_finding_and_an_unreadable_one_is() -> None:
    e = expected({"tpm": {}})
    assert gate.check(e, Observed(tpm_absent="no TPM: the kernel offers no /dev/tpmrm0")) == []
    found = gate.check(e, Observed(unread={"tpm": "TPM_RC_FAILURE"}))
    assert [m.check for m in found] == ["tpm.unreadable"] and "TPM_RC_FAILURE" in found[0].message
