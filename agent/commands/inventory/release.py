"""The release gate's observed state, for inventory.refresh's ``expect.state`` (ramdisk and node).

``observe`` reads what agent.policy.release checks, only the areas the expected state names:
the UEFI variables (efivarfs under the machine's root), every GPU's state (NVML, holding the
"nvml" lock as diag.nvml does), each NIC's firmware configuration (``mlxconfig``, else
``mstconfig``: ``query -e`` through the driver layer) and each NVMe controller's namespaces
(nvme-cli's JSON: ``list-ns --all``, ``id-ctrl``, ``id-ns``) and the TPM (the one the setting
``bc.tpm`` names, else ``root``/dev/tpmrm0: its NV indices, persistent handles, TPMA_PERMANENT
and lockout counter; whether its firmware's PPI can clear it). What cannot be read is kept in
``Observed.unread`` or the device's ``error``, and becomes an ``*.unreadable`` finding: the gate
never passes what it could not look at. ``report`` makes the ReleaseReport.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from agent import drivers
from agent.commands.base import Context
from agent.commands.gpu import NVML_LOCK
from agent.drivers import efivars as efivars_driver
from agent.drivers import mlxconfig, tpm_ppi
from agent.drivers import nvme as nvme_driver
from agent.errors import AgentError
from agent.hw import bootid, efivars, gpu, system
from agent.hw import tpm as tpmwire
from agent.policy.release.findings import restorable
from agent.policy.release.golden import Diff
from agent.policy.release.state import (
    SITE_AREAS,
    ExpectedState,
    NicConfig,
    NicProfile,
    NvmeController,
    Observed,
    TpmState,
    UefiState,
)
from agent.policy.release.wipes import certificates_of
from agent.proto import agent_pb2
from agent.security import erasure

TOOL_SECONDS = 30.0                 # one query of one device
NIC_TOOLS = ("mlxconfig", "mstconfig")
NOT_CHECKED_YET: tuple[str, ...] = ()
# The BMC's half: checked at the site (bmc.query baseline), named in checked_elsewhere.
CHECKED_AT_SITE = SITE_AREAS


def observe(ctx: Context, expected: ExpectedState, inv: agent_pb2.Inventory,
            root: Path = system.ROOT) -> Observed:
    seen = Observed()
    if expected.uefi is not None:
        _uefi(seen, root)
    if "gpus" in expected.areas:
        try:
            with ctx.hold(NVML_LOCK):
                seen.gpus = gpu.read_all(gpu.library_path(ctx.config.nvml_library))
        except AgentError as exc:
            seen.unread["gpus"] = exc.message
    if expected.nics:
        seen.nics = _nics(ctx, expected.nics, inv)
    if expected.nvme is not None:
        seen.nvme = _nvme(ctx, seen, root)
    if expected.tpm is not None:
        _tpm(seen, ctx.config.tpm, root)
    if expected.wipes is not None:
        _wipes(seen, ctx)
    return seen


def _wipes(seen: Observed, ctx: Context) -> None:
    """This boot's verified erasure certificates (agent/security/erasure.py)."""
    public = erasure.node_public_key(ctx.config.state_dir)
    if public is None:
        seen.wipes_refused.append("no node key in the state directory: no disk.wipe ran here")
        return
    kept = erasure.certified(ctx.config.state_dir, public, ctx.boot_id or bootid.boot_id())
    seen.wipes, seen.wipes_refused = kept.certificates, kept.refused
    seen.wipe_results = kept.results


def _tpm(seen: Observed, spec: str, root: Path) -> None:
    try:
        tpm = tpmwire.open_setting(spec, root)
        if tpm is None:
            seen.tpm_absent = tpmwire.absent(spec)
            return
        with tpm:
            nv = {}
            for index in tpm.handles(tpmwire.HR_NV_INDEX):
                public = tpm.nv_public(index)
                if public is not None:
                    nv[index] = public.platform_created
            persistent = tuple(tpm.handles(tpmwire.HR_PERSISTENT))
            props = tpm.properties(tpmwire.PT_PERMANENT, 17)   # 0x200-0x210: PERMANENT to the lockout's
    except AgentError as exc:
        seen.unread["tpm"] = exc.message
        return
    except OSError as exc:                         # the simulator's socket refused the connection
        seen.unread["tpm"] = f"the TPM could not be reached: {exc}"
        return
    seen.tpm = TpmState(nv, persistent, props.get(tpmwire.PT_PERMANENT, 0),
                                 props.get(tpmwire.PT_LOCKOUT_COUNTER, 0),
                                 props.get(tpmwire.PT_LOCKOUT_INTERVAL, 0), tpm_ppi.clear_refused(root))


def _uefi(seen: Observed, root: Path) -> None:
    try:
        v = efivars_driver.variables(root)
    except AgentError as exc:
        seen.unread["uefi"] = exc.message
        return
    seen.uefi = UefiState(
        boot_entries={e.number: e for e in v.boot_entries()},
        boot_order=None if (order := v.boot_order()) is None else tuple(order),
        secure_boot=v.flag("SecureBoot"), setup_mode=v.flag("SetupMode"),
        digests={name.lower(): v.sha256(name, guid) for name, guid in efivars_driver.SECURE_BOOT_VARIABLES},
        memory_overwrite=v.flag("MemoryOverwriteRequestControl", efivars.MOR),
    )  # fmt: skip


def tool_output(ctx: Context, driver: str, operation: str, **values: drivers.base.Value) -> str:
    argv = drivers.get(driver).argv(operation, values)
    return ctx.run(argv, timeout=min(TOOL_SECONDS, max(1.0, ctx.remaining()))).text


