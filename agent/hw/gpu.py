"""NVIDIA GPUs through NVML (pynvml), read-only.

``open_nvml()`` loads libnvidia-ml (the one named by the nvml_library setting or the
BC_NVML_LIBRARY environment variable, else ``libnvidia-ml.so.1`` from the loader's path),
initialises it and shuts it down again. No library or no kernel driver raises ``NoDriver``,
a one-line error, never a traceback.

What a GPU model does not have (NVML_ERROR_NOT_SUPPORTED, or a function an older driver
lacks) is "not available": the field stays None. A GPU that fell off the bus
(NVML_ERROR_GPU_IS_LOST) is returned as a ``GpuState`` with ``lost=True``, not raised.
Any other failing query is kept in ``GpuState.errors`` under the field's name.

``list_gpus()`` is the short form the inventory uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from agent import deps, limits
from agent.errors import NotFound, ToolFailed, Unsupported

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_LIBRARY = "libnvidia-ml.so.1"
LIBRARY_ENV = "BC_NVML_LIBRARY"

# Clock event ("throttle") reasons, NVML's bit -> (name, severe). Severe ones mean the
# hardware is slowing itself down (heat, power brake), not a policy or an idle GPU.
CLOCK_EVENT_REASONS: dict[int, tuple[str, bool]] = {
    0x001: ("gpu_idle", False),
    0x002: ("applications_clocks_setting", False),
    0x004: ("sw_power_cap", False),
    0x008: ("hw_slowdown", True),
    0x010: ("sync_boost", False),
    0x020: ("sw_thermal_slowdown", True),
    0x040: ("hw_thermal_slowdown", True),
    0x080: ("hw_power_brake_slowdown", True),
    0x100: ("display_clock_setting", False),
}

# NVML return codes the agent tells apart (nvml.h; stable across releases).
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_ARGUMENT_VERSION_MISMATCH = 25
_UNAVAILABLE = {_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH}


UNREADABLE = "handle"  # GpuState.errors key when NVML cannot even open the GPU


class NoDriver(Unsupported):
    """No NVIDIA driver (library or kernel module) on this machine."""


class _Lost(Exception):
    pass


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None
    name: str


@dataclass(frozen=True)
class GpuSummary:
    """One GPU for the inventory."""

    index: int
    uuid: str
    name: str
    serial: str
    pci_bus_id: str                 # "00000000:18:00.0"
    pci_device_id: int              # NVML's 0xDDDDVVVV (device << 16 | vendor)
    memory_total_bytes: int
    lost: bool = False
    vbios_version: str = ""
    pcie_generation: int = 0
    pcie_generation_max: int = 0
    pcie_width: int = 0
    pcie_width_max: int = 0
    nvlinks: tuple[tuple[int, bool], ...] = ()     # (link, active)

    @property
    def vendor_id(self) -> str:
        return f"{self.pci_device_id & 0xFFFF:04x}"

    @property
    def device_id(self) -> str:
        return f"{self.pci_device_id >> 16:04x}"


@dataclass
class GpuState:
    """Everything diag.nvml reads of one GPU. None: not available on this GPU."""

    index: int
    uuid: str = ""
    serial: str | None = None
    name: str = ""
    pci_bus_id: str = ""
    pci_device_id: int = 0
    vbios_version: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    temperature_shutdown_c: int | None = None
    power_draw_mw: int | None = None
    power_limit_mw: int | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_event_reasons: int | None = None
    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    ecc_enabled: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    nvlinks: list[tuple[int, bool]] = field(default_factory=list)
    persistence_mode: bool | None = None
    compute_mode: int | None = None                 # NVML_COMPUTEMODE_*: 0 default, 2 exclusive, 3 prohibited
    # What a tenant can change and the release puts back (agent.policy.release).
    mig_mode: bool | None = None
    mig_mode_pending: bool | None = None
    power_limit_set_mw: int | None = None           # the management limit a user set (nvidia-smi -pl)
    power_limit_default_mw: int | None = None
    app_clock_graphics_mhz: int | None = None
    app_clock_memory_mhz: int | None = None
    app_clock_graphics_default_mhz: int | None = None
    app_clock_memory_default_mhz: int | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    lost: bool = False
    errors: dict[str, str] = field(default_factory=dict)

    def clock_event_names(self) -> list[tuple[str, bool]]:
        bits = self.clock_event_reasons or 0
        return [name_severe for bit, name_severe in CLOCK_EVENT_REASONS.items() if bits & bit]

    def summary(self) -> GpuSummary:
        return GpuSummary(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            serial=self.serial or "",
            pci_bus_id=self.pci_bus_id,
            pci_device_id=self.pci_device_id,
            memory_total_bytes=self.memory_total_bytes or 0,
            lost=self.lost,
            vbios_version=self.vbios_version or "",
            pcie_generation=self.pcie_generation or 0,
            pcie_generation_max=self.pcie_generation_max or 0,
            pcie_width=self.pcie_width or 0,
            pcie_width_max=self.pcie_width_max or 0,
            nvlinks=tuple(self.nvlinks),
        )


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str
    cuda_driver_version: str        # "12.4"
    nvml_version: str


def pci_address(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs and the kernel log write it, "0000:18:00.0"."""
    domain, _, rest = bus_id.lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()
    except ValueError:
        return bus_id.lower()


