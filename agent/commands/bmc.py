"""bmc.power, bmc.boot, bmc.query, bmc.rotate, bmc.firmware, bmc.storage: a node's BMC,
driven by the site daemon over Redfish or IPMI.

Every kind takes a ``BmcOperationRequest``; ``parse`` checks the protocol, the address, the
credentials_ref (a name, see agent/site/bmc/secrets.py), the operation and every parameter
before anything runs. ``run`` reads the credentials from the site's secret store, holds
"bmc:<address>" (one operation at a time per BMC; many BMCs in parallel), settles any
rotation a crash interrupted, then does the operation through the protocol's client
(agent/site/bmc/ipmi.py, agent/site/bmc/redfish/) and reports a typed BmcOperationResult.

docs/site.md lists the operations and parameters of each kind.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import limits
from agent.commands import bmc_golden, bmc_spdm
from agent.commands.base import Context, Handler, Kept
from agent.errors import (
    AgentError,
    BmcRefused,
    CommandTimeout,
    InvalidParameters,
    Unsupported,
)
from agent.policy.release import gate
from agent.policy.release.golden import Golden
from agent.policy.release.state import ExpectedState
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc import events, secrets, secure_boot
from agent.site.bmc import posture as bmc_posture
from agent.site.bmc import release as bmc_release
from agent.site.bmc.client import (
    BmcClient,
    BmcProtocol,
    BootDevice,
    BootMode,
    BootSetting,
    CallContext,
    Credentials,
    Pacing,
    PowerAction,
    PowerState,
    Target,
)
from agent.site.bmc.ipmi import check_ipmi_password, split_address
from agent.site.bmc.redfish.vendors import VENDORS

if TYPE_CHECKING:
    from agent.site.bmc.redfish.client import RedfishClient
from agent.site.observe.console import Bmc

Result = site_pb2.BmcOperationResult
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
    "bmc.query": {"query": {}, "events": {"since": False}, "bios": {"names": False}, "baseline": {},
                  "secure_boot": {"policy": False},
                  # the BMC read whole: the golden state's BMC half (agent/commands/bmc_golden.py)
                  "golden": {},
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


def make_client(protocol: BmcProtocol, target: Target, call: CallContext, kept: Kept | None = None,
                key: str = "") -> BmcClient:
    """The protocol's client; a Redfish one starts from what ``kept`` holds under ``key``
    (the BMC's paths and connection from its last command)."""
    if protocol is BmcProtocol.IPMI:
        from agent.site.bmc.ipmi import IpmiClient

        return IpmiClient(target, call)
    from agent.site.bmc.redfish.client import RedfishClient
    from agent.site.bmc.redfish.session import Discovered

    return RedfishClient(target, call, kept.take(key, Discovered) if kept is not None else None)


class BmcSession:
    """One command's use of one BMC: the store entry, the client, the lock."""

    def __init__(self, ctx: Context, params: BmcParams) -> None:
        self.ctx = ctx
        self.params = params
        self.store = secrets.SecretStore(ctx.config.secrets_dir)
        self.partial: list[str] = []    # what the handler could not read, for result.values["partial"]
        self.call = CallContext(
            cancel=ctx.cancel_event, deadline=ctx.deadline,
            pacing=Pacing(ctx.config.bmc_poll_seconds, ctx.config.bmc_poll_max_seconds),
            ipmi_sessions=ctx.locks.slots("ipmi-sessions", ctx.config.ipmi_max_sessions))

    def client(self, creds: Credentials) -> BmcClient:
        target = Target(self.params.address, creds, verify_tls=self.params.verify_tls,
                        vendor=self.params.args.vendor)
        return make_client(self.params.protocol, target, self.call, self.ctx.kept, self.params.lock_name)

    def done(self, client: BmcClient) -> None:
        """End ``client``'s use of its BMC: a Redfish client's paths and idle connection are
        kept for the BMC's next command; every client is closed."""
        from agent.site.bmc.redfish.session import RedfishSession

        if isinstance(client, RedfishSession):
            self.ctx.kept.put(self.params.lock_name, client.leave())
        else:
            client.close()

    def open(self) -> tuple[BmcClient, Credentials]:
        """The client logged in with the entry's working credentials (an interrupted
        rotation settled first)."""
        creds = self.store.get(self.params.credentials_ref)
        client = self.client(creds)
        if self.store.pending(self.params.credentials_ref) is not None:
            creds = self.store.reconcile(self.params.credentials_ref, client.check_login)
            client.close()
            client = self.client(creds)
        return client, creds


def _result(params: BmcParams, client: BmcClient, **fields: Any) -> site_pb2.BmcOperationResult:
    result = site_pb2.BmcOperationResult(operation=params.operation, **fields)
    result.attempts = getattr(client, "attempts", 0)
    return result


class _BmcHandler(Handler[site_pb2.BmcOperationRequest, BmcParams]):
    def parse(self, payload: site_pb2.BmcOperationRequest) -> BmcParams:
        return parse_request(self.kind, payload)

    def serial_key(self, params: BmcParams) -> str:
        # One operation at a time per BMC, in order of arrival: the scheduler's keyed pool
        # starts this command only when no other operation on this BMC runs.
        return params.lock_name

    def run(self, ctx: Context, params: BmcParams) -> site_pb2.BmcOperationResult:
        # The node's boot timeline and console (agent/site/observe/): its console kept from
        # the first command on its BMC, attached before a power on (the firmware's first
        # lines), the power and boot device after.
        observe = ctx.site_services.observe if ctx.site_services is not None and params.node_id else None
        bmc = _observed(params)
        powering = self.kind == "bmc.power" and params.operation in ("on", "cycle", "reset")
        session = BmcSession(ctx, params)
        client, creds = session.open()
        if observe is not None:
            # over SSH where the BMC offers it, SOL where IPMI is on (sshconsole.py): read
            # once per BMC, at the first command that names the node
            bmc = observe.console_for(params.node_id, bmc, client)
        if observe is not None and powering:
            observe.before_power(params.node_id, bmc)
        try:
            if observe is not None and powering:
                observe.power_requested(params.node_id, params.operation)
            result = self.operate(session, client, creds)
            # What could not be read (a LogService down, no virtual media) is said, not lost.
            partial = [*getattr(client, "partial", []), *session.partial]
            if partial:
                result.values["partial"] = "; ".join(partial)
            # An ambiguous answer read back (a Reset answered 500 that took) is said too.
            readback = getattr(client, "readback", [])
            if readback:
                result.values["readback"] = "; ".join(readback)
        except AgentError as exc:
            if observe is not None:
                observe.bmc_failed(params.node_id, self.kind, params.operation, exc.message)
            raise
        finally:
            session.done(client)
        if observe is not None:
            observe.bmc_done(params.node_id, bmc, self.kind, params.operation,
                             str(params.args.device or ""))
        return result

    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        raise NotImplementedError


def _observed(params: BmcParams) -> Bmc:
    return Bmc(params.address, str(params.protocol), params.credentials_ref)


def settle(session: BmcSession, client: BmcClient, want: PowerState, since: float) -> float:
    """Poll until the BMC reports ``want``, paced; the seconds it took since ``since``."""
    pacing = session.call.pacing
    delay = pacing.min_interval
    while True:
        if client.power_state() is want:
            return time.monotonic() - since
        if session.ctx.remaining() <= delay:
            raise CommandTimeout(f"BMC {session.params.address}: power did not settle to "
                                 f"{want} before the deadline", bmc_address=session.params.address)
        session.ctx.sleep(delay)
        delay = min(delay * pacing.factor, pacing.max_interval)


class BmcPower(_BmcHandler, kind="bmc.power"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params = session.params
        action = PowerAction(params.operation)
        before = client.power_state()
        if action is PowerAction.STATUS:
            return _result(params, client, state=str(before), power_state=str(before))
        want = PowerState.OFF if action is PowerAction.OFF else PowerState.ON
        started = time.monotonic()
        if action in (PowerAction.ON, PowerAction.OFF) and before is want:
            return _result(params, client, state=str(want), power_state=str(want), changed=False,
                           power_state_before=str(before))
        # Leave the forced power-off and the settling time within the deadline.
        graceful = max(0.0, min(params.args.graceful_timeout_seconds, session.ctx.remaining() - 30.0))
        client.set_power(action, graceful_timeout=graceful)
        seconds = settle(session, client, want, started)
        return _result(params, client, state=str(want), power_state=str(want), settle_seconds=seconds,
                       changed=True, power_state_before=str(before))


def _boot_message(setting: BootSetting) -> site_pb2.BmcBootDevice:
    return site_pb2.BmcBootDevice(device=str(setting.device), persistent=setting.persistent,
                                  mode=str(setting.mode) if setting.mode else "")


class BmcBoot(_BmcHandler, kind="bmc.boot"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params = session.params
        if params.operation == "get_boot_device":
            now = client.boot_device()
            return _result(params, client, state=str(now.device), boot=_boot_message(now))
        args = params.args
        assert args.device is not None   # required by set_boot_device: parse saw to it
        wanted = BootSetting(args.device, args.persistent, args.mode)
        back = client.set_boot_device(wanted)
        if back.device is not wanted.device:
            raise BmcRefused(
                f"BMC {params.address} accepted boot device {wanted.device} but reads back "
                f"{back.device}", bmc_message=f"read back {back.device}")
        result = _result(params, client, state=str(back.device), boot=_boot_message(back))
        # What the BMC does not report back (IPMI BMCs often drop these bits) is said, not hidden.
        if back.persistent != wanted.persistent:
            result.not_kept.append("persistent")
        if wanted.mode is not None and back.mode is not None and back.mode is not wanted.mode:
            result.not_kept.append("mode")
        return result


def _redfish(session: BmcSession, client: BmcClient) -> RedfishClient:
    """The client as Redfish, for what only Redfish offers (BIOS attributes)."""
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        raise Unsupported(f"{session.params.operation}: Redfish only")
    return client


def media_schemes(ctx: Context, params: BmcParams) -> tuple[str, ...]:
    """The image URL schemes the BMC's virtual media mounts (() for any), asked for
    boot.prepareRamdisk under the BMC's own serial key (its ``lock_name``)."""
    session = BmcSession(ctx, params)
    client, _ = session.open()
    try:
        return _redfish(session, client).media_schemes()
    finally:
        session.done(client)


class BmcQuery(_BmcHandler, kind="bmc.query"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        if session.params.operation == "baseline":
            expected = session.params.expect
            assert expected is not None           # parse saw to it
            seen = bmc_release.observe(client, expected, creds.username)
            mismatches = gate.check_bmc(expected, seen)
            expected_posture = _expected_posture(session)
            if expected_posture:
                mismatches += bmc_release.posture_check(client, expected_posture)
            versions: list[Any] = []
            if session.params.firmware_profile:     # the firmware set's comparison, its own module
                from agent.commands.bmc_fwsets import release_firmware

                found, versions = release_firmware(session.ctx, session.params.firmware_profile, client)
                mismatches.extend(found)
            compared: list[agent_pb2.SourceCount] = []
            if session.params.golden is not None:      # round 2: the BMC whole against its golden
                found, compared = bmc_golden.baseline(client, session.params.golden)
                mismatches.extend(found)
            result = _result(session.params, client, state="pool_ready" if not mismatches
                             else f"{len(mismatches)} finding(s)")
            result.release.CopyFrom(bmc_release.report(
                expected, mismatches, (bmc_release.POSTURE_AREA,) if expected_posture else ()))
            if session.params.firmware_profile:
                result.release.checked.append("firmware")
                result.release.firmware.extend(versions)
            if compared:
                result.release.checked.append("golden")
                result.release.compared.extend(compared)
            return result
        if session.params.operation == "golden":
            return bmc_golden.capture_result(client, _result(session.params, client))
        if session.params.operation == "secure_boot":
            return _secure_boot(session, client)
        if session.params.operation == "bios":
            current, pending = _redfish(session, client).bios(list(session.params.args.names))
            state = f"{len(current)} attributes, {len(pending)} pending"
            result = _result(session.params, client, state=state)
            result.values.update({k: str(v) for k, v in current.items()})
            result.values.update({f"pending.{k}": str(v) for k, v in pending.items()})
            return result
        if session.params.operation == "responders":
            return bmc_spdm.responders(client, _result(session.params, client))
        if session.params.operation == "measurements":
            return bmc_spdm.measurements(client, session.params.args.nonces, _result(session.params, client))
        if session.params.operation == "events":
            result = _result(session.params, client, events=client.event_log(session.params.args.since))
            result.state = f"{len(result.events)} entries"
            result.attempts = getattr(client, "attempts", 0)
            return result
        result = client.query()
        site = session.ctx.site_services
        if site is not None and session.params.node_id and result.parts:  # for inventory.refresh
            site.parts.record(session.params.node_id, session.params.address, result)
        _management(session, client, result)
        result.operation = session.params.operation
        result.state = result.power_state
        result.attempts = getattr(client, "attempts", 0)
        return result


def _expected_posture(session: BmcSession) -> dict[str, bool]:
    """The fleet's BMC posture (the site's ``bmc_posture`` setting); {} when unset."""
    return bmc_posture.parse(session.ctx.config.bmc_posture)


def _restore_posture(session: BmcSession, client: BmcClient) -> Result:
    """bmc.firmware restore_posture: the site's bmc_posture put back where the BMC takes it; what
    was put back in ``values["posture_restored"]``, what still stands in ``release``."""
    expected = _expected_posture(session)
    if not expected:
        raise InvalidParameters("bmc.firmware restore_posture: the site's bmc_posture setting is unset: "
                                "no posture to put back")
    found, restored = bmc_release.posture_restore(client, expected)
    result = _result(session.params, client,
                     state="restored" if not found else f"{len(found)} finding(s) left")
    result.values["posture_restored"] = ", ".join(restored) or "none"
    result.release.CopyFrom(agent_pb2.ReleaseReport(pool_ready=not found, checked=[bmc_release.POSTURE_AREA],
                                                    cannot_restore=found))
    return result


def _management(session: BmcSession, client: BmcClient, result: Result) -> None:
    """bmc.query query: the BMC's management posture in ``result.management`` (Redfish); what
    could not be read is named partial, the rest of the query kept."""
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        return
    try:
        result.management.extend(state.message() for state in client.posture())
    except (Unsupported, BmcRefused) as exc:
        session.partial.append(f"management: {exc.message}")


def _secure_boot(session: BmcSession, client: BmcClient) -> Result:
    """bmc.query secure_boot: the SecureBoot resource in ``values``; with a ``policy``, the
    release gate's Secure Boot findings in ``release`` (agent/site/bmc/secure_boot.py)."""
    policy = session.params.args.policy
    state, why = secure_boot.observe(_redfish(session, client))
    if policy is None:
        if state is None:
            raise Unsupported(f"bmc.query secure_boot: {why}")
        result = _result(session.params, client, state=state.mode or "unknown")
        result.values.update(state.values())
        return result
    mismatches = secure_boot.check(policy, state, why)
    result = _result(session.params, client, state="pool_ready" if not mismatches
                     else f"{len(mismatches)} finding(s)")
    if state is not None:
        result.values.update(state.values())
    result.release.CopyFrom(secure_boot.report(mismatches))
    return result


def _restore_secure_boot(session: BmcSession, client: BmcClient) -> Result:
    """bmc.firmware restore_secure_boot: the keys and Secure Boot put back as the policy says,
    each write once and read back; ``release`` what is still off after (named, never passed)."""
    report, done = secure_boot.restore_report(_redfish(session, client), session.params.args.policy)
    result = _result(session.params, client, state="restored" if report.pool_ready
                     else f"{len(report.restorable) + len(report.cannot_restore)} finding(s) left")
    result.values["writes"] = "; ".join(done) or "none"
    result.release.CopyFrom(report)
    return result


class BmcRotate(_BmcHandler, kind="bmc.rotate"):
    """rotate: stage, set, prove, promote: the working password is kept until the new one is
    proven. disable_account: an account the release's check found (bmc.query baseline) disabled,
    once, and read back; never the site's own."""

    def disable(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params, username = session.params, session.params.args.username
        if username == creds.username:
            raise InvalidParameters(f"{username!r} is the site's own account on this BMC "
                                    f"({params.credentials_ref}); it is not disabled")
        back = client.disable_account(username)
        session.ctx.log.info("bmc.rotate: %s: account %r disabled (%d)", params.address, username, len(back))
        result = _result(params, client, state="disabled")
        result.values.update({"username": username, "accounts": ",".join(a.id for a in back)})
        return result

    def new_password(self, session: BmcSession) -> str:
        args = session.params.args
        if args.new_password_ref:
            password = session.store.get(args.new_password_ref).password
        else:
            length = args.length
            policy = secrets.PasswordPolicy(min_length=12, max_length=20) \
                if session.params.protocol is BmcProtocol.IPMI else secrets.PasswordPolicy(max_length=64)
            password = policy.generate(length)
        if session.params.protocol is BmcProtocol.IPMI:
            check_ipmi_password(password)
        return password

    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params, args = session.params, session.params.args
        if params.operation == "disable_account":
            return self.disable(session, client, creds)
        if params.operation == "reset_account":
            return bmc_golden.reset_account(client, creds, args.account, args.user_name, args.role,
                                            args.enabled, _result(params, client))
        if params.operation == "delete_subscription":
            return bmc_golden.delete_subscription(client, args.subscription, _result(params, client))
        params, store, ref = session.params, session.store, session.params.credentials_ref
        new = Credentials(creds.username, self.new_password(session))
        if new.password == creds.password:
            raise InvalidParameters("the new password is the current one")
        store.stage(ref, new)
        try:
            client.set_password(creds.username, new.password)
        except AgentError:
            # Did it take? Keep whichever the BMC now accepts; then report the failure.
            store.reconcile(ref, client.check_login)
            raise
        new_ok = client.check_login(new)
        if not new_ok:
            store.reconcile(ref, client.check_login)
            raise BmcRefused(f"BMC {params.address}: the new password is not accepted after the "
                             "change; the old one is kept", bmc_message="login with the new password failed")
        old_ok = client.check_login(creds)
        if old_ok:
            # Both work: the change did not take the way it should; keep both for an operator.
            raise BmcRefused(f"BMC {params.address}: the old password still works after the "
                             "change; both are kept (pending) for the next use to settle",
                             bmc_message="login with the old password still succeeds")
        store.promote(ref)
        ctx_log = session.ctx.log
        ctx_log.info("bmc.rotate: %s: password of %s rotated and proven", params.address, creds.username)
        result = _result(params, client, state="rotated")
        result.values.update({"username": creds.username, "credentials_ref": ref,
                              "new_login": "accepted", "old_login": "refused"})
        return result


class BmcFirmware(_BmcHandler, kind="bmc.firmware"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params, args = session.params, session.params.args

        def progress(percent: int, message: str) -> None:
            session.ctx.progress(done=percent, total=100, message=message, subject=params.address)

        if params.operation == "set_bios":
            back, pending = _redfish(session, client).set_bios(dict(args.attributes))
            state = "pending: applied at the next reset" if pending else "applied"
            result = _result(params, client, state=state)
            result.values.update({k: str(v) for k, v in back.items()})
            return result
        if params.operation == "restore_secure_boot":
            return _restore_secure_boot(session, client)
        if params.operation == "restore_posture":
            return _restore_posture(session, client)
        if params.operation == "set_service":
            assert args.enabled is not None       # required: parse saw to it
            return bmc_golden.set_service(client, args.protocol, args.enabled, _result(params, client))
        if params.operation in ("plan", "apply"):
            from agent.commands.bmc_fwsets import firmware_set

            def power(after: str) -> None:       # a step's reboot ("reboot") or AC cycle
                started = time.monotonic()
                client.set_power(PowerAction.RESET if after == "reboot" else PowerAction.CYCLE,
                                 graceful_timeout=0.0)
                settle(session, client, PowerState.ON, started)

            return firmware_set(session.ctx, params.operation, args.profile, _redfish(session, client),
                                _result(params, client), power=power, progress=progress)
        if params.operation == "status":
            result = client.firmware_status(args.task_uri)
            result.attempts = getattr(client, "attempts", 0)
            return result
        if params.operation == "simple_update":
            task = client.firmware_update(image_uri=args.image_uri, transfer_protocol=args.transfer_protocol,
                                          method="simple_update", progress=progress)
        else:     # push (a file: multipart, else HttpPushUri) or update (what the BMC offers that fits)
            task = client.firmware_update(image_uri=args.image_uri, file=args.file, sha256=args.sha256,
                                          transfer_protocol=args.transfer_protocol, method=args.method,
                                          progress=progress)
        return _result(params, client, state=task.state, firmware=task)


class BmcStorage(_BmcHandler, kind="bmc.storage"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params, args, op = session.params, session.params.args, session.params.operation
        result = _result(params, client)
        if op == "list":
            # Each half on its own: a BMC with Storage and no virtual media (BlueField-3) or
            # the reverse answers what it has, the rest named partial; neither is refused.
            try:
                result.storage.extend(client.storage())
            except Unsupported as exc:
                session.partial.append(f"storage: {exc.message}")
            try:
                result.virtual_media.extend(client.virtual_media())
            except Unsupported as exc:
                if session.partial:
                    raise
                session.partial.append(f"virtual_media: {exc.message}")
        elif op == "insert_media":
            # The site's own media URL has an https twin where the site serves its media over
            # TLS: a BMC that mounts https:// only is handed that one (docs/site.md).
            site = session.ctx.site_services
            twin = site.media.over_https(args.image_url) if site is not None else ""
            alternates = (twin,) if twin else ()
            media = client.insert_media(args.image_url, media_type=args.media_type, alternates=alternates)
            result.virtual_media.append(media)
            # Read back, as bmc.boot does the boot device: a BMC that accepted the request but
            # holds no medium (or another one) would boot something else.
            if not media.inserted or media.image not in (args.image_url, *alternates):
                raise BmcRefused(
                    f"BMC {params.address} accepted the medium but reads back "
                    f"{'inserted' if media.inserted else 'not inserted'}"
                    f"{', another image' if media.inserted else ''} in {media.id or 'its drive'}",
                    bmc_message=f"read back inserted={str(media.inserted).lower()}")
        elif op == "eject_media":
            client.eject_media()
        elif op == "create_volume":
            volume = client.create_volume(
                args.controller_id, name=args.name, raid_type=args.raid_type,
                drives=list(args.drives), capacity_bytes=args.capacity_bytes)
            result.storage.add(id=args.controller_id).volumes.append(volume)
        elif op == "delete_volume":
            client.delete_volume(args.volume_id)
        result.state = "done"
        result.attempts = getattr(client, "attempts", 0)
        return result
