"""diag.dcgm: DCGM's active diagnostics (`dcgmi diag -r 1..4 -j`), judged like diag.nvml.

dcgmi connects to a running nv-hostengine, or starts an embedded host engine itself. When
neither works, the agent starts its own `nv-hostengine -n` on a private Unix socket for the
run, points dcgmi at it with --host unix://..., and stops it afterwards. The run holds
"gpu:<index>" for every GPU it covers; at the deadline dcgmi's whole process group is
killed and the command reports a timeout.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent import limits, proc
from agent.commands.base import Context, Handler
from agent.commands.gpu import NVML_LOCK, gpu_lock
from agent.errors import InvalidParameters, MissingDependency, ToolFailed, ToolMissing
from agent.hw import dcgm, gpu
from agent.policy import gpu_health
from agent.policy.gpu_health import Thresholds
from agent.proto import agent_pb2

HOSTENGINE_START_SECONDS = 30.0
RAW_JSON_LIMIT = 4 * 1024 * 1024
PROGRESS_SECONDS = 10.0
# Rough length of a run per level on an 8-GPU node, for the progress estimate only.
EXPECTED_SECONDS = {1: 90.0, 2: 300.0, 3: 1800.0, 4: 5400.0}


@dataclass(frozen=True)
class DcgmParams:
    level: int
    gpus: tuple[int, ...]
    parameters: dict[str, str]
    thresholds: Thresholds


class DiagDcgm(Handler[agent_pb2.DiagDcgmRequest, DcgmParams], kind="diag.dcgm"):
    def parse(self, payload: agent_pb2.DiagDcgmRequest) -> DcgmParams:
        level = payload.level or 1  # unset: the quick level
        if level not in (1, 2, 3, 4):
            raise InvalidParameters(f"DCGM diagnostic level {payload.level} is not 1 to 4")
        gpus: set[int] = set()
        for ref in payload.gpus:
            ref = ref.strip()
            if not (limits.is_digits(ref) and len(ref) <= 3):
                raise InvalidParameters(f"diag.dcgm takes GPU indices, not {ref!r}")
            gpus.add(int(ref))
        return DcgmParams(level=level, gpus=tuple(sorted(gpus)),
                          parameters=dcgm.check_parameters(dict(payload.parameters)),
                          thresholds=Thresholds.from_proto(payload.thresholds))

    def run(self, ctx: Context, params: DcgmParams) -> agent_pb2.DiagDcgmResult:
        dcgmi = ctx.config.dcgmi
        hostengine = ctx.config.nv_hostengine
        covered = params.gpus or tuple(range(_gpu_count(ctx)))
        started = False
        with ctx.hold(*(gpu_lock(i) for i in covered)):
            ctx.progress(message=f"dcgmi diag -r {params.level}", fraction=0.0)
            argv = dcgm.diag_argv(dcgmi, params.level, params.gpus, params.parameters)
            done = _diag(ctx, argv, params.level)
            if done.returncode != 0 and dcgm.connection_failed(_output(done)):
                ctx.log.info("no DCGM host engine: starting %s for this run", hostengine)
                with _host_engine(ctx, hostengine) as host:
                    started = True
                    done = _diag(ctx, [*argv, "--host", host], params.level)
        if done.returncode != 0 and dcgm.connection_failed(_output(done)):
            raise ToolFailed("dcgmi cannot reach a DCGM host engine: " + _tail(done), tool=dcgmi,
                             returncode=done.returncode)
        try:
            report = dcgm.parse(done.text)
        except dcgm.DcgmOutputError as exc:
            if done.returncode != 0:
                raise ToolFailed(f"dcgmi diag failed (exit {done.returncode}): {_tail(done)}", tool=dcgmi,
                                 returncode=done.returncode) from exc
            raise
        findings = gpu_health.judge_dcgm(report.tests, level=params.level, exit_code=done.returncode,
                                         gpus_seen=len(report.gpus), whole_node=not params.gpus,
                                         th=params.thresholds)
        result = agent_pb2.DiagDcgmResult(
            dcgm_version=report.dcgm_version,
            level=params.level,
            verdict=gpu_health.verdict(findings, params.thresholds).wire,
            findings=[f.to_proto() for f in findings],
            raw_json=done.text[:RAW_JSON_LIMIT],
            exit_code=done.returncode,
            json_format=report.json_format,
            gpus=report.gpus,
            hostengine_started=started,
        )
        for t in report.tests:
            result.tests.add(name=t.name, category=t.category, gpu_index=t.gpu_index, status=t.status,
                             info=t.info, warnings=t.warnings, error_codes=t.error_codes)
        return result


def _output(done: proc.Completed) -> str:
    return done.text + "\n" + done.stderr.decode("utf-8", "replace")


def _tail(done: proc.Completed) -> str:
    lines = [line.strip() for line in _output(done).strip().splitlines() if line.strip()]
    return " / ".join(lines[-3:]) or "no output"


def _diag(ctx: Context, argv: list[str], level: int) -> proc.Completed:
    """Run dcgmi (bounded by the command's deadline), reporting progress while it runs."""
    box: dict[str, proc.Completed | BaseException] = {}

    def work() -> None:
        try:
            box["done"] = ctx.run(argv, check=False)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=work, name="dcgmi", daemon=True)
    started = time.monotonic()
    worker.start()
    expected = EXPECTED_SECONDS[level]
    while True:
        worker.join(PROGRESS_SECONDS)
        if not worker.is_alive():
            break
        elapsed = time.monotonic() - started
        ctx.progress(message=f"dcgmi diag -r {level}: running for {elapsed:.0f}s (about {expected:.0f}s)",
                     fraction=min(0.99, elapsed / expected), eta_seconds=max(0.0, expected - elapsed))
    error = box.get("error")
    if isinstance(error, ToolMissing):
        raise ToolMissing(f"DCGM is not installed on this machine ({argv[0]} not found)",
                          tool=argv[0]) from error
    if isinstance(error, BaseException):
        raise error
    done = box["done"]
    assert isinstance(done, proc.Completed)
    return done


