"""The release gate's BMC accounts area (checked at the site): the expected accounts, nothing else."""

from __future__ import annotations

from agent.policy.release.findings import Found, bmc_remedy
from agent.policy.release.state import BmcObserved, ExpectedAccount


def check_accounts(expected: tuple[ExpectedAccount, ...], seen: BmcObserved, out: Found) -> None:
    if seen.accounts is None:
        why = seen.unread.get("bmc_accounts", "not read")
        out.add("bmc.unreadable", "accounts", "unreadable", "accounts",
                f"the BMC's accounts cannot be read: {why}")
        return
    wanted = {a.user_name: a for a in expected}
    if seen.management_user not in wanted:            # the site's own: always there, enabled
        wanted[seen.management_user] = ExpectedAccount(seen.management_user)
    for a in seen.accounts:
        if not a.user_name:                           # IPMI's anonymous user, turned on
            out.add("bmc.account_extra", "absent", f"{a.role or 'no role'}, enabled", f"id {a.id}",
                    f"the BMC's user {a.id} has no name and is enabled: an anonymous login "
                    f"({a.role or 'no role'}); disable it by its id (ipmitool user disable {a.id})")
            continue
        want = wanted.get(a.user_name)
        disable = bmc_remedy("bmc.rotate", "disable_account", username=a.user_name)
        if want is None:
            if a.enabled:
                out.add("bmc.account_extra", "absent", f"{a.role or 'no role'}, enabled", a.user_name,
                        f"the BMC has an enabled account {a.user_name!r} ({a.role or 'no role'}, id {a.id}) "
                        "not in the baseline", disable)
            continue
        if want.role and a.role != want.role:
            out.add("bmc.account_role", want.role, a.role or "none", a.user_name,
                    f"the BMC's account {a.user_name!r} has role {a.role or 'none'}, "
                    f"the baseline's {want.role}")
        if a.enabled != want.enabled:
            state = "enabled" if a.enabled else "disabled"
            out.add("bmc.account_enabled", "enabled" if want.enabled else "disabled", state, a.user_name,
                    f"the BMC's account {a.user_name!r} is {state}, the baseline's is not",
                    None if want.enabled else disable)
    listed = {a.user_name for a in seen.accounts}
    for name in sorted(set(wanted) - listed):
        out.add("bmc.account_missing", "present", "absent", name,
                f"the BMC has no account {name!r}; the baseline keeps one")
