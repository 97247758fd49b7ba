"""The kept console against a real BMC: OpenIPMI's ipmi_sim serving Serial-over-LAN from a
scripted serial port (a TCP server standing for the node's ttyS0, which ipmi_sim connects to as
it would to QEMU's), through real ``ipmitool sol activate`` sessions supervised by the site.

The ring (bounds, time ranges, a restart's append) is tested on its own first."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.observe import console
from agent.site.observe.console import Bmc, Ring, clean, milestone, payload_holder, starts_boot
from agent.site.observe.observer import Observer, ObserverSettings
from agent.site.observe.timeline import Prepared, Step
from qemu.ipmisim import IpmiSim, start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from tests.site.observe.observing import consoles_of, kept, power_on, steps, wait_for
from tests.site.observe.test_kexec import DEPLOYED, HAND_OVER, RAMDISK
from tests.site.test_site_agent import ArgvWatcher

USERNAME, PASSWORD, REF = "bcadmin", "Sol-Pass-7hq2Wm", "rack1-n01"
MAC = "52:54:00:00:00:01"


# -- the ring and the milestones, on their own --------------------------------------------------


def test_ring_is_bounded_and_read_by_time(tmp_path: Path) -> None:
    ring = Ring(tmp_path / "n1", 8192)
    for i in range(2000):
        ring.append(1000.0 + i, f"line {i:04d} " + "x" * 40)
    assert ring.bytes() <= 8192
    lines = ring.read()
    assert lines[-1] == (2999.0, "line 1999 " + "x" * 40)
    numbers = [int(text.split()[1]) for _, text in lines]
    assert numbers == sorted(numbers) and numbers == list(range(numbers[0], 2000))   # nothing lost within
    window = ring.read(since=2990.0, until=2995.0)
    assert [t for t, _ in window] == [2990.0 + i for i in range(6)]
    # a window from a line's own moment holds it, finer than the millisecond the ring keeps (the
    # fault matrix's boot loop once showed no lines of the attempt its first line began)
    fine = Ring(tmp_path / "n2", 8192)
    fine.append(2999.0, "the attempt before's last line")
    fine.append(3000.0007, "the attempt's first line")
    assert fine.read(since=3000.0007) == [(3000.0, "the attempt's first line")]
    assert fine.read(until=2999.9995) == [(2999.0, "the attempt before's last line")]
    # a restart appends where it was
    again = Ring(tmp_path / "n1", 8192)
    again.append(5000.0, "after the restart")
    assert again.read()[-1] == (5000.0, "after the restart") and again.read()[-2] == lines[-1]


def test_lines_are_cleaned_and_milestones_named() -> None:
    assert clean("\x1b[2J\x1b[1;1HSeaBIOS (version 1.16.2)\r") == "SeaBIOS (version 1.16.2)"
    # OVMF's screen mode, before its first line
    assert clean("\x1b[=3h\x1b[=3hBdsDxe: failed to load Boot0002") == "BdsDxe: failed to load Boot0002"
    # the kernel prints its command line: the node's enrollment token never reaches the ring
    assert clean("[    0.0] Command line: console=ttyS0 bc.token=Zq8-secret bc.gateway=gw:443") == \
        "[    0.0] Command line: console=ttyS0 bc.token=[REDACTED] bc.gateway=gw:443"
    cases = {
        "SeaBIOS (version 1.16.2-debian-1.16.2-1)": Step.FIRMWARE,
        "iPXE initialising devices...": Step.BOOT_LOADER,
        "[    0.000000] Linux version 6.1.0-28-cloud-amd64 (debian-kernel@lists)": Step.KERNEL_STARTED,
        "bc-init [1.52]: up, kernel 6.1.0-28-cloud-amd64": Step.INIT,
        "bc-init [1.60]: starting agent: python3 /usr/lib/bettercompute/agent.pyz run": Step.AGENT_STARTED,
        "2026-12-03 18:00:01,123 INFO agent.link.session: connected to gateway gw-1 at 10.0.2.2:7443 "
        "(heartbeat 5.0s, dead after 15.0s, 0 unacked results)": Step.JOINED,
        "2026-12-03 18:00:01,123 WARNING agent.link.session: gateway 10.0.2.2:7443: [Errno 111] "
        "Connection refused": Step.GATEWAY_UNREACHABLE,
        "2026-12-03 18:00:01,123 INFO agent.link.session: gateway 10.0.2.2:7443: [Errno 101] Network "
        "is unreachable: the network is not up yet": Step.NO_NETWORK,
        "[    2.1] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block": Step.PANIC,
        "Boot failed: not a bootable disk": Step.NO_BOOT_DEVICE,
        'BdsDxe: failed to load Boot0001 "UEFI Misc Device" from PciRoot(0x0)/Pci(0x3,0x0): Not Found':
            Step.NO_BOOT_DEVICE,                         # OVMF, an empty disk
        'BdsDxe: failed to load Boot0001 "UEFI PXEv4 (MAC:525400FA0002)" from PciRoot(0x0)/Pci(0x2,0x0)'
        "/MAC(525400FA0002,0x1)/IPv4(0.0.0.0,0x0,DHCP,0.0.0.0,0.0.0.0,0.0.0.0): Access Denied":
            Step.SECURE_BOOT_DENIED,
        'BdsDxe: loading Boot0002 "EFI Internal Shell" from Fv(7CB8BDC9-F8EB-4F34-AAEA-3EE4AF6516A1)':
            Step.FIRMWARE,
        "nothing here": None,
    }
    for line, step in cases.items():
        assert milestone(line) == step, line


# -- a real BMC serving SOL ----------------------------------------------------------------------


class SerialPort:
    """The node's serial port as a TCP server (what QEMU's -serial tcp:...,server is): ipmi_sim
    connects to it; ``say`` writes lines to whoever is connected."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(4)
        self.port = self.server.getsockname()[1]
        self.conn: socket.socket | None = None
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conn = conn
            self.connected.set()

    def say(self, *lines: str) -> None:
        assert self.conn is not None
        for line in lines:
            self.conn.sendall(line.encode() + b"\r\n")

    def close(self) -> None:
        self.server.close()
        if self.conn is not None:
            self.conn.close()


