"""The pass / warn / fail rules for GPUs: one place shared by diag.nvml, diag.dcgm and gpu.reset.

Every rule yields a ``Finding`` with a stable code; the verdict is the worst finding (a warn
counts as a fail when the request says so). Thresholds come from the request's
GpuThresholds; a zero field means the documented default.

Per GPU (NVML):
  fail  gpu_lost                 NVML reports the GPU lost (fell off the bus)
  fail  gpu_unreadable           NVML cannot open the GPU at all (e.g. "Unknown Error")
  fail  gpu_missing              a GPU the request names is not there
  fail  model_mismatch           name does not contain expected_model
  fail  ecc_uncorrected          volatile uncorrected ECC errors > max_ecc_uncorrected_volatile (0)
  warn  ecc_corrected            volatile corrected ECC errors > max_ecc_corrected_volatile (0)
  warn  ecc_uncorrected_history  aggregate (lifetime) uncorrected ECC errors > 0
  warn  ecc_disabled             the GPU has ECC and it is off
  fail  row_remap_failure        row remapping failed: the GPU needs replacing
  fail  row_remap_pending        a row remap waits for a GPU reset (gpu.reset)
  fail  retired_pages_pending    a page retirement waits for a GPU reset
  warn  retired_pages            retired pages > max_retired_pages (0)
  fail  overheating              temperature at or above the slowdown threshold
  warn  temperature_high         temperature above max_temperature_c (slowdown - 5)
  warn  clock_throttled          a hardware/thermal clock event reason is active
  fail  pcie_width_degraded      link width below min_pcie_width (the GPU's max width)
  warn  pcie_generation_low      link generation below min_pcie_generation (the max), GPU not idle
  warn  nvlink_inactive          an NVLink link is down
  warn  persistence_mode_off     only when require_persistence_mode
  warn  processes_running        compute processes, unless allow_compute_processes
  warn  nvml_query_failed        a query failed for another reason than "not supported"
Kernel log (Xid events since boot, classified by agent/policy/xid.py after NVIDIA's catalogue):
  fail  xid_reboot               an Xid that calls for a reboot (79, fallen off the bus, ...)
  fail  xid_drain                an Xid that calls for service (contact support)
  fail  xid_reset_gpu            an Xid that calls for a GPU reset (48, 95, ...)
  warn  xid_unknown              an Xid the catalogue does not know
        (an Xid the catalogue calls the application's own, e.g. 13 or 31, is reported, no finding)
Node:
  fail  no_driver                no NVIDIA driver (warn when no GPU count is expected)
  fail  gpu_count                fewer GPUs than expected_gpu_count (warn when more)
  warn  no_gpus                  the driver sees no GPU and no count is expected
DCGM:
  fail  dcgm_test_failed         a test result is Fail
  warn  dcgm_test_warning        a test result is Warn
  fail  dcgm_exit_status         dcgmi exited non-zero without a failed test in its JSON
  warn  dcgm_nothing_tested      every test of a level >= 2 run was skipped
  fail  gpu_count                fewer GPUs in the run than expected (whole-node runs only)
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agent.errors import InvalidParameters
from agent.hw.dcgm import DcgmTest
from agent.hw.gpu import UNREADABLE, GpuState
from agent.policy import xid
from agent.proto import agent_pb2, common_pb2


class Level(enum.IntEnum):
    PASS = common_pb2.PASS
    WARN = common_pb2.WARN
    FAIL = common_pb2.FAIL

    @property
    def wire(self) -> common_pb2.Verdict:
        """The protobuf Verdict of this level (the same number)."""
        return typing.cast(common_pb2.Verdict, int(self))


NODE = -1  # gpu_index of a node-wide finding

_Add = Callable[[Level, str, str], None]  # the add() of judge_gpu, passed to its rule groups


@dataclass(frozen=True)
class Finding:
    level: Level
    code: str
    message: str
    gpu_index: int = NODE
    subject: str = ""

    def to_proto(self) -> common_pb2.Finding:
        return common_pb2.Finding(verdict=self.level.wire, code=self.code, message=self.message,
                                  gpu_index=self.gpu_index, subject=self.subject)


@dataclass(frozen=True)
class Thresholds:
    expected_gpu_count: int = 0
    expected_model: str = ""
    max_temperature_c: int = 0
    min_pcie_width: int = 0
    min_pcie_generation: int = 0
    max_ecc_corrected_volatile: int = 0
    max_ecc_uncorrected_volatile: int = 0
    max_retired_pages: int = 0
    require_persistence_mode: bool = False
    allow_compute_processes: bool = False
    treat_warn_as_fail: bool = False

    @classmethod
    def from_proto(cls, msg: agent_pb2.GpuThresholds) -> Thresholds:
        if msg.expected_gpu_count > 64:
            raise InvalidParameters(f"expected_gpu_count {msg.expected_gpu_count} is more than 64")
        if not 0 <= msg.max_temperature_c <= 150:
            raise InvalidParameters(f"max_temperature_c {msg.max_temperature_c} is not within 0..150")
        if msg.min_pcie_width not in (0, 1, 2, 4, 8, 12, 16, 32):
            raise InvalidParameters(f"min_pcie_width {msg.min_pcie_width} is not a PCIe link width")
        if msg.min_pcie_generation > 8:
            raise InvalidParameters(f"min_pcie_generation {msg.min_pcie_generation} is not a PCIe generation")
        if len(msg.expected_model) > 96 or not msg.expected_model.isprintable():
            raise InvalidParameters("expected_model must be printable and at most 96 characters")
        return cls(
            expected_gpu_count=msg.expected_gpu_count,
            expected_model=msg.expected_model.strip(),
            max_temperature_c=msg.max_temperature_c,
            min_pcie_width=msg.min_pcie_width,
            min_pcie_generation=msg.min_pcie_generation,
            max_ecc_corrected_volatile=msg.max_ecc_corrected_volatile,
            max_ecc_uncorrected_volatile=msg.max_ecc_uncorrected_volatile,
            max_retired_pages=msg.max_retired_pages,
            require_persistence_mode=msg.require_persistence_mode,
            allow_compute_processes=msg.allow_compute_processes,
            treat_warn_as_fail=msg.treat_warn_as_fail,
        )


def verdict(findings: Iterable[Finding], thresholds: Thresholds) -> Level:
    worst = max((f.level for f in findings), default=Level.PASS)
    if worst == Level.WARN and thresholds.treat_warn_as_fail:
        return Level.FAIL
    return worst


# -- NVML, per GPU ---------------------------------------------------------------------------


def judge_gpu(s: GpuState, th: Thresholds) -> list[Finding]:
    out: list[Finding] = []

    def add(level: Level, code: str, message: str) -> None:
        out.append(Finding(level, code, f"GPU {s.index}: {message}", s.index, s.uuid))

    if s.lost:
        add(Level.FAIL, "gpu_lost", "NVML reports the GPU lost (fallen off the bus); it needs a reset "
            "or a reboot, and replacing if it happens again")
        return out
    if UNREADABLE in s.errors:
        add(Level.FAIL, "gpu_unreadable", f"NVML cannot open the GPU ({s.errors[UNREADABLE]}); it may "
            "have fallen off the bus")
        return out
    if th.expected_model and th.expected_model.lower() not in s.name.lower():
        add(Level.FAIL, "model_mismatch", f"is a {s.name!r}, expected {th.expected_model!r}")
    _ecc(s, th, add)
    _memory(s, th, add)
    _thermal(s, th, add)
    _links(s, th, add)
    if th.require_persistence_mode and s.persistence_mode is False:
        add(Level.WARN, "persistence_mode_off", "persistence mode is off")
    if s.processes and not th.allow_compute_processes:
        listed = ", ".join(f"{p.pid} ({p.name or '?'})" for p in s.processes)
        add(Level.WARN, "processes_running", f"{len(s.processes)} compute process(es) running: {listed}")
    for name, error in sorted(s.errors.items()):
        add(Level.WARN, "nvml_query_failed", f"reading {name} failed: {error}")
    return out


def _ecc(s: GpuState, th: Thresholds, add: _Add) -> None:
    if s.ecc_enabled is False:
        add(Level.WARN, "ecc_disabled", "ECC is supported but disabled")
    uncorrected = s.ecc_uncorrected_volatile
    if uncorrected is not None and uncorrected > th.max_ecc_uncorrected_volatile:
        add(Level.FAIL, "ecc_uncorrected", f"{s.ecc_uncorrected_volatile} uncorrected ECC error(s) since "
            f"the last reset (allowed {th.max_ecc_uncorrected_volatile})")
    if s.ecc_corrected_volatile is not None and s.ecc_corrected_volatile > th.max_ecc_corrected_volatile:
        add(Level.WARN, "ecc_corrected", f"{s.ecc_corrected_volatile} corrected ECC error(s) since the "
            f"last reset (allowed {th.max_ecc_corrected_volatile})")
    if s.ecc_uncorrected_aggregate:
        add(Level.WARN, "ecc_uncorrected_history",
            f"{s.ecc_uncorrected_aggregate} uncorrected ECC error(s) over the GPU's life")


def _memory(s: GpuState, th: Thresholds, add: _Add) -> None:
    if s.remapped_rows_failure:
        add(Level.FAIL, "row_remap_failure", "row remapping failed: the GPU's memory cannot be repaired, "
            "replace the GPU")
    if s.remapped_rows_pending:
        add(Level.FAIL, "row_remap_pending", "a row remap is pending: reset the GPU (gpu.reset) to apply it")
    if s.retired_pages_pending:
        add(Level.FAIL, "retired_pages_pending", "a page retirement is pending: reset the GPU to apply it")
    retired = (s.retired_pages_single_bit or 0) + (s.retired_pages_double_bit or 0)
    if retired > th.max_retired_pages:
        add(Level.WARN, "retired_pages", f"{retired} retired page(s) ({s.retired_pages_double_bit or 0} "
            f"for double-bit errors; allowed {th.max_retired_pages})")


def _thermal(s: GpuState, th: Thresholds, add: _Add) -> None:
    if s.temperature_c is not None:
        slowdown = s.temperature_slowdown_c
        limit = th.max_temperature_c or ((slowdown - 5) if slowdown else 85)
        if slowdown and s.temperature_c >= slowdown:
            add(Level.FAIL, "overheating", f"{s.temperature_c} C, at or above its slowdown threshold "
                f"of {slowdown} C")
        elif s.temperature_c > limit:
            add(Level.WARN, "temperature_high", f"{s.temperature_c} C, above {limit} C")
    severe = [name for name, is_severe in s.clock_event_names() if is_severe]
    if severe:
        add(Level.WARN, "clock_throttled", "clocks held back by " + ", ".join(severe))


def _links(s: GpuState, th: Thresholds, add: _Add) -> None:
    if s.pcie_width is not None:
        want = th.min_pcie_width or s.pcie_width_max or 0
        if s.pcie_width < want:
            add(Level.FAIL, "pcie_width_degraded", f"PCIe link is x{s.pcie_width}, expected x{want} "
                f"(the GPU can do x{s.pcie_width_max})")
    idle = any(name == "gpu_idle" for name, _ in s.clock_event_names())
    if s.pcie_generation is not None and not idle:  # an idle GPU lowers its link speed to save power
        want = th.min_pcie_generation or s.pcie_generation_max or 0
        if s.pcie_generation < want:
            add(Level.WARN, "pcie_generation_low", f"PCIe link runs at generation {s.pcie_generation}, "
                f"expected {want}")
    down = [link for link, active in s.nvlinks if not active]
    if down:
        add(Level.WARN, "nvlink_inactive", f"{len(down)} of {len(s.nvlinks)} NVLink link(s) down: "
            + ", ".join(str(link) for link in down))


# -- Xid events -------------------------------------------------------------------------------

_XID_FINDINGS = {
    xid.Action.REBOOT: (Level.FAIL, "xid_reboot", "reboot the node"),
    xid.Action.DRAIN: (Level.FAIL, "xid_drain", "drain the node for service"),
    xid.Action.RESET_GPU: (Level.FAIL, "xid_reset_gpu", "reset the GPU (gpu.reset)"),
    xid.Action.UNKNOWN: (Level.WARN, "xid_unknown", "an Xid this agent's catalogue does not know"),
}


def judge_xid(events: Sequence[xid.XidEvent], gpu_index: Callable[[str], int]) -> list[Finding]:
    """One finding per GPU and Xid code that calls for something; ``gpu_index(pci_address)``
    is the GPU's index (NODE when the address is no GPU NVML knows)."""
    seen: dict[tuple[str, int], list[xid.XidEvent]] = {}
    for e in events:
        if e.action in _XID_FINDINGS:
            seen.setdefault((e.pci_address, e.xid), []).append(e)
    out = []
    for (address, code), same in seen.items():
        level, name, what = _XID_FINDINGS[same[0].action]
        index = gpu_index(address)
        where = f"GPU {index}" if index != NODE else f"GPU {address}"
        label = f" ({same[0].name})" if same[0].name else ""
        out.append(Finding(level, name, f"{where}: Xid {code}{label} {len(same)} time(s) since boot: {what}",
                           index, address))
    return out


