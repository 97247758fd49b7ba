"""The BMC's management posture (issue 53, item 5) on the eight recorded BMCs
(../shared/vendor-trees) through the project's emulator: bmc.query reads each tree's
ManagerNetworkProtocol as recorded; the release gate (bmc.query baseline, with the site's
``bmc_posture`` setting) finds a drifted posture and writes nothing, naming bmc.firmware
restore_posture where the BMC takes the write; that puts it back by one PATCH, read back, and
reports for an operator what the BMC refuses, ignores or does not list."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import InvalidParameters
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc import posture
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import run_kind
from tests.site.bmc.redfish_emulator.server import USER
from tests.site.bmc.test_bmc_redfish import REF

FLEET = "ipmi=off,http=off,https=on"

# What each recording's ManagerNetworkProtocol says (the Manager of the System; the notes in
# ../shared/notes/bmc-consoles-and-posture.md): protocol -> (enabled, port); absent: not listed.
RECORDED: dict[str, dict[str, tuple[bool, int]]] = {
    "dell_r750": {"IPMI": (True, 0), "HTTP": (True, 80), "HTTPS": (True, 443), "SSH": (True, 22),
                  "KVMIP": (True, 5900), "VirtualMedia": (True, 0)},
    "hpe_dl385": {"IPMI": (False, 623), "HTTP": (True, 80), "HTTPS": (True, 443), "SSH": (True, 22),
                  "KVMIP": (True, 17990), "SSDP": (True, 1900), "VirtualMedia": (True, 17988)},
    "lenovo_sr670": {"IPMI": (True, 623), "HTTP": (True, 80), "HTTPS": (True, 443), "SSH": (True, 22),
                     "KVMIP": (True, 3900), "SSDP": (True, 1900), "VirtualMedia": (True, 3900)},
    "supermicro_sys821": {"IPMI": (True, 623), "HTTP": (True, 80), "HTTPS": (True, 443), "SSH": (True, 22),
                          "KVMIP": (True, 5900), "SSDP": (True, 1900), "VirtualMedia": (True, 623)},
    "nvidia_dgxh100": {"IPMI": (True, 623), "HTTPS": (True, 443), "SSH": (True, 22), "KVMIP": (True, 443),
                       "SSDP": (True, 1900), "VirtualMedia": (True, 443)},
    "nvidia_gh200": {"IPMI": (True, 623), "HTTP": (False, 0), "HTTPS": (True, 443), "SSH": (True, 22)},
    "nvidia_gb200": {"IPMI": (True, 623), "HTTP": (False, 0), "HTTPS": (True, 443), "SSH": (True, 22)},
    "nvidia_bluefield3": {"IPMI": (True, 623), "HTTP": (False, 0), "HTTPS": (True, 443), "SSH": (True, 22)},
}
TREES = sorted(RECORDED)


# The Manager of the System, whose NetworkProtocol the site reads (not the HGX HMC's).
MANAGER = {"dell_r750": "iDRAC.Embedded.1", "hpe_dl385": "1", "lenovo_sr670": "1", "supermicro_sys821": "1",
           "nvidia_dgxh100": "BMC", "nvidia_gh200": "BMC_0", "nvidia_gb200": "BMC_0",
           "nvidia_bluefield3": "Bluefield_BMC"}


def network_protocol(tree: str) -> str:
    return f"/redfish/v1/Managers/{MANAGER[tree]}/NetworkProtocol"


def _run(kind: str, operation: str, config: Config, bmc: RedfishEmulator, fleet: str,
         vendor: str) -> tuple[site_pb2.BmcOperationResult, list[agent_pb2.Mismatch]]:
    payload = site_pb2.BmcOperationRequest(node_id="n1", bmc_address=bmc.address, protocol="redfish",
                                           operation=operation, credentials_ref=REF, verify_tls=False)
    if vendor:
        payload.parameters["vendor"] = vendor
    if operation == "baseline":
        payload.expect.bmc_accounts.accounts.add(user_name=USER)
    handler = handler_for(kind)
    assert handler is not None
    settings = dataclasses.replace(config, bmc_posture=fleet)
    result = handler.run(Context.local(kind, settings, timeout=60), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    report = result.release
    found = [m for m in (*report.restorable, *report.cannot_restore) if m.check == "bmc.posture"]
    assert "bmc_posture" in result.release.checked
    return result, found


def gate(config: Config, bmc: RedfishEmulator, fleet: str = FLEET,
         vendor: str = "") -> tuple[site_pb2.BmcOperationResult, list[agent_pb2.Mismatch]]:
    """bmc.query baseline with the site's ``bmc_posture`` set to ``fleet`` (the accounts area set
    too, as the baseline needs one of the BMC's areas); the result and its posture findings."""
    return _run("bmc.query", "baseline", config, bmc, fleet, vendor)