def library_path(named: str = "") -> str | None:
    """The NVML library ``named`` (the nvml_library setting), else $BC_NVML_LIBRARY, else
    None for the loader's default."""
    return named or os.environ.get(LIBRARY_ENV) or None


# -- loading ------------------------------------------------------------------------------

_load_guard = threading.Lock()
_loaded: str | None = None  # the explicit library path pynvml currently uses, if any


def _import_pynvml() -> ModuleType:
    with warnings.catch_warnings():
        # The "pynvml" distribution re-exports nvidia-ml-py with a FutureWarning on import.
        warnings.simplefilter("ignore", FutureWarning)
        return deps.need("pynvml")


def _use_library(nv: ModuleType, library: str | None) -> None:
    """Point pynvml at ``library`` (or back at its default), once per change."""
    global _loaded
    with _load_guard:
        if library == _loaded:
            return
        handle = None
        if library is not None:
            try:
                handle = ctypes.CDLL(library)
            except OSError as exc:
                raise NoDriver(
                    f"no NVIDIA driver: cannot load the NVML library {library} ({exc})", library=library
                ) from exc
        # pynvml keeps the library and its function pointers in module globals.
        with getattr(nv, "libLoadLock", contextlib.nullcontext()):
            nv.nvmlLib = handle  # type: ignore[attr-defined]  # a module global pynvml sets at run time
            cache = getattr(nv, "_nvmlGetFunctionPointer_cache", None)
            if cache is not None:
                cache.clear()
        _loaded = library


def _code(exc: BaseException) -> int:
    return int(getattr(exc, "value", -1))


@contextlib.contextmanager
def open_nvml(library: str | None = None) -> Iterator[Nvml]:
    """Initialise NVML for the duration of the block. Raises NoDriver, MissingDependency."""
    nv = _import_pynvml()
    _use_library(nv, library)
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        code = _code(exc)
        if code == _LIBRARY_NOT_FOUND:
            raise NoDriver(
                f"no NVIDIA driver on this machine ({library or DEFAULT_LIBRARY} not found)",
                nvml_error=code,
            ) from exc
        if code == _DRIVER_NOT_LOADED:
            raise NoDriver(
                "no NVIDIA driver: the NVML library is installed but the kernel driver is not loaded",
                nvml_error=code,
            ) from exc
        raise NoDriver(f"NVML cannot be initialised: {exc}", nvml_error=code) from exc
    try:
        yield Nvml(nv)
    except nv.NVMLError as exc:
        raise ToolFailed(f"NVML call failed: {exc}", nvml_error=_code(exc)) from exc
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _cuda_version(raw: int) -> str:
    return f"{raw // 1000}.{raw % 1000 // 10}"


