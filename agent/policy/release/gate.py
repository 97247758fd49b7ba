"""The release gate: every area the expected state names, checked (the node's half, and the BMC's
half at the site)."""

from __future__ import annotations

from agent.policy.release.bios import check_bios
from agent.policy.release.bmc_accounts import check_accounts
from agent.policy.release.findings import Found
from agent.policy.release.gpus import check_gpus
from agent.policy.release.nics import check_nics
from agent.policy.release.nvme import check_nvme
from agent.policy.release.state import BmcObserved, ExpectedState, Observed
from agent.policy.release.tpm import check_tpm
from agent.policy.release.uefi import check_uefi
from agent.policy.release.wipes import check_wipes
from agent.proto import agent_pb2


def check(e: ExpectedState, seen: Observed) -> list[agent_pb2.Mismatch]:
    """Every way ``seen`` differs from ``e``, each with its remedy where there is one."""
    out = Found()
    if e.uefi is not None:
        check_uefi(e.uefi, seen, out)
    if "gpus" in e.areas:
        check_gpus(e, seen, out)
    if e.nics:
        check_nics(e.nics, seen, out)
    if e.nvme is not None:
        check_nvme(e.nvme, seen, out)
    if e.tpm is not None:
        check_tpm(e.tpm, seen, out)
    if e.wipes is not None:
        check_wipes(e.wipes, seen, out)
    return out.mismatches


def check_bmc(e: ExpectedState, seen: BmcObserved) -> list[agent_pb2.Mismatch]:
    """Every way the BMC differs from ``e``'s bios and bmc_accounts, each with its site remedy
    where there is one."""
    out = Found()
    if e.bmc_accounts is not None:
        check_accounts(e.bmc_accounts, seen, out)
    if e.bios is not None:
        check_bios(seen, out)
    return out.mismatches