def _gpu_count(ctx: Context) -> int:
    """How many GPUs NVML sees, for the locks of a whole-node run (0 when it cannot tell)."""
    try:
        with ctx.hold(NVML_LOCK), gpu.open_nvml(gpu.library_path(ctx.config.nvml_library)) as nvml:
            return nvml.count()
    except (gpu.NoDriver, MissingDependency) as exc:
        ctx.log.info("cannot count GPUs through NVML (%s); DCGM will say", exc)
        return 0


@contextlib.contextmanager
def _host_engine(ctx: Context, tool: str) -> Iterator[str]:
    """Run `nv-hostengine -n` on a private Unix socket; yield dcgmi's --host for it."""
    workdir = Path(tempfile.mkdtemp(prefix="bc-dcgm-"))
    socket_path = workdir / "nv-hostengine.sock"
    argv = [tool, "-n", "-d", str(socket_path), "--pid", str(workdir / "nv-hostengine.pid"),
            "-f", str(workdir / "nv-hostengine.log")]
    started = False
    try:
        with ctx.running(argv, stdout=subprocess.DEVNULL) as child:
            started = True
            give_up = time.monotonic() + min(HOSTENGINE_START_SECONDS, ctx.remaining())
            while not socket_path.exists():
                if (returncode := child.poll()) is not None:
                    raise ToolFailed(f"no DCGM host engine is running and {tool} could not start "
                                     f"({proc.describe_exit(returncode)}): "
                                     f"{child.stderr_text() or 'no output'}", tool=tool)
                if time.monotonic() >= give_up:
                    raise ToolFailed(f"{tool} did not open its socket within {HOSTENGINE_START_SECONDS:g}s",
                                     tool=tool)
                ctx.sleep(0.05)
            yield f"unix://{socket_path}"
            child.stop()  # it serves until here: its exit is ours, not checked
    except ToolMissing as exc:
        if started:  # dcgmi's, from the body: the caller says what it means
            raise
        raise ToolFailed("no DCGM host engine is running, dcgmi cannot start an embedded one, and "
                         f"{tool} is not installed", tool=tool) from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
