"""The release gate's TPM area: NV indices, persistent objects, authorizations, the lockout counter."""

from __future__ import annotations

from agent.hw import tpm as tpmwire
from agent.policy.release.findings import Found, invoke
from agent.policy.release.state import Observed, TpmBaseline

_AUTH_SET = (("tpm.owner_auth", tpmwire.Permanent.OWNER_AUTH_SET, "owner"),
             ("tpm.endorsement_auth", tpmwire.Permanent.ENDORSEMENT_AUTH_SET, "endorsement"),
             ("tpm.lockout_auth", tpmwire.Permanent.LOCKOUT_AUTH_SET, "lockout"))


def check_tpm(e: TpmBaseline, seen: Observed, out: Found) -> None:
    t = seen.tpm
    if t is None:
        if "tpm" in seen.unread:
            out.add("tpm.unreadable", "readable", "unreadable", "",
                    f"the TPM cannot be read: {seen.unread['tpm']}")
        return                                    # no TPM: stated in the report, not a finding
    remedy = None if t.clear_refused else invoke("tpm-ppi", "clear")
    after = f"; it cannot be cleared from here: {t.clear_refused}" if t.clear_refused else \
        "; the firmware clears the TPM at the next boot once asked"
    for index, by_platform in sorted(t.nv_indices.items()):
        if by_platform or index in tpmwire.EK_NV_RANGE or index in e.nv_indices:
            continue
        out.add("tpm.nv_index", "absent", "defined", f"{index:#010x}",
                f"the TPM holds NV index {index:#010x}, defined by its owner{after}", remedy)
    for handle in t.persistent:
        if handle == tpmwire.EK_HANDLE or handle in e.persistent_handles:
            continue
        out.add("tpm.persistent_handle", "absent", "present", f"{handle:#010x}",
                f"the TPM holds a persistent object at {handle:#010x}{after}", remedy)
    for check, bit, hierarchy in _AUTH_SET:
        if t.permanent & bit:
            out.add(check, "empty", "set", hierarchy,
                    f"the TPM's {hierarchy} authorization is set{after}", remedy)
    if t.lockout_counter:                         # not every TPM's Clear zeroes failedTries: reset it
        if t.permanent & tpmwire.Permanent.LOCKOUT_AUTH_SET:
            how, reset = ("the reset needs the lockout authorization its owner set: once the firmware's "
                          "Clear has emptied it, check again"), None
        else:
            how, reset = "TPM2_DictionaryAttackLockReset with the empty lockout authorization resets "\
                "them", invoke("tpm", "reset_lockout")
        out.add("tpm.lockout_counter", 0, t.lockout_counter, "",
                f"the TPM counts {t.lockout_counter} authorization failure(s) (a power cycle without "
                f"TPM2_Shutdown counts one); they fall by one every {t.lockout_interval} s "
                f"(TPM_PT_LOCKOUT_INTERVAL); {how}", reset)
