"""The release gate's golden diff of the node's sources: each Change a finding, with its remedy.

``check_golden`` diffs the node's capture (agent/commands/inventory/golden.py) against the
profile's golden state (golden.py's ``diff``, the rules saying what varies) and turns each
change into a ``Mismatch`` named ``<source>.added|removed|changed``, ``where`` the item's path,
``expected``/``found`` the golden and found values; an unreadable source is
``<source>.unreadable``. A remedy is the driver.invoke that puts the item back where one exists:

  uefi  added variable (not authenticated)        efivars.delete_variable
        BootOrder/DriverOrder/SysPrepOrder changed efivars.set_load_order (the golden order)
        anything else (a Setup byte, a removed or  -  (the BMC's BIOS settings, or a person)
        re-attributed variable, an authenticated one)
  tpm   persistent added                          tpm.evict (tpm-ppi.clear where the owner's
                                                  authorization is set)
        persistent at the EK's handle changed or  tpm.persist_ek
        removed
        nv added (by the owner)                   tpm.undefine_nv (tpm-ppi.clear likewise)
        permanent.* (authorizations set,          tpm-ppi.clear (the firmware clears with the
        disableClear), policy/* (the owner's,     platform hierarchy: the only way back for
        endorsement's, lockout's)                 disableClear)
        permanent.inLockout, da/* (maxTries,      tpm.set_da_parameters with the golden values
        recoveryTime, lockoutRecovery)            (tpm-ppi.clear first where lockoutAuth is set)
        da/failedTries                            tpm.reset_lockout
        pcrs/*                                    tpm-ppi.set_pcr_banks (PPI operation 23)
        the rest (fixed, ek/rsa, sessions, ...)   -
  nic   a parameter's current or next-boot value  mlxconfig|mstconfig.set (the golden next-boot
                                                  value; not an array's element)
  nvme  a namespace, its format or size           nvme.factory_layout (where every golden
                                                  namespace is one size without metadata or PI)
        the TCG (Opal) locking state              -  (a PSID revert, by a person)
  gpu   persistence_mode                          nvidia-smi.set_persistence_mode
        mig_mode, mig_mode_pending                nvidia-smi.set_mig_mode off, then .reset
        ecc_mode                                  nvidia-smi.set_ecc (at the next reset)
        compute_mode                              nvidia-smi.set_compute_mode
        cc (confidential computing)               -  (NVIDIA's admin tools, by a person)

What a PPI request or a NIC's next-boot value puts back shows at the next boot: the finding stays
until then, with the same remedy, harmless to send again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.hw import efivars
from agent.hw import tpm as tpmwire
from agent.policy.release.findings import Found, invoke
from agent.policy.release.golden import Capture, Change, Diff, Golden, diff
from agent.policy.release.nics import same_value
from agent.proto import agent_pb2

NV_POLICY_DELETE = 1 << 10
PLATFORM = 0x4000000C                   # TPM_RH_PLATFORM: the firmware's policy, not the owner's
Remedy = agent_pb2.DriverInvokeRequest | None


@dataclass(frozen=True)
class Hints:
    """What the node's remedies need beyond the items: the NIC tool, what its PPI refuses."""

    nic_tool: str = ""
    clear_refused: str = ""            # "" where the firmware's PPI takes a Clear
    banks_refused: str = ""            # "" where it takes Set PCR Banks


def check_golden(g: Golden, seen: Capture, hints: Hints, out: Found) -> Diff:
    """Every change of the node's sources against ``g``, each added to ``out``; the diff."""
    golden = Capture({s: g.capture.sources[s] for s in g.node_sources if s in g.capture.sources})
    d = diff(golden, seen, g.rules)
    for source, why in sorted(d.unreadable.items()):
        out.add(f"{source}.unreadable", "readable", "unreadable", "",
                f"the golden state's source {source} could not be read: {why}")
    for c in d.changes:
        remedy, note = _REMEDIES[c.source](c, golden.sources.get(c.source, {}),
                                           seen.sources.get(c.source, {}), hints)
        what = {"added": f"{c.path} is new ({c.found[:120]})",
                "removed": f"{c.path} is gone (it was {c.golden[:120]})",
                "changed": f"{c.path} changed: {c.found[:120]}, golden {c.golden[:120]}"}[c.kind]
        out.add(c.check, c.golden or "absent", c.found or "absent", c.path,
                f"{c.source}: {what}{'; ' + note if note else ''}", remedy)
    return d


