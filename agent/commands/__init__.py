"""Command handlers, one module per kind or close family of kinds.

Each module registers its handlers with ``Handler.__init_subclass__(kind=...)``. Which module
serves which kind is listed here explicitly (no entry points: they do not exist inside a
zipapp), and a module is imported the first time its kind is needed: the ramdisk runs under
software emulation in CI and on slow consoles, where every import at start-up costs ~40 times
what it does natively, and a node that only ever runs inventory.refresh never pays for the
disk or GPU code.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from agent.commands.base import Context, Handler, SelfTermination
from agent.errors import MissingDependency

__all__ = ["MODULES", "Context", "Handler", "HandlerTable", "SelfTermination", "handler_for"]

# kind -> the module whose Handler serves it.
MODULES: dict[str, str] = {
    "boot.cleanUp": "agent.commands.boot",
    "boot.kexec": "agent.commands.kexec",
    "boot.prepareRamdisk": "agent.commands.boot",
    "daemon.upgrade": "agent.commands.upgrade",
    "deploy.image": "agent.commands.deploy",
    "diag.dcgm": "agent.commands.dcgm",
    "diag.nvml": "agent.commands.gpu",
    "disk.wipe": "agent.commands.wipe",
    "driver.invoke": "agent.commands.driver",
    "gpu.reset": "agent.commands.gpu",
    "instance.snapshot": "agent.commands.snapshot",
    "inventory.refresh": "agent.commands.inventory",
    "logs.collect": "agent.commands.logs",
    "node.reboot": "agent.commands.reboot",
    "site.httpProxy": "agent.commands.proxy",
}

def handler_class(kind: str) -> type[Handler[Any]] | None:
    """The Handler class serving ``kind``, importing its module; None if no module serves it."""
    cls = Handler.registry.get(kind)
    if cls is not None or kind not in MODULES:
        return cls
    try:
        importlib.import_module(MODULES[kind])
    except ImportError as exc:
        raise MissingDependency(
            f"{kind}: its handler cannot be loaded: {exc}", module=exc.name or ""
        ) from exc
    return Handler.registry.get(kind)


def handler_for(kind: str) -> Handler[Any] | None:
    cls = handler_class(kind)
    return cls() if cls is not None else None


class HandlerTable(Mapping[str, Handler[Any]]):
    """The handlers an agent serves, by kind, each created on first use.

    Classes already registered when the table is made win over the listed modules: that is how
    test-only handlers (agent/app.py's BC_AGENT_TEST_HANDLERS) replace a kind's real handler.
    """

    def __init__(self) -> None:
        self._classes: dict[str, type[Handler[Any]]] = dict(Handler.registry)
        self._instances: dict[str, Handler[Any]] = {}
        self._lock = threading.Lock()

    def __contains__(self, kind: object) -> bool:
        return kind in self._classes or kind in MODULES

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._classes) | set(MODULES)))

    def __len__(self) -> int:
        return len(set(self._classes) | set(MODULES))

    def __getitem__(self, kind: str) -> Handler[Any]:
        with self._lock:
            handler = self._instances.get(kind)
            if handler is None:
                cls = self._classes.get(kind) or handler_class(kind)
                if cls is None:
                    raise KeyError(kind)
                handler = self._instances[kind] = cls()
            return handler
