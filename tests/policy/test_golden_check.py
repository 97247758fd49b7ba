"""The golden diff's findings and remedies, case by case, where the choice of remedy turns on the
node's state: what cannot be put back from here is named without a remedy, never sent blind."""

from __future__ import annotations

import pytest

from agent.errors import InvalidParameters
from agent.hw import efivars
from agent.policy.release.findings import Found
from agent.policy.release.golden import Capture, Golden, Rules
from agent.policy.release.golden_check import Hints, check_golden
from agent.policy.release.state import ExpectedState
from agent.proto import agent_pb2

TPM = {"permanent.ownerAuthSet": "0", "permanent.lockoutAuthSet": "0", "permanent.disableClear": "0",
       "da/maxTries": "32", "da/recoveryTime": "600", "da/lockoutRecovery": "86400", "da/failedTries": "0",
       "pcrs/sha1": "", "pcrs/sha256": "0-23", "persistent/0x81010001": "name=ek"}


def run(golden: dict[str, dict[str, str]], seen: dict[str, dict[str, str]], hints: Hints | None = None,
        unreadable: dict[str, str] | None = None) -> dict[str, agent_pb2.Mismatch]:
    out = Found()
    check_golden(Golden("p", Capture(golden)), Capture(seen, unreadable or {}), hints or Hints(), out)
    return {m.where or m.check: m for m in out.mismatches}


def remedy(m: agent_pb2.Mismatch) -> str:
    return f"{m.remedy.driver}.{m.remedy.operation}" if m.HasField("remedy") else ""


def test_an_authenticated_variable_is_named_not_deleted() -> None:
    added = {"db2-x": "attrs=0x00000027;sha256=00", "Driver0001-x": "attrs=0x00000007;sha256=00"}
    found = run({"uefi": {}}, {"uefi": added})
    assert remedy(found["db2-x"]) == "" and "signed write" in found["db2-x"].message
    assert remedy(found["Driver0001-x"]) == "efivars.delete_variable"


def test_a_load_order_is_written_back_with_the_golden_order() -> None:
    name = f"BootOrder-{efivars.GLOBAL}"
    found = run({"uefi": {name: "attrs=0x00000007;sha256=a;order=0000,0001"}},
                {"uefi": {name: "attrs=0x00000007;sha256=b;order=0003,0000,0001"}})
    assert remedy(found[name]) == "efivars.set_load_order"
    assert found[name].remedy.arguments["order"].string_value == "0000,0001"


def test_the_tpms_remedies_follow_its_authorizations_and_the_ppi() -> None:
    planted = {**TPM, "persistent/0x81000001": "name=tenant", "nv/0x01500001": "attrs=0x00000000;size=8",
               "permanent.disableClear": "1", "da/maxTries": "0", "pcrs/sha1": "0-23", "pcrs/sha256": ""}
    found = run({"tpm": TPM}, {"tpm": planted})
    assert {w: remedy(m) for w, m in found.items()} == {
        "persistent/0x81000001": "tpm.evict", "nv/0x01500001": "tpm.undefine_nv",
        "permanent.disableClear": "tpm-ppi.clear", "da/maxTries": "tpm.set_da_parameters",
        "pcrs/sha1": "tpm-ppi.set_pcr_banks", "pcrs/sha256": "tpm-ppi.set_pcr_banks"}
    args = found["da/maxTries"].remedy.arguments
    assert (args["max_tries"].int_value, args["lockout_recovery"].int_value) == (32, 86400)
    assert found["pcrs/sha1"].remedy.arguments["banks"].string_value == "sha256"

    owned = {**planted, "permanent.ownerAuthSet": "1", "permanent.lockoutAuthSet": "1"}
    found = run({"tpm": TPM}, {"tpm": owned})        # the tenant's passwords: only the firmware's Clear
    for where in ("persistent/0x81000001", "nv/0x01500001", "da/maxTries", "permanent.ownerAuthSet"):
        assert remedy(found[where]) == "tpm-ppi.clear", where

    refused = run({"tpm": TPM}, {"tpm": owned}, Hints(clear_refused="no PPI", banks_refused="no PPI"))
    assert all(not m.HasField("remedy") for m in refused.values())         # named, nothing sent blind
    assert "no PPI" in refused["permanent.disableClear"].message


def test_the_eks_handle_is_persisted_again_and_a_platform_index_is_left() -> None:
    found = run({"tpm": TPM}, {"tpm": {**TPM, "persistent/0x81010001": "name=tenant",
                                       "nv/0x01c00100": "attrs=0x40000000;size=8"}})
    assert remedy(found["persistent/0x81010001"]) == "tpm.persist_ek"
    assert remedy(found["nv/0x01c00100"]) == "" and "platform" in found["nv/0x01c00100"].message


def test_a_nic_default_that_differs_is_another_firmware() -> None:
    p = "0000:3b:00.0/LINK_TYPE_P1"
    g = {p: "default=ETH(2);current=ETH(2);next=ETH(2)"}
    tool = Hints(nic_tool="mlxconfig")
    found = run({"nic": g}, {"nic": {p: "default=IB(1);current=ETH(2);next=ETH(2)"}}, tool)
    assert remedy(found[p]) == ""
    found = run({"nic": g}, {"nic": {p: "default=ETH(2);current=ETH(2);next=IB(1)"}}, tool)
    assert found[p].remedy.arguments["value"].string_value == "2"


def test_an_unreadable_source_and_one_not_read_are_findings() -> None:
    found = run({"tpm": TPM, "nvme": {}}, {"gpu": {}}, unreadable={"tpm": "no TPM: ..."})
    assert set(found) == {"tpm.unreadable", "nvme.unreadable"}
    assert all(not m.HasField("remedy") for m in found.values())


def test_rules_leave_what_varies_and_the_sites_sources_are_not_the_nodes() -> None:
    golden = Golden("p", Capture({"uefi": {"MonotonicCounter-x": "1"}, "bmc": {"a": "b"}}),
                    Rules({"uefi": ("MonotonicCounter-*",)}))
    out = Found()
    d = check_golden(golden, Capture({"uefi": {"MonotonicCounter-x": "2"}}), Hints(), out)
    assert not out.mismatches and d.varied == {"uefi": 1} and "bmc" not in d.unreadable
    assert golden.node_sources == ["uefi"]


def test_a_bad_golden_state_is_refused_at_the_edge() -> None:
    msg = agent_pb2.ExpectedState()
    msg.golden.profile = "h100"
    msg.golden.capture = b'{"format": 1, "sources": {"uefi": {"a": 1}}}'
    with pytest.raises(InvalidParameters, match=r"golden\.capture"):
        ExpectedState.from_proto(msg)
    msg.golden.capture = Capture({"uefi": {}}).to_json()
    msg.golden.profile = ""
    with pytest.raises(InvalidParameters, match=r"golden\.profile"):
        ExpectedState.from_proto(msg)
    msg.golden.profile = "h100"
    assert ExpectedState.from_proto(msg).areas == ["golden"]
