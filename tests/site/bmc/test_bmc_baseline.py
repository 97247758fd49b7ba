"""The BMC's half of the release gate (bmc.query baseline) and its remedies (bmc.rotate
disable_account, bmc.firmware set_bios), against a real ipmi_sim (no QEMU) and the project's
Redfish emulator serving Dell's recorded R750 tree: residue a tenant leaves (an extra IPMI user,
an extra Redfish account, a BIOS attribute changed) found, put back by the remedy each finding
carries, sent as the control plane would, and gone on the next check; a clean BMC passes with no
finding."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.catalog import KINDS
from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.proto import agent_pb2, session_pb2, site_pb2
from agent.site.bmc.client import CallContext, Credentials, Target
from agent.site.bmc.ipmi import IpmiClient
from qemu.ipmisim import IpmiSim, SimUser, start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from tests.runtime.core_harness import World, accepted, rejected
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.test_bmc_redfish import REF, config_with
from tests.site.conftest import PASSWORD, USERNAME
from tests.site.test_site_agent import site_agent

TENANT_PASSWORD = "Tenant-Pw-9x2"
DELL_ACCOUNTS = "/redfish/v1/AccountService/Accounts"
ROOT_PASSWORD = "Root-Pass-3Jd8"


def run_kind(config: Config, payload: site_pb2.BmcOperationRequest, kind: str) -> site_pb2.BmcOperationResult:
    handler = handler_for(kind)
    assert handler is not None
    result = handler.run(Context.local(kind, config, timeout=120), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


class Bmc:
    """One BMC as the control plane addresses it: its address, protocol and credentials_ref."""

    def __init__(self, config: Config, address: str, protocol: str) -> None:
        self.config, self.address, self.protocol = config, address, protocol

    def request(self, operation: str, expect: dict[str, Any] | None = None,
                **parameters: str) -> site_pb2.BmcOperationRequest:
        payload = site_pb2.BmcOperationRequest(
            node_id="n01", bmc_address=self.address, protocol=self.protocol, operation=operation,
            credentials_ref=REF, verify_tls=False, parameters=parameters)
        if expect is not None:
            json_format.ParseDict(expect, payload.expect)
        return payload

    def check(self, expect: dict[str, Any]) -> agent_pb2.ReleaseReport:
        result = run_kind(self.config, self.request("baseline", expect), "bmc.query")
        report = result.release
        assert result.state == ("pool_ready" if report.pool_ready else
                                f"{len(report.restorable) + len(report.cannot_restore)} finding(s)")
        return report

    def put_back(self, report: agent_pb2.ReleaseReport) -> list[site_pb2.BmcOperationResult]:
        """Every remedy as the control plane sends it: the same BMC, protocol and credentials."""
        done = []
        for m in report.restorable:
            r = m.bmc_remedy
            done.append(run_kind(self.config, self.request(r.operation, **dict(r.parameters)), r.kind))
        return done


def findings(report: agent_pb2.ReleaseReport) -> set[tuple[str, str]]:
    return {(m.check, m.where) for m in [*report.restorable, *report.cannot_restore]}


# -- IPMI: ipmi_sim -------------------------------------------------------------------------


def _sim(tmp_path: Path, users: list[SimUser]) -> IpmiSim:
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openipmi ipmitool)")
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    return start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD, users=users)


@pytest.fixture
def tenant_sim(tmp_path: Path) -> Iterator[IpmiSim]:
    """ipmi_sim with what a tenant left: an enabled admin "tenant" (user 3); and a disabled
    "spare" operator (user 4), which no one can log in as and so is no finding."""
    sim = _sim(tmp_path, [SimUser(3, "tenant", TENANT_PASSWORD, "admin"),
                          SimUser(4, "spare", "Spare-Pw-1q", "operator", enabled=False)])
    yield sim
    sim.stop()


@pytest.fixture
def clean_sim(tmp_path: Path) -> Iterator[IpmiSim]:
    sim = _sim(tmp_path, [])
    yield sim
    sim.stop()


def ipmi_bmc(tmp_path: Path, sim: IpmiSim) -> Bmc:
    return Bmc(config_with(tmp_path, USERNAME, PASSWORD), sim.address, "ipmi")


def can_log_in(sim: IpmiSim, username: str, password: str) -> bool:
    call = CallContext(cancel=threading.Event(), deadline=time.monotonic() + 60)
    client = IpmiClient(Target(sim.address, Credentials(USERNAME, PASSWORD)), call)
    return client.check_login(Credentials(username, password))


def test_ipmi_an_extra_user_is_found_disabled_and_gone(tmp_path: Path, tenant_sim: IpmiSim) -> None:
    bmc = ipmi_bmc(tmp_path, tenant_sim)
    assert can_log_in(tenant_sim, "tenant", TENANT_PASSWORD)
    report = bmc.check({"bmcAccounts": {}})                 # only the site's own account expected
    assert not report.pool_ready and list(report.checked) == ["bmc_accounts"]
    [m] = report.restorable
    assert (m.check, m.where, m.expected, m.found) == ("bmc.account_extra", "tenant", "absent",
                                                       "Administrator, enabled")
    assert (m.bmc_remedy.kind, m.bmc_remedy.operation, dict(m.bmc_remedy.parameters)) == \
        ("bmc.rotate", "disable_account", {"username": "tenant"})
    assert not report.cannot_restore
    [done] = bmc.put_back(report)
    assert done.state == "disabled" and dict(done.values) == {"username": "tenant", "accounts": "3"}
    assert not can_log_in(tenant_sim, "tenant", TENANT_PASSWORD)   # the BMC itself refuses it now
    again = bmc.check({"bmcAccounts": {}})
    assert again.pool_ready and not again.restorable and not again.cannot_restore
    assert can_log_in(tenant_sim, USERNAME, PASSWORD)               # the site's own is untouched


def test_ipmi_a_clean_bmc_passes_with_no_finding(tmp_path: Path, clean_sim: IpmiSim) -> None:
    bmc = ipmi_bmc(tmp_path, clean_sim)
    expect = {"bmcAccounts": {"accounts": [{"userName": USERNAME, "role": "Administrator"}]}}
    report = bmc.check(expect)
    assert report.pool_ready and not report.restorable and not report.cannot_restore


def test_ipmi_role_missing_account_and_bios_are_named_without_a_remedy(tmp_path: Path,
                                                                       clean_sim: IpmiSim) -> None:
    bmc = ipmi_bmc(tmp_path, clean_sim)
    report = bmc.check({"bmcAccounts": {"accounts": [{"userName": USERNAME, "role": "Operator"},
                                                     {"userName": "oncall"}]},
                        "bios": {"attributes": {"LogicalProc": "Enabled"}}})
    assert not report.restorable
    assert findings(report) == {("bmc.account_role", USERNAME), ("bmc.account_missing", "oncall"),
                                ("bios.unreadable", "bios")}
    role = next(m for m in report.cannot_restore if m.check == "bmc.account_role")
    assert (role.expected, role.found) == ("Operator", "Administrator")


def test_ipmi_the_sites_own_account_is_never_disabled(tmp_path: Path, clean_sim: IpmiSim) -> None:
    bmc = ipmi_bmc(tmp_path, clean_sim)
    with pytest.raises(InvalidParameters, match="the site's own account"):
        run_kind(bmc.config, bmc.request("disable_account", username=USERNAME), "bmc.rotate")
    assert can_log_in(clean_sim, USERNAME, PASSWORD)


# -- Redfish: the project's emulator, Dell R750 -----------------------------------------------


@pytest.fixture
def dell(trees: Path) -> Iterator[RedfishEmulator]:
    """The R750 as recorded: root (the site's account here) and forge_admin enabled, the other
    slots empty or disabled (fwupd)."""
    with RedfishEmulator.of("dell_r750", trees, user="root", password=ROOT_PASSWORD) as bmc:
        yield bmc


DELL_BASELINE = {"bmcAccounts": {"accounts": [{"userName": "forge_admin", "role": "Administrator"}]},
                 "bios": {"attributes": {"LogicalProc": "Enabled", "AcPwrRcvryUserDelay": "120"}}}


def redfish_bmc(tmp_path: Path, emulator: RedfishEmulator) -> Bmc:
    return Bmc(config_with(tmp_path, "root", ROOT_PASSWORD), emulator.address, "redfish")


def test_redfish_a_clean_bmc_passes_with_no_finding(tmp_path: Path, dell: RedfishEmulator) -> None:
    report = redfish_bmc(tmp_path, dell).check(DELL_BASELINE)
    assert report.pool_ready and not report.restorable and not report.cannot_restore
    assert list(report.checked) == ["bios", "bmc_accounts"] and not report.checked_elsewhere
    assert not dell.writes("PATCH") and not dell.writes("POST", "/Accounts")


def test_redfish_an_extra_account_and_a_changed_bios_attribute_are_found_and_put_back(
        tmp_path: Path, dell: RedfishEmulator) -> None:
    bmc = redfish_bmc(tmp_path, dell)
    # The tenant's residue: an iDRAC slot given a user (as iDRAC creates one: a PATCH of an empty
    # slot), and LogicalProc turned off through the BIOS settings, applied at a reset.
    with dell.state.lock:
        dell.state.docs[f"{DELL_ACCOUNTS}/5"].update(
            {"UserName": "tenant", "RoleId": "Administrator", "Enabled": True})
    run_kind(bmc.config, bmc.request("set_bios", attributes='{"LogicalProc": "Disabled"}'), "bmc.firmware")
    run_kind(bmc.config, bmc.request("reset"), "bmc.power")

    report = bmc.check(DELL_BASELINE)
    assert not report.pool_ready and not report.cannot_restore
    assert findings(report) == {("bmc.account_extra", "tenant"), ("bios.attribute", "LogicalProc")}
    bios = next(m for m in report.restorable if m.check == "bios.attribute")
    assert (bios.expected, bios.found) == ("Enabled", "current Disabled")   # applied: none pending
    assert (bios.bmc_remedy.kind, bios.bmc_remedy.operation) == ("bmc.firmware", "set_bios")
    assert json.loads(bios.bmc_remedy.parameters["attributes"]) == {"LogicalProc": "Enabled"}

    before = len(dell.writes("PATCH"))
    bmc.put_back(report)
    writes = dell.writes("PATCH")[before:]
    assert [(path, body) for _, path, body in writes] == [
        (f"{DELL_ACCOUNTS}/5", {"Enabled": False}),
        ("/redfish/v1/Systems/System.Embedded.1/Bios/Settings",
         {"Attributes": {"LogicalProc": "Enabled"}, "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}),
    ]                                                   # each write once
    assert dell.doc(f"{DELL_ACCOUNTS}/5")["Enabled"] is False

    # The account is gone at once; the BIOS value waits for the next reset, and says so.
    waiting = bmc.check(DELL_BASELINE)
    [m] = waiting.restorable
    assert (m.check, m.found) == ("bios.attribute", "current Disabled, pending Enabled")
    assert "takes effect at the next reset" in m.message
    run_kind(bmc.config, bmc.request("reset"), "bmc.power")
    after = bmc.check(DELL_BASELINE)
    assert after.pool_ready and not after.restorable and not after.cannot_restore


# Each recorded tree that lists accounts with Enabled: (the site's login, a recorded account that
# plays the tenant's). Every other named, enabled account its collection lists is the baseline's.
# (DMTF's public mockup lists one account, Administrator: no second one to play the tenant.)
TENANTS = {
    "dell_r750": ("root", "forge_admin"),
    "lenovo_sr670": ("USERID", "dcops"),
    "nvidia_bluefield3": ("root", "forge_admin"),
    "nvidia_dgxh100": ("admin", "S6AmJsX9uejbhS2r"),
    "nvidia_gb200": ("root", "ipmiuser"),
    "nvidia_gh200": ("root", "G1ZgR8ufrlnPjwJg"),
    "supermicro_sys821": ("root", "tests_admin"),
}


def recorded_accounts(bmc: RedfishEmulator) -> dict[str, tuple[str, dict[str, Any]]]:
    """UserName -> (path, the account) of those the recording's Accounts collection lists."""
    members = bmc.doc("/redfish/v1/AccountService/Accounts")["Members"]
    docs = {m["@odata.id"].rstrip("/"): bmc.doc(m["@odata.id"]) for m in members}
    return {d["UserName"]: (p, d) for p, d in docs.items() if d.get("UserName")}


@pytest.mark.parametrize("tree", sorted(TENANTS))
def test_redfish_an_extra_account_is_disabled_on_every_recorded_bmc(tree: str, trees: Path,
                                                                    tmp_path: Path) -> None:
    login, tenant = TENANTS[tree]
    with RedfishEmulator.of(tree, trees, user=login, password=ROOT_PASSWORD) as emulator:
        bmc = Bmc(config_with(tmp_path, login, ROOT_PASSWORD), emulator.address, "redfish")
        recorded = recorded_accounts(emulator)
        baseline = [{"userName": name, "role": a["RoleId"]} for name, (_, a) in sorted(recorded.items())
                    if a.get("Enabled") is True and name not in (login, tenant)]
        expect = {"bmcAccounts": {"accounts": baseline}}
        report = bmc.check(expect)
        assert findings(report) == {("bmc.account_extra", tenant)} and not report.cannot_restore
        bmc.put_back(report)
        path = recorded[tenant][0]
        assert [(p, body) for _, p, body in emulator.writes("PATCH")] == [(path, {"Enabled": False})]
        assert emulator.doc(path)["Enabled"] is False
        assert bmc.check(expect).pool_ready


def test_redfish_accounts_without_enabled_are_found_but_not_disabled(trees: Path, tmp_path: Path) -> None:
    """The iLO 5 recording's accounts have no Enabled: each logs in, so the tenant's is found;
    this BMC cannot disable it over Redfish, which is said, and nothing is written."""
    with RedfishEmulator.of("hpe_dl385", trees, user="root", password=ROOT_PASSWORD) as emulator:
        bmc = Bmc(config_with(tmp_path, "root", ROOT_PASSWORD), emulator.address, "redfish")
        report = bmc.check({"bmcAccounts": {}})
        assert findings(report) == {("bmc.account_extra", "tests_admin")}
        with pytest.raises(Unsupported, match="no Enabled property"):
            bmc.put_back(report)
        assert not emulator.writes("PATCH")


def test_redfish_bios_without_a_registry_is_named_unreadable(trees: Path, tmp_path: Path) -> None:
    with RedfishEmulator.of("supermicro_sys821", trees, user="root", password=ROOT_PASSWORD) as emulator:
        bmc = Bmc(config_with(tmp_path, "root", ROOT_PASSWORD), emulator.address, "redfish")
        report = bmc.check({"bios": {"attributes": {"QuietBoot": "true"}}})
        [m] = report.cannot_restore
        assert m.check == "bios.unreadable" and "publishes no BIOS AttributeRegistry" in m.message


def test_redfish_an_attribute_unknown_to_the_registry_is_itself_a_finding(tmp_path: Path,
                                                                         dell: RedfishEmulator) -> None:
    report = redfish_bmc(tmp_path, dell).check(
        {"bios": {"attributes": {"NoSuchThing": "1", "LogicalProc": "Maybe", "AcPwrRcvryUserDelay": "120"}}})
    assert not report.restorable
    assert findings(report) == {("bios.unknown_attribute", "NoSuchThing"),
                                ("bios.invalid_value", "LogicalProc")}
    invalid = next(m for m in report.cannot_restore if m.check == "bios.invalid_value")
    assert "'Maybe' is not one of" in invalid.found


def test_the_ramdisks_areas_are_named_as_checked_elsewhere(tmp_path: Path, dell: RedfishEmulator) -> None:
    report = redfish_bmc(tmp_path, dell).check({**DELL_BASELINE, "tpm": {}, "gpus": {"atDefaults": True}})
    assert report.pool_ready and list(report.checked_elsewhere) == ["gpus", "tpm"]


# -- what is refused before anything runs ----------------------------------------------------


@pytest.mark.parametrize(("operation", "expect", "parameters", "message"), [
    ("baseline", None, {}, "expect is required"),
    ("baseline", {"tpm": {}}, {}, "sets neither bios nor bmc_accounts"),
    ("baseline", {"wipes": {}}, {}, "sets neither bios nor bmc_accounts"),
    ("query", {"bmcAccounts": {}}, {}, "takes no expect"),
    ("baseline", {"bmcAccounts": {"accounts": [{"userName": "a"}, {"userName": "a"}]}}, {}, "once"),
    ("baseline", {"bios": {"attributes": {"bad name": "1"}}}, {}, "an attribute name"),
])
def test_bad_requests_are_refused_at_parse(operation: str, expect: dict[str, Any] | None,
                                           parameters: dict[str, str], message: str, tmp_path: Path) -> None:
    bmc = Bmc(config_with(tmp_path, "u", "p"), "127.0.0.1:9", "redfish")
    handler = handler_for("bmc.query")
    assert handler is not None
    with pytest.raises(InvalidParameters, match=message):
        handler.parse(bmc.request(operation, expect, **parameters))


def test_disable_account_takes_a_user_name(tmp_path: Path) -> None:
    handler = handler_for("bmc.rotate")
    assert handler is not None
    bmc = Bmc(config_with(tmp_path, "u", "p"), "127.0.0.1:9", "ipmi")
    with pytest.raises(InvalidParameters, match="missing parameter"):
        handler.parse(bmc.request("disable_account"))
    with pytest.raises(InvalidParameters, match="printable"):
        handler.parse(bmc.request("disable_account", username="bad\nname"))


def test_through_the_agent_disable_account_runs_only_signed(tmp_path: Path, tenant_sim: IpmiSim,
                                                            world: World) -> None:
    """The remedy that writes an account rides on bmc.rotate: destructive, so the site daemon
    refuses it unsigned (and the account stays as it was) and runs it signed."""
    assert KINDS["bmc.rotate"].destructive
    agent, frames = site_agent(world, config_with(tmp_path, USERNAME, PASSWORD), kinds=("bmc.rotate",))

    def disable(cid: str, sign: bool) -> session_pb2.SignedCommand:
        payload = Bmc(agent.config, tenant_sim.address, "ipmi").request("disable_account", username="tenant")
        return world.command(cid, "bmc.rotate", payload, sign=sign)

    assert rejected(agent.submit(disable("d1", sign=False))) == "signature_missing"
    assert can_log_in(tenant_sim, "tenant", TENANT_PASSWORD)
    accepted(agent.submit(disable("d2", sign=True)))
    done = frames.result("d2", timeout=60)
    assert done.status == session_pb2.SUCCEEDED, done
    assert not can_log_in(tenant_sim, "tenant", TENANT_PASSWORD)