# -- node-wide --------------------------------------------------------------------------------


def judge_count(seen: int, th: Thresholds) -> list[Finding]:
    if th.expected_gpu_count and seen < th.expected_gpu_count:
        return [Finding(Level.FAIL, "gpu_count", f"{seen} GPU(s) found, expected {th.expected_gpu_count}")]
    if th.expected_gpu_count and seen > th.expected_gpu_count:
        return [Finding(Level.WARN, "gpu_count",
                        f"{seen} GPU(s) found, expected only {th.expected_gpu_count}")]
    if not th.expected_gpu_count and seen == 0:
        return [Finding(Level.WARN, "no_gpus", "the NVIDIA driver sees no GPU")]
    return []


def judge_no_driver(message: str, th: Thresholds) -> list[Finding]:
    level = Level.FAIL if th.expected_gpu_count else Level.WARN
    return [Finding(level, "no_driver", message)]


def missing(ref: str, why: str) -> Finding:
    return Finding(Level.FAIL, "gpu_missing", f"GPU {ref}: {why}", subject=ref)


# -- DCGM -------------------------------------------------------------------------------------


def judge_dcgm(tests: Sequence[DcgmTest], *, level: int, exit_code: int, gpus_seen: int | None,
               whole_node: bool, th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    for t in tests:
        where = f"GPU {t.gpu_index}: " if t.gpu_index >= 0 else ""
        detail = ("; " + " / ".join(t.warnings)) if t.warnings else ""
        if t.status == "fail":
            out.append(Finding(Level.FAIL, "dcgm_test_failed", f"{where}{t.name} failed{detail}",
                               t.gpu_index, t.name))
        elif t.status == "warn":
            out.append(Finding(Level.WARN, "dcgm_test_warning", f"{where}{t.name} warned{detail}",
                               t.gpu_index, t.name))
    if exit_code != 0 and not any(f.level == Level.FAIL for f in out):
        out.append(Finding(Level.FAIL, "dcgm_exit_status",
                           f"dcgmi exited with {exit_code} but its JSON names no failed test"))
    exercised = [t for t in tests if t.category.lower() != "deployment"]
    if level >= 2 and exercised and all(t.status == "skip" for t in exercised):
        out.append(Finding(Level.WARN, "dcgm_nothing_tested",
                           f"every level-{level} test was skipped: nothing was exercised"))
    if whole_node and gpus_seen is not None and th.expected_gpu_count and gpus_seen < th.expected_gpu_count:
        out.append(Finding(Level.FAIL, "gpu_count",
                           f"DCGM ran on {gpus_seen} GPU(s), expected {th.expected_gpu_count}"))
    return out


# -- to the wire ------------------------------------------------------------------------------


def health_proto(s: GpuState, th: Thresholds) -> agent_pb2.GpuHealth:
    """The GpuHealth message of one GPU, with its verdict and findings."""
    findings = judge_gpu(s, th)
    msg = agent_pb2.GpuHealth(
        index=s.index,
        uuid=s.uuid,
        serial=s.serial or "",
        name=s.name,
        pci_bus_id=s.pci_bus_id,
        vbios_version=s.vbios_version or "",
        lost=s.lost,
        verdict=verdict(findings, th).wire,
        findings=[f.to_proto() for f in findings],
    )
    for name in ("memory_total_bytes", "memory_used_bytes", "temperature_c", "temperature_slowdown_c",
                 "temperature_shutdown_c", "power_draw_mw", "power_limit_mw", "clock_sm_mhz",
                 "clock_mem_mhz", "pcie_generation", "pcie_generation_max", "pcie_width",
                 "pcie_width_max", "ecc_enabled", "ecc_corrected_volatile", "ecc_uncorrected_volatile",
                 "ecc_corrected_aggregate", "ecc_uncorrected_aggregate", "retired_pages_single_bit",
                 "retired_pages_double_bit", "retired_pages_pending", "remapped_rows_correctable",
                 "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure",
                 "persistence_mode"):
        value = getattr(s, name)
        if value is not None:
            setattr(msg, name, value)
        elif not s.lost:
            msg.unavailable.append(name)
    for reason, severe in s.clock_event_names():
        msg.clock_event_reasons.add(name=reason, severe=severe)
    for link, active in s.nvlinks:
        msg.nvlinks.add(link=link, active=active)
    for p in s.processes:
        msg.processes.add(pid=p.pid, used_memory_bytes=p.used_memory_bytes or 0, name=p.name)
    return msg