def _nics(ctx: Context, profiles: tuple[NicProfile, ...],
          inv: agent_pb2.Inventory) -> list[NicConfig]:
    firmware = {n.pci_address: n.firmware_version for n in inv.nics if n.pci_address}
    tool = next((t for t in NIC_TOOLS if shutil.which(t)), "")
    found = []
    for d in inv.pci_devices:
        ids = f"{d.vendor_id}:{d.device_id}"
        if not d.class_code.removeprefix("0x").startswith("02"):
            continue
        profile = next((p for p in profiles if p.matches(ids)), None)
        if profile is None:
            continue
        nic = NicConfig(d.address, ids, firmware.get(d.address, ""), tool)
        if profile.config:
            ctx.check()
            if not tool:
                nic = NicConfig(d.address, ids, nic.firmware_version,
                                         error="neither mlxconfig (NVIDIA MFT) nor mstconfig (mstflint) "
                                               "is installed")
            else:
                try:
                    table = mlxconfig.parse_query(tool_output(ctx, tool, "query", device=d.address))
                except AgentError as exc:
                    nic = NicConfig(d.address, ids, nic.firmware_version, tool, error=exc.message)
                else:
                    nic = NicConfig(d.address, ids, nic.firmware_version, tool,
                                             {k: (s.current, s.next_boot) for k, s in table.items()})
        found.append(nic)
    return found


def nvme_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise AgentError(f"nvme-cli's output is not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise AgentError("nvme-cli's output is not a JSON object")
    return value


def _nvme(ctx: Context, seen: Observed, root: Path) -> list[NvmeController]:
    try:
        names = sorted(n for n in os.listdir(root / "sys/class/nvme") if n.startswith("nvme"))
    except FileNotFoundError:
        return []
    if names and shutil.which(drivers.get("nvme").tool) is None:
        seen.unread["nvme"] = "nvme-cli is not installed (apt install nvme-cli)"
        return []
    found = []
    for name in names:
        ctx.check()
        device = f"/dev/{name}"
        try:
            try:
                listed = nvme_json(tool_output(ctx, "nvme", "list_ns", device=device))
            except AgentError as exc:            # a drive without namespace management: the attached
                ctx.log.info("%s: no list of allocated namespaces (%s); the attached ones", name, exc.message)
                listed = nvme_json(tool_output(ctx, "nvme", "list_ns", device=device, all=False))
            nsids = tuple(sorted(int(n["nsid"]) for n in listed.get("nsid_list", [])))
            ctrl = nvme_json(tool_output(ctx, "nvme", "id_ctrl", device=device))
            sizes = {}
            attached = tuple(n for n in nsids if (root / "sys/block" / f"{name}n{n}").exists())
            for nsid in attached:                  # a namespace with a block device: attached here
                    ns = nvme_json(tool_output(ctx, "nvme", "id_ns", device=f"{device}n{nsid}"))
                    flbas = int(ns.get("flbas", 0))
                    formats = ns.get("lbafs", [])
                    index = (flbas & 0xF) | ((flbas >> 1) & 0x30)
                    if index < len(formats):
                        sizes[nsid] = 1 << int(formats[index].get("ds", 0))
        except (AgentError, KeyError, TypeError, ValueError) as exc:
            message = exc.message if isinstance(exc, AgentError) else f"unexpected nvme-cli output: {exc!r}"
            found.append(NvmeController(name, error=message))
            continue
        # Namespace management (OACS bit 3) with a capacity to carve from: QEMU 7.2 sets the bit for
        # attachment alone, with no total capacity (tnvmcap 0) and no create-ns.
        managed = bool(int(ctrl.get("oacs", 0)) & nvme_driver.OACS_NS_MANAGEMENT) and \
            int(ctrl.get("tnvmcap", 0)) > 0
        found.append(NvmeController(name, nsids, int(ctrl.get("unvmcap", 0)), sizes, attached,
                                             managed=managed))
    return found


def report(expected: ExpectedState, mismatches: list[agent_pb2.Mismatch],
           seen: Observed | None = None, boot_id: str = "",
           golden: Diff | None = None) -> agent_pb2.ReleaseReport:
    """The release's record: every finding of the whole gate, split by whether it can be put back.
    A machine without a TPM has "tpm" not checked, and says why in ``tpm_absent``. With
    ``expect.state.wipes``, the certificate of each disk named (the newest of this boot) and the
    signed result that carries it. With the golden diff, ``compared``: per source the items
    compared, those the profile's rules left alone, and why one could not be read.
    ``attestation_verdict`` is the gateway's to fill."""
    seen = seen or Observed()
    tpm_absent = seen.tpm_absent
    checked = [a for a in expected.areas if not (a == "tpm" and tpm_absent)]
    out = agent_pb2.ReleaseReport(boot_id=boot_id or bootid.boot_id(), pool_ready=not mismatches,
                                  checked=checked,
                                  not_checked=(["tpm"] if tpm_absent else []) + list(NOT_CHECKED_YET),
                                  tpm_absent=tpm_absent, checked_elsewhere=CHECKED_AT_SITE)
    if expected.wipes:
        for i in certificates_of(expected.wipes, seen.wipes):
            out.wipe_certificates.append(seen.wipes[i])
            if i < len(seen.wipe_results) and seen.wipe_results[i] not in out.wipe_results:
                out.wipe_results.append(seen.wipe_results[i])
    if golden is not None:
        out.compared.extend(golden.counts())
    for m in mismatches:
        (out.restorable if restorable(m) else out.cannot_restore).append(m)
    return out
