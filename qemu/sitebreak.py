"""One node of ``./dev demo --nodes N`` broken on purpose (``--break WAY``), and the cause the
site names for it beside the others' success (issue 41.6; docs/site.md, "Why a node did not
come up").

    life_of = breaker(BREAKS["unregistered-mac"], say)   # what that node's thread runs
    life_of(life)                                         # a qemu/sitelife.py Lifecycle

Each way is one the site lab injects cheaply with the commands a control plane sends, so the
node's own BMC, NIC and ramdisk are the healthy nodes' ones:

- ``unregistered-mac``: the node's PXE entry is made, then removed (boot.cleanUp) before the
  node is powered on: the proxy DHCP ignores its request; named ``not_registered`` at once.
- ``bad-cmdline``: its entry's kernel command line names no init (``rdinit=/nonexistent``):
  the kernel panics; named ``kernel_panic`` from the kept console, with the panic's line.

The node is powered off (forced) once the site has named a cause (or after ``CAUSE_TIMEOUT``), so it
does not boot again and again beside the others. A break never fails the demo: a cause not
named, or another than the one expected, is said.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

CAUSE_TIMEOUT = 300.0     # how long the demo waits for the site to name the broken node's cause
POLL_SECONDS = 5.0


@dataclass(frozen=True)
class Break:
    name: str            # the --break value
    cause: str           # the cause the site should name (agent/site/observe/causes.py)
    how: str             # what is done to the node, for a person
    cmdline_extra: str = ""
    unregister: bool = False


BREAKS = {b.name: b for b in (
    Break("unregistered-mac", "not_registered",
          "its PXE entry removed (boot.cleanUp) before power on: the proxy DHCP ignores its MAC",
          unregister=True),
    Break("bad-cmdline", "kernel_panic",
          "its entry's kernel command line names no init (rdinit=/nonexistent): the kernel panics",
          cmdline_extra="rdinit=/nonexistent"),
)}


class Life(Protocol):
    """What a broken node's run needs of qemu/sitelife.py's Lifecycle (a fake in the tests)."""

    node: Any

    def query(self) -> None: ...
    def prepare_ramdisk(self, cmdline_extra: str = "") -> None: ...
    def boot_device(self, device: str) -> None: ...
    def power_on(self) -> None: ...
    def site(self, kind: str, payload: dict[str, Any]) -> Any: ...
    def bmc_op(self, kind: str, operation: str, **parameters: str) -> Any: ...


def cause_of(result: Any, node_id: str) -> tuple[str, str]:
    """(cause, detail) of ``node_id``'s last attempt in a site's inventory.refresh result;
    ("", "") while none is named."""
    for boot in getattr(result, "node_boots", ()):
        if boot.node_id == node_id:
            return boot.cause, boot.cause_detail
    return "", ""


def breaker(brk: Break, say: Callable[[str], None], *, timeout: float = CAUSE_TIMEOUT,
            poll: float = POLL_SECONDS,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> Callable[[Life], str]:
    """The broken node's run: set up as ``brk`` says, powered on, the site asked (its
    inventory.refresh, as a control plane would) until it names a cause; then powered off.
    Returns the cause named ("" for none)."""

    def run(life: Life) -> str:
        name = life.node.name
        say(f"{name}: BROKEN on purpose ({brk.name}): {brk.how}")
        life.query()
        life.prepare_ramdisk(brk.cmdline_extra)
        if brk.unregister:
            life.site("boot.cleanUp", {"node_id": name})
        life.boot_device("pxe")
        life.power_on()
        started = clock()
        cause, detail, after = "", "", 0.0
        try:
            while not cause and clock() - started < timeout:
                sleep(poll)
                cause, detail = cause_of(life.site("inventory.refresh", {"skip_gpus": True}), name)
                after = clock() - started
        finally:   # forced: the broken node has no system to shut down gracefully
            life.bmc_op("bmc.power", "off", graceful_timeout_seconds="0")
        if not cause:
            say(f"{name}: the site named no cause within {timeout:.0f}s (expected {brk.cause}); powered off")
        else:
            verdict = "as expected" if cause == brk.cause else f"expected {brk.cause}"
            say(f"{name}: CAUSE named by the site, seen {after:.0f}s after power on: {cause} "
                f"({verdict}): {detail}; powered off")
        return cause

    return run
