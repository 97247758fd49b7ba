"""driver.invoke: run one operation of a registered driver (a vendor tool) with typed arguments.

The request never carries a command line. ``parse`` finds the driver and the operation,
checks every argument against the operation's signature and builds the argv tail from the
checked values; ``run`` finds the tool (ToolMissing when it is not installed), runs it
through ``ctx.run`` (the deadline or a cancel kills its whole process group) and returns its
exit status and output, capped. An in-process driver's operation (efivars) runs in the agent
on the machine under ``root``; what it reports is its stdout, and a failure raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from agent import drivers
from agent.commands.base import Context, Handler
from agent.errors import InvalidParameters
from agent.hw import system
from agent.proto import agent_pb2

# Output kept per stream; the tail is dropped (a tool's first lines say what it did).
OUTPUT_CAP_BYTES = 1024 * 1024


@dataclass(frozen=True)
class DriverParams:
    driver: str
    operation: str
    tail: tuple[str, ...]                    # argv after the tool, built from checked values
    values: dict[str, drivers.base.Value] = field(default_factory=dict)


def _value(arg: agent_pb2.DriverArgument) -> drivers.base.Value:
    which = arg.WhichOneof("value")
    if which is None:
        raise InvalidParameters("a driver argument has no value set")
    value: drivers.base.Value = getattr(arg, which)
    return value


class DriverInvoke(Handler[agent_pb2.DriverInvokeRequest, DriverParams], kind="driver.invoke"):
    root: Path = system.ROOT                 # in-process drivers act on the machine here; tests: a tree

    def parse(self, payload: agent_pb2.DriverInvokeRequest) -> DriverParams:
        if not payload.driver:
            raise InvalidParameters("driver.invoke: 'driver' is required")
        if not payload.operation:
            raise InvalidParameters("driver.invoke: 'operation' is required")
        driver = drivers.get(payload.driver)
        op = driver.operation(payload.operation)
        values = op.validate({name: _value(arg) for name, arg in payload.arguments.items()})
        return DriverParams(driver.name, op.name, tuple(op.build(values)), values)

    def run(self, ctx: Context, params: DriverParams) -> agent_pb2.DriverInvokeResult:
        driver = drivers.get(params.driver)
        argv = [driver.executable(), *params.tail]
        ctx.log.info("driver %s.%s: %s", params.driver, params.operation, argv)
        started = time.monotonic()
        local = driver.operation(params.operation).local
        if local is not None:
            report = local(params.values, self.root, ctx.config).encode()
            return agent_pb2.DriverInvokeResult(driver=params.driver, operation=params.operation,
                                                argv=argv, stdout=report, seconds=time.monotonic() - started)
        # Only the cap is ever held in memory: the rest of a chatty tool's output is read and dropped.
        done = ctx.run(argv, check=False, max_output=OUTPUT_CAP_BYTES)
        truncated = done.dropped > 0 or max(len(done.stdout), len(done.stderr)) > OUTPUT_CAP_BYTES
        return agent_pb2.DriverInvokeResult(
            driver=params.driver,
            operation=params.operation,
            argv=list(done.argv),
            exit_code=done.returncode,
            stdout=done.stdout[:OUTPUT_CAP_BYTES],
            stderr=done.stderr[:OUTPUT_CAP_BYTES],
            truncated=truncated,
            seconds=time.monotonic() - started,
        )
