"""bmc.power, bmc.boot, bmc.query, bmc.rotate, bmc.firmware, bmc.storage: a node's BMC,
driven by the site daemon over Redfish or IPMI.

Every kind takes a ``BmcOperationRequest``; ``parse`` checks the protocol, the address, the
credentials_ref (a name, see agent/site/secrets.py), the operation and every parameter
before anything runs. ``run`` reads the credentials from the site's secret store, holds
"bmc:<address>" (one operation at a time per BMC; many BMCs in parallel), settles any
rotation a crash interrupted, then does the operation through the protocol's client
(agent/site/ipmi.py, agent/site/redfish.py) and reports a typed BmcOperationResult.

docs/site.md lists the operations and parameters of each kind.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import limits
from agent.commands.base import Context, Handler
from agent.errors import (
    AgentError,
    BmcRefused,
    CommandTimeout,
    InvalidParameters,
)
from agent.proto import site_pb2
from agent.site import events, secrets
from agent.site.bmc import (
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
from agent.site.ipmi import check_ipmi_password, split_address

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
    "bmc.query": {"query": {}, "events": {"since": False}},
    "bmc.rotate": {"rotate": {"new_password_ref": False, "length": False}},
    "bmc.firmware": {
        "simple_update": {"image_uri": True, "transfer_protocol": False},
        "push": {"file": True, "sha256": True},
        "status": {"task_uri": False},
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
class BmcParams:
    node_id: str
    address: str                  # as given; the lock uses ``lock_name``
    protocol: BmcProtocol
    operation: str
    credentials_ref: str
    verify_tls: bool
    parameters: Mapping[str, str] = field(default_factory=dict)

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


def _check_values(kind: str, op: str, p: Mapping[str, str]) -> None:
    """Each parameter's value, as far as it can be checked without the BMC."""
    if "graceful_timeout_seconds" in p:
        _number("graceful_timeout_seconds", p["graceful_timeout_seconds"], 0, 240)
    if "device" in p:
        try:
            BootDevice(p["device"])
        except ValueError:
            raise InvalidParameters(f"parameter device: one of {', '.join(BootDevice)}") from None
    if "persistent" in p:
        _bool("persistent", p["persistent"])
    if p.get("mode"):
        try:
            BootMode(p["mode"])
        except ValueError:
            raise InvalidParameters(f"parameter mode: one of {', '.join(BootMode)}") from None
    if "new_password_ref" in p:
        secrets.check_ref(p["new_password_ref"])
    if "length" in p:
        _number("length", p["length"], 8, 64)
    for name in ("image_uri", "image_url"):
        if name in p and not p[name].startswith(("http://", "https://", "ftp://", "nfs://", "cifs://")):
            raise InvalidParameters(f"parameter {name}: a URL (http, https, ftp, nfs, cifs)")
    if "sha256" in p and not re.fullmatch(r"[0-9a-fA-F]{64}", p["sha256"]):
        raise InvalidParameters("parameter sha256: 64 hexadecimal digits")
    if "file" in p and not p["file"].startswith("/"):
        raise InvalidParameters("parameter file: an absolute path on the site server")
    if "since" in p:
        events.parse_since(p["since"])
    if "task_uri" in p and (not re.fullmatch(r"/(?!/)[!$&'()*+,;=:@%A-Za-z0-9._~/-]{0,1023}", p["task_uri"])
                            or ".." in p["task_uri"].split("/")):
        raise InvalidParameters("parameter task_uri: a path on the BMC (/redfish/v1/TaskService/Tasks/...)")
    if "capacity_bytes" in p and not limits.is_digits(p["capacity_bytes"]):
        raise InvalidParameters("parameter capacity_bytes: a whole number of bytes")


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
    _check_values(kind, payload.operation, params)
    return BmcParams(
        node_id=payload.node_id, address=payload.bmc_address, protocol=protocol,
        operation=payload.operation, credentials_ref=payload.credentials_ref,
        verify_tls=payload.verify_tls, parameters=params,
    )


def make_client(protocol: BmcProtocol, target: Target, call: CallContext) -> BmcClient:
    if protocol is BmcProtocol.IPMI:
        from agent.site.ipmi import IpmiClient

        return IpmiClient(target, call)
    from agent.site.redfish import RedfishClient

    return RedfishClient(target, call)


class BmcSession:
    """One command's use of one BMC: the store entry, the client, the lock."""

    def __init__(self, ctx: Context, params: BmcParams) -> None:
        self.ctx = ctx
        self.params = params
        self.store = secrets.SecretStore(ctx.config.secrets_dir)
        self.call = CallContext(
            cancel=ctx.cancel_event, deadline=ctx.deadline, pacing=Pacing(),
            ipmi_sessions=ctx.locks.slots("ipmi-sessions", ctx.config.ipmi_max_sessions))

    def client(self, creds: Credentials) -> BmcClient:
        target = Target(self.params.address, creds, verify_tls=self.params.verify_tls)
        return make_client(self.params.protocol, target, self.call)

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
        session = BmcSession(ctx, params)
        client, creds = session.open()
        try:
            return self.operate(session, client, creds)
        finally:
            client.close()

    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        raise NotImplementedError


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
            result = _result(params, client, state=str(want), power_state=str(want))
            result.values["changed"] = "false"
            return result
        graceful = float(params.parameters.get("graceful_timeout_seconds", DEFAULT_GRACEFUL_SECONDS))
        # Leave the forced power-off and the settling time within the deadline.
        graceful = max(0.0, min(graceful, session.ctx.remaining() - 30.0))
        client.set_power(action, graceful_timeout=graceful)
        seconds = settle(session, client, want, started)
        result = _result(params, client, state=str(want), power_state=str(want), settle_seconds=seconds)
        result.values["changed"] = "true"
        result.values["before"] = str(before)
        return result


