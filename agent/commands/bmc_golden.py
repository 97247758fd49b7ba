"""The release gate's golden state at the site (round 2): bmc.query golden (the BMC captured
whole, the golden state's BMC half as the tool itself writes it), bmc.query baseline with
``expect.golden`` (the BMC diffed against it, each change a finding with its remedy), and the
remedies that were missing: bmc.rotate reset_account and delete_subscription, bmc.firmware
set_service. agent/site/bmc/golden.py reads and diffs; called by agent/commands/bmc.py.
"""

from __future__ import annotations

import re

from agent.errors import InvalidParameters, Unsupported
from agent.policy.release.golden import Golden
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc import golden
from agent.site.bmc.client import BmcClient, Credentials

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@%+-]{0,127}")
_PROTOCOL = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def parse_golden(msg: agent_pb2.GoldenState) -> Golden:
    """The request's golden state (golden.Golden.from_proto), holding the BMC's half whole."""
    g = Golden.from_proto(msg, what="expect.golden")
    capture = g.capture
    if not set(capture.sources) & set(golden.SITE_SOURCES):
        raise InvalidParameters(f"expect.golden: the capture has none of the BMC's sources "
                                f"({', '.join(golden.SITE_SOURCES)})")
    broken = sorted(set(capture.unreadable) & set(golden.SITE_SOURCES))
    if broken:
        raise InvalidParameters(f"expect.golden: the capture could not read {', '.join(broken)}: "
                                "not a golden state; capture the BMC again")
    return g


def identifier(name: str, text: str) -> str:
    """An account slot's or a subscription's Id as the BMC lists it."""
    if not _ID.fullmatch(text):
        raise InvalidParameters(f"parameter {name}: an Id as the BMC lists it "
                                "(letters, digits, . _ : @ % + -)")
    return text


def protocol(name: str, text: str) -> str:
    if not _PROTOCOL.fullmatch(text):
        raise InvalidParameters(f"parameter {name}: a NetworkProtocol property (VNC, KVMIP, SSH, SNMP, ...)")
    return text


def user_name(name: str, text: str) -> str:
    """An account's golden name: printable, 64 characters at most, "" for an empty slot."""
    if len(text) > 64 or not text.isprintable():
        raise InvalidParameters(f"parameter {name}: a user name, printable, 64 characters at most")
    return text


def role(name: str, text: str) -> str:
    if len(text) > 64 or not text.isprintable():
        raise InvalidParameters(f"parameter {name}: a role (RoleId or IPMI privilege), 64 characters at most")
    return text


def check_reset(given: dict[str, str]) -> None:
    """bmc.rotate reset_account names the slot's golden user_name, even an empty one."""
    if "user_name" not in given:
        raise InvalidParameters("bmc.rotate reset_account: user_name is required (\"\" for an empty slot)")


def baseline(client: BmcClient, expect: Golden, ipmi: BmcClient | None = None
             ) -> tuple[list[agent_pb2.Mismatch], list[agent_pb2.SourceCount]]:
    """The BMC captured now and diffed against the golden's BMC half: the findings (each with
    its remedy where there is one) and the counts per source. Only the golden's sources are
    read; one this protocol does not read is unreadable: a finding. ``ipmi``: the same BMC over
    IPMI (a Redfish request's ipmi_address), which reads the "ipmi" source; its findings carry
    no remedy (a BmcRemedy is sent over the request's protocol: check over ipmi for them)."""
    wanted = tuple(src for src in golden.SITE_SOURCES if src in expect.capture.sources)
    seen = golden.capture(client, wanted, ipmi)
    found, d = golden.check(expect.capture, expect.rules, seen,
                            elsewhere=golden.IPMI_ONLY if ipmi is not None else ())
    return found, d.counts()


def capture_result(client: BmcClient, result: site_pb2.BmcOperationResult,
                   ipmi: BmcClient | None = None) -> site_pb2.BmcOperationResult:
    """bmc.query golden: the capture as JSON in ``values["capture"]``, counted in ``state``;
    with ``ipmi`` (the same BMC over IPMI), its "ipmi" source too."""
    capture = golden.capture(client, (), ipmi)
    items = sum(len(v) for v in capture.sources.values())
    result.state = f"{items} items in {len(capture.sources)} sources, {len(capture.unreadable)} unreadable"
    result.values["capture"] = capture.to_json().decode()
    for source, items_of in sorted(capture.sources.items()):
        result.values[f"items.{source}"] = str(len(items_of))
    for source, why in sorted(capture.unreadable.items()):
        result.values[f"unreadable.{source}"] = why
    return result


def reset_account(client: BmcClient, creds: Credentials, slot: str, name: str, role_id: str,
                  enabled: bool | None, result: site_pb2.BmcOperationResult) -> site_pb2.BmcOperationResult:
    back = client.reset_account(slot, name, role_id, enabled, creds.username)
    result.state = "reset"
    result.values.update({"account": back.id, "username": back.user_name, "role": back.role,
                          "enabled": str(back.enabled).lower()})
    return result


def delete_subscription(client: BmcClient, subscription: str,
                        result: site_pb2.BmcOperationResult) -> site_pb2.BmcOperationResult:
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        raise Unsupported("delete_subscription: Redfish only (IPMI has no EventService)")
    result.state = "deleted" if client.delete_subscription(subscription) else "absent"
    result.values["subscription"] = subscription
    return result


def set_service(client: BmcClient, name: str, enabled: bool,
                result: site_pb2.BmcOperationResult) -> site_pb2.BmcOperationResult:
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        raise Unsupported("set_service: Redfish only (IPMI has no ManagerNetworkProtocol)")
    changed = client.set_service(name, enabled)
    result.state = ("turned " if changed else "already ") + ("on" if enabled else "off")
    result.values.update({"protocol": name, "enabled": str(enabled).lower()})
    return result
