"""The release gate's golden state, BMC half (#55): bmc.query baseline with expect.golden diffs
the BMC, read whole, against the golden state the tool captured (tests/site/bmc/golden/), each
change a finding named by source and path, with the site command that puts it back.

Each recorded tree, and ipmi_sim, against its own fixture: zero findings, every source counted.
Then what a tenant with the BMC's credentials leaves behind and a checklist misses, planted one
at a time on the Dell iDRAC recording (and DMTF's, and ipmi_sim for IPMI users by slot): each
found, its remedy sent as the control plane sends it (each write once), and the BMC clean after.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import Config
from agent.errors import InvalidParameters
from agent.policy.release.golden import Capture
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc.client import CallContext
from agent.site.bmc.redfish.session import RedfishSession
from qemu.ipmisim import IpmiSim, SimUser, start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from tests.site.bmc.golden_capture import FIXTURES, IPMI_SIM, IPMI_SIM_TWO_LANS, request, run
from tests.site.bmc.golden_capture import REF as REDFISH_REF
from tests.site.bmc.redfish_emulator import PASSWORD as EMULATOR_PASSWORD
from tests.site.bmc.redfish_emulator import USER as EMULATOR_USER
from tests.site.bmc.redfish_emulator import RedfishEmulator, tree_names
from tests.site.conftest import PASSWORD, REF, USERNAME, _skip_without_tools

DELL_SYSTEM = "/redfish/v1/Systems/System.Embedded.1"
DELL_PROTOCOL = "/redfish/v1/Managers/iDRAC.Embedded.1/NetworkProtocol"
SOURCES = {"bmc", "bios", "firmware"}


def golden_of(name: str) -> bytes:
    path = FIXTURES / f"{name}.json"
    if not path.exists():
        pytest.skip(f"no golden state of {name}: python -m tests.site.bmc.golden_capture {name}")
    return path.read_bytes()


def check(config: Config, address: str, name: str, protocol: str = "redfish",
          ref: str = "") -> agent_pb2.ReleaseReport:
    """bmc.query baseline against ``name``'s golden state: its release report."""
    payload = request(address, "baseline", protocol, ref or REDFISH_REF,
                      golden=golden_of(name))
    return run("bmc.query", config, payload).release


def found(report: agent_pb2.ReleaseReport) -> set[tuple[str, str]]:
    return {(m.check, m.where) for m in (*report.restorable, *report.cannot_restore)}


def put_back(config: Config, address: str, report: agent_pb2.ReleaseReport, protocol: str = "redfish",
             ref: str = "") -> list[site_pb2.BmcOperationResult]:
    """Each distinct remedy sent once, as the control plane sends them."""
    sent: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
    for m in report.restorable:
        r = m.bmc_remedy
        key = (r.kind, r.operation, tuple(sorted(r.parameters.items())))
        if key not in sent:
            sent.append(key)
    return [run(kind, config, request(address, operation, protocol, ref or REDFISH_REF,
                                      **dict(params)))
            for kind, operation, params in sent]


@pytest.fixture(scope="module")
def dell(trees: Path) -> Iterator[RedfishEmulator]:
    """The Dell iDRAC recording, shared by the plantings: each test leaves it clean (asserted)."""
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        yield bmc


@pytest.mark.slow
@pytest.mark.parametrize("tree", tree_names())
def test_a_recorded_tree_matches_its_golden_state(tree: str, trees: Path, emulator_config: Config) -> None:
    golden = golden_of(tree)
    with RedfishEmulator.of(tree, trees) as bmc:
        report = check(emulator_config, bmc.address, tree)
    assert found(report) == set() and report.pool_ready
    assert "golden" in report.checked
    counts = {c.source: c.compared for c in report.compared}
    assert set(counts) == SOURCES and not any(c.unreadable for c in report.compared)
    items = Capture.from_json(golden).sources
    varied = {c.source: c.varied for c in report.compared}
    assert all(counts[s] + varied[s] == len(items[s]) and counts[s] > 0 for s in SOURCES), (counts, varied)