def restore(config: Config, bmc: RedfishEmulator, fleet: str = FLEET,
            vendor: str = "") -> tuple[site_pb2.BmcOperationResult, list[agent_pb2.Mismatch]]:
    """bmc.firmware restore_posture: the result and the posture findings still standing."""
    return _run("bmc.firmware", "restore_posture", config, bmc, fleet, vendor)


@pytest.mark.parametrize("tree", TREES)
def test_bmc_query_reports_each_trees_management_posture(trees: Path, emulator_config: Config,
                                                         tree: str) -> None:
    with RedfishEmulator.of(tree, trees) as bmc:
        result = run_kind("bmc.query", emulator_config, bmc, "query")
    got = {m.protocol: (m.enabled, m.port) for m in result.management if m.listed}
    assert got == RECORDED[tree]
    assert [m.protocol for m in result.management] == list(posture.PROTOCOLS)
    assert "partial" not in result.values or "management" not in result.values["partial"]


@pytest.mark.parametrize("tree", TREES)
def test_the_gate_finds_a_drifted_posture_and_restore_puts_it_back_once(
        trees: Path, emulator_config: Config, tree: str) -> None:
    """IPMI and HTTP on where the recording has them on: the gate writes nothing and names
    bmc.firmware restore_posture; that sends one PATCH, read back off, and the next check finds
    the posture in line with nothing sent. HTTP the BMC does not list (DGX H100) stays a finding:
    its state cannot be told."""
    with RedfishEmulator.of(tree, trees) as bmc:
        path = network_protocol(tree)
        recorded = RECORDED[tree]
        drifted = [f"{p} off" for p in ("IPMI", "HTTP") if recorded.get(p, (False, 0))[0]]
        before = bmc.doc(path)
        _, checked = gate(emulator_config, bmc)
        assert not bmc.writes("PATCH", path)
        remedied = sorted(m.where for m in checked if m.HasField("bmc_remedy"))
        assert remedied == sorted(p.split()[0] for p in drifted)
        assert all(m.bmc_remedy.kind == "bmc.firmware" and m.bmc_remedy.operation == "restore_posture"
                   for m in checked if m.HasField("bmc_remedy"))
        result, found = restore(emulator_config, bmc)
        patches = bmc.writes("PATCH", path)
        assert len(patches) == (1 if drifted else 0)
        if drifted:
            assert patches[0][2] == {p.split()[0]: {"ProtocolEnabled": False} for p in drifted}
            assert result.values["posture_restored"] == ", ".join(drifted)
        doc = bmc.doc(path)
        for p in ("IPMI", "HTTP"):
            if p in doc:
                assert doc[p] == before[p] | {"ProtocolEnabled": False}      # its Port kept
        unlisted = [p for p in ("IPMI", "HTTP", "HTTPS") if p not in recorded]
        assert sorted(m.where for m in found) == unlisted
        assert all(m.found == "not listed" and not m.HasField("bmc_remedy") for m in found)
        _, again = gate(emulator_config, bmc)
        assert len(bmc.writes("PATCH", path)) == len(patches)
        assert sorted(m.where for m in again) == unlisted


