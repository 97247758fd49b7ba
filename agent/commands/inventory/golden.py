"""The node's sources of the golden state (agent/policy/release/golden.py): each read whole.

Every source is read as everything it enumerates, never a chosen few, into flat ``path -> value``
text items; one that cannot be read goes into ``Capture.unreadable`` with why (the gate makes it
a finding). How each source spells its paths and values:

  uefi   every efivarfs variable: "Name-GUID" -> "attrs=0x00000007;sha256=HEX"; a ``*Order``
         variable (BootOrder, DriverOrder, SysPrepOrder) adds ";order=0000,0001" so that its
         remedy can write the golden order back.
  tpm    every handle of every kind ("persistent/0x81010001" -> "name=HEX": the object's name,
         its public area's digest; "nv/0x01c00002" -> "attrs=0x..;alg=0x..;size=N;policy=HEX"
         with ";data=sha256" where the index reads with an empty authorization; "transient/..",
         "loaded_session/..", "saved_session/..", "permanent/..", "pcr/.."), TPMA_PERMANENT
         and TPMA_STARTUP_CLEAR bit by bit ("permanent.disableClear" -> "1"), every other variable
         property and every fixed one ("property/0x020a", "fixed/0x0100"; not the TPM_PT_HR_*
         counts of handles, which the handles themselves say), the dictionary-attack parameters
         ("da/maxTries", "da/recoveryTime", "da/lockoutRecovery", "da/failedTries"), the PCR
         allocation ("pcrs/sha1" -> "0-23" or ""), the hierarchies' policies where the TPM
         offers them ("policy/0x40000001" -> "ALG:HEX"), and the name of the EK made from the
         TCG's RSA template ("ek/rsa" -> "name=HEX"; unreadable where the endorsement
         authorization is set).
  nic    every parameter ``mlxconfig -e query`` lists of every Mellanox NIC, lower-case names
         included: "0000:3b:00.0/LINK_TYPE_P1" -> "default=ETH(2);current=ETH(2);next=ETH(2)".
  nvme   per controller its namespaces and unallocated capacity; per namespace its size, the LBA
         format in use with data size, metadata size, protection information ("nvme0/ns1/format"
         -> "ds=512;ms=0;pi=0;pil=0;ext=0"), whether it is attached here, its multi-path and
         write-protect attributes; where the drive has Security Send/Receive, its TCG Storage (Opal)
         state from Level 0 Discovery ("nvme0/tcg_locking" -> "supported=1;enabled=0;locked=0;...").
  gpu    per GPU (by PCI address) its NVML index and modes: persistence, MIG (current and
         pending), ECC, compute mode; node-wide the confidential-computing state where NVML has it.

``capture`` reads them all for inventory.refresh (``expect.state.golden``) and for ``agent golden``
(agent/cli/golden.py: the clean node's capture, taken by the agent itself).
"""

from __future__ import annotations

import hashlib
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent import drivers
from agent.commands.base import Context
from agent.commands.gpu import NVML_LOCK
from agent.commands.inventory import release
from agent.drivers import efivars as efivars_driver
from agent.drivers import mlxconfig, tpm_ppi
from agent.drivers import nvme as nvme_driver
from agent.errors import AgentError, TpmFailed
from agent.hw import efivars, gpu, system
from agent.hw import tpm as tpmwire
from agent.policy.release.golden import MAX_TEXT, NODE_SOURCES, Capture
from agent.policy.release.golden_check import Hints
from agent.policy.release.state import MELLANOX
from agent.proto import agent_pb2

PERMANENT_BITS = {0: "ownerAuthSet", 1: "endorsementAuthSet", 2: "lockoutAuthSet", 8: "disableClear",
                  9: "inLockout", 10: "tpmGeneratedEPS"}
STARTUP_CLEAR_BITS = {0: "phEnable", 1: "shEnable", 2: "ehEnable", 3: "phEnableNV", 31: "orderly"}
DA = {"maxTries": tpmwire.PT_MAX_AUTH_FAIL, "recoveryTime": tpmwire.PT_LOCKOUT_INTERVAL,
      "lockoutRecovery": tpmwire.PT_LOCKOUT_RECOVERY, "failedTries": tpmwire.PT_LOCKOUT_COUNTER}
