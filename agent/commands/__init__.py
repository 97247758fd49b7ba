"""Command handlers, one module per kind or close family of kinds.

Each module registers its handlers with ``Handler.__init_subclass__(kind=...)``. Which module
serves which kind is the kind's catalog row (``Kind.handler_module``; no entry points: they do
not exist inside a zipapp), and a module is imported the first time its kind is needed: the
ramdisk runs under software emulation in CI and on slow consoles, where every import at
start-up costs ~40 times what it does natively, and a node that only ever runs
inventory.refresh never pays for the disk or GPU code.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from agent import catalog
from agent.commands.base import Context, Handler, SelfTermination
from agent.errors import MissingDependency

__all__ = ["Context", "Handler", "HandlerTable", "SelfTermination", "handler_class", "handler_for"]


def handler_class(kind: str) -> type[Handler[Any, Any]] | None:
    """The Handler class serving ``kind``, importing its module; None if the module has none."""
    cls = Handler.registry.get(kind)
    row = catalog.get(kind)
    if cls is not None or row is None:
        return cls
    try:
        importlib.import_module(row.handler_module)
    except ImportError as exc:
        raise MissingDependency(
            f"{kind}: its handler cannot be loaded: {exc}", module=exc.name or ""
        ) from exc
    return Handler.registry.get(kind)


def handler_for(kind: str) -> Handler[Any, Any] | None:
    cls = handler_class(kind)
    return cls() if cls is not None else None


class HandlerTable(Mapping[str, Handler[Any, Any]]):
    """The handlers of every kind in the catalog, each created on first use.

    Classes already registered when the table is made win over the catalog's modules: that is
    how a test entry point (tests/runtime/agent_main.py) serves real kind names with test handlers.
    """

    def __init__(self) -> None:
        self._classes: dict[str, type[Handler[Any, Any]]] = dict(Handler.registry)
        self._instances: dict[str, Handler[Any, Any]] = {}
        self._lock = threading.Lock()

    def __contains__(self, kind: object) -> bool:
        return kind in self._classes or kind in catalog.KINDS

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._classes) | set(catalog.KINDS)))

    def __len__(self) -> int:
        return len(set(self._classes) | set(catalog.KINDS))

    def __getitem__(self, kind: str) -> Handler[Any, Any]:
        with self._lock:
            handler = self._instances.get(kind)
            if handler is None:
                cls = self._classes.get(kind) or handler_class(kind)
                if cls is None:
                    raise KeyError(kind)
                handler = self._instances[kind] = cls()
            return handler
