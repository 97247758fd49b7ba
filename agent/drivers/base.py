"""What a driver is: a vendor tool, its operations, and each operation's typed arguments.

The wire (``DriverInvokeRequest``) names a driver, an operation and a map of typed values. It
never carries a command line: ``Operation.argv`` builds one from values that ``validate``
has checked against the operation's signature (type, choices, pattern, bounds). A string
value can never start with "-", so it can never be read by the tool as an option.

A driver with no tool (``tool=""``) does its operations in the agent itself, through the hw
layer: each operation's ``local(values, root, settings)`` acts on the machine under ``root``
("/", or a test's tree), with the agent's settings (``Config.tpm``, the TPM the setting ``bc.tpm`` names),
and returns its report as text (the efivars driver: UEFI variables).

A driver registers itself by calling ``register(Driver(...))`` at import time; its module is
imported explicitly by agent/drivers/__init__.py (no entry points inside a zipapp).
"""

from __future__ import annotations

import enum
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import Config
from agent.errors import InvalidParameters, ToolMissing

Value = str | int | bool
Values = Mapping[str, Value]
Settings = Config                            # the agent's settings (e.g. ``tpm``, the setting bc.tpm)


class ArgType(enum.StrEnum):
    STRING = "string"
    INT = "int"
    BOOL = "bool"


# Conservative default for strings: names, devices, keys; never an option, never a space.
SAFE_STRING = r"[A-Za-z0-9_.:/@+=,-]{1,128}"


@dataclass(frozen=True)
class Arg:
    name: str
    type: ArgType
    help: str = ""
    required: bool = True
    default: Value | None = None
    choices: tuple[str, ...] = ()            # STRING: the only values allowed
    pattern: str = SAFE_STRING               # STRING: must match in full (when no choices)
    minimum: int | None = None               # INT bounds, inclusive
    maximum: int | None = None

    def check(self, value: Value) -> Value:
        """The value if it fits this argument, else InvalidParameters saying why."""
        if self.type is ArgType.BOOL:
            if not isinstance(value, bool):
                raise InvalidParameters(f"argument {self.name!r} must be a bool", argument=self.name)
            return value
        if self.type is ArgType.INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidParameters(f"argument {self.name!r} must be an int", argument=self.name)
            if self.minimum is not None and value < self.minimum:
                raise InvalidParameters(
                    f"argument {self.name!r} must be >= {self.minimum} (got {value})", argument=self.name
                )
            if self.maximum is not None and value > self.maximum:
                raise InvalidParameters(
                    f"argument {self.name!r} must be <= {self.maximum} (got {value})", argument=self.name
                )
            return value
        if not isinstance(value, str):
            raise InvalidParameters(f"argument {self.name!r} must be a string", argument=self.name)
        if self.choices:
            if value not in self.choices:
                raise InvalidParameters(
                    f"argument {self.name!r} must be one of {', '.join(self.choices)} (got {value!r})",
                    argument=self.name,
                )
            return value
        if value.startswith("-") or not re.fullmatch(self.pattern, value):
            raise InvalidParameters(
                f"argument {self.name!r} does not match {self.pattern} (got {value!r})", argument=self.name
            )
        return value


@dataclass(frozen=True)
class Operation:
    name: str
    help: str
    build: Callable[[Values], list[str]]     # argv after the tool name, from checked values
    args: tuple[Arg, ...] = ()
    changes_state: bool = False              # documentation: a write, not a query
    local: Callable[[Values, Path, Settings], str] | None = None   # in-process drivers: the work

    def validate(self, given: Values) -> dict[str, Value]:
        """Checked values for every argument (defaults filled in); InvalidParameters otherwise."""
        known = {a.name: a for a in self.args}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise InvalidParameters(
                f"operation {self.name!r} takes no argument {', '.join(map(repr, unknown))}"
                f" (it takes: {', '.join(known) or 'none'})",
                operation=self.name,
            )
        values: dict[str, Value] = {}
        for arg in self.args:
            if arg.name in given:
                values[arg.name] = arg.check(given[arg.name])
            elif arg.default is not None:
                values[arg.name] = arg.default
            elif arg.required:
                raise InvalidParameters(
                    f"operation {self.name!r} needs argument {arg.name!r} ({arg.type})", argument=arg.name
                )
        return values


@dataclass(frozen=True)
class Driver:
    name: str
    tool: str                                # executable looked up on PATH
    description: str
    install_hint: str                        # e.g. "apt install ethtool"
    operations: dict[str, Operation] = field(default_factory=dict)

    def operation(self, name: str) -> Operation:
        op = self.operations.get(name)
        if op is None:
            raise InvalidParameters(
                f"driver {self.name!r} has no operation {name!r}"
                f" (it has: {', '.join(sorted(self.operations))})",
                driver=self.name,
                operation=name,
            )
        return op

    @property
    def in_process(self) -> bool:
        return not self.tool

    def executable(self) -> str:
        """Absolute path of the tool, or ToolMissing with what to install."""
        if self.in_process:
            return f"({self.name})"            # what the result's argv shows for in-process work
        path = shutil.which(self.tool)
        if path is None:
            raise ToolMissing(
                f"driver {self.name!r} needs {self.tool!r}, which is not installed on this machine"
                f" ({self.install_hint})",
                driver=self.name,
                tool=self.tool,
            )
        return path

    def argv(self, operation: str, given: Values) -> list[str]:
        """The full command line for ``operation`` (tool path first), from checked values."""
        op = self.operation(operation)
        values = op.validate(given)
        return [self.executable(), *op.build(values)]


REGISTRY: dict[str, Driver] = {}


def register(driver: Driver) -> Driver:
    if driver.name in REGISTRY:
        raise ValueError(f"driver {driver.name!r} registered twice")
    REGISTRY[driver.name] = driver
    return driver


def get(name: str) -> Driver:
    driver = REGISTRY.get(name)
    if driver is None:
        raise InvalidParameters(
            f"no driver {name!r} in this agent (it has: {', '.join(sorted(REGISTRY))})", driver=name
        )
    return driver
