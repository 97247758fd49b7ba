"""diag.nvml (health of every GPU through NVML) and gpu.reset (reset one GPU, then re-read it).

Both hold "gpu:<index>" for each GPU they touch, so a reset and a diagnostic of the same GPU
never overlap, and "nvml" while NVML is open in this process: an open NVML session keeps the
device files open, and nvidia-smi refuses to reset a GPU that any client holds. Every command
takes its gpu locks and "nvml" in one hold() (sorted: gpu:N before nvml), or "nvml" alone for
a moment, so no two commands wait on each other in a circle.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent import limits, proc
from agent.commands.base import Context, Handler
from agent.errors import InvalidParameters, NotFound, ProtectedDevice, ToolFailed
from agent.hw import gpu
from agent.policy import gpu_health, xid
from agent.policy.gpu_health import Level, Thresholds
from agent.proto import agent_pb2

NVML_LOCK = "nvml"
STOP_GRACE_SECONDS = 10.0
_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F-]{8,64}")   # used with fullmatch


def gpu_lock(index: int) -> str:
    return f"gpu:{index}"


def parse_gpu_ref(ref: str) -> str:
    """An index ("0") or a UUID ("GPU-..."), else InvalidParameters."""
    ref = ref.strip()
    if limits.is_digits(ref) and len(ref) <= 3:
        return str(int(ref))
    if _UUID.fullmatch(ref):
        return ref
    raise InvalidParameters(f"GPU {ref!r} is neither an index nor a UUID (GPU-...)")


# -- diag.nvml -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NvmlParams:
    gpus: tuple[str, ...]
    thresholds: Thresholds


class DiagNvml(Handler[agent_pb2.DiagNvmlRequest, NvmlParams], kind="diag.nvml"):
    kernel_log: Callable[[], list[xid.XidEvent] | None] = staticmethod(xid.since_boot)  # tests: a fake log

    def parse(self, payload: agent_pb2.DiagNvmlRequest) -> NvmlParams:
        if len(payload.gpus) > 64:
            raise InvalidParameters("at most 64 GPUs may be named")
        refs = tuple(dict.fromkeys(parse_gpu_ref(r) for r in payload.gpus))
        return NvmlParams(gpus=refs, thresholds=Thresholds.from_proto(payload.thresholds))

    def run(self, ctx: Context, params: NvmlParams) -> agent_pb2.DiagNvmlResult:
        th = params.thresholds
        result = agent_pb2.DiagNvmlResult()
        findings: list[gpu_health.Finding] = []
        states: list[gpu.GpuState] = []
        library = gpu.library_path(ctx.config.nvml_library)
        try:
            with ctx.hold(NVML_LOCK), gpu.open_nvml(library) as nvml:
                system = nvml.system()
                result.driver_present = True
                result.driver_version = system.driver_version
                result.cuda_driver_version = system.cuda_driver_version
                result.nvml_version = system.nvml_version
                count = nvml.count()
                indices: set[int] = set()
                for ref in params.gpus or tuple(str(i) for i in range(count)):
                    try:
                        indices.add(nvml.resolve(ref))
                    except NotFound as exc:
                        findings.append(gpu_health.missing(ref, exc.message))
            findings.extend(gpu_health.judge_count(count, th))
            # Locks in one call (sorted: every gpu:N before nvml), as gpu.reset and diag.dcgm take them.
            with ctx.hold(*(gpu_lock(i) for i in indices), NVML_LOCK), gpu.open_nvml(library) as nvml:
                for n, index in enumerate(sorted(indices)):
                    ctx.check()
                    states.append(nvml.read(index))
                    ctx.progress(fraction=(n + 1) / len(indices), subject=gpu_lock(index),
                                 message=f"read GPU {index} ({n + 1} of {len(indices)})")
        except gpu.NoDriver as exc:
            result.driver_present = False
            result.message = exc.message
            findings.extend(gpu_health.judge_no_driver(exc.message, th))
        for state in states:
            result.gpus.append(gpu_health.health_proto(state, th))
        events = self.kernel_log()
        result.kernel_log_read = events is not None
        result.xid_events.extend(e.to_proto() for e in events or ())
        by_address = {gpu.pci_address(s.pci_bus_id): s.index for s in states if s.pci_bus_id}
        findings.extend(gpu_health.judge_xid(events or (), lambda a: by_address.get(a, gpu_health.NODE)))
        all_findings = findings + [f for s in states for f in gpu_health.judge_gpu(s, th)]
        result.findings.extend(f.to_proto() for f in findings)
        result.verdict = gpu_health.verdict(all_findings, th).wire
        if not result.message:
            result.message = _summary(result, all_findings)
        return result


def _summary(result: agent_pb2.DiagNvmlResult, findings: list[gpu_health.Finding]) -> str:
    bad = sum(1 for g in result.gpus if g.verdict != Level.PASS.wire)
    worst = gpu_health.verdict(findings, Thresholds())
    return f"{len(result.gpus)} GPU(s) read, {bad} with findings; worst: {worst.name.lower()}"


# -- gpu.reset -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetParams:
    gpu: str
    stop_processes: bool
    thresholds: Thresholds


class GpuReset(Handler[agent_pb2.GpuResetRequest, ResetParams], kind="gpu.reset"):
    def parse(self, payload: agent_pb2.GpuResetRequest) -> ResetParams:
        if not payload.gpu:
            raise InvalidParameters("gpu.reset needs the GPU to reset (its index or UUID)")
        return ResetParams(gpu=parse_gpu_ref(payload.gpu), stop_processes=payload.stop_processes,
                           thresholds=Thresholds.from_proto(payload.thresholds))

    def run(self, ctx: Context, params: ResetParams) -> agent_pb2.GpuResetResult:
        library = gpu.library_path(ctx.config.nvml_library)
        tool = ctx.config.nvidia_smi
        with ctx.hold(NVML_LOCK), gpu.open_nvml(library) as nvml:
            index = nvml.resolve(params.gpu)
        # nvml stays held through the reset: no NVML session of this agent may hold the GPU open.
        with ctx.hold(gpu_lock(index), NVML_LOCK):
            with gpu.open_nvml(library) as nvml:
                before = nvml.read(index)
            stopped: list[gpu.GpuProcess] = []
            if before.processes:
                if not params.stop_processes:
                    listed = ", ".join(f"{p.pid} ({p.name or '?'})" for p in before.processes)
                    raise ProtectedDevice(
                        f"GPU {index} is in use by {len(before.processes)} process(es): {listed}; "
                        "stop them or send stop_processes",
                        gpu=index,
                        processes=",".join(str(p.pid) for p in before.processes),
                    )
                stopped = stop_processes(ctx, before.processes)
                with gpu.open_nvml(library) as nvml:
                    left = nvml.processes(index)
                if left:
                    raise ProtectedDevice(
                        f"GPU {index} is still in use after stopping its processes: "
                        + ", ".join(str(p.pid) for p in left),
                        gpu=index,
                    )
            ctx.progress(message=f"resetting GPU {index}", subject=gpu_lock(index))
            done = ctx.run([tool, "--gpu-reset", "-i", str(index)], check=False)
            output = (done.text + done.stderr.decode("utf-8", "replace")).strip()
            if done.returncode != 0:
                raise ToolFailed(
                    f"{tool} --gpu-reset -i {index} failed (exit {done.returncode}): "
                    + " / ".join(output.splitlines()[-3:]),
                    tool=tool, returncode=done.returncode, gpu=index,
                )
            with gpu.open_nvml(library) as nvml:
                after = nvml.read(index)
        result = agent_pb2.GpuResetResult(
            method="nvidia-smi",
            health=gpu_health.health_proto(after, params.thresholds),
            index=index,
            uuid=after.uuid or before.uuid,
            output=output[-4000:],
        )
        for p in stopped:
            result.stopped_processes.add(pid=p.pid, used_memory_bytes=p.used_memory_bytes or 0, name=p.name)
        return result


def stop_processes(ctx: Context, processes: list[gpu.GpuProcess]) -> list[gpu.GpuProcess]:
    """SIGTERM, then SIGKILL after a grace period, every process; never this agent or init."""
    protected = {0, 1, os.getpid(), os.getppid()}
    for p in processes:
        if p.pid in protected:
            raise ProtectedDevice(f"process {p.pid} ({p.name}) uses the GPU and must not be stopped: it is "
                                  "this agent, its parent or init", pid=p.pid)
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        alive = [p for p in processes if proc.alive(p.pid)]
        if not alive:
            break
        for p in alive:
            ctx.log.info("stopping GPU process %d (%s) with %s", p.pid, p.name, sig.name)
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                continue
            except PermissionError as exc:
                raise ToolFailed(f"cannot stop process {p.pid} ({p.name}): {exc.strerror}",
                                 pid=p.pid) from exc
        end = time.monotonic() + grace
        while time.monotonic() < end and any(proc.alive(p.pid) for p in alive):
            ctx.sleep(0.05)
    left = [p.pid for p in processes if proc.alive(p.pid)]
    if left:
        raise ToolFailed(f"processes {left} did not exit after SIGKILL", pids=",".join(map(str, left)))
    return list(processes)
