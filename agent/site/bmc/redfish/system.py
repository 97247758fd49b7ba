"""The System over Redfish: power (ComputerSystem.Reset), the boot override, the inventory
that bmc.query reads (System, Manager, NICs, sensors, firmware versions), and accounts.

Functions over a ``RedfishSession`` (agent/site/bmc/redfish/session.py).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time

from agent.errors import BmcRefused, BmcUnreachable, Cancelled, CommandTimeout, Unsupported
from agent.proto import site_pb2
from agent.site.bmc.client import BootDevice, BootMode, BootSetting, PowerAction, PowerState, Unconfirmed
from agent.site.bmc.redfish import firmware, hardware
from agent.site.bmc.redfish.session import (
    Doc,
    RedfishSession,
    dicts,
    link,
    normal_mac,
    text,
)

log = logging.getLogger(__name__)

_BOOT_TO_REDFISH = {
    BootDevice.PXE: "Pxe",
    BootDevice.HTTP: "UefiHttp",
    BootDevice.DISK: "Hdd",
    BootDevice.CDROM: "Cd",
    BootDevice.BIOS: "BiosSetup",
    BootDevice.NONE: "None",
}
_BOOT_FROM_REDFISH = {v: k for k, v in _BOOT_TO_REDFISH.items()}
_MODE_TO_REDFISH = {BootMode.UEFI: "UEFI", BootMode.LEGACY: "Legacy"}
_MODE_FROM_REDFISH = {v: k for k, v in _MODE_TO_REDFISH.items()}
# PoweringOn is not on yet, PoweringOff not off yet: the caller keeps polling.
_POWER_FROM_REDFISH = {"On": PowerState.ON, "PoweringOff": PowerState.ON, "Paused": PowerState.ON,
                       "Off": PowerState.OFF, "PoweringOn": PowerState.OFF}



# -- power ---------------------------------------------------------------------------


def power_state(s: RedfishSession) -> PowerState:
    return _power_of(s, s.system())


def _power_of(s: RedfishSession, system: Doc) -> PowerState:
    value = system.get("PowerState")
    state = _POWER_FROM_REDFISH.get(value) if isinstance(value, str) else None
    if state is None:
        raise BmcRefused(f"Redfish BMC {s.target.address}: unknown PowerState {value!r}")
    return state


def _reset_types(s: RedfishSession, system: Doc) -> tuple[str, list[str]]:
    """(the Reset action's target, its allowed ResetTypes; [] when the BMC does not say)."""
    action = system.get("Actions", {}).get("#ComputerSystem.Reset")
    if not isinstance(action, dict) or not action.get("target"):
        raise Unsupported(f"Redfish BMC {s.target.address}: the System has no Reset action")
    allowed = action.get("ResetType@Redfish.AllowableValues")
    if allowed is None and action.get("@Redfish.ActionInfo"):
        info = s.get(action["@Redfish.ActionInfo"])
        for param in info.get("Parameters", []):
            if isinstance(param, dict) and param.get("Name") == "ResetType":
                allowed = param.get("AllowableValues")
    return str(action["target"]), [str(a) for a in allowed or []]


class ResetOutcome(enum.StrEnum):
    """What a Reset answered ambiguously did, as read back (``_reset``)."""

    APPLIED = "applied"
    NOT_APPLIED = "not applied"
    UNKNOWN = "unknown"


# The PowerState a ResetType leaves the System in; the others (ForceRestart, PowerCycle,
# GracefulRestart, Nmi, PushPowerButton) leave it as it was, or say nothing by it.
_RESET_LEAVES = {"On": PowerState.ON, "ForceOn": PowerState.ON,
                 "ForceOff": PowerState.OFF, "GracefulShutdown": PowerState.OFF}


def _reset(s: RedfishSession, target: str, reset_type: str, *, quiet: bool = False) -> ResetOutcome:
    """POST the Reset once. Answered ambiguously (a 5xx after the request went out whole, a cut
    answer, a timeout: ``Unconfirmed``), it is not sent again but read back (``_reset_readback``):
    applied, and the command goes on; not applied (the BMC's own LastResetTime and PowerState
    unchanged after the reads), and it is sent once more, the one resend a reset ever gets;
    unknown, and Unconfirmed is raised saying so. ``quiet`` (GracefulShutdown, whose caller
    waits and then forces off anyway): never resent nor raised. Each outcome is noted in
    ``s.readback``."""
    log.info("Redfish %s: ResetType %s", s.target.address, reset_type)
    before = s.as_read(s.system_ref()).doc
    for attempt in (1, 2):
        try:
            s.send("POST", target, json_body={"ResetType": reset_type})
            return ResetOutcome.APPLIED
        except Unconfirmed as exc:
            if s.call.cancel.is_set():
                raise
            outcome, why = _reset_readback(s, reset_type, before)
            status = exc.details.get("status", "")
            said = f"HTTP {status}" if status and status != "0" else "no answer"
            s.readback.append(f"Reset {reset_type}: {said}; read back: {outcome} ({why})")
            log.warning("Redfish %s: Reset %s answered ambiguously (%s); read back: %s (%s)",
                        s.target.address, reset_type, said, outcome, why)
            if outcome is ResetOutcome.APPLIED or quiet:
                return outcome
            if outcome is ResetOutcome.UNKNOWN or attempt == 2:
                raise Unconfirmed(f"Redfish BMC {s.target.address}: Reset {reset_type}: {said};"
                                  f" read back: {outcome} ({why}); not sent again: the BMC may have"
                                  " acted on it", status=exc.details.get("status", ""), ambiguous="true",
                                  readback=str(outcome)) from exc
    raise AssertionError("unreachable")


def _reset_readback(s: RedfishSession, reset_type: str, before: Doc) -> tuple[ResetOutcome, str]:
    """Read the System back, paced, ``reset_readback_polls`` times (the vendor row's): applied
    where its LastResetTime moved, or its PowerState became the one the reset leaves (or, for a
    restart, was seen off); not applied where it has a LastResetTime and neither it nor the
    PowerState moved in all the reads; unknown otherwise (no LastResetTime to tell by, an
    answer missing, the deadline)."""
    was, last = before.get("PowerState"), before.get("LastResetTime")
    leaves = _RESET_LEAVES.get(reset_type)
    pacing, polls = s.call.pacing, s.vendor().reset_readback_polls
    interval, seen, moved = pacing.min_interval, 0, False
    for _ in range(polls):
        left = s.call.deadline - time.monotonic()
        if left <= interval:
            return ResetOutcome.UNKNOWN, "the deadline came before the reads"
        if s.call.cancel.wait(interval):
            raise Cancelled("cancelled")
        interval = min(pacing.max_interval, interval * pacing.factor)
        try:
            doc = s.get(s.system_ref())
        except (BmcRefused, BmcUnreachable) as exc:
            log.info("Redfish %s: reading the System back: %s", s.target.address, exc.message)
            continue
        seen += 1
        now = doc.get("PowerState")
        if last is not None and doc.get("LastResetTime") not in (None, last):
            return ResetOutcome.APPLIED, "LastResetTime moved"
        if leaves is not None and now != was and _POWER_FROM_REDFISH.get(str(now)) is leaves:
            return ResetOutcome.APPLIED, f"PowerState {now}"
        if leaves is None and was == "On" and now in ("Off", "PoweringOn", "PoweringOff"):
            return ResetOutcome.APPLIED, f"PowerState {now} on the way back"
        moved = moved or now != was
    if seen == polls and last is not None and not moved:
        return ResetOutcome.NOT_APPLIED, f"LastResetTime and PowerState unchanged in {polls} reads"
    return ResetOutcome.UNKNOWN, ("the System has no LastResetTime to tell by" if last is None
                                  else f"{seen} of {polls} reads answered")


def set_power(s: RedfishSession, action: PowerAction, *, graceful_timeout: float) -> None:
    if action is PowerAction.STATUS:
        return
    system = s.as_read(s.system_ref()).doc   # the caller has just read the state
    state = _power_of(s, system)
    target, allowed = _reset_types(s, system)

    def pick(*choices: str) -> str:
        for choice in choices:
            if not allowed or choice in allowed:
                return choice
        raise Unsupported(f"Redfish BMC {s.target.address} offers none of ResetType {choices}")

    if action is PowerAction.ON:
        if state is not PowerState.ON:
            _reset(s, target, pick("On", "ForceOn"))
    elif action is PowerAction.OFF:
        if state is not PowerState.OFF:
            _power_off(s, target, allowed, graceful_timeout)
    elif state is PowerState.OFF:          # cycle or reset of a node that is off: start it
        _reset(s, target, pick("On", "ForceOn"))
    elif action is PowerAction.CYCLE and (not allowed or "PowerCycle" in allowed):
        _reset(s, target, "PowerCycle")
    elif action is PowerAction.RESET and (not allowed or "ForceRestart" in allowed):
        _reset(s, target, "ForceRestart")
    else:                                  # no cycle/restart offered: off, settled, on
        _reset(s, target, pick("ForceOff"))
        _wait_power(s, PowerState.OFF, s.call.deadline)
        _reset(s, target, pick("On", "ForceOn"))


def _power_off(s: RedfishSession, target: str, allowed: list[str], graceful_timeout: float) -> None:
    if not allowed or "GracefulShutdown" in allowed:
        _reset(s, target, "GracefulShutdown", quiet=True)
        until = min(time.monotonic() + graceful_timeout, s.call.deadline)
        if _wait_power(s, PowerState.OFF, until, raise_timeout=False):
            return
        log.info("Redfish %s: not off after %.0f s of GracefulShutdown, forcing",
                 s.target.address, graceful_timeout)
    if "ForceOff" not in allowed and allowed:
        raise Unsupported(f"Redfish BMC {s.target.address} offers no ResetType ForceOff")
    _reset(s, target, "ForceOff")


def _wait_power(s: RedfishSession, want: PowerState, until: float, *, raise_timeout: bool = True) -> bool:
    for _ in s.paced(until):
        if power_state(s) is want:
            return True
    if raise_timeout:
        raise CommandTimeout(f"Redfish BMC {s.target.address}: power not {want} in time")
    return False


# -- boot ----------------------------------------------------------------------------


def boot_device(s: RedfishSession) -> BootSetting:
    return _boot_of(s, s.system())


def _boot_of(s: RedfishSession, system: Doc) -> BootSetting:
    boot = system.get("Boot", {})
    enabled = boot.get("BootSourceOverrideEnabled", "Disabled")
    raw = boot.get("BootSourceOverrideTarget", "None")
    mode = _MODE_FROM_REDFISH.get(boot.get("BootSourceOverrideMode", ""))
    if enabled == "Disabled" or raw in (None, "None"):
        return BootSetting(BootDevice.NONE, persistent=False, mode=mode)
    device = _BOOT_FROM_REDFISH.get(raw)
    if device is None:
        raise Unsupported(f"Redfish BMC {s.target.address}: boot override {raw!r} has no name here")
    return BootSetting(device, persistent=enabled == "Continuous", mode=mode)


def _boot_patches(s: RedfishSession, setting: BootSetting, boot: Doc) -> list[Doc]:
    """The Boot PATCH bodies for ``setting`` given the Boot read now, in order: checked against
    the allowable values the BMC gives; the mode only where the Boot offers it, and only when it
    must change (iDRAC queues a BIOS job for a mode named unchanged) unless the vendor needs
    it in every PATCH; in a PATCH of its own where the vendor takes no extra property."""
    where = f"Redfish BMC {s.target.address}"
    wanted = _BOOT_TO_REDFISH[setting.device]
    allowed = boot.get("BootSourceOverrideTarget@Redfish.AllowableValues")
    if setting.device is not BootDevice.NONE and isinstance(allowed, list) and wanted not in allowed:
        raise Unsupported(f"{where} cannot boot from {setting.device}"
                          f" (BootSourceOverrideTarget {wanted} not in {allowed})")
    enabled = "Disabled" if setting.device is BootDevice.NONE else \
        "Continuous" if setting.persistent else "Once"
    offered = boot.get("BootSourceOverrideEnabled@Redfish.AllowableValues")
    if isinstance(offered, list) and enabled not in offered:
        raise Unsupported(f"{where} offers no {enabled} boot override (BootSourceOverrideEnabled {offered})")
    patch: Doc = {"BootSourceOverrideTarget": wanted, "BootSourceOverrideEnabled": enabled}
    vendor = s.vendor()
    modes = boot.get("BootSourceOverrideMode@Redfish.AllowableValues")
    has_mode = "BootSourceOverrideMode" in boot or isinstance(modes, list)
    current = boot.get("BootSourceOverrideMode")
    mode = _MODE_TO_REDFISH[setting.mode] if setting.mode is not None else None
    if mode is not None and not has_mode:
        log.info("%s: its Boot has no BootSourceOverrideMode; mode %s not sent", where, mode)
        mode = None
    if mode is not None and isinstance(modes, list) and mode not in modes:
        raise Unsupported(f"{where} offers no boot mode {mode} (BootSourceOverrideMode {modes})")
    if mode is None and vendor.mode_in_every_boot_patch and has_mode and isinstance(current, str):
        mode = current                 # named, unchanged, lest the BMC reset it to Legacy
    if mode is None or (mode == current and not vendor.mode_in_every_boot_patch):
        return [patch]
    if vendor.boot_patch_minimal:
        return [patch, {"BootSourceOverrideMode": mode}]
    return [patch | {"BootSourceOverrideMode": mode}]


def _boot_target(s: RedfishSession, system: Doc) -> tuple[str, Doc]:
    """Where the Boot PATCH goes, and the Boot to check it against: the settings object the
    System names in @Redfish.Settings where that object's Boot carries the override
    (BootSourceOverrideTarget), whatever the vendor (DMTF DSP0266 "Settings"; BlueField-3 accepts
    the PATCH at its System and applies nothing, NVIDIA's BlueField BMC documentation; AMI
    refuses it there, DMTF/Redfish-Tacklebox#144): applied at the next reset, the System reading
    back the old override until then. Else the System (Lenovo's Pending object holds only its
    BootOrder; XCC documents the override PATCHed at the System). The settings object's Boot is
    checked with the System's allowable values where it gives none of its own."""
    current = system.get("Boot")
    current = current if isinstance(current, dict) else {}
    settings = system.get("@Redfish.Settings")
    ref = link(settings, "SettingsObject") if isinstance(settings, dict) else ""
    if ref and ref.rstrip("/") != s.system_ref().rstrip("/"):
        pending = s.get(ref).get("Boot")
        if isinstance(pending, dict) and "BootSourceOverrideTarget" in pending:
            return ref, current | pending
    return s.system_ref(), current


def set_boot_device(s: RedfishSession, setting: BootSetting) -> BootSetting:
    system = s.system()
    ref, boot = _boot_target(s, system)
    wanted = _BOOT_TO_REDFISH[setting.device]

    def read_back() -> BootSetting:
        return _boot_of(s, s.get(ref)) if ref != s.system_ref() else boot_device(s)

    for body in _boot_patches(s, setting, boot if isinstance(boot, dict) else {}):
        s.write("PATCH", ref, {"Boot": body}, etag=True,
                taken=lambda: read_back().device is setting.device)
    delay = s.vendor().boot_readback_delay
    if delay and s.call.cancel.wait(min(delay, max(0.0, s.call.deadline - time.monotonic()))):
        raise Cancelled("cancelled")
    got = read_back()
    if got.device is not setting.device:
        raise BmcRefused(
            f"Redfish BMC {s.target.address} accepted boot override {wanted} but reads back"
            f" {got.device}", bmc_message=f"read back {got.device}"
        )
    # A persistence or mode the BMC does not keep (sushy's emulator keeps every override
    # Continuous) is reported by the caller from its own read-back, as for IPMI; not hidden.
    mode_differs = setting.mode is not None and got.mode is not setting.mode
    if got.persistent != setting.persistent or mode_differs:
        log.warning("Redfish %s: boot override %s reads back persistent=%s mode=%s, asked %s/%s",
                    s.target.address, wanted, got.persistent, got.mode, setting.persistent,
                    setting.mode)
    return got


# -- query ---------------------------------------------------------------------------


def query(s: RedfishSession) -> site_pb2.BmcOperationResult:
    system = s.system()
    result = site_pb2.BmcOperationResult(operation="query")
    sys_msg = result.system
    sys_msg.manufacturer = text(system.get("Manufacturer"))
    sys_msg.model = text(system.get("Model"))
    sys_msg.serial = text(system.get("SerialNumber"))
    sys_msg.bios_version = text(system.get("BiosVersion"))
    sys_msg.uuid = text(system.get("UUID"))
    sys_msg.health = text(system.get("Status", {}).get("Health"))
    with contextlib.suppress(Unsupported):
        sys_msg.bmc_firmware_version = text(s.manager().get("FirmwareVersion"))
    result.power_state = str(_power_of(s, system))
    result.state = result.power_state
    nics_ref = link(system, "EthernetInterfaces")
    for ref in s.members(nics_ref) if nics_ref else []:
        nic = s.get(ref)
        mac = normal_mac(nic.get("MACAddress") or nic.get("PermanentMACAddress"))
        if mac:
            status = text(nic.get("LinkStatus"))
            result.nics.add(id=text(nic.get("Id")), mac_address=mac, link_status=status)
    try:
        result.sensors.extend(sensors(s))
    except Unsupported as exc:
        log.info("Redfish %s: no sensors: %s", s.target.address, exc)
    result.firmware_inventory.extend(firmware.inventory(s))
    partial: list[str] = []
    result.parts.extend(hardware.parts(s, partial))
    if partial:
        result.values["parts_partial"] = "; ".join(partial)
    result.attempts = s.attempts
    return result


def sensors(s: RedfishSession) -> list[site_pb2.BmcSensor]:
    """Thermal and Power (one GET each) where the Chassis has them, else its Sensors."""
    chassis = s.chassis()
    out: list[site_pb2.BmcSensor] = []
    thermal, power = link(chassis, "Thermal"), link(chassis, "Power")
    if thermal:
        doc = s.get(thermal)
        for t in dicts(doc.get("Temperatures")):
            out.append(sensor(t, "temperature", t.get("ReadingCelsius"), "Cel"))
        for f in dicts(doc.get("Fans")):
            units = "RPM" if f.get("ReadingUnits", "RPM") == "RPM" else "%"
            out.append(sensor(f, "fan", f.get("Reading", f.get("ReadingRPM")), units))
    if power:
        doc = s.get(power)
        for p in dicts(doc.get("PowerSupplies")):
            watts = p.get("LastPowerOutputWatts", p.get("PowerOutputWatts"))
            out.append(sensor(p, "power_supply", watts, "W"))
        for v in dicts(doc.get("Voltages")):
            out.append(sensor(v, "voltage", v.get("ReadingVolts"), "V"))
        for c in dicts(doc.get("PowerControl")):
            out.append(sensor(c, "power", c.get("PowerConsumedWatts"), "W"))
    if not thermal and not power and link(chassis, "Sensors"):
        kinds = {"Temperature": ("temperature", "Cel"), "Rotational": ("fan", "RPM"),
                 "Power": ("power", "W"), "Voltage": ("voltage", "V")}
        for ref in s.members(link(chassis, "Sensors"))[:256]:
            doc = s.get(ref)
            kind, units = kinds.get(text(doc.get("ReadingType")), ("", ""))
            if kind:
                out.append(sensor(doc, kind, doc.get("Reading"), text(doc.get("ReadingUnits")) or units))
    elif not thermal and not power:
        raise Unsupported("the Chassis has neither Thermal/Power nor Sensors")
    return out


def set_password(s: RedfishSession, username: str, new_password: str) -> None:
    service = link(s.root(), "AccountService")
    if not service:
        raise Unsupported(f"Redfish BMC {s.target.address} has no AccountService")
    accounts = link(s.get(service), "Accounts")
    for ref in s.members(accounts) if accounts else []:
        if s.get(ref).get("UserName") == username:
            s._secrets.append(new_password)
            try:
                s.patch(ref, {"Password": new_password})
            finally:
                s._secrets.remove(new_password)
            log.info("Redfish %s: password of %r changed", s.target.address, username)
            return
    raise BmcRefused(f"Redfish BMC {s.target.address} has no account {username!r}")



def sensor(doc: Doc, kind: str, reading: object, units: str) -> site_pb2.BmcSensor:
    msg = site_pb2.BmcSensor(name=text(doc.get("Name") or doc.get("MemberId") or doc.get("Id")), kind=kind,
                             units=units, health=text(doc.get("Status", {}).get("Health")))
    if isinstance(reading, int | float) and not isinstance(reading, bool):
        msg.reading = float(reading)
        msg.has_reading = True
    return msg