def _tools() -> None:
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openipmi ipmitool)")


@pytest.fixture
def serial() -> Iterator[SerialPort]:
    port = SerialPort()
    yield port
    port.close()


def make_sim(tmp_path: Path, name: str, sol: str) -> IpmiSim:
    node = PoweredNode(tmp_path / f"{name}-node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    return start_ipmi_sim(tmp_path / name, node, USERNAME, PASSWORD, sol=sol)


@pytest.fixture
def sol_sim(tmp_path: Path, serial: SerialPort) -> Iterator[IpmiSim]:
    _tools()
    sim = make_sim(tmp_path, "bmc", f"tcp:127.0.0.1:{serial.port}")
    yield sim
    sim.stop()


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(USERNAME, PASSWORD))
    return store.root


def make_observer(tmp_path: Path, secrets_dir: Path, **settings: int) -> Observer:
    obs = Observer(ObserverSettings(tmp_path / "observe", secrets_dir, **settings))  # type: ignore[arg-type]
    obs.start()
    return obs


def test_a_reset_before_any_kernel_is_a_new_boot_for_the_milestones(tmp_path: Path) -> None:
    """A node reset after its firmware found no boot device (bmc.power reset of an empty disk,
    the QEMU fault matrix) boots again: its milestones are reported again, so the new attempt
    is named from its own lines."""
    seen: list[str] = []
    session = console.SolSession(
        "n1", Bmc("127.0.0.1:623", "ipmi", REF), Ring(tmp_path / "ring", 1 << 20),
        SecretStore(tmp_path / "secrets"), report=lambda node, step, line: seen.append(step))
    boot = ("SeaBIOS (version 1.16.2)\r\nBooting from Hard Disk...\r\n"
            "Boot failed: not a bootable disk\r\nBooting from DVD/CD...\r\nNo bootable device.\r\n")
    session._lines(boot)
    session._lines(boot)
    assert seen == ["firmware", "boot_loader", "no_boot_device"] * 2


def test_ovmfs_failed_load_of_an_empty_disk_is_one_boot(tmp_path: Path) -> None:
    """x86 OVMF's first serial line is BdsDxe's failed load of an empty disk, then its shell's:
    one boot (firmware, no boot device), not a reboot after the failure (its shell's line is the
    firmware's too). Seen in tests/e2e/test_site_ipmi_off.py, which first named a second attempt
    "reboot seen on the console" here. A real reset after it is still a new boot."""
    seen: list[str] = []
    session = console.SolSession(
        "n1", Bmc("127.0.0.1:623", "ipmi", REF), Ring(tmp_path / "ring", 1 << 20),
        SecretStore(tmp_path / "secrets"), report=lambda node, step, line: seen.append(step))
    session._lines('\x1b[=3h\x1b[=3hBdsDxe: failed to load Boot0002 "UEFI Misc Device" from '
                   'PciRoot(0x0)/Pci(0x3,0x0): Not Found\r\n'
                   'BdsDxe: loading Boot0004 "EFI Internal Shell" from Fv(7CB8BDC9-F8EB)/FvFile(7C04A583)\r\n'
                   "UEFI Interactive Shell v2.2\r\nEDK II\r\nShell> \r\n")
    assert seen == ["firmware", "no_boot_device"]
    session._lines("UEFI firmware (version  built at 13:10:49 on Nov  5 2024)\r\n")   # a reset
    assert seen == ["firmware", "no_boot_device", "firmware"]


def test_a_session_failing_on_the_sites_own_fault_says_failed(tmp_path: Path) -> None:
    """A fault of the site's own in a session (here a transport whose session raises what no
    BMC answer makes) is said ``failed`` with what it was, in the ring and the timeline: not a
    dead thread whose console still says attached."""
    seen: list[str] = []

    class Broken(console.SolSession):
        def _session(self, creds: Credentials) -> str:
            raise ValueError("filedescriptor out of range in select()")

    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(USERNAME, PASSWORD))
    session = Broken("n1", Bmc("127.0.0.1:623", "ipmi", REF), Ring(tmp_path / "ring", 1 << 20),
                     store, report=lambda node, step, line: seen.append(line))
    session.start()
    session._thread.join(10)
    assert session.state == "failed" and not session.alive
    assert seen == ["failed: the site's console session failed: ValueError: filedescriptor out of "
                    "range in select()"], seen


