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
        raise _missing(top, exc) from exc


def missing_from(exc: ModuleNotFoundError) -> MissingDependency | None:
    """The MissingDependency an import of a module not found stands for (``exc.name``, e.g.
    ``google`` for ``from google.protobuf import ...``); None when the module is the agent's
    own, which is a bug and not a missing dependency."""
    name = exc.name or ""
    if not name or name == "agent" or name.startswith("agent."):
        return None
    top = next(
        (dep for dep in _HOW if name == dep or dep.startswith(name + ".") or name.startswith(dep + ".")),
        name.partition(".")[0],
    )
    return _missing(top, exc)


def _missing(top: str, exc: ImportError) -> MissingDependency:
    return MissingDependency(
        f"missing Python dependency {top!r} ({exc}); to get it: {_HOW.get(top, 'pip install ' + top)}",
        module=top,
    )
