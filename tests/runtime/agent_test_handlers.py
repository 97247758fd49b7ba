"""TEST-ONLY handlers for real kind names, registered by the test entry point tests/runtime/agent_main.py.

They do no real work. What each command does is read from ``$BC_TEST_DIR/spec/<command id>.json``
(all keys optional; default: sleep 0.05 s):

    sleep      seconds to sleep (cancellable)
    hold       a file name: wait until $BC_TEST_DIR/<hold> exists (cancellable)
    child      true: start `sleep 3600` as a child (pid in $BC_TEST_DIR/child-<id>.pid), then
               wait until cancelled; the runtime must kill it
    stuck      true: ignore cancellation entirely (a handler that never returns)
    spin       seconds of busy Python work in the handler thread (holds the GIL; benchmarks)
    burn       true: run `sha256sum /dev/zero` as a child until the hold file appears (CPU load)
    exit       boot.kexec only: end the agent (os._exit) as a self-terminating action
    fail       a reason code: raise an AgentError with it
    progress   how many progress reports to send
    log        how many log lines to write through ctx.log

If $BC_TEST_DIR/boot_id exists, the agent reads its boot id from there (a "new boot" for the
self-terminating tests). Every start and every end is appended (O_APPEND, fsync) to
$BC_TEST_DIR/executions.log as ``start <id> <kind> <pid>`` / ``end <id>``, so a test can count
how often a command ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

import agent.runtime.core
from agent import schema
from agent.commands.base import Context, Handler, SelfTermination
from agent.errors import AgentError, Reason

TEST_DIR = Path(os.environ.get("BC_TEST_DIR", "/nonexistent"))


def record(line: str) -> None:
    fd = os.open(TEST_DIR / "executions.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def spec_for(command_id: str) -> dict[str, Any]:
    path = TEST_DIR / "spec" / f"{command_id}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError:
        return {"sleep": 0.05}


class _TestHandler(Handler[Message, Message]):
    def parse(self, payload: Message) -> Message:
        return payload

    def run(self, ctx: Context, params: Message) -> Message:
        spec = spec_for(ctx.command_id)
        record(f"start {ctx.command_id} {ctx.kind.name} {os.getpid()}")
        steps = int(spec.get("progress", 0))
        for i in range(steps):
            ctx.progress(done=i + 1, total=steps, message=f"step {i + 1}")
        for i in range(int(spec.get("log", 0))):
            ctx.log.info("test handler line %d of %s", i + 1, ctx.command_id)
        if spec.get("sleep"):
            ctx.sleep(float(spec["sleep"]))
        if spec.get("spin"):
            end = time.monotonic() + float(spec["spin"])
            n = 0
            while time.monotonic() < end:
                n += sum(i * i for i in range(2000))
                ctx.check()
        with contextlib.ExitStack() as burning:
            if spec.get("burn"):
                burner = burning.enter_context(
                    ctx.running(["sha256sum", "/dev/zero"], stdout=subprocess.DEVNULL))
                burning.callback(burner.stop)      # when the hold file appears
            if spec.get("hold"):
                flag = TEST_DIR / str(spec["hold"])
                while not flag.exists():
                    ctx.sleep(0.02)
        if spec.get("child"):
            with ctx.running(["sleep", "3600"]) as child:
                (TEST_DIR / f"child-{ctx.command_id}.pid").write_text(str(child.popen.pid))
                while True:
                    ctx.sleep(0.05)
        if spec.get("stuck"):
            while True:
                time.sleep(0.05)
        if spec.get("fail"):
            raise AgentError(f"test handler failed as asked ({spec['fail']})", reason=Reason(spec["fail"]))
        record(f"end {ctx.command_id}")
        return schema.result_class(ctx.kind.name)()


class TestKexec(_TestHandler, kind="boot.kexec"):
    """Self-terminating: the action ends the agent process, as a kexec would."""

    def run(self, ctx: Context, params: Message) -> Message | SelfTermination:  # type: ignore[override]
        spec = spec_for(ctx.command_id)
        record(f"start {ctx.command_id} {ctx.kind.name} {os.getpid()}")
        if spec.get("fail"):
            raise AgentError("kexec refused as asked", reason=Reason(spec["fail"]))

        def action() -> None:
            record(f"end {ctx.command_id}")
            os._exit(0)

        return SelfTermination(proof={}, action=action, result=schema.result_class(ctx.kind.name)())


_boot_file = TEST_DIR / "boot_id"
if _boot_file.exists():
    _boot = _boot_file.read_text().strip()
    agent.runtime.core.read_boot_id = lambda *a, **k: _boot  # type: ignore[assignment]


# One test handler class per real kind the runtime tests use (control, provision and bulk lanes;
# retry-safe and not; attested; destructive).
KINDS = (
    "inventory.refresh", "diag.nvml", "diag.dcgm", "deploy.image", "disk.wipe", "driver.invoke",
    "logs.collect", "gpu.reset", "instance.snapshot",
)
for _kind in KINDS:
    type(f"Test_{_kind.replace('.', '_')}", (_TestHandler,), {}, kind=_kind)

print(f"agent_test_handlers: serving {', '.join(KINDS)} with TEST handlers", file=sys.stderr)
