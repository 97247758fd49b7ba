"""Shared test set-up. Area-specific fixtures live in the conftest.py of their folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
