"""The BMC's golden state without a BMC: how a Redfish resource becomes items, which change
gets which remedy, and what the request's parse refuses (test_bmc_golden.py drives the BMCs)."""

from __future__ import annotations

import json

import pytest

from agent.commands.bmc_params import BmcParams
from agent.errors import AgentError, InvalidParameters
from agent.policy.release.golden import MAX_TEXT, Capture, Rules
from agent.proto import agent_pb2
from agent.site.bmc import golden
from agent.site.bmc.redfish import golden as redfish_golden
from tests.site.bmc.redfish_emulator.handlers import parse_kind


def test_a_resource_is_flattened_whole_without_its_annotations() -> None:
    out: dict[str, str] = {}
    redfish_golden.flatten("EventService/Subscriptions/7", {
        "@odata.id": "/redfish/v1/EventService/Subscriptions/7", "@odata.type": "#EventDestination",
        "Destination": "https://203.0.113.9/x", "EventTypes": ["Alert", "Other"], "EventTypes@odata.count": 2,
        "HttpHeaders": [], "Status": {"State": "Enabled"}, "Links": {"Owner": {"@odata.id": "/a/b"}},
        "Actions": {"#X.Y": {"target": "/t"}}, "Oem": {}, "Port": 443, "On": True, "Gone": None,
        "a/b": "slash", "Long": "x" * (MAX_TEXT + 1)}, out)
    base = "EventService/Subscriptions/7/"
    assert {k.removeprefix(base): v for k, v in out.items() if k != base + "Long"} == {
        "Destination": "https://203.0.113.9/x", "EventTypes/0": "Alert", "EventTypes/1": "Other",
        "HttpHeaders": "[]", "Status/State": "Enabled", "Links/Owner": "/a/b", "Oem": "{}", "Port": "443",
        "On": "true", "Gone": "null", "a%2Fb": "slash"}
    assert out[base + "Long"].startswith("sha256:") and len(out[base + "Long"]) == 71


def test_a_source_past_its_bound_is_refused_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redfish_golden, "MAX_ITEMS", 10)
    with pytest.raises(AgentError, match="more than 10 items"):
        redfish_golden.flatten("Bios", {f"A{i}": i for i in range(20)}, {})


GOLDEN = Capture({
    "bmc": {"EventService/Subscriptions/1/Destination": "10.0.0.1",
            "AccountService/Accounts/3/UserName": "ops", "AccountService/Accounts/3/RoleId": "Operator",
            "AccountService/Accounts/3/Enabled": "true", "AccountService/Accounts/3/Locked": "false",
            "Certificates/x/Fingerprint": "aa", "NetworkProtocol/SSH/ProtocolEnabled": "true",
            "NetworkProtocol/SSH/Port": "22"},
    "bios": {"Attributes/ProcVirtualization": "Enabled"},
    "firmware": {"BMC/Version": "1.0"},
    "uefi": {"Boot0000": "whatever: the ramdisk's"}})


def remedies(seen: Capture) -> dict[tuple[str, str], tuple[str, dict[str, str]] | None]:
    found, _ = golden.check(GOLDEN, Rules({"bmc": ("AccountService/Accounts/*/Locked",)}), seen)
    return {(m.check, m.where):
            (f"{m.bmc_remedy.kind} {m.bmc_remedy.operation}", dict(m.bmc_remedy.parameters))
            if m.HasField("bmc_remedy") else None for m in found}


