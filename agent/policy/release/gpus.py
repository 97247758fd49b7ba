"""The release gate's GPU area: every GPU at its defaults (clocks, persistence, ECC, MIG ...)."""

from __future__ import annotations

from agent.hw.gpu import pci_address
from agent.policy.release.findings import Found, invoke
from agent.policy.release.state import ExpectedState, Observed


def check_gpus(e: ExpectedState, seen: Observed, out: Found) -> None:
    if seen.gpus is None:
        out.add("gpu.unreadable", "NVML", "unreadable", "",
                f"the GPUs' state cannot be read: {seen.unread.get('gpus', 'no NVML')}")
        return
    for g in seen.gpus:
        where = pci_address(g.pci_bus_id) if g.pci_bus_id else str(g.index)
        if g.lost or g.errors:
            out.add("gpu.unreadable", "readable", "lost" if g.lost else "errors", where,
                    f"GPU {where} cannot be read: {'lost' if g.lost else '; '.join(g.errors.values())}")
            continue
        reset = invoke("nvidia-smi", "reset", gpu=g.index)
        if e.gpu_persistence_mode is not None and g.persistence_mode not in (None, e.gpu_persistence_mode):
            out.add("gpu.persistence_mode", e.gpu_persistence_mode, g.persistence_mode, where,
                    f"GPU {where}: persistence mode {'on' if g.persistence_mode else 'off'}",
                    invoke("nvidia-smi", "set_persistence_mode", gpu=g.index, enabled=e.gpu_persistence_mode))
        if not e.gpus_at_defaults:
            continue
        if g.mig_mode or g.mig_mode_pending:
            # Set off first; once only the current mode is on, a reset takes the pending "off" up.
            out.add("gpu.mig_mode", "off", f"current {'on' if g.mig_mode else 'off'}, pending "
                    f"{'on' if g.mig_mode_pending else 'off'}", where, f"GPU {where} is in MIG mode",
                    reset if not g.mig_mode_pending else
                    invoke("nvidia-smi", "set_mig_mode", gpu=g.index, enabled=False))
        default = g.power_limit_default_mw
        if default and g.power_limit_set_mw is not None and g.power_limit_set_mw != default:
            watts = default // 1000         # nvidia-smi -pl takes whole watts, 50-2000 (the driver's Arg)
            out.add("gpu.power_limit", f"{watts} W", f"{g.power_limit_set_mw // 1000} W", where,
                    f"GPU {where}: power limit {g.power_limit_set_mw // 1000} W, its default {watts} W",
                    invoke("nvidia-smi", "set_power_limit", gpu=g.index, watts=watts)
                    if 50 <= watts <= 2000 else None)
        clocks = (g.app_clock_graphics_mhz, g.app_clock_memory_mhz)
        defaults = (g.app_clock_graphics_default_mhz, g.app_clock_memory_default_mhz)
        if None not in clocks and None not in defaults and clocks != defaults:
            want, have = "{}/{} MHz".format(*defaults), "{}/{} MHz".format(*clocks)
            out.add("gpu.app_clocks", want, have, where,
                    f"GPU {where}: application clocks (graphics/memory) {have}, defaults {want}",
                    invoke("nvidia-smi", "reset_application_clocks", gpu=g.index))
        if g.retired_pages_pending:
            out.add("gpu.retired_pending", False, True, where,
                    f"GPU {where}: a page retirement waits for a reset", reset)
        if g.remapped_rows_pending:
            out.add("gpu.remap_pending", False, True, where,
                    f"GPU {where}: a row remap waits for a reset", reset)
        if g.remapped_rows_failure:
            out.add("gpu.remap_failure", False, True, where,
                    f"GPU {where}: a row remap failed; the GPU needs service")
        volatile = (g.ecc_corrected_volatile or 0) + (g.ecc_uncorrected_volatile or 0)
        if volatile:
            out.add("gpu.ecc_volatile", 0, volatile, where,
                    f"GPU {where}: {volatile} volatile ECC error(s) since its last reset", reset)
