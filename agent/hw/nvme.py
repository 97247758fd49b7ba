"""NVMe erase capabilities and commands, through nvme-cli's JSON output.

What a controller can do comes from Identify Controller (``nvme id-ctrl -o json``):

- OACS bit 1: Format NVM supported;
- FNA bit 0: a format applies to every namespace; bit 1: a secure erase applies to every
  namespace; bit 2: cryptographic erase supported as part of Format NVM (SES=2);
- SANICAP bits 0/1/2: Sanitize crypto erase / block erase / overwrite supported.

Identify Namespace (``nvme id-ns -o json``) gives the current LBA format (FLBAS) and DLFEAT
(bits 2:0 = 001b: deallocated blocks read zeros).

Commands take a ``runner`` (``Context.run`` in the agent, a fake in tests) that runs an argv
and returns ``proc.Completed``; it raises ToolMissing/ToolFailed like ``proc.run``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import ToolFailed
from agent.proc import Completed

Runner = Callable[..., Completed]

# Sanitize actions (SANACT) and statuses (SSTAT bits 2:0).
SANACT_BLOCK, SANACT_OVERWRITE, SANACT_CRYPTO = 2, 3, 4
SSTAT_NEVER, SSTAT_DONE, SSTAT_RUNNING, SSTAT_FAILED, SSTAT_DONE_NO_DEALLOC = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Controller:
    name: str
    model: str
    serial: str
    firmware: str
    oacs: int
    fna: int
    sanicap: int

    @property
    def can_format(self) -> bool:
        return bool(self.oacs & 0x2)

    @property
    def can_crypto_format(self) -> bool:
        return self.can_format and bool(self.fna & 0x4)

    @property
    def format_all_namespaces(self) -> bool:
        return bool(self.fna & 0x3)

    @property
    def can_sanitize_crypto(self) -> bool:
        return bool(self.sanicap & 0x1)

    @property
    def can_sanitize_block(self) -> bool:
        return bool(self.sanicap & 0x2)

    @property
    def can_sanitize_overwrite(self) -> bool:
        return bool(self.sanicap & 0x4)


@dataclass(frozen=True)
class Namespace:
    nsid: int
    lbaf: int           # current LBA format index
    dlfeat: int

    @property
    def deallocated_reads_zeros(self) -> bool:
        return self.dlfeat & 0x7 == 0x1


@dataclass(frozen=True)
class SanitizeStatus:
    status: int         # SSTAT_*
    progress: float     # 0..1 (SPROG / 65536)

    @property
    def running(self) -> bool:
        return self.status == SSTAT_RUNNING

    @property
    def succeeded(self) -> bool:
        return self.status in (SSTAT_DONE, SSTAT_DONE_NO_DEALLOC)


def _json(done: Completed, what: str) -> dict[str, Any]:
    try:
        data = json.loads(done.stdout)
    except ValueError as exc:
        raise ToolFailed(f"nvme {what}: output is not JSON ({exc})", tool="nvme") from exc
    if not isinstance(data, dict):
        raise ToolFailed(f"nvme {what}: unexpected JSON", tool="nvme")
    return data


def _num(value: Any) -> int:
    if isinstance(value, str):
        return int(value, 0)
    return int(value or 0)


def parse_id_ctrl(name: str, data: dict[str, Any]) -> Controller:
    return Controller(
        name=name,
        model=str(data.get("mn", "")).strip(),
        serial=str(data.get("sn", "")).strip(),
        firmware=str(data.get("fr", "")).strip(),
        oacs=_num(data.get("oacs", 0)),
        fna=_num(data.get("fna", 0)),
        sanicap=_num(data.get("sanicap", 0)),
    )


def parse_id_ns(nsid: int, data: dict[str, Any]) -> Namespace:
    flbas = _num(data.get("flbas", 0))
    lbaf = (flbas & 0xF) | ((flbas >> 1) & 0x30)  # bits 6:5 extend the index past 16
    return Namespace(nsid=nsid, lbaf=lbaf, dlfeat=_num(data.get("dlfeat", 0)))


def parse_sanitize_log(data: dict[str, Any]) -> SanitizeStatus:
    """nvme-cli 1.x puts the fields at the top; 2.x nests them under the device name."""
    log = data
    if "sprog" not in log:
        log = next((v for v in data.values() if isinstance(v, dict) and "sprog" in v), {})
    if "sprog" not in log:
        raise ToolFailed("nvme sanitize-log: no sprog field in the output", tool="nvme")
    sstat = log.get("sstat", 0)
    status = _num(sstat.get("status", 0)) if isinstance(sstat, dict) else _num(sstat) & 0x7
    return SanitizeStatus(status=status, progress=min(1.0, _num(log["sprog"]) / 65536))


def id_ctrl(run: Runner, controller: str) -> Controller:
    return parse_id_ctrl(controller, _json(run(["nvme", "id-ctrl", f"/dev/{controller}", "-o", "json"]),
                                           "id-ctrl"))


def id_ns(run: Runner, device: str, nsid: int) -> Namespace:
    return parse_id_ns(nsid, _json(run(["nvme", "id-ns", device, "-n", str(nsid), "-o", "json"]), "id-ns"))


def version(run: Runner) -> str:
    try:
        first = run(["nvme", "version"]).text.strip().splitlines()
    except Exception:
        return "nvme-cli"
    return first[0].replace("nvme version", "nvme-cli").strip() if first else "nvme-cli"


def format_argv(device: str, ns: Namespace, ses: int, timeout_ms: int) -> Sequence[str]:
    return [
        "nvme", "format", device, f"--namespace-id={ns.nsid}", f"--lbaf={ns.lbaf}", f"--ses={ses}",
        f"--timeout={timeout_ms}", "--force",
    ]


def format_ns(run: Runner, device: str, ns: Namespace, ses: int, timeout_ms: int) -> None:
    """Format NVM with SES=1 (user data erase) or 2 (crypto erase); blocks until done."""
    run(format_argv(device, ns, ses, timeout_ms), timeout=timeout_ms / 1000 + 30)


def sanitize(run: Runner, controller: str, action: int) -> None:
    """Start a sanitize (it runs in the background); poll with sanitize_log."""
    run(["nvme", "sanitize", f"/dev/{controller}", f"--sanact={action}"])


def sanitize_log(run: Runner, controller: str) -> SanitizeStatus:
    return parse_sanitize_log(_json(run(["nvme", "sanitize-log", f"/dev/{controller}", "-o", "json"]),
                                    "sanitize-log"))