def test_each_change_has_the_remedy_that_puts_it_back_or_none() -> None:
    bmc = dict(GOLDEN.sources["bmc"])
    bmc.update({"EventService/Subscriptions/1/Destination": "203.0.113.9",     # changed: not ours to fix
                "EventService/Subscriptions/9/Destination": "203.0.113.9",     # added: deleted
                "AccountService/Accounts/3/Enabled": "false", "AccountService/Accounts/3/Locked": "true",
                "Certificates/x/Fingerprint": "bb", "NetworkProtocol/SSH/ProtocolEnabled": "false",
                "NetworkProtocol/SSH/Port": "2222"})
    seen = Capture({"bmc": bmc, "bios": {"Attributes/ProcVirtualization": "Disabled"},
                    "firmware": {"BMC/Version": "1.1"}})
    assert remedies(seen) == {
        ("bmc.changed", "EventService/Subscriptions/1/Destination"): None,
        ("bmc.added", "EventService/Subscriptions/9/Destination"):
            ("bmc.rotate delete_subscription", {"subscription": "9"}),
        ("bmc.changed", "AccountService/Accounts/3/Enabled"):
            ("bmc.rotate reset_account", {"account": "3", "user_name": "ops", "role": "Operator",
                                          "enabled": "true"}),
        ("bmc.changed", "Certificates/x/Fingerprint"): None,
        ("bmc.changed", "NetworkProtocol/SSH/ProtocolEnabled"):
            ("bmc.firmware set_service", {"protocol": "SSH", "enabled": "true"}),
        ("bmc.changed", "NetworkProtocol/SSH/Port"): None,
        ("bios.changed", "Attributes/ProcVirtualization"):
            ("bmc.firmware set_bios", {"attributes": json.dumps({"ProcVirtualization": "Enabled"})}),
        ("firmware.changed", "BMC/Version"): None}


def test_a_source_not_read_is_a_finding_and_the_node_s_are_left_to_the_ramdisk() -> None:
    seen = Capture({"bmc": dict(GOLDEN.sources["bmc"])}, unreadable={"bios": "HTTP 500"})
    found, d = golden.check(GOLDEN, Rules(), seen)
    assert {(m.check, m.where) for m in found} == {("bios.unreadable", "bios"),
                                                   ("firmware.unreadable", "firmware")}
    assert "uefi" not in d.compared and "uefi" not in d.unreadable
    counts = {c.source: (c.compared, c.unreadable) for c in d.counts()}
    assert counts == {"bmc": (8, ""), "bios": (0, "HTTP 500"),
                      "firmware": (0, "not read (the golden state has it)")}


def test_the_new_operations_are_checked_in_parse() -> None:
    with pytest.raises(InvalidParameters, match="user_name is required"):
        parse_kind("bmc.rotate", "reset_account", account="3")
    assert parse_kind("bmc.rotate", "reset_account", account="3", user_name="").args.user_name == ""
    with pytest.raises(InvalidParameters, match="parameter account"):
        parse_kind("bmc.rotate", "reset_account", account="../3", user_name="")
    with pytest.raises(InvalidParameters, match="parameter protocol"):
        parse_kind("bmc.firmware", "set_service", protocol="VNC; rm", enabled="false")
    assert parse_kind("bmc.firmware", "set_service", protocol="VNC", enabled="false").args.enabled is False
    with pytest.raises(InvalidParameters, match="unknown parameter"):
        parse_kind("bmc.query", "golden", names="x")


def test_an_expected_golden_state_is_checked_in_parse() -> None:
    from agent.commands import handler_for
    from agent.proto import site_pb2

    handler = handler_for("bmc.query")
    assert handler is not None

    def parse(state: agent_pb2.GoldenState) -> BmcParams:
        payload = site_pb2.BmcOperationRequest(bmc_address="10.0.0.1", protocol="redfish",
                                               operation="baseline", credentials_ref="rack1-rf01")
        payload.expect.golden.CopyFrom(state)
        params = handler.parse(payload)
        assert isinstance(params, BmcParams)
        return params

    with pytest.raises(InvalidParameters, match="capture is required"):
        parse(agent_pb2.GoldenState(profile="p"))
    with pytest.raises(InvalidParameters):
        parse(agent_pb2.GoldenState(profile="p", capture=b"{not json"))
    with pytest.raises(InvalidParameters, match="profile"):
        parse(agent_pb2.GoldenState(capture=GOLDEN.to_json()))
    with pytest.raises(InvalidParameters, match="none of the BMC's sources"):
        parse(agent_pb2.GoldenState(profile="p", capture=Capture({"uefi": {"a": "b"}}).to_json()))
    with pytest.raises(InvalidParameters, match="could not read bios"):
        parse(agent_pb2.GoldenState(profile="p",
                                    capture=Capture({"bmc": {}}, {"bios": "HTTP 500"}).to_json()))
    with pytest.raises(InvalidParameters, match="vary"):
        parse(agent_pb2.GoldenState(profile="p", capture=GOLDEN.to_json(), rules=b'{"vary": {"bmc": "*"}}'))
    params = parse(agent_pb2.GoldenState(profile="p", capture=GOLDEN.to_json()))
    assert params.golden is not None and params.golden.capture == GOLDEN
