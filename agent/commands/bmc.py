"""bmc.power, bmc.boot, bmc.query, bmc.rotate, bmc.firmware, bmc.storage: a node's BMC,
driven by the site daemon over Redfish or IPMI.

Every kind takes a ``BmcOperationRequest``; ``parse`` checks the protocol, the address, the
credentials_ref (a name, see agent/site/bmc/secrets.py), the operation and every parameter
before anything runs. ``run`` reads the credentials from the site's secret store, holds
"bmc:<address>" (one operation at a time per BMC; many BMCs in parallel), settles any
rotation a crash interrupted, then does the operation through the protocol's client
(agent/site/bmc/ipmi.py, agent/site/bmc/redfish/) and reports a typed BmcOperationResult.
The request is read at the edge by agent/commands/bmc_params.py; the golden state's, SPDM's
and the firmware sets' parts are bmc_golden.py, bmc_spdm.py and bmc_fwsets.py.

docs/site.md lists the operations and parameters of each kind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agent.commands import bmc_golden, bmc_spdm
from agent.commands.base import Context, Handler, Kept
from agent.commands.bmc_params import BmcParams, parse_request
from agent.errors import (
    AgentError,
    BmcRefused,
    CommandTimeout,
    InvalidParameters,
    Unsupported,
)
from agent.policy.release import gate
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc import posture as bmc_posture
from agent.site.bmc import release as bmc_release
from agent.site.bmc import secrets, secure_boot
from agent.site.bmc.client import (
    BmcClient,
    BmcProtocol,
    BootSetting,
    CallContext,
    Credentials,
    Pacing,
    PowerAction,
    PowerState,
    Target,
)
from agent.site.bmc.ipmi import check_ipmi_password

if TYPE_CHECKING:
    from agent.site.bmc.redfish.client import RedfishClient
from agent.site.observe.console import Bmc

Result = site_pb2.BmcOperationResult
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

    @contextlib.contextmanager
    def second(self, creds: Credentials) -> Iterator[BmcClient | None]:
        """The same BMC over IPMI, with the same credentials, where the request names its
        ``ipmi_address`` (bmc.query golden and baseline over Redfish); None where it does not.
        Read-only use: the command's serial key stays the Redfish address's."""
        if not self.params.args.ipmi_address:
            yield None
            return
        target = Target(self.params.args.ipmi_address, creds)
        client = make_client(BmcProtocol.IPMI, target, self.call)
        try:
            yield client
        finally:
            client.close()

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
                with session.second(creds) as ipmi:
                    found, compared = bmc_golden.baseline(client, session.params.golden, ipmi)
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
            with session.second(creds) as ipmi:
                return bmc_golden.capture_result(client, _result(session.params, client), ipmi)
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
