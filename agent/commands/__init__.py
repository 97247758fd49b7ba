"""Command handlers, one module per kind or close family of kinds.

Each module registers its handlers with ``Handler.__init_subclass__(kind=...)``. They are
imported here explicitly (no entry points: they do not exist inside a zipapp).
"""

from agent.commands.base import Context, Handler, SelfTermination, handler_for

__all__ = ["Context", "Handler", "SelfTermination", "handler_for"]

# Handler modules (import for their registration side effect), one line each:
from agent.commands import (
    dcgm,  # noqa: F401
    deploy,  # noqa: F401
    driver,  # noqa: F401
    gpu,  # noqa: F401
    inventory,  # noqa: F401
    kexec,  # noqa: F401
    logs,  # noqa: F401
    reboot,  # noqa: F401
    snapshot,  # noqa: F401
    upgrade,  # noqa: F401
    wipe,  # noqa: F401
)