# TPM_PT_HR_*: how many handles of a kind, and room for more: the handles themselves are listed
# (a count would only repeat them), and the loaded and active ones are the resource manager's.
HANDLE_COUNTS = range(0x202, 0x20A)
OACS_SECURITY = 1 << 0               # NVMe Security Send/Receive
NV_AUTHREAD = 1 << 18
NV_WRITTEN = 1 << 29
NV_READ_LIMIT = 4096                 # an EK certificate is ~1.5 KB; larger indices are digested unread


def capture(ctx: Context, inv: agent_pb2.Inventory, root: Path = system.ROOT,
            sources: tuple[str, ...] = NODE_SOURCES) -> Capture:
    """Every named source read whole; each that fails is unreadable with why."""
    readers: dict[str, Callable[[], dict[str, str]]] = {
        "uefi": lambda: uefi(root),
        "tpm": lambda: tpm(ctx.config.tpm, root),
        "nic": lambda: nics(ctx, inv),
        "nvme": lambda: nvme(ctx, root),
        "gpu": lambda: gpus(ctx),
    }
    found: dict[str, dict[str, str]] = {}
    unreadable: dict[str, str] = {}
    for source in sources:
        ctx.check()
        try:
            items = readers[source]()
        except AgentError as exc:
            unreadable[source] = exc.message
            continue
        except OSError as exc:
            unreadable[source] = f"{source} could not be read: {exc}"
            continue
        too_long = [p for p, v in items.items() if len(p) > MAX_TEXT or len(v) > MAX_TEXT]
        if too_long:
            unreadable[source] = f"{source}: an item longer than {MAX_TEXT} characters ({too_long[0][:80]!r})"
            continue
        found[source] = items
    return Capture(found, unreadable)


def hints(root: Path) -> Hints:
    """What the golden diff's remedies need of the node: its NIC tool, what its PPI refuses."""
    return Hints(nic_tool(), tpm_ppi.clear_refused(root), tpm_ppi.clear_refused(root, tpm_ppi.SET_PCR_BANKS))


# --------------------------------------------------------------------------- uefi


