"""``./dev demo --nodes N --break WAY`` without QEMU: the commands each way sends for the
broken node (qemu/sitebreak.py, against a fake Lifecycle that records them), the site's answer
read until it names a cause, the node powered off whatever happens, and the option's checks
(qemu/demo.py)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from agent.proto import agent_pb2
from qemu import demo
from qemu.sitebreak import BREAKS, breaker, cause_of

NODE = "demo-node-3"


class FakeLife:
    """A Lifecycle's steps recorded; the site's inventory.refresh answers from ``answers``."""

    def __init__(self, answers: list[tuple[str, str]]) -> None:
        self.node = types.SimpleNamespace(name=NODE)
        self.calls: list[tuple[str, Any]] = []
        self.answers = answers

    def query(self) -> None:
        self.calls.append(("bmc.query", None))

    def prepare_ramdisk(self, cmdline_extra: str = "") -> None:
        self.calls.append(("boot.prepareRamdisk", cmdline_extra))

    def boot_device(self, device: str) -> None:
        self.calls.append(("bmc.boot", device))

    def power_on(self) -> None:
        self.calls.append(("bmc.power", "on"))

    def site(self, kind: str, payload: dict[str, Any]) -> Any:
        self.calls.append((kind, payload))
        if kind != "inventory.refresh":
            return None
        cause, detail = self.answers.pop(0) if self.answers else ("", "")
        boots = [agent_pb2.NodeBoot(node_id="demo-node-1", outcome="joined"),
                 agent_pb2.NodeBoot(node_id=NODE, cause=cause, cause_detail=detail)]
        return agent_pb2.InventoryRefreshResult(node_boots=boots)

    def bmc_op(self, kind: str, operation: str, **parameters: str) -> Any:
        self.calls.append((kind, operation))
        self.parameters = parameters


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(way: str, answers: list[tuple[str, str]], timeout: float = 300.0) -> tuple[str, FakeLife, list[str]]:
    said: list[str] = []
    life, clock = FakeLife(answers), Clock()
    cause = breaker(BREAKS[way], said.append, timeout=timeout, clock=clock, sleep=clock.sleep)(life)
    return cause, life, said


def test_an_unregistered_mac_is_prepared_then_removed_before_the_power_on() -> None:
    cause, life, said = run("unregistered-mac", [("", ""), ("not_registered", "the MAC has no boot entry")])
    assert cause == "not_registered"
    assert [c[0] for c in life.calls] == ["bmc.query", "boot.prepareRamdisk", "boot.cleanUp", "bmc.boot",
                                         "bmc.power", "inventory.refresh", "inventory.refresh", "bmc.power"]
    assert life.calls[1] == ("boot.prepareRamdisk", "")
    assert life.calls[2] == ("boot.cleanUp", {"node_id": NODE})
    assert life.calls[3] == ("bmc.boot", "pxe") and life.calls[-1] == ("bmc.power", "off")
    assert life.parameters == {"graceful_timeout_seconds": "0"}   # nothing to shut down gracefully
    assert "seen 10s after power on: not_registered (as expected): the MAC has no boot entry" in said[-1]


def test_a_bad_command_line_names_no_init_and_keeps_the_entry() -> None:
    cause, life, _ = run("bad-cmdline", [("kernel_panic", "Kernel panic - not syncing: VFS")])
    assert cause == "kernel_panic"
    assert ("boot.prepareRamdisk", "rdinit=/nonexistent") in life.calls
    assert not [c for c in life.calls if c[0] == "boot.cleanUp"]
    assert life.calls[-1] == ("bmc.power", "off")


def test_another_cause_or_none_is_said_not_raised() -> None:
    cause, _, said = run("bad-cmdline", [("never_joined", "no console")])
    assert cause == "never_joined" and "expected kernel_panic" in said[-1]
    cause, life, said = run("unregistered-mac", [], timeout=20)
    assert cause == "" and "named no cause within 20s" in said[-1]
    assert life.calls[-1] == ("bmc.power", "off")
    assert len([c for c in life.calls if c[0] == "inventory.refresh"]) == 4   # every 5 s for 20 s


def test_the_node_is_powered_off_when_the_site_cannot_be_asked() -> None:
    life = FakeLife([])

    def failing(kind: str, payload: dict[str, Any]) -> Any:
        life.calls.append((kind, payload))
        raise RuntimeError("the site did not answer")

    life.site = failing  # type: ignore[method-assign]  # the site failing
    clock = Clock()
    with pytest.raises(RuntimeError):
        breaker(BREAKS["bad-cmdline"], print, clock=clock, sleep=clock.sleep)(life)
    assert life.calls[-1] == ("bmc.power", "off")


def test_cause_of_reads_the_node_s_last_attempt() -> None:
    result = agent_pb2.InventoryRefreshResult(node_boots=[
        agent_pb2.NodeBoot(node_id="a", cause="no_kernel", cause_detail="d")])
    assert cause_of(result, "a") == ("no_kernel", "d")
    assert cause_of(result, "b") == ("", "")


@pytest.mark.parametrize("argv", [
    ["--break", "bad-cmdline"],                               # one node: nothing beside it
    ["--nodes", "3", "--break", "bad-cmdline", "--user-net"],
    ["--nodes", "3", "--break", "unregistered-mac", "--virtual-media"],
    ["--nodes", "3", "--break", "no-such-way"],
])
def test_the_option_is_refused_where_it_cannot_apply(argv: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        demo.main(argv)
    assert ended.value.code == 2
    assert "--break" in capsys.readouterr().err
