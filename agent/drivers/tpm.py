"""tpm: the TPM's own commands that put back what a tenant left, in the agent (agent/hw/tpm.py).

``reset_lockout`` is TPM2_DictionaryAttackLockReset with the lockout hierarchy's authorization
as a cleared TPM has it (empty): the count of authorization failures (TPM_PT_LOCKOUT_COUNTER)
back to zero, and the TPM out of lockout. A TPM2_Clear keeps that count, so a release resets it
itself. Where the tenant set a lockout authorization the reset is refused before anything is
sent (a wrong authorization would count against the lockout hierarchy): the firmware's Clear
(tpm-ppi) empties it first. The TPM is the one the setting ``bc.tpm`` names, else the kernel's
/dev/tpmrm0 under ``root``.

The golden state's remedies (agent/policy/release/golden_check.py), each with the owner's or the
lockout hierarchy's authorization as a cleared TPM has it (empty; refused before anything is sent
where the tenant set one: the firmware's Clear first): ``evict`` (a persistent object the golden
state lacks), ``persist_ek`` (the EK made again from the TCG's template, deterministic from the
endorsement seed, and persisted at its handle in place of whatever is there), ``undefine_nv`` (an
NV index the owner defined) and ``set_da_parameters`` (maxTries, recoveryTime, lockoutRecovery
put back, then the lockout counter reset).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agent.drivers.base import Arg, ArgType, Driver, Operation, Settings, Values, register
from agent.errors import AgentError, Reason, Unsupported
from agent.hw import tpm as tpmwire

log = logging.getLogger(__name__)


def _open(root: Path, settings: Settings) -> tpmwire.Tpm:
    try:
        tpm = tpmwire.open_setting(settings.tpm, root)
    except OSError as exc:
        raise AgentError(f"the TPM could not be reached: {exc}", reason=Reason.TOOL_FAILED) from exc
    if tpm is None:
        raise Unsupported(tpmwire.absent(settings.tpm))
    return tpm


def _lockout(tpm: tpmwire.Tpm) -> tuple[int, int, int]:
    """(TPMA_PERMANENT, the lockout counter, the counter's interval in seconds)."""
    props = tpm.properties(tpmwire.PT_PERMANENT, 17)
    return (props.get(tpmwire.PT_PERMANENT, 0), props.get(tpmwire.PT_LOCKOUT_COUNTER, 0),
            props.get(tpmwire.PT_LOCKOUT_INTERVAL, 0))


def _status(_: Values, root: Path, settings: Settings) -> str:
    with _open(root, settings) as tpm:
        permanent, counter, interval = _lockout(tpm)
    return json.dumps({"lockout_counter": counter, "lockout_interval": interval,
                       "in_lockout": bool(permanent & tpmwire.Permanent.IN_LOCKOUT),
                       "lockout_auth_set": bool(permanent & tpmwire.Permanent.LOCKOUT_AUTH_SET)}, indent=1)


def _reset_lockout(_: Values, root: Path, settings: Settings) -> str:
    with _open(root, settings) as tpm:
        permanent, counter = _lockout(tpm)[:2]
        if permanent & tpmwire.Permanent.LOCKOUT_AUTH_SET:
            raise Unsupported("the TPM's lockout authorization is set (by its owner): the reset needs it; "
                              "clear the TPM through the firmware first (tpm-ppi.clear), then reset")
        tpm.dictionary_attack_lock_reset(b"")
        after = _lockout(tpm)[1]
    if after:
        raise AgentError(f"TPM2_DictionaryAttackLockReset succeeded but the lockout counter reads {after}",
                         reason=Reason.TOOL_FAILED)
    log.info("TPM: lockout counter reset (it was %d)", counter)
    return f"lockout counter reset: {counter} -> 0\n"


PERSISTENT = Arg("handle", ArgType.STRING, "a persistent handle, 0x81xxxxxx", pattern=r"0x81[0-9a-fA-F]{6}")
EK_TEMPLATES = {tpmwire.EK_HANDLE: tpmwire.EK_RSA_TEMPLATE, tpmwire.EK_ECC_HANDLE: tpmwire.EK_ECC_TEMPLATE}


def _refuse_set(tpm: tpmwire.Tpm, bit: int, hierarchy: str) -> None:
    permanent = tpm.properties(tpmwire.PT_PERMANENT, 1).get(tpmwire.PT_PERMANENT, 0)
    if permanent & bit:
        raise Unsupported(f"the TPM's {hierarchy} authorization is set (by its owner): clear the TPM "
                          "through the firmware first (tpm-ppi.clear)")


def _evict(values: Values, root: Path, settings: Settings) -> str:
    handle = int(str(values["handle"]), 16)
    with _open(root, settings) as tpm:
        _refuse_set(tpm, tpmwire.Permanent.OWNER_AUTH_SET, "owner")
        if handle not in tpm.handles(tpmwire.HR_PERSISTENT):
            return f"{handle:#010x}: no persistent object (nothing to evict)\n"
        tpm.evict_control(handle, handle)
    log.info("TPM: persistent object %#010x evicted", handle)
    return f"evicted {handle:#010x}\n"


def _persist_ek(values: Values, root: Path, settings: Settings) -> str:
    handle = int(str(values["handle"]), 16)
    template = EK_TEMPLATES.get(handle)
    if template is None:
        raise Unsupported(f"{handle:#010x} is not an EK's handle (0x81010001 RSA, 0x81010002 ECC)")
    with _open(root, settings) as tpm:
        _refuse_set(tpm, tpmwire.Permanent.OWNER_AUTH_SET, "owner")
        _refuse_set(tpm, tpmwire.Permanent.ENDORSEMENT_AUTH_SET, "endorsement")
        ek = tpm.create_primary(tpmwire.RH_ENDORSEMENT, template)
        if handle in tpm.handles(tpmwire.HR_PERSISTENT):
            if tpm.read_public(handle).name == ek.name:
                return f"{handle:#010x} holds the EK already\n"
            tpm.evict_control(handle, handle)
        tpm.evict_control(ek.handle, handle)
    log.info("TPM: the EK persisted again at %#010x", handle)
    return f"the EK (name {ek.name.hex()}) persisted at {handle:#010x}\n"


def _undefine_nv(values: Values, root: Path, settings: Settings) -> str:
    index = int(str(values["index"]), 16)
    with _open(root, settings) as tpm:
        _refuse_set(tpm, tpmwire.Permanent.OWNER_AUTH_SET, "owner")
        public = tpm.nv_public(index)
        if public is None:
            return f"{index:#010x}: not defined (nothing to undefine)\n"
        if public.platform_created:
            raise Unsupported(f"NV index {index:#010x} was defined by the platform (the firmware's)")
        tpm.nv_undefine(index)
    log.info("TPM: NV index %#010x undefined", index)
    return f"undefined NV index {index:#010x}\n"


def _set_da_parameters(values: Values, root: Path, settings: Settings) -> str:
    tries, recovery, lockout = (int(values[n]) for n in ("max_tries", "recovery_time", "lockout_recovery"))
    with _open(root, settings) as tpm:
        _refuse_set(tpm, tpmwire.Permanent.LOCKOUT_AUTH_SET, "lockout")
        tpm.dictionary_attack_parameters(tries, recovery, lockout)
        tpm.dictionary_attack_lock_reset(b"")
    log.info("TPM: dictionary-attack parameters %d/%d/%d, counter reset", tries, recovery, lockout)
    return f"maxTries {tries}, recoveryTime {recovery} s, lockoutRecovery {lockout} s; counter reset\n"


def _seconds(name: str) -> Arg:
    return Arg(name, ArgType.INT, minimum=0, maximum=0xFFFFFFFF)


DRIVER = register(
    Driver(
        name="tpm",
        tool="",
        description="the TPM's own commands, in the agent: the lockout reset, DA parameters, evict, undefine",
        install_hint="a TPM 2.0 (/dev/tpmrm0, or the setting bc.tpm)",
        operations={
            op.name: op
            for op in (
                Operation("status", "the lockout counter, its interval, whether in lockout (JSON)",
                          build=lambda v: ["status"], local=_status),
                Operation("reset_lockout",
                          "TPM2_DictionaryAttackLockReset with the empty lockout authorization",
                          build=lambda v: ["reset_lockout"], changes_state=True, local=_reset_lockout),
                Operation("evict", "TPM2_EvictControl: a persistent object evicted (owner authorization)",
                          build=lambda v: ["evict", str(v["handle"])], args=(PERSISTENT,),
                          changes_state=True, local=_evict),
                Operation("persist_ek", "the EK made from the TCG template and persisted at its handle, "
                          "in place of what is there", build=lambda v: ["persist_ek", str(v["handle"])],
                          args=(PERSISTENT,), changes_state=True, local=_persist_ek),
                Operation("undefine_nv", "TPM2_NV_UndefineSpace of an index the owner defined",
                          build=lambda v: ["undefine_nv", str(v["index"])],
                          args=(Arg("index", ArgType.STRING, "an NV index, 0x01xxxxxx",
                                    pattern=r"0x01[0-9a-fA-F]{6}"),),
                          changes_state=True, local=_undefine_nv),
                Operation("set_da_parameters", "TPM2_DictionaryAttackParameters, then the lockout reset",
                          build=lambda v: ["set_da_parameters", str(v["max_tries"]), str(v["recovery_time"]),
                                           str(v["lockout_recovery"])],
                          args=tuple(_seconds(n) for n in ("max_tries", "recovery_time", "lockout_recovery")),
                          changes_state=True, local=_set_da_parameters),
            )
        },
    )
)
