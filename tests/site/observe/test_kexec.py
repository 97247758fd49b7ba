"""A kexec as the site sees it: not the boot.kexec command (it goes from the gateway to the
node), only the node's console, where the ramdisk's agent says it hands over and the deployed
kernel's init speaks next, with no firmware between. The console names it (the milestone
``kexec``), the timeline makes it an attempt of its own (method ``kexec``) with its own
milestones and join, and the cause rules name a kexec'd kernel that fails.

The console lines are the ones a QEMU run of tests/e2e/test_ramdisk_lifecycle.py's kexec
logged on the node's serial line (its kernels booted ``quiet``: no "Linux version")."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.site.bmc.secrets import SecretStore
from agent.site.observe import console
from agent.site.observe.causes import Diagnosis
from agent.site.observe.console import Bmc, Ring, kexecs, milestone
from agent.site.observe.observer import Observer, ObserverSettings
from agent.site.observe.timeline import Outcome, Prepared, Step, Timelines
from tests.site.observe.test_causes import Clock, timelines

MAC = "52:54:00:00:00:01"

# The ramdisk joined, then boot.kexec: the agent's last lines and the deployed node's first.
RAMDISK = [
    "SeaBIOS (version 1.16.2-debian-1.16.2-1)",
    "iPXE initialising devices...ok",
    "bc-init [1.52]: up, kernel 6.1.0-57-cloud-amd64",
    "bc-init [1.60]: starting agent: python3 /usr/lib/bettercompute/agent.pyz run",
    "2026-12-04 02:55:28,535 INFO agent.link.session: connected to gateway reference-gateway at "
    "10.0.2.100:443 (heartbeat 5.0s, dead after 15.0s, 0 unacked results)",
]
HAND_OVER = [
    "2026-12-04 02:55:58,590 INFO agent.runtime.core: accepted boot.kexec boot.kexec-af5bf3271809 on "
    "lane control",
    "2026-12-04 02:56:00,223 INFO agent.commands.kexec: kexec image loaded with kexec_file_load; executing "
    "once the agent is quiet",
    "2026-12-04 02:56:00,245 WARNING agent.runtime.core: boot.kexec boot.kexec-af5bf3271809: ending the "
    "agent now",
    "2026-12-04 02:56:00,246 INFO agent.hw.kexec: reboot(LINUX_REBOOT_CMD_KEXEC)",
]
DEPLOYED = [
    "bc-init [3.70]: up, kernel 6.1.0-57-cloud-amd64",
    "bc-init [4.24]: module kernel/fs/efivarfs/efivarfs.ko did not load",
    "bc-init [4.51]: node root LABEL=bcroot mounted on /sysroot",
    "bc-init [4.68]: starting agent: python3 /usr/lib/bettercompute/launcher.py "
    "/usr/lib/bettercompute/agent.pyz run --config /etc/bettercompute/agent.json",
    "bc-init [5.08]: network: eth0 10.0.2.15/24",
    "2026-12-04 02:56:11,404 INFO agent.runtime.core: boot.kexec boot.kexec-af5bf3271809: rejoin marker on "
    "the kernel command line",
    "2026-12-04 02:56:11,847 INFO agent.link.session: connected to gateway reference-gateway at "
    "10.0.2.100:443 (heartbeat 5.0s, dead after 15.0s, 0 unacked results)",
]


# -- the console -------------------------------------------------------------------------------


def test_the_lines_that_announce_a_kexec() -> None:
    for line in (HAND_OVER[-1], "[  812.004512] kexec_core: Starting new kernel",
                 "[  812.0] systemd-shutdown[1]: Rebooting with kexec."):
        assert milestone(line) == Step.KEXEC, line
    for line in HAND_OVER[:-1]:
        assert milestone(line) is None, line


def test_which_lines_are_a_kexec() -> None:
    booted = {Step.FIRMWARE, Step.BOOT_LOADER, Step.INIT, Step.AGENT_STARTED, Step.JOINED}
    cases = [
        # (line, what was seen in this boot, a kexec?)
        (HAND_OVER[-1], booted, True),
        (HAND_OVER[-1], set(), True),                                   # the first line seen
        ("[  812.0] kexec_core: Starting new kernel", {Step.KEXEC}, False),  # the same hand-over
        (DEPLOYED[0], booted, True),                                    # a kexec no line announced
        (DEPLOYED[0], {Step.KEXEC}, False),                             # the announced one's kernel
        (DEPLOYED[0], {Step.FIRMWARE, Step.BOOT_LOADER}, False),        # a boot's own init
        ("[    0.000000] Linux version 6.1.0-28-cloud-amd64", {Step.PANIC}, True),   # a crash kernel
        ("[    0.000000] Linux version 6.1.0-28-cloud-amd64", {Step.FIRMWARE}, False),
        ("[    0.1] Run /init as init process", {Step.KERNEL_STARTED}, False),
        ("systemd[1]: Started bettercompute-agent.service.", booted, False),   # systemd speaks all along
    ]
    for line, seen, kexec in cases:
        assert kexecs(line, milestone(line), {str(s) for s in seen}) == kexec, (line, seen)


def session_seeing(tmp_path: Path) -> tuple[console.SolSession, list[str]]:
    seen: list[str] = []
    session = console.SolSession(
        "n1", Bmc("127.0.0.1:623", "ipmi", "rack1-n01"), Ring(tmp_path / "ring", 1 << 20),
        SecretStore(tmp_path / "secrets"), report=lambda node, step, line: seen.append(step))
    return session, seen


def test_a_kexec_is_a_new_boot_whose_milestones_are_reported_again(tmp_path: Path) -> None:
    session, seen = session_seeing(tmp_path)
    session._lines("\r\n".join(RAMDISK + HAND_OVER + DEPLOYED) + "\r\n")
    assert seen == ["firmware", "boot_loader", "init", "agent_started", "joined",
                    "kexec", "init", "agent_started", "joined"]
    assert [t for _, t in session.ring.read()] == RAMDISK + HAND_OVER + DEPLOYED


def test_a_kexec_no_line_announced_is_seen_from_the_new_kernels_first_line(tmp_path: Path) -> None:
    session, seen = session_seeing(tmp_path)
    session._lines("\r\n".join(RAMDISK + HAND_OVER[:-1] + DEPLOYED) + "\r\n")
    assert seen == ["firmware", "boot_loader", "init", "agent_started", "joined",
                    "kexec", "init", "agent_started", "joined"]


def test_a_reset_after_a_kexec_that_showed_nothing_is_a_new_boot(tmp_path: Path) -> None:
    session, seen = session_seeing(tmp_path)
    session._lines("\r\n".join(RAMDISK + HAND_OVER + RAMDISK[:2]) + "\r\n")
    assert seen == ["firmware", "boot_loader", "init", "agent_started", "joined", "kexec",
                    "firmware", "boot_loader"]


# -- the timeline and its causes ---------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tl(tmp_path: Path, clock: Clock) -> Timelines:
    return timelines(tmp_path / "timeline", clock, Diagnosis())


class Node:
    """A node's kept console (a SolSession fed its lines one by one, ``seconds`` apart) telling
    the timelines its milestones, as the observer wires them."""

    def __init__(self, tl: Timelines, clock: Clock, ring: Path) -> None:
        self.tl, self.clock = tl, clock
        self.session = console.SolSession(
            "n1", Bmc("127.0.0.1:623", "ipmi", "rack1-n01"), Ring(ring, 1 << 20), SecretStore(ring / "s"),
            report=tl.console)

    def say(self, lines: list[str], seconds: float = 1.0) -> None:
        for line in lines:
            self.clock.now += seconds
            self.session._lines(line + "\r\n")


@pytest.fixture
def node(tl: Timelines, clock: Clock, tmp_path: Path) -> Node:
    return Node(tl, clock, tmp_path / "ring")


def ramdisk_joined(node: Node) -> None:
    """A PXE boot whose ramdisk joined (its console kept), then boot.cleanUp."""
    node.tl.prepared("n1", Prepared("pxe", MAC, 4e9))
    node.tl.console("n1", Step.CONSOLE, "attached")
    node.tl.power("n1", "on")
    node.say(RAMDISK)
    node.tl.cleaned("n1")


def test_a_kexec_after_clean_up_is_an_attempt_of_its_own_that_joins(
        tl: Timelines, node: Node, tmp_path: Path) -> None:
    ramdisk_joined(node)
    node.say(HAND_OVER + DEPLOYED)
    ramdisk, kexec = tl.attempts("n1")
    assert (ramdisk.method, ramdisk.outcome, ramdisk.events[-1].step) == ("pxe", Outcome.JOINED, "cleaned")
    assert (kexec.number, kexec.method, kexec.trigger) == (2, "kexec", "kexec seen on the console")
    assert [e.step for e in kexec.events] == ["kexec", "init", "agent_started", "joined"]
    assert kexec.events[0].detail == HAND_OVER[-1]
    assert kexec.outcome == Outcome.JOINED and not kexec.cause
    # its phases for /metrics: from the kexec to the join, nothing of a power on or a fetch
    obs = Observer(ObserverSettings(tmp_path / "observe", tmp_path / "secrets"))
    assert obs.joined_phases(kexec) == {"kexec_to_join": len(DEPLOYED)}


def test_a_kexec_continues_a_next_boot_only_set_up(tl: Timelines, node: Node) -> None:
    """boot.cleanUp, bmc.boot disk (the next boot set up), then a kexec instead of the power
    cycle: the set-up attempt is the kexec's."""
    ramdisk_joined(node)
    tl.boot_device("n1", "disk")
    node.say(HAND_OVER + DEPLOYED)
    attempts = tl.attempts("n1")
    assert len(attempts) == 2
    assert (attempts[1].method, attempts[1].trigger) == ("kexec", "kexec seen on the console")
    assert [e.step for e in attempts[1].events] == ["boot_device", "kexec", "init", "agent_started", "joined"]