def test_the_clean_dell_passes_and_a_golden_of_another_bmc_does_not(dell: RedfishEmulator,
                                                                    emulator_config: Config) -> None:
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()
    other = check(emulator_config, dell.address, "hpe_dl385")
    assert not other.pool_ready and len(found(other)) > 100


def test_an_event_subscription_to_an_outside_address_is_found_and_deleted(
        dell: RedfishEmulator, emulator_config: Config) -> None:
    # The tenant, with the BMC's credentials, subscribes an outside address to its events.
    s = RedfishSession(dell.target(), CallContext(cancel=threading.Event(), deadline=time.monotonic() + 60))
    try:
        made = s.send("POST", "/redfish/v1/EventService/Subscriptions",
                      json_body={"Destination": "https://203.0.113.9/collect", "Protocol": "Redfish"})
    finally:
        s.close()
    sid = made.doc["Id"]
    report = check(emulator_config, dell.address, "dell_r750")
    at = f"EventService/Subscriptions/{sid}/Destination"
    assert ("bmc.added", at) in found(report)
    m = next(m for m in report.restorable if m.where == at)
    assert m.found == "https://203.0.113.9/collect"
    assert (m.bmc_remedy.kind, m.bmc_remedy.operation, dict(m.bmc_remedy.parameters)) == \
        ("bmc.rotate", "delete_subscription", {"subscription": sid})
    assert not report.cannot_restore
    [done] = put_back(emulator_config, dell.address, report)
    assert done.state == "deleted"
    assert [p for _, p, _ in dell.writes("DELETE", sid)] == [f"/redfish/v1/EventService/Subscriptions/{sid}"]
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()


def test_the_vnc_server_turned_on_is_found_and_turned_off(dell: RedfishEmulator,
                                                          emulator_config: Config) -> None:
    with dell.state.lock:                     # iDRAC's VNC server: the NetworkProtocol's RFB
        dell.state.docs[DELL_PROTOCOL]["RFB"]["ProtocolEnabled"] = True
    report = check(emulator_config, dell.address, "dell_r750")
    assert found(report) == {("bmc.changed", "NetworkProtocol/RFB/ProtocolEnabled")}
    [m] = report.restorable
    assert (m.expected, m.found) == ("false", "true")
    assert dict(m.bmc_remedy.parameters) == {"protocol": "RFB", "enabled": "false"}
    before = len(dell.writes("PATCH"))
    [done] = put_back(emulator_config, dell.address, report)
    assert done.state == "turned off"
    assert [(p, b) for _, p, b in dell.writes("PATCH")[before:]] == [
        (DELL_PROTOCOL, {"RFB": {"ProtocolEnabled": False}})]
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()


def test_an_account_in_another_slot_with_an_expected_name_is_found_and_reset(
        dell: RedfishEmulator, emulator_config: Config) -> None:
    """forge_admin is slot 3's; a second forge_admin in empty slot 9 passes a check by name."""
    slot = "/redfish/v1/AccountService/Accounts/9"
    with dell.state.lock:
        golden_slot = {k: dell.state.docs[slot].get(k) for k in ("UserName", "RoleId", "Enabled")}
        dell.state.docs[slot].update({"UserName": "forge_admin", "RoleId": "Administrator", "Enabled": True})
    report = check(emulator_config, dell.address, "dell_r750")
    assert found(report) == {("bmc.changed", f"AccountService/Accounts/9/{k}") for k in golden_slot}
    remedies = {(m.bmc_remedy.operation, tuple(sorted(m.bmc_remedy.parameters.items())))
                for m in report.restorable}
    assert remedies == {("reset_account", (("account", "9"), ("enabled", "false"), ("role", "None"),
                                           ("user_name", "")))}
    [done] = put_back(emulator_config, dell.address, report)
    assert done.values["username"] == "" and done.values["enabled"] == "false"
    assert {k: dell.doc(slot).get(k) for k in golden_slot} == golden_slot
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()