def session_seeing(tmp_path: Path, *, resumed: bool = False) -> tuple[console.SolSession, list[str]]:
    """A session whose milestones are collected (as "step" or "step: line"), fed by ``_lines``."""
    seen: list[str] = []
    session = console.SolSession(
        "n1", Bmc("127.0.0.1:623", "ipmi", REF), Ring(tmp_path / "ring", 1 << 20),
        SecretStore(tmp_path / "secrets"), resumed=resumed,
        report=lambda node, step, line: seen.append(step))
    return session, seen


def test_a_power_cycle_of_a_kept_console_reports_the_next_boots_milestones(tmp_path: Path) -> None:
    """A console kept across a power cycle whose firmware lines the BMC never sent (its session
    was reconnecting): told the boot begins (bmc.power's before_power), the next boot's
    agent and join are reported again, not taken for the last boot's."""
    session, seen = session_seeing(tmp_path)
    joined = ("bc-init [1.60]: starting agent: python3 /usr/lib/bettercompute/agent.pyz run\r\n"
              "INFO agent.link.session: connected to gateway gw-1 at 10.0.2.2:7443\r\n")
    session._lines("SeaBIOS (version 1.16.2)\r\n" + joined)
    session._lines(joined)                 # the same boot's words again: nothing new
    session.boot_begins()
    session._lines(joined)                 # the next boot, its firmware's lines lost
    assert seen == ["firmware", "agent_started", "joined", "agent_started", "joined"], seen


# A ramdisk booted ``quiet loglevel=4``, as the QEMU tests' consoles show it: no "Linux version".
QUIET_PANIC = ("SeaBIOS (version 1.16.2-debian-1.16.2-1)\r\nBooting from ROM...\r\n"
               "iPXE initialising devices...ok\r\n"
               "iPXE 1.0.0+git-20190125.36a4c85-5.1 -- Open Source Network Boot Firmware -- http\r\n"
               "bc-init [1.52]: up, kernel 6.1.0-28-cloud-amd64\r\n"
               "[    2.1] Kernel panic - not syncing: Attempted to kill init!\r\n")


def test_a_quiet_kernels_reboot_is_a_new_boot_from_the_firmwares_banner(tmp_path: Path) -> None:
    """The demo's panicking node rebooted three times in one attempt: its kernel, booted quiet,
    never printed "Linux version". The firmware's banner starts each boot; its milestones are
    reported again."""
    session, seen = session_seeing(tmp_path)
    for _ in range(3):
        session._lines(QUIET_PANIC)
    assert seen == ["firmware", "boot_loader", "init", "panic"] * 3


def test_a_line_that_begins_a_boot_is_in_its_attempts_window(tmp_path: Path) -> None:
    """The line a milestone is reported for is stamped in the ring no earlier than the report:
    a reboot loop whose attempt held only the line that began it (the node powered off at once)
    read back no lines when the ring's stamp came a few milliseconds before the timeline's
    clock. The ring's hand-on (the console store's append) is slow on purpose here (5 ms, as a
    loaded site's can be)."""
    ring = Ring(tmp_path / "ring", 1 << 20, also=lambda t, line: time.sleep(0.005))
    reported: list[float] = []
    session = console.SolSession("n1", Bmc("127.0.0.1:623", "ipmi", REF), ring,
                                 SecretStore(tmp_path / "secrets"),
                                 report=lambda node, step, line: reported.append(time.time()))
    session._lines("bc-fault-matrix: rebootinSeaBIOS (version 1.16.2-debian-1.16.2-1)\r\n")
    assert reported, "the firmware's banner is a milestone"
    assert [text for _, text in ring.read(since=reported[0])] == [
        "bc-fault-matrix: rebootinSeaBIOS (version 1.16.2-debian-1.16.2-1)"]


def test_which_lines_start_a_boot() -> None:
    kernel = {Step.FIRMWARE, Step.BOOT_LOADER, Step.INIT}
    early = {Step.FIRMWARE, Step.BOOT_LOADER}
    banner_ipxe = "iPXE 1.21.1+ (g1d1cf74a) -- Open Source Network Boot Firmware -- https://ipxe.org"
    cases = [
        # (line, what was seen in this boot, a new boot?)
        ("SeaBIOS (version 1.16.2-debian-1.16.2-1)", early, True),      # a reset in iPXE
        ("SeaBIOS (version 1.16.2-debian-1.16.2-1)", set(), False),     # the first boot seen
        ("UEFI firmware (version  built at 13:10:49 on Nov  5 2024)", {Step.NO_BOOT_DEVICE}, True),  # AAVMF
        ('BdsDxe: loading Boot0001 "UEFI PXEv4 (MAC:525400FA0002)"', kernel, True),   # x86 OVMF
        ('BdsDxe: loading Boot0002 "UEFI QEMU HARDDISK"', early, False),  # the next boot option
        (banner_ipxe, {Step.AGENT_STARTED}, True),                      # a firmware silent on serial
        (banner_ipxe, early, False),                                    # iPXE chaining iPXE
        ("iPXE initialising devices...ok", {Step.PANIC}, True),
        ("[    0.000000] Linux version 6.1.0", early, False),
    ]
    for line, seen, new in cases:
        assert starts_boot(line, milestone(line), {str(s) for s in seen}) == new, (line, seen)


