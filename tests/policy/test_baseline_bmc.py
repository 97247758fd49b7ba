"""agent.policy.release's BMC half (check_bmc): the expected accounts and BIOS attributes checked
at the edge, and the judgements the emulators of tests/site/bmc/test_bmc_baseline.py do not reach
(a role changed, an expected-disabled account enabled, a typed value, nothing readable)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from agent.errors import InvalidParameters
from agent.policy.release import gate
from agent.policy.release.findings import restorable
from agent.policy.release.state import Account, BiosValue, BmcObserved, ExpectedState
from agent.proto import agent_pb2


def expected(state: dict[str, Any]) -> ExpectedState:
    return ExpectedState.from_proto(json_format.ParseDict(state, agent_pb2.ExpectedState()))


def checks(e: ExpectedState, seen: BmcObserved) -> dict[tuple[str, str], agent_pb2.Mismatch]:
    return {(m.check, m.where): m for m in gate.check_bmc(e, seen)}


@pytest.mark.parametrize("state", [
    {"bmcAccounts": {"accounts": [{"userName": ""}]}},
    {"bmcAccounts": {"accounts": [{"userName": "a\tb"}]}},
    {"bmcAccounts": {"accounts": [{"userName": "x" * 65}]}},
    {"bmcAccounts": {"accounts": [{"userName": "ops"}, {"userName": "ops", "role": "ReadOnly"}]}},
    {"bmcAccounts": {"accounts": [{"userName": f"u{i}"} for i in range(65)]}},
    {"bios": {"attributes": {"Proc Turbo": "Enabled"}}},
    {"bios": {"attributes": {"ProcTurbo": "x" * 257}}},
    {"bios": {"attributes": {"ProcTurbo": "a\nb"}}},
])  # fmt: skip
def test_what_cannot_be_meant_is_refused(state: dict[str, Any]) -> None:
    with pytest.raises(InvalidParameters, match=r"expect\.state\.(bios|bmc_accounts)"):
        expected(state)


def test_the_bmcs_areas_are_the_sites_not_the_ramdisks() -> None:
    e = expected({"bios": {}, "bmcAccounts": {}, "tpm": {}})
    assert e.site_areas == ["bios", "bmc_accounts"] and e.areas == ["tpm"]
    assert e.bios == {} and e.bmc_accounts == ()
    assert expected({"tpm": {}}).site_areas == []


def test_accounts_against_the_expected_set() -> None:
    e = expected({"bmcAccounts": {"accounts": [
        {"userName": "ops", "role": "Operator"}, {"userName": "spare", "disabled": True},
        {"userName": "audit"}, {"userName": "gone"}]}})
    seen = BmcObserved("site", accounts=[
        Account("2", "site", "Administrator", True),
        Account("3", "ops", "Administrator", True),          # a tenant raised its role
        Account("4", "spare", "ReadOnly", True),             # a tenant enabled it
        Account("5", "audit", "ReadOnly", False),            # expected enabled
        Account("6", "tenant", "Administrator", True),       # the tenant's own
        Account("7", "old", "Operator", False),              # disabled: no login, no finding
    ])
    found = checks(e, seen)
    assert set(found) == {("bmc.account_role", "ops"), ("bmc.account_enabled", "spare"),
                          ("bmc.account_enabled", "audit"), ("bmc.account_extra", "tenant"),
                          ("bmc.account_missing", "gone")}
    remedied = {k for k, m in found.items() if restorable(m)}
    assert remedied == {("bmc.account_enabled", "spare"), ("bmc.account_extra", "tenant")}
    for key in remedied:
        r = found[key].bmc_remedy
        assert (r.kind, r.operation, dict(r.parameters)) == ("bmc.rotate", "disable_account",
                                                             {"username": key[1]})
    role = found[("bmc.account_role", "ops")]
    assert (role.expected, role.found) == ("Operator", "Administrator")
    audit = found[("bmc.account_enabled", "audit")]
    assert (audit.expected, audit.found) == ("enabled", "disabled")


def test_an_enabled_account_without_a_name_is_named_by_its_id() -> None:
    """IPMI's user 1 (a null user name: the anonymous login) turned on by a tenant."""
    found = checks(expected({"bmcAccounts": {}}), BmcObserved("site", accounts=[
        Account("1", "", "Administrator", True), Account("2", "site", "Administrator", True)]))
    [(key, m)] = found.items()
    assert key == ("bmc.account_extra", "id 1") and not restorable(m)
    assert "anonymous login" in m.message


def test_the_sites_own_account_is_always_expected() -> None:
    e = expected({"bmcAccounts": {}})
    assert checks(e, BmcObserved("site", accounts=[Account("2", "site", "Administrator", True)])) == {}
    missing = checks(e, BmcObserved("site", accounts=[]))
    assert set(missing) == {("bmc.account_missing", "site")}
    off = checks(e, BmcObserved("site", accounts=[Account("2", "site", "Administrator", False)]))
    assert set(off) == {("bmc.account_enabled", "site")}
    assert not restorable(off[("bmc.account_enabled", "site")])


def test_bios_values_compared_as_the_registry_types_them() -> None:
    e = expected({"bios": {"attributes": {"Delay": "120", "Turbo": "true", "Mode": "Max"}}})
    same = BmcObserved("site", bios=[BiosValue("Delay", True, 120, current=120),
                                     BiosValue("Turbo", True, True, current=True, pending=True),
                                     BiosValue("Mode", True, "Max", current="Max")])
    assert checks(e, same) == {}
    differs = BmcObserved("site", bios=[BiosValue("Delay", True, 120, current=180),
                                        BiosValue("Turbo", True, True, current=True, pending=False),
                                        BiosValue("Mode", True, "Max", current="Min", pending="Max")])
    found = checks(e, differs)
    assert {k: (m.expected, m.found) for k, m in found.items()} == {
        ("bios.attribute", "Delay"): ("120", "current 180"),
        ("bios.attribute", "Turbo"): ("true", "current true, pending false"),
        ("bios.attribute", "Mode"): ("Max", "current Min, pending Max"),
    }
    assert found[("bios.attribute", "Turbo")].bmc_remedy.parameters["attributes"] == '{"Turbo": true}'
    assert found[("bios.attribute", "Delay")].bmc_remedy.parameters["attributes"] == '{"Delay": 120}'
    assert "takes effect at the next reset" in found[("bios.attribute", "Mode")].message


def test_what_could_not_be_read_is_a_finding_without_a_remedy() -> None:
    e = expected({"bios": {"attributes": {"Turbo": "true"}}, "bmcAccounts": {}})
    seen = BmcObserved("site", unread={"bios": "IPMI has no BIOS attributes",
                                       "bmc_accounts": "no AccountService"})
    found = checks(e, seen)
    assert set(found) == {("bios.unreadable", "bios"), ("bmc.unreadable", "accounts")}
    assert not any(restorable(m) for m in found.values())
    assert "no AccountService" in found[("bmc.unreadable", "accounts")].message