def test_bmcweb_is_sent_only_what_it_takes_and_the_rest_is_reported(trees: Path,
                                                                    emulator_config: Config) -> None:
    """GH200 with HTTP turned on: bmcweb's PATCH takes IPMI and SSH only, so IPMI is put back and
    HTTP is a finding that says why, with no PATCH naming it."""
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        path = network_protocol("nvidia_gh200")
        bmc.state.docs[path]["HTTP"].update({"ProtocolEnabled": True, "Port": 80})
        _, checked = gate(emulator_config, bmc)
        assert {m.where: m.HasField("bmc_remedy") for m in checked} == {"IPMI": True, "HTTP": False}
        result, found = restore(emulator_config, bmc)
        assert [w[2] for w in bmc.writes("PATCH", path)] == [{"IPMI": {"ProtocolEnabled": False}}]
        assert result.values["posture_restored"] == "IPMI off"
        assert [(m.where, m.found) for m in found] == [("HTTP", "on (port 80)")]
        assert "bmcweb takes only IPMI's and SSH's ProtocolEnabled" in found[0].message
        assert not result.release.pool_ready


def test_a_patch_the_bmc_refuses_is_sent_once_and_reported_with_its_words(trees: Path,
                                                                         emulator_config: Config) -> None:
    """Named "generic", GH200 is sent IPMI and HTTP in one PATCH; bmcweb refuses it whole (400):
    nothing resent, both findings carry the BMC's message."""
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        path = network_protocol("nvidia_gh200")
        bmc.state.docs[path]["HTTP"]["ProtocolEnabled"] = True
        result, found = restore(emulator_config, bmc, vendor="generic")
        assert len(bmc.writes("PATCH", path)) == 1
        assert result.values["posture_restored"] == "none"
        assert sorted(m.where for m in found) == ["HTTP", "IPMI"]
        assert all("refused the PATCH" in m.message and "HTTP" in m.message for m in found)
        assert bmc.doc(path)["IPMI"]["ProtocolEnabled"] is True


def test_a_patch_the_bmc_ignores_is_a_finding(trees: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        path = network_protocol("dell_r750")
        bmc.state.ignored.add(path)
        _, found = restore(emulator_config, bmc)
        assert len(bmc.writes("PATCH", path)) == 1
        assert sorted(m.where for m in found) == ["HTTP", "IPMI"]
        assert all("reads back unchanged" in m.message for m in found)


def test_the_posture_over_ipmi_is_unreadable_never_a_pass() -> None:
    from agent.site.bmc import release
    from agent.site.bmc.client import CallContext, Credentials, Target
    from agent.site.bmc.ipmi import IpmiClient
    from tests.site.bmc.sushy import fast_call

    call: CallContext = fast_call(5)
    client = IpmiClient(Target("127.0.0.1:9", Credentials("u", "p")), call)
    assert [m.found for m in release.posture_check(client, posture.parse(FLEET))] == ["unreadable"]
    found, restored = release.posture_restore(client, posture.parse(FLEET))
    assert [m.found for m in found] == ["unreadable"] and not restored


def test_the_posture_setting_is_checked_when_it_is_read() -> None:
    from agent.cli import settings

    assert settings.load({"bmc_posture": FLEET}, None, "").config.bmc_posture == FLEET
    with pytest.raises(InvalidParameters, match="bmc_posture"):
        settings.load({"bmc_posture": "ipmi=maybe"}, None, "")
    assert posture.parse("IPMI=off, http=Off,https=on") == {"IPMI": False, "HTTP": False, "HTTPS": True}
    assert posture.parse("") == {}
    for bad in ("telnet=off", "ipmi=maybe", "ipmi=off,ipmi=on", "ipmi"):
        with pytest.raises(InvalidParameters, match="bmc_posture"):
            posture.parse(bad)