def test_the_site_s_own_account_is_never_reset(dell: RedfishEmulator, emulator_config: Config) -> None:
    from tests.site.bmc.redfish_emulator import USER

    slot = "/redfish/v1/AccountService/Accounts/12"      # the site's own login, on this BMC
    with dell.state.lock:
        kept = dict(dell.state.docs[slot])
        dell.state.docs[slot].update({"UserName": USER, "Enabled": True})
    try:
        with pytest.raises(InvalidParameters, match="site's own account"):
            run("bmc.rotate", emulator_config, request(dell.address, "reset_account", account="12",
                                                       user_name="", enabled="false"))
        assert not dell.writes("PATCH", slot)
    finally:
        with dell.state.lock:
            dell.state.docs[slot] = kept


def test_the_bios_tpm_switched_off_is_found_and_set_back(dell: RedfishEmulator,
                                                         emulator_config: Config) -> None:
    with dell.state.lock:                     # switched off in the BIOS setup, applied
        dell.state.docs[f"{DELL_SYSTEM}/Bios"]["Attributes"]["TpmSecurity"] = "Off"
    report = check(emulator_config, dell.address, "dell_r750")
    assert found(report) == {("bios.changed", "Attributes/TpmSecurity")}
    [m] = report.restorable
    assert (m.expected, m.found) == ("On", "Off")
    assert (m.bmc_remedy.operation, json.loads(m.bmc_remedy.parameters["attributes"])) == \
        ("set_bios", {"TpmSecurity": "On"})
    put_back(emulator_config, dell.address, report)
    waiting = check(emulator_config, dell.address, "dell_r750")   # pending until the next reset
    assert found(waiting) == {("bios.changed", "Attributes/TpmSecurity"),
                              ("bios.added", "Pending/TpmSecurity")}
    run("bmc.power", emulator_config, request(dell.address, "reset"))
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()


def test_virtual_media_left_inserted_is_found_and_ejected(dell: RedfishEmulator,
                                                          emulator_config: Config) -> None:
    with dell.state.lock:
        dell.state.docs[f"{DELL_SYSTEM}/VirtualMedia/1"].update(
            {"Image": "http://203.0.113.9/tenant.iso", "Inserted": True, "ConnectedVia": "URI"})
    report = check(emulator_config, dell.address, "dell_r750")
    assert found(report) == {("bmc.changed", f"VirtualMedia/1/{k}")
                             for k in ("Image", "Inserted", "ConnectedVia")}
    assert {(m.bmc_remedy.kind, m.bmc_remedy.operation) for m in report.restorable} == \
        {("bmc.storage", "eject_media")}
    put_back(emulator_config, dell.address, report)
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()


def test_a_persistent_boot_override_is_found_and_cleared(dell: RedfishEmulator,
                                                         emulator_config: Config) -> None:
    run("bmc.boot", emulator_config,
        request(dell.address, "set_boot_device", device="cdrom", persistent="true"))
    report = check(emulator_config, dell.address, "dell_r750")
    assert found(report) == {("bmc.changed", "Boot/BootSourceOverrideEnabled"),
                             ("bmc.changed", "Boot/BootSourceOverrideTarget")}
    assert {(m.bmc_remedy.kind, m.bmc_remedy.operation, m.bmc_remedy.parameters["device"])
            for m in report.restorable} == {("bmc.boot", "set_boot_device", "none")}
    put_back(emulator_config, dell.address, report)
    assert found(check(emulator_config, dell.address, "dell_r750")) == set()


def test_an_unreadable_source_is_a_finding(trees: Path, emulator_config: Config) -> None:
    """The Bios gone (404: the System links one it does not answer): bios.unreadable, never a pass."""
    with RedfishEmulator.of("nvidia_bluefield3", trees) as bmc:
        bios = "/redfish/v1/Systems/Bluefield/Bios"
        bmc.state.gone.add(bios)
        report = check(emulator_config, bmc.address, "nvidia_bluefield3")
        assert ("bios.unreadable", "bios") in found(report)
        counts = {c.source: c.unreadable for c in report.compared}
        assert counts["bios"] and not counts["bmc"]
        assert not report.pool_ready


# -- IPMI: users by slot and channel ---------------------------------------------------------


