"""The bmc.* kinds' requests read once, at the edge: ``parse_request`` checks a
``BmcOperationRequest`` (the protocol, the address, the credentials_ref, the operation, every
parameter and bmc.query baseline's expected state) and returns the typed ``BmcParams`` the
handlers of agent/commands/bmc.py work with, before anything runs.

``OPERATIONS`` lists each kind's operations and the parameters each takes; ``READERS`` reads
each parameter's string into its typed value (``BmcArgs``). docs/site.md lists them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import limits
from agent.commands import bmc_golden, bmc_spdm
from agent.errors import InvalidParameters
from agent.policy.release.golden import Golden
from agent.policy.release.state import ExpectedState
from agent.proto import site_pb2
from agent.site.bmc import events, secrets, secure_boot
from agent.site.bmc.client import BmcProtocol, BootDevice, BootMode
from agent.site.bmc.ipmi import split_address
from agent.site.bmc.redfish.vendors import VENDORS

DEFAULT_GRACEFUL_SECONDS = 60.0
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")

# kind -> operation -> the parameters it takes (name -> required?)
OPERATIONS: dict[str, dict[str, dict[str, bool]]] = {
    "bmc.power": {a: ({"graceful_timeout_seconds": False} if a == "off" else {})
                  for a in ("on", "off", "cycle", "reset", "status")},
    "bmc.boot": {
        "set_boot_device": {"device": True, "persistent": False, "mode": False},
        "get_boot_device": {},
    },
    "bmc.query": {"query": {}, "events": {"since": False}, "bios": {"names": False},
                  "baseline": {"ipmi_address": False},
                  "secure_boot": {"policy": False},
                  # the BMC read whole: the golden state's BMC half (agent/commands/bmc_golden.py);
                  # over Redfish, ipmi_address reads its "ipmi" source over IPMI as well
                  "golden": {"ipmi_address": False},
                  # SPDM device attestation, the site's half (agent/commands/bmc_spdm.py)
                  "responders": {}, "measurements": {"nonces": True}},
    "bmc.rotate": {"rotate": {"new_password_ref": False, "length": False},
                   "disable_account": {"username": True},
                   # the golden state's remedies: a slot put back, a subscription deleted
                   "reset_account": {"account": True, "user_name": False, "role": False, "enabled": False},
                   "delete_subscription": {"subscription": True}},
    "bmc.firmware": {
        "simple_update": {"image_uri": True, "transfer_protocol": False},
        "push": {"file": True, "sha256": True, "method": False},
        # The way in picked from what the BMC's UpdateService offers, or named by ``method``.
        "update": {"image_uri": False, "file": False, "sha256": False, "transfer_protocol": False,
                   "method": False},
        "status": {"task_uri": False},
        "set_bios": {"attributes": True},
        "restore_secure_boot": {"policy": True},
        # The site's bmc_posture put back (agent/site/bmc/release.py posture_restore).
        "restore_posture": {},
        # One NetworkProtocol service on or off (the golden state's remedy).
        "set_service": {"protocol": True, "enabled": True},
        # The site's firmware set of a hardware profile (setting site_firmware_sets): what differs,
        # and that plan carried out (agent/site/bmc/redfish/fwsets.py, fwapply.py).
        "plan": {"profile": True},
        "apply": {"profile": True},
    },
    "bmc.storage": {
        "list": {},
        "insert_media": {"image_url": True, "media_type": False},
        "eject_media": {},
        "create_volume": {"controller_id": True, "name": True, "raid_type": True, "drives": True,
                          "capacity_bytes": False},
        "delete_volume": {"volume_id": True},
    },
}


@dataclass(frozen=True)
class BmcArgs:
    """An operation's parameters as ``parse`` read them from the request's strings: typed,
    checked, defaults filled in. ``run`` uses these, never the strings."""

    graceful_timeout_seconds: float = DEFAULT_GRACEFUL_SECONDS
    device: BootDevice | None = None
    persistent: bool = False
    mode: BootMode | None = None
    new_password_ref: str = ""
    length: int | None = None
    image_uri: str = ""
    transfer_protocol: str = ""
    file: Path | None = None
    sha256: str = ""
    image_url: str = ""
    media_type: str = "CD"
    controller_id: str = ""
    name: str = ""
    raid_type: str = ""
    drives: tuple[str, ...] = ()
    capacity_bytes: int = 0
    volume_id: str = ""
    since: int = 0                # bmc.query events: seconds since 1970
    vendor: str = ""              # Redfish: the vendor profile to use (redfish/vendors.py); "" detects it
    attributes: tuple[tuple[str, Any], ...] = ()   # bmc.firmware set_bios: BIOS attributes, in order
    names: tuple[str, ...] = ()   # bmc.query bios: the attributes to read (all when empty)
    task_uri: str = ""            # bmc.firmware status: a task to read once
    username: str = ""            # bmc.rotate disable_account: the account to disable
    method: str = ""              # bmc.firmware update/push: simple_update, multipart, http_push; "": picked
    policy: Any = None            # bmc.query secure_boot, bmc.firmware restore_secure_boot: the
                                  # fleet's SecureBootPolicy (agent/site/bmc/secure_boot.py)
    profile: str = ""             # bmc.firmware plan/apply: a hardware profile of the firmware sets
    account: str = ""             # bmc.rotate reset_account: the slot (its Id)
    user_name: str = ""           # bmc.rotate reset_account: the slot's golden name ("" empty)
    role: str = ""                # bmc.rotate reset_account: its golden RoleId / IPMI privilege
    enabled: bool | None = None   # reset_account: its golden Enabled; set_service: on or off
    subscription: str = ""        # bmc.rotate delete_subscription: the subscription's Id
    protocol: str = ""            # bmc.firmware set_service: the NetworkProtocol property
    nonces: tuple[tuple[str, bytes], ...] = ()  # bmc.query measurements: the gateway's, per device
    ipmi_address: str = ""        # bmc.query golden/baseline over Redfish: the same BMC's IPMI LAN


@dataclass(frozen=True)
class BmcParams:
    node_id: str
    address: str                  # as given; the BMC's key uses ``lock_name``
    protocol: BmcProtocol
    operation: str
    credentials_ref: str
    verify_tls: bool
    args: BmcArgs = field(default_factory=BmcArgs)
    expect: ExpectedState | None = None    # bmc.query baseline: the BMC's half
    firmware_profile: str = ""    # bmc.query baseline: expect.firmware's profile (its firmware set)
    golden: Golden | None = None   # bmc.query baseline: expect.golden

    @property
    def lock_name(self) -> str:
        host, port = split_address(self.address)
        return f"bmc:{host.lower()}:{port}" if self.protocol is BmcProtocol.IPMI \
            else f"bmc:{self.address.lower()}"


def _bool(name: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise InvalidParameters(f"parameter {name}: true or false, not {text!r}")


def _number(name: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidParameters(f"parameter {name}: a number, not {text!r}") from None
    if not low <= value <= high:
        raise InvalidParameters(f"parameter {name}: between {low:g} and {high:g}")
    return value


def _choice(kind: type[BootDevice] | type[BootMode]) -> Callable[[str, str], Any]:
    def parse(name: str, text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise InvalidParameters(f"parameter {name}: one of {', '.join(kind)}") from None
    return parse


def _url(name: str, text: str) -> str:
    if not text.startswith(("http://", "https://", "ftp://", "nfs://", "cifs://")):
        raise InvalidParameters(f"parameter {name}: a URL (http, https, ftp, nfs, cifs)")
    return text


def _sha256(name: str, text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise InvalidParameters(f"parameter {name}: 64 hexadecimal digits")
    return text.lower()


def _file(name: str, text: str) -> Path:
    if not text.startswith("/"):
        raise InvalidParameters(f"parameter {name}: an absolute path on the site server")
    return Path(text)


def _bytes(name: str, text: str) -> int:
    if not limits.is_digits(text):
        raise InvalidParameters(f"parameter {name}: a whole number of bytes")
    return int(text)


def _task_uri(name: str, text: str) -> str:
    if not re.fullmatch(r"/(?!/)[!$&'()*+,;=:@%A-Za-z0-9._~/-]{0,1023}", text) or ".." in text.split("/"):
        raise InvalidParameters(f"parameter {name}: a path on the BMC (/redfish/v1/TaskService/Tasks/...)")
    return text


def _vendor(name: str, text: str) -> str:
    if text and text not in VENDORS:
        raise InvalidParameters(f"parameter {name}: one of {', '.join(VENDORS)}")
    return text


MAX_BIOS_ATTRIBUTES = 64
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _attributes(name: str, text: str) -> tuple[tuple[str, Any], ...]:
    """A JSON object of BIOS attribute names to values (string, integer or boolean)."""
    doc = limits.loads_json(text, what=f"parameter {name} (a JSON object of attribute names to values)",
                            max_depth=2)
    if not isinstance(doc, dict) or not doc or len(doc) > MAX_BIOS_ATTRIBUTES:
        raise InvalidParameters(f"parameter {name}: a JSON object of 1 to {MAX_BIOS_ATTRIBUTES} attributes")
    for key, value in doc.items():
        if not _ATTRIBUTE_NAME.fullmatch(key):
            raise InvalidParameters(f"parameter {name}: {key[:40]!r} is no attribute name")
        if not isinstance(value, str | int | bool) or (isinstance(value, str) and len(value) > 256):
            raise InvalidParameters(f"parameter {name}: {key}: a string (256 at most), integer or boolean")
    return tuple(doc.items())


def _names(name: str, text: str) -> tuple[str, ...]:
    names = tuple(n for n in text.split(",") if n)
    if len(names) > MAX_BIOS_ATTRIBUTES or not all(_ATTRIBUTE_NAME.fullmatch(n) for n in names):
        raise InvalidParameters(f"parameter {name}: up to {MAX_BIOS_ATTRIBUTES} attribute names,"
                                " comma separated")
    return names


def _username(name: str, text: str) -> str:
    """An account's name as the BMC lists it: matched, never put on a command line."""
    if not 0 < len(text) <= 64 or not text.isprintable():
        raise InvalidParameters(f"parameter {name}: a user name, printable, 64 characters at most")
    return text