def _order(value: bytes) -> str:
    return ",".join(f"{n:04X}" for (n,) in struct.iter_unpack("<H", value[: len(value) // 2 * 2]))


def uefi(root: Path) -> dict[str, str]:
    out = {}
    for name, var in efivars_driver.variables(root).every():
        text = f"attrs={var.attributes:#010x};sha256={hashlib.sha256(var.value).hexdigest()}"
        if name.split("-", 1)[0] in efivars.LOAD_ORDERS and name.endswith(efivars.GLOBAL):
            text += f";order={_order(var.value)}"
        out[name] = text
    return out


# --------------------------------------------------------------------------- tpm


def tpm(spec: str, root: Path) -> dict[str, str]:
    try:
        device = tpmwire.open_setting(spec, root)
    except OSError as exc:
        raise AgentError(f"the TPM could not be reached: {exc}") from exc
    if device is None:
        raise AgentError(tpmwire.absent(spec))
    try:
        with device as t:
            return _tpm(t)
    except OSError as exc:
        raise AgentError(f"the TPM could not be reached: {exc}") from exc


def _tpm(t: tpmwire.Tpm) -> dict[str, str]:
    out: dict[str, str] = {}
    for kind, first in tpmwire.HANDLE_KINDS.items():
        for handle in t.handles(first):
            path = f"{kind}/{handle:#010x}"
            if kind == "persistent":
                out[path] = f"name={t.read_public(handle).name.hex()}"
            elif kind == "nv":
                out[path] = _nv(t, handle)
            else:
                out[path] = "present"
    variable = t.properties(0x200, 64)
    fixed = t.properties(0x100, 64)
    for bits, prop, prefix in ((PERMANENT_BITS, tpmwire.PT_PERMANENT, "permanent"),
                               (STARTUP_CLEAR_BITS, tpmwire.PT_STARTUP_CLEAR, "startup_clear")):
        value = variable.get(prop, 0)
        for bit, name in bits.items():
            out[f"{prefix}.{name}"] = str(value >> bit & 1)
        rest = value & ~sum(1 << b for b in bits)
        out[f"{prefix}.other"] = f"{rest:#010x}"
    for name, prop in DA.items():
        out[f"da/{name}"] = str(variable.get(prop, 0))
    named = {tpmwire.PT_PERMANENT, tpmwire.PT_STARTUP_CLEAR, *DA.values()}
    for prop, value in variable.items():
        if prop not in named and prop not in HANDLE_COUNTS:
            out[f"property/{prop:#06x}"] = str(value)
    for prop, value in fixed.items():
        out[f"fixed/{prop:#06x}"] = str(value)
    for alg, pcrs in t.pcr_allocation().items():
        out[f"pcrs/{tpmwire.BANKS.get(alg, f'{alg:#06x}')}"] = _ranges(pcrs)
    try:
        for handle, policy in t.auth_policies().items():
            out[f"policy/{handle:#010x}"] = f"{policy[:2].hex()}:{policy[2:].hex()}"
    except TpmFailed as exc:
        out["policy"] = f"not offered ({exc.details.get('rc_name', exc.message)})"
    try:
        ek = t.create_primary(tpmwire.RH_ENDORSEMENT, tpmwire.EK_RSA_TEMPLATE)
    except TpmFailed as exc:
        out["ek/rsa"] = f"unreadable ({exc.details.get('rc_name', exc.message)})"
    else:
        out["ek/rsa"] = f"name={ek.name.hex()}"
        t.flush(ek.handle)
    return out


def _nv(t: tpmwire.Tpm, index: int) -> str:
    public = t.nv_public(index)
    if public is None:
        return "gone while listed"
    text = (f"attrs={public.attributes:#010x};alg={public.name_alg:#06x};size={public.size};"
            f"policy={public.auth_policy.hex()}")
    if public.attributes & NV_WRITTEN and public.attributes & NV_AUTHREAD and public.size <= NV_READ_LIMIT:
        try:
            text += f";data={hashlib.sha256(t.nv_read(index, public.size)).hexdigest()}"
        except TpmFailed as exc:
            text += f";data=unreadable ({exc.details.get('rc_name', '')})"
    return text


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        elif out and "-" not in out[-1] and int(out[-1]) == n - 1:
            out[-1] = f"{out[-1]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


# --------------------------------------------------------------------------- nic


def nic_tool() -> str:
    """The NIC configuration tool installed: mlxconfig (NVIDIA MFT), else mstconfig (mstflint)."""
    return next((t for t in release.NIC_TOOLS if shutil.which(t)), "")


def nics(ctx: Context, inv: agent_pb2.Inventory) -> dict[str, str]:
    """Every parameter of every Mellanox NIC; a NIC the tool cannot read makes the source unreadable."""
    adapters = [d.address for d in inv.pci_devices
                if d.vendor_id == MELLANOX and d.class_code.removeprefix("0x").startswith("02")]
    if not adapters:
        return {}
    tool = nic_tool()
    if not tool:
        raise AgentError("neither mlxconfig (NVIDIA MFT) nor mstconfig (mstflint) is installed")
    out = {}
    for address in sorted(adapters):
        ctx.check()
        table = mlxconfig.parse_query(release.tool_output(ctx, tool, "query", device=address))
        if not table:
            raise AgentError(f"{tool} listed no parameter of NIC {address}")
        for name, s in table.items():
            out[f"{address}/{name}"] = f"default={s.default};current={s.current};next={s.next_boot}"
    return out


# --------------------------------------------------------------------------- nvme


def nvme(ctx: Context, root: Path) -> dict[str, str]:
    try:
        names = sorted(n for n in (root / "sys/class/nvme").iterdir() if n.name.startswith("nvme"))
    except FileNotFoundError:
        return {}
    if names and shutil.which(drivers.get("nvme").tool) is None:
        raise AgentError("nvme-cli is not installed (apt install nvme-cli)")
    out: dict[str, str] = {}
    for path in names:
        ctx.check()
        name, device = path.name, f"/dev/{path.name}"
        try:
            listed = release.nvme_json(release.tool_output(ctx, "nvme", "list_ns", device=device))
            ctrl = release.nvme_json(release.tool_output(ctx, "nvme", "id_ctrl", device=device))
            nsids = sorted(int(n["nsid"]) for n in listed.get("nsid_list", []))
            out[f"{name}/namespaces"] = ",".join(map(str, nsids))
            out[f"{name}/unallocated"] = str(int(ctrl.get("unvmcap", 0)))
            oacs = int(ctrl.get("oacs", 0))
            out[f"{name}/security"] = f"oacs={oacs:#06x}"
            if oacs & OACS_SECURITY:                  # Security Send/Receive: TCG (Opal) state
                argv = drivers.get("nvme").argv("security_discovery", {"device": device})
                level0 = nvme_driver.parse_level0(
                    ctx.run(argv, timeout=min(release.TOOL_SECONDS, max(1.0, ctx.remaining()))).stdout)
                out[f"{name}/tcg_features"] = level0["features"]
                out[f"{name}/tcg_locking"] = level0["locking"]
            for nsid in nsids:
                attached = (root / "sys/block" / f"{name}n{nsid}").exists()
                out[f"{name}/ns{nsid}/attached"] = "yes" if attached else "no"
                if attached:
                    ns = release.nvme_json(release.tool_output(ctx, "nvme", "id_ns",
                                                               device=f"{device}n{nsid}"))
                    out.update(_namespace(f"{name}/ns{nsid}", ns))
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"{name}: unexpected nvme-cli output: {exc!r}") from exc
    return out


def _namespace(path: str, ns: Mapping[str, Any]) -> dict[str, str]:
    flbas = int(ns.get("flbas", 0))
    index = (flbas & 0xF) | ((flbas >> 1) & 0x30)
    formats = ns.get("lbafs", [])
    if index >= len(formats):
        raise AgentError(f"{path}: LBA format {index} is not among the {len(formats)} it lists")
    fmt = formats[index]
    dps = int(ns.get("dps", 0))
    return {f"{path}/size": str(int(ns.get("nsze", 0)) << int(fmt.get("ds", 0))),
            f"{path}/format": (f"ds={1 << int(fmt.get('ds', 0))};ms={int(fmt.get('ms', 0))};pi={dps & 7};"
                               f"pil={dps >> 3 & 1};ext={flbas >> 4 & 1}"),
            f"{path}/nmic": str(int(ns.get("nmic", 0))),
            f"{path}/nsattr": str(int(ns.get("nsattr", 0)))}


# --------------------------------------------------------------------------- gpu


def _mode(value: bool | int | None) -> str:
    return "unsupported" if value is None else str(int(value))


def gpus(ctx: Context) -> dict[str, str]:
    with ctx.hold(NVML_LOCK):
        states, cc = gpu.read_modes(gpu.library_path(ctx.config.nvml_library))
    out = {"cc": "unsupported" if cc is None else f"environment={cc[0]};feature={cc[1]}"}
    for g in states:
        where = gpu.pci_address(g.pci_bus_id) if g.pci_bus_id else str(g.index)
        if g.lost or gpu.UNREADABLE in g.errors:
            raise AgentError(f"GPU {where} cannot be read: {'lost' if g.lost else g.errors[gpu.UNREADABLE]}")
        out[f"{where}/index"] = str(g.index)
        out[f"{where}/persistence_mode"] = _mode(g.persistence_mode)
        out[f"{where}/mig_mode"] = _mode(g.mig_mode)
        out[f"{where}/mig_mode_pending"] = _mode(g.mig_mode_pending)
        out[f"{where}/ecc_mode"] = _mode(g.ecc_enabled)
        out[f"{where}/compute_mode"] = _mode(g.compute_mode)
    return out