@pytest.fixture
def tenant_sim(tmp_path: Path) -> Iterator[IpmiSim]:
    """ipmi_sim with a second user named as the site's own (bcadmin) in slot 5."""
    _skip_without_tools()
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    s = start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD,
                       users=[SimUser(5, USERNAME, "Tenant-Pass-77", "admin")])
    yield s
    s.stop()


def test_ipmi_sim_matches_its_golden_state(sim: IpmiSim, site_config: Config) -> None:
    report = check(site_config, sim.address, IPMI_SIM, "ipmi", REF)
    assert found(report) == set() and report.pool_ready
    assert {c.source for c in report.compared} == {"ipmi", "firmware"}
    # A golden captured over Redfish, checked over IPMI: its Redfish sources are not a pass.
    other = check(site_config, sim.address, "dell_r750", "ipmi", REF)
    unread = {c.source: c.unreadable for c in other.compared if c.unreadable}
    assert set(unread) == {"bmc", "bios"} and "not read over ipmi" in unread["bmc"]
    assert {("bmc.unreadable", "bmc"), ("bios.unreadable", "bios")} <= found(other)


def test_a_second_ipmi_user_with_an_expected_name_is_found_and_reset(tenant_sim: IpmiSim,
                                                                     site_config: Config) -> None:
    report = check(site_config, tenant_sim.address, IPMI_SIM, "ipmi", REF)
    assert ("ipmi.changed", "users/5/name") in found(report)
    assert ("ipmi.changed", "users/5/channel/1/Privilege Level") in found(report)
    assert {(m.bmc_remedy.operation, tuple(sorted(m.bmc_remedy.parameters.items())))
            for m in report.restorable if m.where.startswith("users/")} == \
        {("reset_account", (("account", "5"), ("enabled", "false"), ("role", "NO ACCESS"),
                            ("user_name", "")))}
    put_back(site_config, tenant_sim.address, report, "ipmi", REF)
    after = check(site_config, tenant_sim.address, IPMI_SIM, "ipmi", REF)
    assert found(after) == set() and after.pool_ready


@pytest.fixture
def two_lans(tmp_path: Path) -> Iterator[IpmiSim]:
    """ipmi_sim with a second LAN channel (2), as a BMC with a second NIC has."""
    _skip_without_tools()
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    s = start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD, more_lans=(2,))
    yield s
    s.stop()


def test_only_the_channels_the_bmc_has_are_read() -> None:
    """Get Channel Info decides (ipmi_sim answers channel getaccess for any channel): the
    one-LAN sim's capture names channels 0, 1 and 15, the two-LAN one's 2 as well, with its
    users' access and its LAN configuration."""
    def channels(name: str) -> set[str]:
        return {p.split("/")[1] for p in Capture.from_json(golden_of(name)).sources["ipmi"]
                if p.startswith("channel/")}

    assert channels(IPMI_SIM) == {"0", "1", "15"}
    assert channels(IPMI_SIM_TWO_LANS) == {"0", "1", "2", "15"}
    two = Capture.from_json(golden_of(IPMI_SIM_TWO_LANS)).sources["ipmi"]
    assert two["users/2/channel/2/Privilege Level"] == "ADMINISTRATOR" and "lan/2/IP Address" in two
    assert not any("/channel/0/" in p or "/channel/15/" in p for p in two)   # session-less: no users


def test_a_user_given_access_on_another_channel_is_found(two_lans: IpmiSim, site_config: Config) -> None:
    """User 3 (nameless, disabled in the golden state) made an administrator with IPMI messaging
    on LAN channel 2 (Set User Access, as a tenant with the BMC's credentials would): found at
    its path on channel 2. The remedy (bmc.rotate reset_account) writes the site's channel (1)
    only, so channel 2's finding is for an operator. ipmi_sim keeps one access per user, not one
    per channel: the same change shows on channel 1 too, where reset_account puts it back (on a
    BMC that keeps them apart, channel 1's would not have changed)."""
    clean = check(site_config, two_lans.address, IPMI_SIM_TWO_LANS, "ipmi", REF)
    assert found(clean) == set() and clean.pool_ready
    planted = two_lans.ipmitool("raw", "0x06", "0x43", "0x92", "0x03", "0x04")   # channel 2, admin
    assert planted.returncode == 0, planted.stderr
    report = check(site_config, two_lans.address, IPMI_SIM_TWO_LANS, "ipmi", REF)
    on_2 = {("ipmi.changed", "users/3/channel/2/Privilege Level"),
            ("ipmi.changed", "users/3/channel/2/IPMI Messaging")}
    assert on_2 <= found(report) and not report.pool_ready
    assert on_2 <= {(m.check, m.where) for m in report.cannot_restore}
    put_back(site_config, two_lans.address, report, "ipmi", REF)
    after = check(site_config, two_lans.address, IPMI_SIM_TWO_LANS, "ipmi", REF)
    assert found(after) == set() and after.pool_ready


