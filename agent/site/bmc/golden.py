"""The BMC's half of the release gate's golden state: read whole at the site, diffed, put back.

``capture(client)`` reads the BMC's sources (agent/policy/release/golden.py's ``Capture``):
over Redfish "bmc", "bios" and "firmware" (agent/site/bmc/redfish/golden.py says what each
holds and how paths are spelt); over IPMI "ipmi" and "firmware":

  ipmi      every channel the BMC has, as Get Channel Info (``channel info N``) answers it for
            channels 0 to 11 and 15 (``channel/2/info/Channel Medium Type``, ``Session
            Support``, its volatile and non-volatile access settings; not the active session
            count), a channel it lacks answering an error (0xCB, 0xCC or 0xC9): ``channel
            getaccess N`` cannot tell, ipmi_sim answers it for any channel; on every channel with
            sessions (a LAN or serial one: no user logs in on IPMB or the system interface) every
            user slot (``users/<id>/name``, and its access on that channel:
            ``users/<id>/channel/2/Privilege Level``, ``IPMI Messaging``, ``Link Authentication``,
            ``Enable Status``, ``Access Available``) and the slots' count (``channel/2/Maximum
            User IDs``; not ``Enabled User IDs``, the users' sum); on every LAN channel its
            configuration as ``lan print`` gives it (``lan/2/RMCP+ Cipher Suites``, ``Cipher
            Suite Priv Max``, ``Auth Type Enable``, the addresses, the SNMP community).
  firmware  the controller's ``mc info`` (``mc/Firmware Revision``, ``mc/Aux Firmware Rev Info``).

``check(golden, rules, seen)`` diffs the BMC's sources (SITE_SOURCES, the golden's
others are the node's, checked by its ramdisk) and turns each change into a finding
(``Mismatch``: check ``<source>.<added|removed|changed>``, where = the path) with the site
command that puts it back where there is one (``remedy``), and each source that could not be
read, or that this protocol does not read, into ``<source>.unreadable``. ``counts`` is the
report's ``compared`` (a SourceCount per source).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from agent.errors import AgentError, BmcRefused, Cancelled
from agent.policy.release.findings import bmc_remedy
from agent.policy.release.golden import Capture, Change, Diff, Rules, diff
from agent.proto import agent_pb2
from agent.site.bmc.client import BmcClient
from agent.site.bmc.ipmi import SITE_CHANNEL

SITE_SOURCES = ("bmc", "bios", "ipmi", "firmware")
REDFISH_SOURCES = ("bmc", "bios", "firmware")
IPMI_SOURCES = ("ipmi", "firmware")
IPMI_ONLY = ("ipmi",)        # read over IPMI only; a Redfish BMC's "firmware" is its inventory's
MAX_IPMI_USERS = 64
_ACCOUNT_RESET = ("UserName", "RoleId", "Enabled", "Links/Role")    # what reset_account puts back
_USER_FIELDS = ("Access Available", "Link Authentication", "IPMI Messaging", "Privilege Level",
                "Enable Status")


def capture(client: BmcClient, wanted: tuple[str, ...] = (), ipmi: BmcClient | None = None) -> Capture:
    """Each of ``wanted`` (every source this protocol reads when empty), whole; what could not
    be read, with why: a source ``wanted`` names that this protocol does not read included.
    ``ipmi``: with a Redfish ``client``, the same BMC over IPMI, which reads IPMI_ONLY ("ipmi":
    users by slot and channel, cipher suites, LAN settings; Redfish has no resource for them)."""
    from agent.site.bmc.ipmi import IpmiClient
    from agent.site.bmc.redfish import golden as redfish_golden
    from agent.site.bmc.redfish.client import RedfishClient

    redfish = isinstance(client, RedfishClient)
    offered = REDFISH_SOURCES if redfish else IPMI_SOURCES
    second = IPMI_ONLY if redfish and ipmi is not None else ()
    wanted = wanted or (*offered, *second)
    other = "ipmi (or over redfish with ipmi_address)" if redfish else "redfish"
    why = {s: f"not read over {'redfish' if redfish else 'ipmi'}: capture and check this BMC over {other}"
           for s in wanted if s not in offered and s not in second}
    if isinstance(client, RedfishClient):
        got, unreadable = redfish_golden.read(client, tuple(s for s in wanted if s in offered))
        if ipmi is not None and any(s in second for s in wanted):
            more = capture(ipmi, tuple(s for s in wanted if s in second))
            got.update({src: dict(items) for src, items in more.sources.items()})
            unreadable = {**unreadable, **{s: f"over IPMI: {w}" for s, w in more.unreadable.items()}}
        return Capture(got, {**why, **unreadable})
    wanted = tuple(s for s in wanted if s in offered)
    assert isinstance(client, IpmiClient)
    sources: dict[str, dict[str, str]] = {}
    for source, reader in (("ipmi", _ipmi), ("firmware", _ipmi_firmware)):
        if source not in wanted:
            continue
        try:
            sources[source] = reader(client)
        except Cancelled:
            raise
        except AgentError as exc:
            why[source] = exc.message
    return Capture(sources, why)


def _fields(text: str) -> list[tuple[str, str]]:
    """``Key : value`` lines, a line with no key (``   : more``) continuing the one before, an
    indented line without a colon (``mc info``'s lists) too."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip():
            out.append((key.strip(), value.strip()))
        elif out and line.strip():
            name, before = out[-1]
            more = value.strip() if colon else line.strip()
            out[-1] = (name, f"{before} | {more}" if before else more)
    return out


# Channel numbers (IPMI 2.0, 6.3): 0 the primary IPMB, 1-11 the implementation's, 12-13 reserved,
# 14 "this channel" (an alias, not read), 15 the system interface.
IPMI_CHANNELS = (*range(12), 15)
# What Get Channel Info answers for a channel the BMC lacks (IPMI 2.0, 22.24 and 5.2: ipmitool
# words them): 0xCB (ipmi_sim), 0xCC and 0xC9 (others).
_NO_CHANNEL = ("requested sensor, data, or record not found", "invalid data field",
               "parameter out of range")
_CHANNEL_VARIES = ("Active Session Count",)     # who is logged in now, the site included


def channels(client: BmcClient) -> dict[int, dict[str, str]]:
    """Every channel the BMC has: its number -> what Get Channel Info says of it."""
    from agent.site.bmc.ipmi import IpmiClient

    assert isinstance(client, IpmiClient)
    found: dict[int, dict[str, str]] = {}
    for n in IPMI_CHANNELS:
        try:
            text = client.run("channel", "info", str(n))
        except BmcRefused as exc:
            said = f"{exc.details.get('bmc_message', '')} {exc.message}".lower()
            if any(p in said for p in _NO_CHANNEL):
                continue
            raise
        found[n] = _channel_info(text)
    if client.channel not in found:
        raise AgentError(f"BMC {client.target.address}: Get Channel Info does not list channel "
                         f"{client.channel}, the one the site is talking over")
    return found


def _channel_info(text: str) -> dict[str, str]:
    """``channel info``'s fields, those under a ``... Settings`` heading prefixed with it."""
    out: dict[str, str] = {}
    heading = ""
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if not colon:
            if line.strip().endswith("Settings"):
                heading = line.strip()
            continue
        key = key.strip()
        if key and key not in _CHANNEL_VARIES and not (key.startswith("Channel 0x") and not value.strip()):
            out[f"{heading}/{key}" if heading else key] = value.strip()
    return out


def _ipmi(client: BmcClient) -> dict[str, str]:
    from agent.site.bmc.ipmi import IpmiClient

    assert isinstance(client, IpmiClient)
    items: dict[str, str] = {}
    for c, info in channels(client).items():
        for key, value in info.items():
            items[f"channel/{c}/info/{key}"] = value
        if info.get("Session Support", "session-less") != "session-less":
            items.update(_users(client, c))
        if info.get("Channel Medium Type", "") == "802.3 LAN":
            for key, value in _fields(client.run("lan", "print", str(c))):
                items[f"lan/{c}/{key}"] = value
    if not any(k.startswith("users/") for k in items):
        raise AgentError(f"BMC {client.target.address}: no channel with sessions listed users")
    return items


def _users(client: BmcClient, c: int) -> dict[str, str]:
    """Every user slot's name and access on channel ``c``."""
    from agent.site.bmc.ipmi import IpmiClient, privilege_code

    assert isinstance(client, IpmiClient)
    items: dict[str, str] = {}
    for block in re.split(r"\n\s*\n", client.run("channel", "getaccess", str(c))):
        fields = dict(_fields(block))
        uid = fields.get("User ID", "")
        if not uid:               # the channel's counts; "Enabled User IDs" is the users' sum
            for key, value in fields.items():
                if key != "Enabled User IDs":
                    items[f"channel/{c}/{key}"] = value
            continue
        if not uid.isdigit() or int(uid) > MAX_IPMI_USERS:
            continue
        items[f"users/{uid}/name"] = fields.get("User Name", "")
        for key in _USER_FIELDS:
            if key in fields:
                value = fields[key]
                if key == "Privilege Level" and privilege_code(value) == 15:
                    value = "NO ACCESS"          # 0 (reserved) grants nothing either
                items[f"users/{uid}/channel/{c}/{key}"] = value
    return items


def _ipmi_firmware(client: BmcClient) -> dict[str, str]:
    from agent.site.bmc.ipmi import IpmiClient

    assert isinstance(client, IpmiClient)
    return {f"mc/{k}": v for k, v in _fields(client.run("mc", "info"))}


# -- the check ------------------------------------------------------------------------


def site_part(golden: Capture) -> Capture:
    """The golden state's site sources (the node's are its ramdisk's to check)."""
    return Capture({s: items for s, items in golden.sources.items() if s in SITE_SOURCES},
                   {s: why for s, why in golden.unreadable.items() if s in SITE_SOURCES})


def check(golden: Capture, rules: Rules, seen: Capture,
          elsewhere: tuple[str, ...] = ()) -> tuple[list[agent_pb2.Mismatch], Diff]:
    """Every change of ``seen`` against the golden's site sources, as findings with remedies;
    none for the sources ``elsewhere`` (read over the BMC's other protocol: a remedy is sent
    over the request's, where the same slot number may name another account)."""
    d = diff(site_part(golden), seen, rules)
    out: list[agent_pb2.Mismatch] = []
    for source, why in sorted(d.unreadable.items()):
        out.append(agent_pb2.Mismatch(
            check=f"{source}.unreadable", expected="read", found="unreadable", where=source,
            message=f"the BMC's {source} could not be read: {why}; a source not read is never a pass"))
    for c in d.changes:
        m = agent_pb2.Mismatch(check=c.check, expected=c.golden if c.kind != "added" else "(absent)",
                               found=c.found if c.kind != "removed" else "(absent)", where=c.path,
                               message=_message(c))
        remedy = None if c.source in elsewhere else _remedy(c, golden.sources.get(c.source, {}))
        if remedy is not None:
            m.bmc_remedy.CopyFrom(remedy)
        out.append(m)
    return out, d


def _message(c: Change) -> str:
    if c.kind == "added":
        return f"{c.source} {c.path} = {c.found!r}: not in the golden state"
    if c.kind == "removed":
        return f"{c.source} {c.path}: in the golden state ({c.golden!r}), not on the BMC"
    return f"{c.source} {c.path} is {c.found!r}, the golden state's {c.golden!r}"


def _unkey(part: str) -> str:
    return part.replace("%2F", "/")


def _remedy(c: Change, old: Mapping[str, str]) -> agent_pb2.BmcRemedy | None:
    """The site command that puts ``c`` back, where there is one (docs/lifecycle.md)."""
    parts = c.path.split("/")
    if c.source == "bmc":
        return _bmc_remedy(c, parts, old)
    if c.source == "bios" and len(parts) == 2 and parts[0] in ("Attributes", "Pending") \
            and c.kind != "removed" and f"Attributes/{parts[1]}" in old:
        value = old[f"Attributes/{parts[1]}"]
        if len(value) <= 256 and value not in ("null", "{}", "[]"):
            return bmc_remedy("bmc.firmware", "set_bios", attributes=json.dumps({_unkey(parts[1]): value}))
    if c.source == "ipmi" and len(parts) >= 3 and parts[0] == "users" and f"users/{parts[1]}/name" in old:
        if parts[2] == "channel" and parts[3:4] != [str(SITE_CHANNEL)]:
            return None             # reset_account writes the site's channel's access only
        slot = f"users/{parts[1]}/channel/{SITE_CHANNEL}/"
        access = {k.rsplit("/", 1)[-1]: v for k, v in old.items() if k.startswith(slot)}
        messaging = access.get("IPMI Messaging", "")
        return _account_remedy(parts[1], old[f"users/{parts[1]}/name"], access.get("Privilege Level", ""),
                               "true" if messaging == "enabled" else "false" if messaging else "")
    return None


def _bmc_remedy(c: Change, parts: list[str], old: Mapping[str, str]) -> agent_pb2.BmcRemedy | None:
    head = parts[0]
    if parts[:2] == ["EventService", "Subscriptions"] and len(parts) > 3:
        slot = f"EventService/Subscriptions/{parts[2]}/"
        if not any(k.startswith(slot) for k in old):            # one the golden has not
            return bmc_remedy("bmc.rotate", "delete_subscription", subscription=_unkey(parts[2]))
        return None
    if head == "NetworkProtocol" and len(parts) == 3 and parts[2] == "ProtocolEnabled" \
            and c.golden in ("true", "false"):
        return bmc_remedy("bmc.firmware", "set_service", protocol=_unkey(parts[1]), enabled=c.golden)
    if parts[:2] == ["AccountService", "Accounts"] and "/".join(parts[3:]) in _ACCOUNT_RESET:
        base = f"AccountService/Accounts/{parts[2]}/"
        if base + "UserName" in old:
            return _account_remedy(parts[2], old[base + "UserName"], old.get(base + "RoleId", ""),
                                   old.get(base + "Enabled", ""))
        return None
    if head == "VirtualMedia" and len(parts) >= 3 and old.get(f"VirtualMedia/{parts[1]}/Inserted") == "false":
        return bmc_remedy("bmc.storage", "eject_media")
    override = ("BootSourceOverrideEnabled", "BootSourceOverrideTarget")
    if head == "Boot" and len(parts) == 2 and parts[1] in override \
            and old.get("Boot/BootSourceOverrideEnabled") == "Disabled" \
            and old.get("Boot/BootSourceOverrideTarget") in ("None", "null", None):
        return bmc_remedy("bmc.boot", "set_boot_device", device="none")
    return None


def _account_remedy(slot: str, name: str, role: str, enabled: str) -> agent_pb2.BmcRemedy | None:
    """bmc.rotate reset_account: the slot put back to the golden's name, role and enabled (the
    site's own account never: the handler refuses it)."""
    if len(name) > 64 or not name.isprintable() or len(role) > 64:
        return None
    params = {"account": _unkey(slot), "user_name": name}
    if role:
        params["role"] = role
    if enabled in ("true", "false"):
        params["enabled"] = enabled
    return bmc_remedy("bmc.rotate", "reset_account", **params)
