"""Build the fake libnvidia-ml.so.1 (fake_nvml.c) and describe the machine it serves.

``build_library(dir)`` compiles fake_nvml.c with gcc into ``dir/libnvidia-ml.so.1``.
``FakeMachine`` writes the JSON the library reads (named by FAKE_NVML_CONFIG) at every
nvmlInit: ``FakeMachine(path, count=8, model="H100")``, then ``machine.set(3, lost="query")``.
GPU fields: see gpu_from_json() in fake_nvml.c.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
FAKE_NVIDIA_SMI = HERE.parent / "nvidia-smi"
CONFIG_ENV = "FAKE_NVML_CONFIG"


class NoCompiler(RuntimeError):
    pass


def build_library(directory: Path) -> Path:
    """Compile the fake into ``directory``/libnvidia-ml.so.1 and return its path."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise NoCompiler("no C compiler (gcc) on this machine")
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "libnvidia-ml.so.1"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE),
         "-lpthread"],
        check=True,
        capture_output=True,
    )
    return out


class FakeMachine:
    """The JSON description of the fake machine, written on every change."""

    def __init__(self, path: Path, count: int = 8, model: str = "H100", **machine: Any) -> None:
        self.path = path
        self.machine: dict[str, Any] = dict(machine)
        self.machine["gpus"] = [{"model": model} for _ in range(count)]
        self.write()

    @property
    def gpus(self) -> list[dict[str, Any]]:
        gpus: list[dict[str, Any]] = self.machine["gpus"]
        return gpus

    def set(self, index: int, **fields: Any) -> FakeMachine:
        self.gpus[index].update(fields)
        return self.write()

    def update(self, **machine: Any) -> FakeMachine:
        self.machine.update(machine)
        return self.write()

    def write(self) -> FakeMachine:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.machine, indent=1))
        os.replace(tmp, self.path)
        return self

    def read(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data