def test_a_bmc_with_both_protocols_is_captured_and_checked_over_both(
        dell: RedfishEmulator, emulator_config: Config, tmp_path: Path) -> None:
    """Redfish has no resource for IPMI's users by slot and channel, cipher suites or LAN
    settings: a BMC that speaks both (the Dell recording, and ipmi_sim as its IPMI LAN, one
    account on both) is captured and checked over Redfish with ``ipmi_address``, its "ipmi"
    source read over IPMI. The capture's parts are what each protocol alone captures (the
    checked-in fixtures); a clean check has zero findings over four sources; an IPMI user named
    as the site's is found, without a remedy (a BmcRemedy goes over the request's protocol, where
    slot 5 may be another account: the ipmi-only check names it); without ipmi_address the
    source is unreadable, a finding."""
    _skip_without_tools()
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    sim = start_ipmi_sim(tmp_path / "ipmi", node, EMULATOR_USER, EMULATOR_PASSWORD)
    try:
        got = run("bmc.query", emulator_config, request(dell.address, "golden", ipmi_address=sim.address))
        both = Capture.from_json(got.values["capture"])
        assert set(both.sources) == {*SOURCES, "ipmi"} and not both.unreadable, both.unreadable
        assert both.sources["ipmi"] == Capture.from_json(golden_of(IPMI_SIM)).sources["ipmi"]
        golden = Capture({**Capture.from_json(golden_of("dell_r750")).sources,
                          "ipmi": Capture.from_json(golden_of(IPMI_SIM)).sources["ipmi"]}).to_json()

        def baseline(**over: str) -> agent_pb2.ReleaseReport:
            return run("bmc.query", emulator_config,
                       request(dell.address, "baseline", golden=golden, **over)).release

        clean = baseline(ipmi_address=sim.address)
        assert found(clean) == set() and clean.pool_ready
        assert {c.source for c in clean.compared if c.compared and not c.unreadable} == {*SOURCES, "ipmi"}
        named = sim.ipmitool("user", "set", "name", "5", EMULATOR_USER)
        assert named.returncode == 0, named.stderr
        planted = baseline(ipmi_address=sim.address)
        assert ("ipmi.changed", "users/5/name") in {(m.check, m.where) for m in planted.cannot_restore}
        assert not planted.restorable and not planted.pool_ready
        one = baseline()
        assert ("ipmi.unreadable", "ipmi") in found(one) and not one.pool_ready
        assert "ipmi_address" in next(c.unreadable for c in one.compared if c.source == "ipmi")
    finally:
        sim.stop()



def test_ipmi_address_is_for_a_check_over_redfish_and_a_valid_address() -> None:
    from agent.commands.bmc_params import parse_request

    with pytest.raises(InvalidParameters, match="ipmi_address is for a BMC checked over redfish"):
        parse_request("bmc.query", request("127.0.0.1:623", "golden", "ipmi", REF,
                                           ipmi_address="127.0.0.1:624"))
    with pytest.raises(InvalidParameters):
        parse_request("bmc.query", request("127.0.0.1:8443", "golden", ipmi_address="no such:host:x"))
    params = parse_request("bmc.query", request("127.0.0.1:8443", "golden", ipmi_address="127.0.0.1:624"))
    assert params.args.ipmi_address == "127.0.0.1:624"