def test_ipxes_banner_after_a_kernel_reports_the_firmware_first(tmp_path: Path) -> None:
    """A machine whose firmware writes nothing to the serial port: iPXE's banner after the
    agent started is the new boot's first line, reported as its firmware (what the timeline
    splits attempts on) and its boot loader."""
    session, seen = session_seeing(tmp_path)
    session._lines("iPXE initialising devices...ok\r\nbc-init [1.60]: starting agent: x\r\n"
                   "iPXE initialising devices...ok\r\n")
    assert seen == ["boot_loader", "agent_started", "firmware", "boot_loader"]


def test_a_resumed_console_takes_no_firmware_line_of_a_boot_under_way_for_a_new_one(tmp_path: Path) -> None:
    """After a daemon restart the node is somewhere in a boot: OVMF trying its next boot option
    is no new boot; the next banner is."""
    session, seen = session_seeing(tmp_path, resumed=True)
    session._lines('BdsDxe: loading Boot0002 "UEFI QEMU HARDDISK"\r\nBooting `Debian GNU/Linux\r\n'
                   "SeaBIOS (version 1.16.2)\r\n")
    assert seen == ["boot_loader", "firmware"]


def test_the_sol_holder_is_read_from_ipmitools_raw_answer() -> None:
    # Get Payload Instance Info: session ID (least significant byte first), port, 7 reserved
    assert payload_holder(" 02 01 00 00 01 00 00 00 00 00 00 00\n") == 0x102
    assert payload_holder(" 00 00 00 00 01 00 00 00 00 00 00 00\n") == 0
    assert payload_holder("RAW REQ (channel=0x0 netfn=0x6 lun=0x0 cmd=0x4b data_len=2)\n"
                          " 9a 7f 00 c0 01 00 00 00\n 00 00 00 00\n") == 0xc0007f9a
    assert payload_holder("") is None and payload_holder(" 00 01\n") is None


def test_a_line_cut_by_a_drop_is_kept_apart_from_the_next_sessions_mark(tmp_path: Path) -> None:
    """A session that ends mid-line (ipmi_sim's keepalive drop, seen in the QEMU fault matrix:
    ">>Start PXE over IPv6.[SOL Session operational..." kept as one line, the attach missed):
    the cut line is kept alone, the next session's mark says attached, ipmitool's own answer
    to the site's "~." is no console line."""
    states: list[str] = []
    ring = Ring(tmp_path / "ring", 1 << 20)
    session = console.SolSession(
        "n1", Bmc("127.0.0.1:623", "ipmi", REF), ring, SecretStore(tmp_path / "secrets"),
        report=lambda node, step, line: states.append(line) if step == Step.CONSOLE else None)
    session._lines("[SOL Session operational.  Use ~? for help]\r\n>>Start PXE over IPv6.")
    session._ended()
    session._say("dropped", "the session ended")
    session._lines("[SOL Session operational.  Use ~? for help]\r\nSeaBIOS (version 1.16.2)\r\n")
    session._lines("~. [terminated ipmitool]\r\n")
    kept = [text for _, text in ring.read()]
    assert kept == ["[site: console attached]", ">>Start PXE over IPv6.",
                    "[site: console dropped: the session ended]", "[site: console attached]",
                    "SeaBIOS (version 1.16.2)"], kept
    assert states == ["attached", "dropped: the session ended", "attached"]