def _fields(value: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in value.split(";") if "=" in part)


# --------------------------------------------------------------------------- per source


def _uefi(c: Change, golden: Mapping[str, str], _seen: Mapping[str, str], _h: Hints) -> tuple[Remedy, str]:
    name = c.path.split("-", 1)[0]
    if c.kind == "added":
        if int(_fields(c.found).get("attrs", "0"), 16) & efivars.AUTHENTICATED:
            return None, "an authenticated variable: only a signed write deletes it"
        return invoke("efivars", "delete_variable", variable=c.path), ""
    if c.kind == "changed" and name in efivars.LOAD_ORDERS:
        old, new = _fields(c.golden), _fields(c.found)
        if old.get("attrs") == new.get("attrs") and "order" in old:
            return invoke("efivars", "set_load_order", variable=name, order=old["order"]), ""
    if c.kind == "removed":
        return None, "a variable the golden state has is gone: the firmware's setup (or its reset) makes it"
    return None, "its value cannot be written back from a digest: the BIOS settings (at the site) or a person"


def _tpm(c: Change, golden: Mapping[str, str], seen: Mapping[str, str], h: Hints) -> tuple[Remedy, str]:
    kind, _, handle = c.path.partition("/")
    owner_set = seen.get("permanent.ownerAuthSet") == "1"
    lockout_set = seen.get("permanent.lockoutAuthSet") == "1"
    clear = None if h.clear_refused else invoke("tpm-ppi", "clear")
    by_clear = f"it cannot be cleared from here: {h.clear_refused}" if h.clear_refused else \
        "the firmware clears the TPM at the next boot once asked"
    if kind == "persistent":
        number = int(handle, 16)
        if number in (tpmwire.EK_HANDLE, tpmwire.EK_ECC_HANDLE) and c.kind != "added":
            if owner_set or seen.get("permanent.endorsementAuthSet") == "1":
                return clear, by_clear + "; then the EK is persisted again"
            return invoke("tpm", "persist_ek", handle=handle), "the EK made again from its template"
        if c.kind == "added":
            return (clear, by_clear) if owner_set else (invoke("tpm", "evict", handle=handle), "")
        return None, "an object the golden state has cannot be made again here"
    if kind == "nv":
        attrs = int(_fields(c.found).get("attrs", "0"), 16)
        if c.kind != "added":
            return None, "an index the golden state has (an EK certificate's?) cannot be written back here"
        if attrs & tpmwire.NV_PLATFORMCREATE:
            return None, "defined by the platform (firmware): a Clear keeps it"
        if owner_set or attrs & NV_POLICY_DELETE:
            return clear, by_clear
        return invoke("tpm", "undefine_nv", index=handle), ""
    da = _da(golden)
    if c.path == "permanent.inLockout" or (kind == "da" and handle != "failedTries"):
        if lockout_set:
            return clear, by_clear + "; then the dictionary-attack parameters are set back"
        return (invoke("tpm", "set_da_parameters", **da), "") if da else (None, "no golden parameters")
    if c.path == "da/failedTries":
        return (clear, by_clear) if lockout_set else (invoke("tpm", "reset_lockout"), "")
    platform_policy = kind == "policy" and handle == f"{PLATFORM:#010x}"
    if (c.path.startswith("permanent.") and c.path != "permanent.tpmGeneratedEPS") or \
            (kind == "policy" and not platform_policy):
        return clear, by_clear
    if kind == "pcrs":
        banks = [b.removeprefix("pcrs/") for b, v in sorted(golden.items()) if b.startswith("pcrs/") and v]
        if h.banks_refused or not banks:
            return None, f"the PCR banks cannot be set from here: {h.banks_refused or 'none golden'}"
        return invoke("tpm-ppi", "set_pcr_banks", banks=",".join(banks)), \
            "the firmware allocates the golden banks at the next boot"
    if kind in ("transient", "loaded_session", "saved_session"):
        return None, "a reboot flushes it (the ramdisk's own boot should have)"
    return None, ""