class Nvml:
    """An initialised NVML session (from ``open_nvml``)."""

    def __init__(self, nv: ModuleType) -> None:
        self.nv = nv

    # -- machine-wide ---------------------------------------------------------------------

    def system(self) -> SystemInfo:
        nv = self.nv
        cuda = self._optional(nv.nvmlSystemGetCudaDriverVersion)
        nvml_version = self._optional(nv.nvmlSystemGetNVMLVersion)
        return SystemInfo(
            driver_version=_text(nv.nvmlSystemGetDriverVersion()),
            cuda_driver_version=_cuda_version(cuda) if cuda else "",
            nvml_version=_text(nvml_version) if nvml_version else "",
        )

    def count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def resolve(self, ref: str) -> int:
        """An index ("3") or a UUID ("GPU-...") to the GPU's index. Raises NotFound."""
        nv = self.nv
        if limits.is_digits(ref):
            index = int(ref)
            if index >= self.count():
                raise NotFound(f"no GPU with index {index} (NVML sees {self.count()})", gpu=ref)
            return index
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(ref.encode())
            return int(nv.nvmlDeviceGetIndex(handle))
        except nv.NVMLError as exc:
            if _code(exc) == _GPU_IS_LOST:
                # The driver knows the UUID but the GPU is gone: its index is that of the one
                # lost GPU, if there is exactly one.
                lost = [i for i in range(self.count()) if self.read(i, processes=False).lost]
                if len(lost) == 1:
                    return lost[0]
            raise NotFound(f"no GPU with UUID {ref} ({exc})", gpu=ref) from exc

    # -- one GPU --------------------------------------------------------------------------

    def _optional(self, fn: Callable[..., T], *args: Any, errors: dict[str, str] | None = None,
                  name: str = "") -> T | None:
        """fn(*args), None when not available; GPU lost raises _Lost; else noted in errors."""
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            code = _code(exc)
            if code == _GPU_IS_LOST:
                raise _Lost from exc
            if code not in _UNAVAILABLE and errors is not None:
                errors[name or getattr(fn, "__name__", "?")] = str(exc)
            return None

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute processes on the GPU (empty when it is lost or cannot say)."""
        try:
            return self._processes(self.nv.nvmlDeviceGetHandleByIndex(index), {})
        except (_Lost, self.nv.NVMLError):
            return []

    def _processes(self, handle: Any, errors: dict[str, str]) -> list[GpuProcess]:
        nv = self.nv
        found = self._optional(nv.nvmlDeviceGetComputeRunningProcesses, handle, errors=errors,
                               name="processes") or []
        out = []
        for p in found:
            name = self._optional(nv.nvmlSystemGetProcessName, p.pid)
            out.append(GpuProcess(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory,
                                  name=_text(name) if name else ""))
        return out

    def read(self, index: int, *, processes: bool = True) -> GpuState:
        """Everything about GPU ``index``; a lost GPU comes back with lost=True."""
        nv = self.nv
        state = GpuState(index=index)
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            if _code(exc) == _GPU_IS_LOST:
                state.lost = True
            else:  # e.g. "Unknown Error": what a GPU that fell off the bus often gives instead
                state.errors[UNREADABLE] = str(exc)
            return state
        try:
            self._fill(state, handle, processes)
        except _Lost:
            state.lost = True
        return state

    def _fill(self, s: GpuState, h: Any, with_processes: bool) -> None:
        nv, err = self.nv, s.errors

        def q(name: str, fn: Callable[..., T], *args: Any) -> T | None:
            return self._optional(fn, h, *args, errors=err, name=name)

        s.uuid = _text(q("uuid", nv.nvmlDeviceGetUUID) or "")
        s.name = _text(q("name", nv.nvmlDeviceGetName) or "")
        serial = q("serial", nv.nvmlDeviceGetSerial)
        s.serial = _text(serial) if serial is not None else None
        pci = q("pci", nv.nvmlDeviceGetPciInfo)
        if pci is not None:
            s.pci_bus_id = _text(pci.busId)
            s.pci_device_id = int(pci.pciDeviceId)
        vbios = q("vbios_version", nv.nvmlDeviceGetVbiosVersion)
        s.vbios_version = _text(vbios) if vbios is not None else None
        memory = self._memory(h, err)
        if memory is not None:
            s.memory_total_bytes, s.memory_used_bytes = memory
        s.temperature_c = q("temperature", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        s.temperature_slowdown_c = q("temperature_slowdown", nv.nvmlDeviceGetTemperatureThreshold,
                                     nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        s.temperature_shutdown_c = q("temperature_shutdown", nv.nvmlDeviceGetTemperatureThreshold,
                                     nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        s.power_draw_mw = q("power_draw", nv.nvmlDeviceGetPowerUsage)
        s.power_limit_mw = q("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit)
        s.clock_sm_mhz = q("clock_sm", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        s.clock_mem_mhz = q("clock_mem", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)
        reasons = self._optional(nv.nvmlDeviceGetCurrentClocksEventReasons, h)  # driver >= 535
        if reasons is None:
            reasons = q("clock_event_reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        s.clock_event_reasons = reasons
        s.pcie_generation = q("pcie_generation", nv.nvmlDeviceGetCurrPcieLinkGeneration)
        s.pcie_generation_max = q("pcie_generation_max", nv.nvmlDeviceGetMaxPcieLinkGeneration)
        s.pcie_width = q("pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth)
        s.pcie_width_max = q("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth)
        self._ecc(s, h)
        self._memory_health(s, h)
        s.nvlinks = self._nvlinks(h, err)
        persistence = q("persistence_mode", nv.nvmlDeviceGetPersistenceMode)
        s.persistence_mode = None if persistence is None else persistence == nv.NVML_FEATURE_ENABLED
        s.compute_mode = q("compute_mode", nv.nvmlDeviceGetComputeMode)
        self._settings(s, h)
        if with_processes:
            s.processes = self._processes(h, err)

    def _settings(self, s: GpuState, h: Any) -> None:
        """MIG mode, the power limit and the application clocks, with their defaults."""
        nv, err = self.nv, s.errors

        def q(name: str, fn: Callable[..., T], *args: Any) -> T | None:
            return self._optional(fn, h, *args, errors=err, name=name)

        mig = q("mig_mode", nv.nvmlDeviceGetMigMode)
        if mig is not None:
            s.mig_mode, s.mig_mode_pending = bool(mig[0]), bool(mig[1])
        s.power_limit_set_mw = q("power_limit_set", nv.nvmlDeviceGetPowerManagementLimit)
        s.power_limit_default_mw = q("power_limit_default", nv.nvmlDeviceGetPowerManagementDefaultLimit)
        graphics, memory = nv.NVML_CLOCK_GRAPHICS, nv.NVML_CLOCK_MEM
        s.app_clock_graphics_mhz = q("app_clock_graphics", nv.nvmlDeviceGetApplicationsClock, graphics)
        s.app_clock_memory_mhz = q("app_clock_memory", nv.nvmlDeviceGetApplicationsClock, memory)
        s.app_clock_graphics_default_mhz = q("app_clock_graphics_default",
                                             nv.nvmlDeviceGetDefaultApplicationsClock, graphics)
        s.app_clock_memory_default_mhz = q("app_clock_memory_default",
                                           nv.nvmlDeviceGetDefaultApplicationsClock, memory)

    def _memory(self, h: Any, err: dict[str, str]) -> tuple[int, int] | None:
        nv = self.nv
        v2 = self._optional(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2)  # used without reserved
        if v2 is not None:
            return int(v2.total), int(v2.used)
        v1 = self._optional(nv.nvmlDeviceGetMemoryInfo, h, errors=err, name="memory")
        return None if v1 is None else (int(v1.total), int(v1.used))

    def _ecc(self, s: GpuState, h: Any) -> None:
        nv, err = self.nv, s.errors
        mode = self._optional(nv.nvmlDeviceGetEccMode, h, errors=err, name="ecc_mode")
        if mode is None:
            return
        s.ecc_enabled = mode[0] == nv.NVML_FEATURE_ENABLED
        if not s.ecc_enabled:
            return
        counters = {
            "ecc_corrected_volatile": (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_uncorrected_volatile": (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_corrected_aggregate": (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            "ecc_uncorrected_aggregate": (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
        }
        for name, (kind, counter) in counters.items():
            value = self._optional(nv.nvmlDeviceGetTotalEccErrors, h, kind, counter, errors=err, name=name)
            setattr(s, name, None if value is None else int(value))

    def _memory_health(self, s: GpuState, h: Any) -> None:
        """Retired pages (up to Volta/Turing) and row remapping (Ampere and later)."""
        nv, err = self.nv, s.errors
        single = self._optional(nv.nvmlDeviceGetRetiredPages, h,
                                nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                                errors=err, name="retired_pages")
        if single is not None:
            s.retired_pages_single_bit = len(single)
            double = self._optional(nv.nvmlDeviceGetRetiredPages, h,
                                    nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                                    errors=err, name="retired_pages")
            s.retired_pages_double_bit = None if double is None else len(double)
            pending = self._optional(nv.nvmlDeviceGetRetiredPagesPendingStatus, h, errors=err,
                                     name="retired_pages_pending")
            s.retired_pages_pending = None if pending is None else bool(pending)
        rows = self._optional(nv.nvmlDeviceGetRemappedRows, h, errors=err, name="remapped_rows")
        if rows is not None:
            corr, unc, pending_rows, failure = rows
            s.remapped_rows_correctable, s.remapped_rows_uncorrectable = int(corr), int(unc)
            s.remapped_rows_pending, s.remapped_rows_failure = bool(pending_rows), bool(failure)

    def _nvlinks(self, h: Any, err: dict[str, str]) -> list[tuple[int, bool]]:
        nv = self.nv
        links: list[tuple[int, bool]] = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                active = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError as exc:
                code = _code(exc)
                if code == _GPU_IS_LOST:
                    raise _Lost from exc
                if code in _UNAVAILABLE and link == 0:
                    break  # no NVLink on this GPU
                if code not in _UNAVAILABLE and code != 2:  # 2: INVALID_ARGUMENT, past the last link
                    err[f"nvlink{link}"] = str(exc)
                continue
            links.append((link, bool(active)))
        return links


# -- short forms ---------------------------------------------------------------------------


def read_all(library: str | None = None) -> list[GpuState]:
    """Every GPU's whole state (no processes). Raises NoDriver without a driver."""
    with open_nvml(library if library is not None else library_path()) as nvml:
        return [nvml.read(i, processes=False) for i in range(nvml.count())]


def read_modes(library: str | None = None) -> tuple[list[GpuState], tuple[int, int] | None]:
    """Every GPU's whole state, and the node's confidential-computing state (environment, CC
    feature: nvmlSystemGetConfComputeState) or None where NVML has none. Raises NoDriver without
    a driver, and NvmlFailed where NVML fails to say."""
    with open_nvml(library if library is not None else library_path()) as nvml:
        states = [nvml.read(i, processes=False) for i in range(nvml.count())]
        errors: dict[str, str] = {}
        cc = nvml._optional(nvml.nv.nvmlSystemGetConfComputeState, errors=errors, name="cc")
    if errors:
        raise ToolFailed(f"NVML's confidential-computing state: {errors['cc']}")
    return states, None if cc is None else (int(cc.environment), int(cc.ccFeature))


def list_gpus(library: str | None = None) -> list[GpuSummary]:
    """Every GPU NVML enumerates, for the inventory. Raises NoDriver without a driver."""
    with open_nvml(library if library is not None else library_path()) as nvml:
        return [nvml.read(i, processes=False).summary() for i in range(nvml.count())]
