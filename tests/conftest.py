"""Shared test set-up. Area-specific fixtures live in the conftest.py of their folder."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.runtime.core_harness import World

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fake libnvidia-ml.so.1 of tests/fakes/nvml, compiled once per test session."""
    from tests.fakes.nvml.fakenvml import NoCompiler, build_library

    try:
        return str(build_library(tmp_path_factory.mktemp("nvml")))
    except NoCompiler as exc:
        pytest.skip(str(exc))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """In-process Agents on one state dir (tests/runtime/core_harness.py), stopped afterwards:
    used by the core tests (tests/runtime) and the lifecycle handlers' rejoin tests (tests/commands)."""
    from tests.runtime.core_harness import world_in

    yield from world_in(tmp_path)