def _method(name: str, text: str) -> str:
    from agent.site.bmc.redfish.firmware import Method

    if text and text not in tuple(Method):
        raise InvalidParameters(f"parameter {name}: one of {', '.join(Method)}"
                                " (or none: what the BMC offers)")
    return text


def _profile(name: str, text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", text):
        raise InvalidParameters(f"parameter {name}: a profile name (letters, digits, '.', '_', '-')")
    return text


def _check_firmware(operation: str, args: BmcArgs) -> None:
    """bmc.firmware update and push: one image, as a URL or as a file with its sha256, and a
    method that takes that kind of image."""
    if operation == "update" and bool(args.image_uri) == (args.file is not None):
        raise InvalidParameters("bmc.firmware update: give image_uri (the BMC fetches it) or file and "
                                "sha256 (the site pushes it), one of them")
    if args.file is not None and not args.sha256:
        raise InvalidParameters(f"bmc.firmware {operation}: file needs its sha256")
    if args.file is not None and args.method == "simple_update":
        raise InvalidParameters(f"bmc.firmware {operation}: method simple_update fetches image_uri,"
                                " it pushes no file")
    if args.image_uri and args.method not in ("", "simple_update"):
        raise InvalidParameters(f"bmc.firmware {operation}: method {args.method} pushes a file:"
                                " give file and sha256")


def _ref(name: str, text: str) -> str:
    secrets.check_ref(text)
    return text


def _address(name: str, text: str) -> str:
    split_address(text)
    return text


def _text(name: str, text: str) -> str:
    return text


# Each parameter's reader: (name, the request's string) -> its typed value, or InvalidParameters.
READERS: dict[str, Callable[[str, str], Any]] = {
    "graceful_timeout_seconds": lambda n, t: _number(n, t, 0, 240),
    "device": _choice(BootDevice),
    "persistent": _bool,
    "mode": lambda n, t: _choice(BootMode)(n, t) if t else None,
    "new_password_ref": _ref,
    "length": lambda n, t: int(_number(n, t, 8, 64)),
    "image_uri": _url,
    "transfer_protocol": _text,
    "file": _file,
    "sha256": _sha256,
    "image_url": _url,
    "media_type": lambda n, t: t or "CD",
    "controller_id": _text,
    "name": _text,
    "raid_type": _text,
    "drives": lambda n, t: tuple(d for d in t.split(",") if d),
    "capacity_bytes": _bytes,
    "volume_id": _text,
    "since": lambda n, t: events.parse_since(t or "0"),
    "task_uri": _task_uri,
    "vendor": _vendor,
    "attributes": _attributes,
    "names": _names,
    "username": _username,
    "method": _method,
    "policy": lambda n, t: secure_boot.load(_file(n, t)),
    "profile": _profile,
    "account": bmc_golden.identifier,
    "user_name": bmc_golden.user_name,
    "role": bmc_golden.role,
    "enabled": _bool,
    "subscription": bmc_golden.identifier,
    "protocol": bmc_golden.protocol,
    "nonces": bmc_spdm.read_nonces,
    "ipmi_address": _address,
}


def read_args(given: Mapping[str, str]) -> BmcArgs:
    """The typed parameters of an operation's strings (their names already checked)."""
    return BmcArgs(**{name: READERS[name](name, text) for name, text in given.items()})


def parse_request(kind: str, payload: site_pb2.BmcOperationRequest) -> BmcParams:
    try:
        protocol = BmcProtocol(payload.protocol)
    except ValueError:
        raise InvalidParameters(
            f"{kind}: protocol {payload.protocol!r}: one of {', '.join(BmcProtocol)}"
        ) from None
    if not payload.bmc_address:
        raise InvalidParameters(f"{kind}: bmc_address is required")
    split_address(payload.bmc_address)
    if not payload.credentials_ref:
        raise InvalidParameters(f"{kind}: credentials_ref is required (a name in the site's secret store)")
    secrets.check_ref(payload.credentials_ref)
    ops = OPERATIONS[kind]
    if payload.operation not in ops:
        raise InvalidParameters(
            f"{kind}: operation {payload.operation!r}: one of {', '.join(ops)}"
        )
    allowed = ops[payload.operation]
    if protocol is BmcProtocol.REDFISH:      # every Redfish operation: the operator's vendor profile
        allowed = allowed | {"vendor": False}
    params = dict(payload.parameters)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InvalidParameters(
            f"{kind} {payload.operation}: unknown parameter(s) {', '.join(unknown)}; "
            f"it takes {', '.join(allowed) or 'none'}"
        )
    missing = sorted(n for n, required in allowed.items() if required and not params.get(n))
    if missing:
        raise InvalidParameters(f"{kind} {payload.operation}: missing parameter(s) {', '.join(missing)}")
    args = read_args(params)
    if args.ipmi_address and protocol is not BmcProtocol.REDFISH:
        raise InvalidParameters(f"{kind} {payload.operation}: ipmi_address is for a BMC checked over "
                                "redfish (its ipmi source read over IPMI as well)")
    if payload.operation == "reset_account":
        bmc_golden.check_reset(params)
    if kind == "bmc.firmware":
        _check_firmware(payload.operation, args)
    return BmcParams(
        node_id=payload.node_id, address=payload.bmc_address, protocol=protocol,
        operation=payload.operation, credentials_ref=payload.credentials_ref,
        verify_tls=payload.verify_tls, args=args, expect=_expect(kind, payload),
        firmware_profile=_profile("expect.firmware.profile", payload.expect.firmware.profile)
        if payload.expect.HasField("firmware") else "",
        golden=bmc_golden.parse_golden(payload.expect.golden)
        if _expect_wanted(kind, payload) and payload.expect.HasField("golden") else None,
    )


def _expect_wanted(kind: str, payload: site_pb2.BmcOperationRequest) -> bool:
    return kind == "bmc.query" and payload.operation == "baseline" and payload.HasField("expect")


def _expect(kind: str, payload: site_pb2.BmcOperationRequest) -> ExpectedState | None:
    """bmc.query baseline's expected state, which must set the BMC's half (bios, bmc_accounts);
    no other operation takes one."""
    wanted = kind == "bmc.query" and payload.operation == "baseline"
    if not payload.HasField("expect"):
        if wanted:
            raise InvalidParameters(f"{kind} baseline: expect is required (its bios and/or bmc_accounts)")
        return None
    if not wanted:
        raise InvalidParameters(f"{kind} {payload.operation}: takes no expect (bmc.query baseline does)")
    expected = ExpectedState.from_proto(payload.expect)
    if not expected.site_areas and not payload.expect.HasField("firmware") \
            and not payload.expect.HasField("golden"):
        raise InvalidParameters(f"{kind} baseline: expect sets neither bios nor bmc_accounts nor firmware"
                                " nor golden, the BMC's half")
    return expected
