"""The BMC's half of the release gate (bmc.query baseline): what the expected state's ``bios``
and ``bmc_accounts`` name, read from the BMC, checked by agent/policy/release/'s
``check_bmc`` and reported in the ramdisk's form (a ReleaseReport).

``observe`` reads only the areas the expected state sets: the accounts (Redfish AccountService;
IPMI ``channel getaccess``) and, over Redfish, each expected BIOS attribute typed by the BMC's
AttributeRegistry with its current and pending value. What cannot be read (IPMI has no BIOS
attributes; a BMC without a registry or an AccountService) is kept in ``unread`` and becomes a
``*.unreadable`` finding: the gate never passes what it could not look at. An unreachable BMC, a
refused login or the deadline fail the command instead.

``posture_check`` is the management posture's part (agent/site/bmc/posture.py): the fleet's
expected posture (the site's ``bmc_posture`` setting) against the BMC's ManagerNetworkProtocol,
read only, each protocol out of line a ``bmc.posture`` finding; one the BMC takes by PATCH
carries the remedy ``bmc.firmware restore_posture``, whose ``posture_restore`` puts what drifted
back by one PATCH (sent once, read back) and reports what is still out of line for an operator.
A check never writes: the control plane may run it as often as it likes.
"""

from __future__ import annotations

from agent.errors import BmcRefused, Unsupported
from agent.policy.release.findings import bmc_remedy, restorable
from agent.policy.release.state import BmcObserved, ExpectedState
from agent.proto import agent_pb2
from agent.site.bmc import posture
from agent.site.bmc.client import BmcClient

POSTURE_AREA = "bmc_posture"


def observe(client: BmcClient, expected: ExpectedState,
            management_user: str) -> BmcObserved:
    seen = BmcObserved(management_user)
    if expected.bmc_accounts is not None:
        try:
            seen.accounts = client.accounts()
        except (Unsupported, BmcRefused) as exc:
            seen.unread["bmc_accounts"] = exc.message
    if expected.bios is not None:
        from agent.site.bmc.redfish.client import RedfishClient

        if not isinstance(client, RedfishClient):
            seen.unread["bios"] = "IPMI has no BIOS attributes; check them over redfish"
        else:
            try:
                seen.bios = client.bios_baseline(expected.bios)
            except (Unsupported, BmcRefused) as exc:
                seen.unread["bios"] = exc.message
    return seen


def posture_check(client: BmcClient, expected: dict[str, bool]) -> list[agent_pb2.Mismatch]:
    """The posture's findings, nothing written: a drifted protocol the vendor's BMC takes by PATCH
    carries the remedy ``bmc.firmware restore_posture``. Over IPMI, or where the NetworkProtocol
    cannot be read: one finding, never a pass."""
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        return posture.unreadable("IPMI has no ManagerNetworkProtocol; check it over redfish")
    try:
        states = client.posture()
        row = client.vendor()
    except (Unsupported, BmcRefused) as exc:
        return posture.unreadable(exc.message)
    wanted = posture.drifted(expected, states)
    why = {p: (f"not put back by PATCH: {row.posture_fixed_why}" if p in row.posture_fixed
               else "bmc.firmware restore_posture puts it back") for p in wanted}
    found = posture.findings(expected, states, why)
    for m in found:
        if m.where in wanted and m.where not in row.posture_fixed:
            m.bmc_remedy.CopyFrom(bmc_remedy("bmc.firmware", "restore_posture"))
    return found


def posture_restore(client: BmcClient,
                    expected: dict[str, bool]) -> tuple[list[agent_pb2.Mismatch], list[str]]:
    """bmc.firmware restore_posture: what drifted put back where the BMC takes it (one PATCH,
    sent once, read back); the findings still standing after it, and what was put back ("IPMI
    off"). Over IPMI, or where the NetworkProtocol cannot be read: one finding."""
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        return posture.unreadable("IPMI has no ManagerNetworkProtocol; check it over redfish"), []
    try:
        before = client.posture()
        after, refused = client.put_back_posture(expected, before)
    except (Unsupported, BmcRefused) as exc:
        return posture.unreadable(exc.message), []
    wanted = posture.drifted(expected, before)
    still = posture.drifted(expected, after)
    restored = [f"{p} {'on' if on else 'off'}" for p, on in wanted.items() if p not in still]
    return posture.findings(expected, after, refused), restored


def report(expected: ExpectedState, mismatches: list[agent_pb2.Mismatch],
           also_checked: tuple[str, ...] = ()) -> agent_pb2.ReleaseReport:
    """The BMC's half of the release record: ``checked`` its areas (and ``also_checked``, the
    site's own: the posture), ``checked_elsewhere`` the ramdisk's areas the expected state also
    set (no boot id: no boot of the node checked it)."""
    out = agent_pb2.ReleaseReport(pool_ready=not mismatches, checked=[*expected.site_areas, *also_checked],
                                  checked_elsewhere=expected.areas)
    for m in mismatches:
        (out.restorable if restorable(m) else out.cannot_restore).append(m)
    return out