def test_a_kexecd_kernel_that_panics_is_named_with_its_line(tl: Timelines, node: Node) -> None:
    ramdisk_joined(node)
    panic = "[    1.9] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)"
    node.say([*HAND_OVER, panic])
    a = tl.last("n1")
    assert a is not None and a.method == "kexec"
    assert (a.outcome, a.cause) == (Outcome.FAILED, "kernel_panic")
    assert "Unable to mount root fs" in a.cause_detail
    # with panic=-1 it resets: the firmware's boot carries the kexec'd kernel's cause
    node.say(RAMDISK[:1])
    after = tl.last("n1")
    assert after is not None and after.number == 3 and after.carried
    assert after.cause == "kernel_panic" and "attempt 2" in after.cause_detail


def test_a_kexec_with_no_new_kernel_on_the_console_is_named_when_late(
        tl: Timelines, clock: Clock, node: Node) -> None:
    ramdisk_joined(node)
    node.say(HAND_OVER)
    clock.now += 119
    tl.evaluate()
    assert (tl.last("n1") or pytest.fail()).cause == ""
    clock.now += 2
    tl.evaluate()
    a = tl.last("n1")
    assert a is not None and a.cause == "kexec_no_kernel"
    assert "reboot(LINUX_REBOOT_CMD_KEXEC)" in a.cause_detail


def test_a_kexecd_kernel_that_boots_but_never_joins(tl: Timelines, clock: Clock, node: Node) -> None:
    ramdisk_joined(node)
    node.say(HAND_OVER + DEPLOYED[:4])     # its agent started, nothing more
    clock.now += 299 - 3                   # its init was 3 lines (seconds) before
    tl.evaluate()
    assert (tl.last("n1") or pytest.fail()).cause == ""
    clock.now += 2
    tl.evaluate()
    a = tl.last("n1")
    assert a is not None and a.cause == "never_joined"
    assert a.cause_detail.startswith("the kexec'd kernel booted (init at")
    assert "agent_started" in a.cause_detail


def test_a_kexecd_kernel_that_cannot_reach_its_gateway(tl: Timelines, clock: Clock, node: Node) -> None:
    ramdisk_joined(node)
    unreachable = ("2026-12-04 02:56:12,001 WARNING agent.link.session: gateway 10.0.2.100:443: [Errno 111] "
                   "Connection refused")
    node.say([*HAND_OVER, *DEPLOYED[:5], unreachable])
    clock.now += 91
    tl.evaluate()
    a = tl.last("n1")
    assert a is not None and a.method == "kexec" and a.cause == "gateway_unreachable"
