"""Heavy or native imports, done where they are used, with a one-line error when missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from agent.errors import MissingDependency

_HOW = {
    "cryptography": "pip install cryptography, apt install python3-cryptography python3-cffi-backend,"
    " or run the agent as the zipapp built by build/zipapp.py (it carries it)",
    "google.protobuf": "pip install protobuf, apt install python3-protobuf,"
    " or run the zipapp built by build/zipapp.py",
    "pynvml": "pip install pynvml, or run the zipapp built by build/zipapp.py",
}


def need(module: str) -> ModuleType:
    """Import ``module`` or raise MissingDependency naming it and how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = next((name for name in _HOW if module == name or module.startswith(name + ".")), module)
        raise MissingDependency(
            f"missing Python dependency {top!r} ({exc}); to get it: {_HOW.get(top, 'pip install ' + top)}",
            module=top,
        ) from exc
