"""tpm: the TPM's own commands that put back what a tenant left, in the agent (agent/hw/tpm.py).

``reset_lockout`` is TPM2_DictionaryAttackLockReset with the lockout hierarchy's authorization
as a cleared TPM has it (empty): the count of authorization failures (TPM_PT_LOCKOUT_COUNTER)
back to zero, and the TPM out of lockout. A TPM2_Clear keeps that count, so a release resets it
itself. Where the tenant set a lockout authorization the reset is refused before anything is
sent (a wrong authorization would count against the lockout hierarchy): the firmware's Clear
(tpm-ppi) empties it first. The TPM is the one the setting ``bc.tpm`` names, else the kernel's
/dev/tpmrm0 under ``root``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agent.drivers.base import Driver, Operation, Settings, Values, register
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


DRIVER = register(
    Driver(
        name="tpm",
        tool="",
        description="the TPM's own commands, in the agent: the dictionary-attack lockout reset",
        install_hint="a TPM 2.0 (/dev/tpmrm0, or the setting bc.tpm)",
        operations={
            op.name: op
            for op in (
                Operation("status", "the lockout counter, its interval, whether in lockout (JSON)",
                          build=lambda v: ["status"], local=_status),
                Operation("reset_lockout",
                          "TPM2_DictionaryAttackLockReset with the empty lockout authorization",
                          build=lambda v: ["reset_lockout"], changes_state=True, local=_reset_lockout),
            )
        },
    )
)