def test_a_console_kept_from_power_on_with_its_milestones(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    obs = make_observer(tmp_path, secrets_dir)
    bmc = Bmc(sol_sim.address, "ipmi", REF)
    try:
        with ArgvWatcher() as argv:
            obs.prepared("n1", Prepared("pxe", MAC, time.time() + 3600))
            power_on(obs, "n1", bmc)
            wait_for("the SOL session", lambda: obs.consoles.state("n1") == "attached")
            wait_for("the serial port", serial.connected.is_set)
            serial.say("SeaBIOS (version 1.16.2)", "iPXE initialising devices...",
                       "[    0.000000] Linux version 6.1.0-28-cloud-amd64",
                       "[    2.1] Kernel panic - not syncing: VFS: Unable to mount root fs")
            wait_for("the panic", lambda: "panic" in steps(obs))
        assert steps(obs) == ["prepared", "console", "power_on", "firmware", "boot_loader",
                              "kernel_started", "panic"]
        obs.tick()
        a = obs.timelines.last("n1")
        assert a is not None and a.cause == "kernel_panic"
        assert "[    2.1] Kernel panic - not syncing: VFS: Unable to mount root fs" in kept(obs)
        assert kept(obs)[0].startswith("[site: console attached")
        for cmdline in argv.seen.values():
            assert PASSWORD.encode() not in cmdline
        # boot.cleanUp keeps it (the node's next boot is its too); letting it go ends the
        # session at the BMC: another can take it
        obs.cleaned("n1")
        assert obs.consoles.state("n1") == "attached"
        obs.consoles.detach("n1")
        assert obs.consoles.state("n1") == "not kept"
        taken = sol_sim.ipmitool("sol", "info")
        assert taken.returncode == 0
        assert "released" in consoles_of(obs)
    finally:
        obs.stop()


def joined_ramdisk(obs: Observer, bmc: Bmc, serial: SerialPort) -> None:
    """A PXE attempt whose ramdisk joined, its console kept from power on, then boot.cleanUp."""
    obs.prepared("n1", Prepared("pxe", MAC, time.time() + 3600))
    power_on(obs, "n1", bmc)
    wait_for("the SOL session", lambda: obs.consoles.state("n1") == "attached")
    wait_for("the serial port", serial.connected.is_set)
    serial.say(*RAMDISK)
    wait_for("the join", lambda: "joined" in steps(obs))
    obs.cleaned("n1")


def test_a_console_kept_across_clean_up_and_a_kexec_with_nothing_lost(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """boot.cleanUp of a node whose ramdisk joined keeps its console: the kexec into the
    deployed system that comes next is kept line for line, an attempt of its own (method
    kexec), and the console stays attached after its join."""
    obs = make_observer(tmp_path, secrets_dir)
    try:
        joined_ramdisk(obs, Bmc(sol_sim.address, "ipmi", REF), serial)
        obs.tick()
        assert obs.consoles.state("n1") == "attached"
        serial.say(*HAND_OVER, *DEPLOYED)
        wait_for("the kexec's join", lambda: len(obs.timelines.attempts("n1")) == 2
                 and "joined" in steps(obs))
        ramdisk, kexec = obs.timelines.attempts("n1")
        assert (ramdisk.method, ramdisk.outcome, ramdisk.events[-1].step) == ("pxe", "joined", "cleaned")
        assert (kexec.method, kexec.outcome) == ("kexec", "joined")
        assert kexec.trigger == "kexec seen on the console"
        assert [e.step for e in kexec.events] == ["kexec", "init", "agent_started", "joined"]
        assert obs.consoles.state("n1") == "attached"
        assert [t for t in kept(obs) if not t.startswith("[site: ")] == RAMDISK + HAND_OVER + DEPLOYED
    finally:
        obs.stop()


def test_a_sol_console_stays_across_power_off_and_on(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """bmc.power off and on again of a node whose ramdisk joined: one SOL session all along,
    what the node writes between kept (the SSH transport's case: test_sshconsole.py)."""
    obs = make_observer(tmp_path, secrets_dir)
    bmc = Bmc(sol_sim.address, "ipmi", REF)
    try:
        joined_ramdisk(obs, bmc, serial)
        session = obs.consoles._sessions["n1"]
        obs.bmc_done("n1", bmc, "bmc.power", "off")
        serial.say("after the power off")
        wait_for("the line", lambda: "after the power off" in kept(obs))
        power_on(obs, "n1", bmc)
        assert obs.consoles._sessions["n1"] is session and session.connects == 1
        assert obs.consoles.state("n1") == "attached" and "released" not in consoles_of(obs)
    finally:
        obs.stop()


def test_a_console_attached_while_its_last_session_ends_is_attached(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """A kexec'd node joins (its console let go, on a thread of its own) and the next command
    is a power cycle (the console attached again) at once: ipmi_sim has ended the old session
    (``~.``) before the new ipmitool activates, so the new one is attached, not busy for 30 s
    while the node's firmware speaks."""
    obs = make_observer(tmp_path, secrets_dir)
    bmc = Bmc(sol_sim.address, "ipmi", REF)
    try:
        for _ in range(3):
            obs.bmc_done("n1", bmc, "bmc.power", "on")
            wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
            threading.Thread(target=obs.consoles.detach, args=("n1",), daemon=True).start()
            time.sleep(0.05)                     # the old session taken out, still ending
            power_on(obs, "n1", bmc)
            wait_for("attached again", lambda: obs.consoles.state("n1") in ("attached", "busy"), 15)
            assert obs.consoles.state("n1") == "attached", consoles_of(obs)
            obs.consoles.detach("n1")
    finally:
        obs.stop()


def test_bmc_commands_run_beside_a_kept_console(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """A console holds no BMC lock and no IPMI session slot: bmc.power status and bmc.query on
    the node go through while its SOL session is up, and it stays up."""
    from agent.catalog import Role
    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.config import Config
    from agent.proto import site_pb2

    obs = make_observer(tmp_path, secrets_dir)
    try:
        power_on(obs, "n1", Bmc(sol_sim.address, "ipmi", REF))
        wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
        config = Config(role=Role.SITE, state_dir=tmp_path / "state", secrets_dir=secrets_dir,
                        ipmi_max_sessions=1)
        for kind, operation in (("bmc.power", "status"), ("bmc.query", "query")):
            handler = handler_for(kind)
            assert handler is not None
            params = handler.parse(site_pb2.BmcOperationRequest(
                node_id="n1", bmc_address=sol_sim.address, protocol="ipmi", operation=operation,
                credentials_ref=REF))
            result = handler.run(Context.local(kind, config, timeout=60), params)
            assert isinstance(result, site_pb2.BmcOperationResult) and result.power_state
        assert obs.consoles.state("n1") == "attached"
        wait_for("the serial port", serial.connected.is_set)
        serial.say("still here")
        wait_for("the line", lambda: "still here" in kept(obs))
    finally:
        obs.stop()


def test_busy_when_another_session_holds_sol_then_attached(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "BUSY_RETRY", 1.0)
    env = proc.clean_env({"IPMI_PASSWORD": PASSWORD})
    host, port = sol_sim.address.split(":")
    other = ["ipmitool", "-I", "lanplus", "-H", host, "-p", port, "-U", USERNAME, "-E", "-C", "3",
             "sol", "activate"]
    obs = make_observer(tmp_path, secrets_dir)
    try:
        with proc.running(other, stdin=subprocess.PIPE, env=env, check=False) as holder:
            time.sleep(2)      # the other session is up
            obs.bmc_done("n1", Bmc(sol_sim.address, "ipmi", REF), "bmc.power", "on")
            wait_for("busy", lambda: obs.consoles.state("n1") == "busy")
            assert any(c.startswith("busy") for c in consoles_of(obs))
            assert holder.popen.stdin is not None
            holder.popen.stdin.write(b"\r~.")       # the other one leaves
            holder.popen.stdin.flush()
            wait_for("the holder's exit", lambda: holder.poll() is not None, 10)
        wait_for("attached after the other left", lambda: obs.consoles.state("n1") == "attached")
    finally:
        obs.stop()


@pytest.mark.slow
def test_a_session_the_bmc_drops_is_reconnected(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """The BMC ends the SOL session (another client's ``sol deactivate``), the IPMI session
    left open: nothing comes and ipmitool's keepalive does not notice. After LIVENESS_SILENCE
    (15 s) without a byte the site asks the BMC who holds the SOL: nobody; it says so and
    reconnects."""
    obs = make_observer(tmp_path, secrets_dir)
    try:
        obs.bmc_done("n1", Bmc(sol_sim.address, "ipmi", REF), "bmc.power", "on")
        wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
        assert sol_sim.ipmitool("sol", "deactivate").returncode == 0
        wait_for("dropped", lambda: obs.consoles.state("n1") == "dropped", 60)
        wait_for("attached again", lambda: obs.consoles.state("n1") == "attached", 30)
        wait_for("the serial port", serial.connected.is_set)
        serial.say("after the drop")
        wait_for("the line", lambda: "after the drop" in kept(obs))
        said = consoles_of(obs)
        assert said[0] == "attached" and said[1].startswith("dropped") and said[2] == "attached", said
    finally:
        obs.stop()


@pytest.mark.slow
def test_a_console_kept_past_the_bmcs_session_timer_loses_nothing(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """A node writing a numbered line every second for 50 s: every line in the ring, in order,
    one session throughout. (With ``sol activate usesolkeepalive`` ipmi_sim closed the IPMI
    session 30 s after the activation, its inactivity timer renewed by IPMI messages only, and
    the lines from then until ipmitool gave up, about 42 s, and the site reconnected were lost:
    50 s holds that whole window, past the timer that ipmitool's keepalive every 15 s renews.)"""
    obs = make_observer(tmp_path, secrets_dir)
    count = 50
    try:
        obs.bmc_done("n1", Bmc(sol_sim.address, "ipmi", REF), "bmc.power", "on")
        wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
        wait_for("the serial port", serial.connected.is_set)
        start = time.monotonic()
        for i in range(count):
            time.sleep(max(0.0, start + i - time.monotonic()))
            serial.say(f"node line {i:03d}")
        last = f"node line {count - 1:03d}"
        wait_for("the last line", lambda: last in kept(obs), 20)
        lines = [t for t in kept(obs) if t.startswith("node line ")]
        assert lines == [f"node line {i:03d}" for i in range(count)], \
            sorted(set(f"node line {i:03d}" for i in range(count)) - set(lines))
        assert consoles_of(obs) == ["attached"], consoles_of(obs)
    finally:
        obs.stop()


def test_a_session_given_to_another_client_is_left_and_said_busy(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another client deactivates the site's SOL session and activates its own: the site's
    next question finds another holder than its own, stops its ipmitool without ``~.`` (whose
    deactivate would end the other's session), and says busy; the other client's session is
    never ended."""
    monkeypatch.setattr(console, "LIVENESS_SILENCE", 2.0)
    monkeypatch.setattr(console, "BUSY_RETRY", 1.0)
    env = proc.clean_env({"IPMI_PASSWORD": PASSWORD})
    host, port = sol_sim.address.split(":")
    other = ["ipmitool", "-I", "lanplus", "-H", host, "-p", port, "-U", USERNAME, "-E", "-C", "3",
             "sol", "activate"]
    obs = make_observer(tmp_path, secrets_dir)
    try:
        obs.bmc_done("n1", Bmc(sol_sim.address, "ipmi", REF), "bmc.power", "on")
        wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
        session = obs.consoles._sessions["n1"]
        wait_for("the holder seen", lambda: session._holder is not None, 20)
        # the next question comes after the other client holds the SOL, not in between (where
        # it would find nobody and take the SOL back first)
        monkeypatch.setattr(console, "LIVENESS_SILENCE", 8.0)
        assert sol_sim.ipmitool("sol", "deactivate").returncode == 0
        with proc.running(other, stdin=subprocess.PIPE, env=env, check=False) as holder:
            wait_for("busy", lambda: obs.consoles.state("n1") == "busy", 30)
            said = consoles_of(obs)
            assert any(c.startswith("busy: another session took the node's SOL") for c in said), said
            time.sleep(2)
            assert holder.poll() is None           # the other client's session goes on
            wait_for("the serial port", serial.connected.is_set)
            assert holder.popen.stdin is not None
            holder.popen.stdin.write(b"\r~.")
            holder.popen.stdin.flush()
            wait_for("the holder's exit", lambda: holder.poll() is not None, 10)
        wait_for("attached after the other left", lambda: obs.consoles.state("n1") == "attached", 30)
    finally:
        obs.stop()


def test_a_console_taken_while_the_node_talks_is_busy_not_the_other_clients(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy boot is never silent for LIVENESS_SILENCE before its join, so the site's own
    SOL session is recorded when it activates, not learned at a first silence: a client that
    takes the console mid-boot (``sol deactivate``, then its own ``sol activate``) is told from
    it, and the site says busy at the silence that follows, never ``attached`` with the other
    client's session taken for its own. (Before: the first holder seen after 15 s of silence was
    taken for the site's, the stealer, and the console said attached throughout.)"""
    monkeypatch.setattr(console, "BUSY_RETRY", 60.0)
    env = proc.clean_env({"IPMI_PASSWORD": PASSWORD})
    host, port = sol_sim.address.split(":")
    other = ["ipmitool", "-I", "lanplus", "-H", host, "-p", port, "-U", USERNAME, "-E", "-C", "3",
             "sol", "activate"]
    talking = threading.Event()

    def talk() -> None:          # the node's boot: a line every half second
        i = 0
        while talking.is_set():
            with contextlib.suppress(OSError, AssertionError):
                serial.say(f"boot line {i}")
            i += 1
            time.sleep(0.5)

    obs = make_observer(tmp_path, secrets_dir)
    try:
        obs.bmc_done("n1", Bmc(sol_sim.address, "ipmi", REF), "bmc.power", "on")
        wait_for("the serial port", serial.connected.is_set)
        talking.set()
        threading.Thread(target=talk, daemon=True).start()
        wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
        wait_for("lines", lambda: len(obs.consoles.read("n1")) > 4)
        monkeypatch.setattr(console, "LIVENESS_SILENCE", 3.0)   # never silent for it before the theft
        assert sol_sim.ipmitool("sol", "deactivate").returncode == 0
        with proc.running(other, stdin=subprocess.PIPE, env=env, check=False) as holder:
            wait_for("busy", lambda: obs.consoles.state("n1") == "busy", 30)
            said = consoles_of(obs)
            assert said[0] == "attached", said
            assert said[1].startswith("busy: another session took the node's SOL"), said
            assert not any(s.startswith("dropped") for s in said), said
            time.sleep(1)
            assert holder.poll() is None             # the other client's session goes on
            assert holder.popen.stdin is not None
            holder.popen.stdin.write(b"\r~.")
            holder.popen.stdin.flush()
            wait_for("the holder's exit", lambda: holder.poll() is not None, 10)
    finally:
        talking.clear()
        obs.stop()


def test_a_daemon_restart_resumes_the_console_and_the_ring(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    obs = make_observer(tmp_path, secrets_dir)
    obs.bmc_done("n1", Bmc(sol_sim.address, "ipmi", REF), "bmc.power", "on")
    wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
    wait_for("the serial port", serial.connected.is_set)
    serial.say("before the restart")
    wait_for("the line", lambda: "before the restart" in kept(obs))
    obs.stop()                                   # the daemon stops; the record stays
    again = make_observer(tmp_path, secrets_dir)
    try:
        assert again.consoles.attached() == ["n1"]
        wait_for("attached again", lambda: again.consoles.state("n1") == "attached")
        time.sleep(0.5)
        serial.say("after the restart")
        wait_for("the line", lambda: "after the restart" in kept(again))
        texts = kept(again)
        assert texts.index("before the restart") < texts.index("after the restart")
    finally:
        again.stop()


@pytest.mark.slow
def test_a_daemon_killed_with_consoles_open_resumes_them(
        tmp_path: Path, sol_sim: IpmiSim, serial: SerialPort, secrets_dir: Path) -> None:
    """The daemon dies (SIGKILL: its ipmitool killed with it, no ``~.`` sent, nothing saved):
    the next daemon resumes the console from the record; the BMC still holds the dead session,
    so it is busy until the BMC times that out (about 30 s with ipmi_sim), then attached; the
    ring holds the lines from before the kill, and the new ones after them."""
    obs = make_observer(tmp_path, secrets_dir)
    power_on(obs, "n1", Bmc(sol_sim.address, "ipmi", REF))
    wait_for("attached", lambda: obs.consoles.state("n1") == "attached")
    wait_for("the serial port", serial.connected.is_set)
    serial.say("before the kill")
    wait_for("the line", lambda: "before the kill" in kept(obs))
    session = obs.consoles._sessions["n1"]
    child = session._child
    assert child is not None
    session._stop.set()                        # the old daemon's thread ends with its process ...
    os.killpg(child.pid, 9)                    # ... and its ipmitool dies without a word
    session._thread.join(10)
    again = make_observer(tmp_path, secrets_dir)   # the record was never cleared
    try:
        assert again.consoles.attached() == ["n1"]
        wait_for("attached again", lambda: again.consoles.state("n1") == "attached", 90)
        time.sleep(0.5)
        serial.say("after the restart")
        wait_for("the line", lambda: "after the restart" in kept(again))
        texts = kept(again)
        assert texts.index("before the kill") < texts.index("after the restart")
        said = consoles_of(again)
        assert any(c.startswith("busy") for c in said) and said[-1] == "attached", said
    finally:
        again.stop()


def test_a_bmc_without_sol_and_a_redfish_bmc_say_so(
        tmp_path: Path, secrets_dir: Path) -> None:
    _tools()
    sim = make_sim(tmp_path, "nosol", "")
    obs = make_observer(tmp_path, secrets_dir)
    try:
        obs.bmc_done("n1", Bmc(sim.address, "ipmi", REF), "bmc.power", "on")
        wait_for("a verdict", lambda: obs.consoles.state("n1") not in ("starting", "attached"), 40)
        assert obs.consoles.attach("n2", Bmc("10.0.0.9", "redfish", REF)) == "no SOL"
        assert any(c.startswith("no SOL: the BMC is driven over redfish") for c in consoles_of(obs, "n2"))
        assert obs.consoles.state("n1") == "no SOL", consoles_of(obs)
    finally:
        obs.stop()
        sim.stop()


def test_the_budget_bounds_the_consoles(tmp_path: Path, secrets_dir: Path) -> None:
    """Unreachable BMCs (port 9 of loopback: no answer) keep their sessions trying: each holds a
    place; the fourth is refused with the cap named, said once, and the place of one let go is
    taken (a power off lets none go: a console is kept for good)."""
    obs = make_observer(tmp_path, secrets_dir, console_ring_bytes=1 << 20, console_budget_bytes=3 << 20)
    try:
        for n in range(4):
            obs.bmc_done(f"n{n}", Bmc("127.0.0.1:9", "ipmi", REF), "bmc.power", "on")
        assert obs.consoles.attached() == ["n0", "n1", "n2"]
        assert any("budget" in c for c in consoles_of(obs, "n3"))
        said = [c for c in consoles_of(obs, "n3") if "not kept" in c]
        assert said == ["not kept: the site keeps 3 consoles at once and holds 3 (the cap: "
                        "site_console_budget_bytes / site_console_ring_bytes)"], said
        obs.bmc_done("n3", Bmc("127.0.0.1:9", "ipmi", REF), "bmc.query", "inventory")
        assert len([c for c in consoles_of(obs, "n3") if "not kept" in c]) == 1   # said once
        obs.bmc_done("n0", Bmc("127.0.0.1:9", "ipmi", REF), "bmc.power", "off")
        assert obs.consoles.attached() == ["n0", "n1", "n2"]       # a power off keeps it
        obs.consoles.detach("n0")
        obs.bmc_done("n3", Bmc("127.0.0.1:9", "ipmi", REF), "bmc.power", "on")
        assert obs.consoles.attached() == ["n1", "n2", "n3"]
        assert "bettercompute_site_consoles_kept 3" in obs.metrics.render()
    finally:
        obs.stop()


@pytest.mark.slow
def test_32_consoles_at_once_within_the_budget(tmp_path: Path, secrets_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """32 BMCs serving SOL, 32 consoles kept at once: every node's line lands in its own ring;
    what they cost the daemon at rest counted (threads, descriptors, the ipmitool children's
    memory) and the rings within the site's budget. The liveness questions of silent consoles
    (a short ipmitool run each, every LIVENESS_SILENCE) are put off past the test: they are not
    what a kept console holds."""
    _tools()
    monkeypatch.setattr(console, "LIVENESS_SILENCE", 3600.0)
    count, ring_bytes = 32, 64 << 10
    ports = [SerialPort() for _ in range(count)]
    sims: list[IpmiSim] = []
    obs = make_observer(tmp_path, secrets_dir, console_ring_bytes=ring_bytes,
                        console_budget_bytes=count * ring_bytes)
    try:
        for i, port in enumerate(ports):
            sims.append(make_sim(tmp_path, f"bmc{i}", f"tcp:127.0.0.1:{port.port}"))
        threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
        for i, sim in enumerate(sims):
            obs.bmc_done(f"n{i}", Bmc(sim.address, "ipmi", REF), "bmc.power", "on")
        wait_for("32 attached", lambda: all(obs.consoles.state(f"n{i}") == "attached"
                                            for i in range(count)), 120)
        for i, port in enumerate(ports):
            wait_for("its serial port", port.connected.is_set)
            port.say(f"node {i} speaking", "x" * 1000)
        for i in range(count):
            wait_for(f"n{i}'s line", lambda i=i: f"node {i} speaking" in kept(obs, f"n{i}"))  # type: ignore[misc]
            assert f"node {(i + 1) % count} speaking" not in kept(obs, f"n{i}")
        more_threads = threading.active_count() - threads
        more_fds = len(os.listdir("/proc/self/fd")) - fds
        rss = 0
        for session in obs.consoles._sessions.values():
            child = session._child
            assert child is not None
            for pid in (child.pid, *map(int, Path(f"/proc/{child.pid}/task/{child.pid}/children")
                                         .read_text().split())):
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
                rss += int(rollup.split("\nPss:")[1].split()[0])     # its share, in KiB
        held = sum(obs.consoles.ring(f"n{i}").bytes() for i in range(count))
        print(f"32 consoles: {more_threads} threads, {more_fds} descriptors, ipmitool PSS "
              f"{rss / 1024:.1f} MiB in all, rings {held} bytes of {count * ring_bytes}")
        assert more_threads <= 2 * count + 4        # a session's thread and its stderr reader
        assert more_fds <= 3 * count + 8            # ipmitool's stdin, stdout and stderr pipes
        assert held <= count * ring_bytes
        assert obs.consoles.capacity == count
        assert obs.consoles.attach("n-extra", Bmc(sims[0].address, "ipmi", REF)).startswith("not kept")
    finally:
        obs.stop()
        for sim in sims:
            sim.stop()
        for port in ports:
            port.close()