def _da(golden: Mapping[str, str]) -> dict[str, str | int | bool]:
    try:
        return {"max_tries": int(golden["da/maxTries"]), "recovery_time": int(golden["da/recoveryTime"]),
                "lockout_recovery": int(golden["da/lockoutRecovery"])}
    except (KeyError, ValueError):
        return {}


def _set_value(value: str) -> str:
    bracket = re.fullmatch(r"[^()]*\((\d+)\)", value)
    return bracket.group(1) if bracket else value


def _nic(c: Change, _golden: Mapping[str, str], _seen: Mapping[str, str], h: Hints) -> tuple[Remedy, str]:
    address, _, name = c.path.partition("/")
    if c.kind != "changed":
        return None, "the firmware lists other parameters than the golden state's (another firmware?)"
    old, new = _fields(c.golden), _fields(c.found)
    if old.get("default") != new.get("default"):
        return None, "its default differs: another firmware than the golden state's"
    if "[" in name or not h.nic_tool:
        return None, "an array's element, or no configuration tool"
    note = "" if not same_value(old.get("next", ""), new.get("next", "")) else \
        "set back for the next boot already: it takes effect at the next firmware boot"
    value = _set_value(old.get("next", ""))
    return invoke(h.nic_tool, "set", device=address, parameter=name, value=value), note


def _nvme(c: Change, golden: Mapping[str, str], _seen: Mapping[str, str], _h: Hints) -> tuple[Remedy, str]:
    controller = c.path.split("/", 1)[0]
    if c.path.endswith("/security") or c.path.endswith("/tcg_features"):
        return None, "the drive's security capabilities differ: another drive or firmware"
    if c.path.endswith("/tcg_locking"):
        return None, "the drive's TCG (Opal) locking: a PSID revert, by a person with the drive's label"
    count = len([n for n in golden.get(f"{controller}/namespaces", "").split(",") if n])
    formats = {v for p, v in golden.items() if p.startswith(f"{controller}/ns") and p.endswith("/format")}
    sizes = {_fields(v).get("ds", "") for v in formats}
    plain = all(_fields(v).get("ms") == "0" and _fields(v).get("pi") == "0" for v in formats)
    if not count or len(sizes) != 1 or not plain or sizes - {"512", "4096"}:
        return None, "the golden layout is not one the factory layout makes (equal namespaces, no metadata)"
    return invoke("nvme", "factory_layout", device=f"/dev/{controller}", namespaces=count,
                  lba_data_size=int(sizes.pop())), "every namespace of the controller made again (data lost)"


def _gpu(c: Change, golden: Mapping[str, str], seen: Mapping[str, str], _h: Hints) -> tuple[Remedy, str]:
    where, _, mode = c.path.partition("/")
    index = seen.get(f"{where}/index", "")
    if c.kind != "changed" or not index.isdigit():
        return None, "a GPU the golden state lacks or has more of"
    gpu = int(index)
    want = c.golden == "1"
    if mode == "persistence_mode":
        return invoke("nvidia-smi", "set_persistence_mode", gpu=gpu, enabled=want), ""
    if mode in ("mig_mode", "mig_mode_pending") and c.golden in ("0", "1"):
        pending = seen.get(f"{where}/mig_mode_pending") == golden.get(f"{where}/mig_mode_pending")
        if pending:                             # set already: a reset takes the pending mode up
            return invoke("nvidia-smi", "reset", gpu=gpu), "a GPU reset takes the pending MIG mode up"
        return invoke("nvidia-smi", "set_mig_mode", gpu=gpu, enabled=want), "then a GPU reset"
    if mode == "compute_mode" and c.golden in ("0", "2", "3"):
        return invoke("nvidia-smi", "set_compute_mode", gpu=gpu, mode=int(c.golden)), ""
    if mode == "ecc_mode" and c.golden in ("0", "1"):
        return invoke("nvidia-smi", "set_ecc", gpu=gpu, enabled=want), "at the GPU's next reset"
    return None, ""


_REMEDIES: dict[str, Callable[[Change, Mapping[str, str], Mapping[str, str], Hints], tuple[Remedy, str]]] = {
    "uefi": _uefi, "tpm": _tpm, "nic": _nic, "nvme": _nvme, "gpu": _gpu}