def _boot_message(setting: BootSetting) -> site_pb2.BmcBootDevice:
    return site_pb2.BmcBootDevice(device=str(setting.device), persistent=setting.persistent,
                                  mode=str(setting.mode) if setting.mode else "")


class BmcBoot(_BmcHandler, kind="bmc.boot"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params = session.params
        if params.operation == "get_boot_device":
            now = client.boot_device()
            return _result(params, client, state=str(now.device), boot=_boot_message(now))
        p = params.parameters
        wanted = BootSetting(BootDevice(p["device"]), _bool("persistent", p.get("persistent", "")),
                             BootMode(p["mode"]) if p.get("mode") else None)
        client.set_boot_device(wanted)
        back = client.boot_device()
        if back.device is not wanted.device:
            raise BmcRefused(
                f"BMC {params.address} accepted boot device {wanted.device} but reads back "
                f"{back.device}", bmc_message=f"read back {back.device}")
        result = _result(params, client, state=str(back.device), boot=_boot_message(back))
        # What the BMC does not report back (IPMI BMCs often drop these bits) is said, not hidden.
        if back.persistent != wanted.persistent:
            result.values["persistent_read_back"] = str(back.persistent).lower()
        if wanted.mode is not None and back.mode is not None and back.mode is not wanted.mode:
            result.values["mode_read_back"] = str(back.mode)
        return result


class BmcQuery(_BmcHandler, kind="bmc.query"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        if session.params.operation == "events":
            since = events.parse_since(session.params.parameters.get("since") or "0")
            result = _result(session.params, client, events=client.event_log(since))
            result.state = f"{len(result.events)} entries"
            result.attempts = getattr(client, "attempts", 0)
            return result
        result = client.query()
        result.operation = session.params.operation
        result.state = result.power_state
        result.attempts = getattr(client, "attempts", 0)
        return result


class BmcRotate(_BmcHandler, kind="bmc.rotate"):
    """Stage, set, prove, promote: the working password is kept until the new one is proven."""

    def new_password(self, session: BmcSession) -> str:
        p = session.params.parameters
        if p.get("new_password_ref"):
            password = session.store.get(p["new_password_ref"]).password
        else:
            length = int(float(p["length"])) if "length" in p else None
            policy = secrets.PasswordPolicy(min_length=12, max_length=20) \
                if session.params.protocol is BmcProtocol.IPMI else secrets.PasswordPolicy(max_length=64)
            password = policy.generate(length)
        if session.params.protocol is BmcProtocol.IPMI:
            check_ipmi_password(password)
        return password

    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
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
        params, p = session.params, session.params.parameters

        def progress(percent: int, message: str) -> None:
            session.ctx.progress(done=percent, total=100, message=message, subject=params.address)

        if params.operation == "status":
            result = client.firmware_status(p.get("task_uri", ""))
            result.attempts = getattr(client, "attempts", 0)
            return result
        if params.operation == "simple_update":
            task = client.firmware_update(image_uri=p["image_uri"],
                                          transfer_protocol=p.get("transfer_protocol", ""),
                                          progress=progress)
        else:
            task = client.firmware_update(file=Path(p["file"]), sha256=p["sha256"].lower(),
                                          progress=progress)
        return _result(params, client, state=task.state, firmware=task)


class BmcStorage(_BmcHandler, kind="bmc.storage"):
    def operate(self, session: BmcSession, client: BmcClient, creds: Credentials) -> Result:
        params, p, op = session.params, session.params.parameters, session.params.operation
        result = _result(params, client)
        if op == "list":
            result.storage.extend(client.storage())
            result.virtual_media.extend(client.virtual_media())
        elif op == "insert_media":
            media = client.insert_media(p["image_url"], media_type=p.get("media_type") or "CD")
            result.virtual_media.append(media)
            # Read back, as bmc.boot does the boot device: a BMC that accepted the request but
            # holds no medium (or another one) would boot something else.
            if not media.inserted or media.image != p["image_url"]:
                raise BmcRefused(
                    f"BMC {params.address} accepted the medium but reads back "
                    f"{'inserted' if media.inserted else 'not inserted'}"
                    f"{', another image' if media.inserted else ''} in {media.id or 'its drive'}",
                    bmc_message=f"read back inserted={str(media.inserted).lower()}")
        elif op == "eject_media":
            client.eject_media()
        elif op == "create_volume":
            volume = client.create_volume(
                p["controller_id"], name=p["name"], raid_type=p["raid_type"],
                drives=[d for d in p["drives"].split(",") if d],
                capacity_bytes=int(p.get("capacity_bytes") or 0))
            result.storage.add(id=p["controller_id"]).volumes.append(volume)
        elif op == "delete_volume":
            client.delete_volume(p["volume_id"])
        result.state = "done"
        result.attempts = getattr(client, "attempts", 0)
        return result
