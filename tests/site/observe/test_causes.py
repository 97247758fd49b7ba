"""Each rule of agent/site/observe/causes.py on a timeline built through Timelines' own entry
points (the ones the handlers, dnsmasq's log and the HTTP service call), with a clock the test
moves: the cause named when the rule can tell, not before, and not when the boot went on."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.site.observe.causes import NAMES, RULES, Diagnosis
from agent.site.observe.timeline import BootEvent, Outcome, Prepared, Step, Timelines

MAC = "52:54:00:00:00:01"
IP = "10.99.0.50"
KERNEL, INITRD = "a" * 64, "b" * 64


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def timelines(root: Path, clock: Clock, diagnose: Diagnosis) -> Timelines:
    """Timelines kept under ``root`` on ``clock``, with no ARP table to learn addresses from."""
    t = Timelines(root, diagnose=diagnose, clock=clock)
    t.arp = lambda ip: ""
    t.load()
    return t


@pytest.fixture
def tl(tmp_path: Path, clock: Clock) -> Timelines:
    return timelines(tmp_path / "timeline", clock, Diagnosis())


def prepare(tl: Timelines, clock: Clock, *, method: str = "pxe", ttl: float = 3600,
            script_url: bool = False) -> None:
    tl.prepared("n1", Prepared(method, MAC, clock.now + ttl, KERNEL, INITRD, script_url))
    tl.power("n1", "on")


def cause(tl: Timelines, clock: Clock, after: float = 0.0) -> str:
    clock.step(after)
    tl.evaluate()
    a = tl.last("n1")
    assert a is not None
    return a.cause


def fetch(tl: Timelines, step: str, status: int = 200, mac: str = "") -> None:
    tl.fetch(IP, step, mac, status, 1000, 0.0)


def offered(tl: Timelines, clock: Clock, detail: str = "") -> None:
    """Prepared, powered on, and offered its boot file by the site's DHCP."""
    prepare(tl, clock)
    tl.by_mac(MAC, ev(clock, Step.DHCP_OFFER, detail))


def boot_to_script(tl: Timelines, clock: Clock) -> None:
    offered(tl, clock)
    fetch(tl, Step.CHAIN_SCRIPT)
    fetch(tl, Step.NODE_SCRIPT, mac=MAC)


def boot_to_files(tl: Timelines, clock: Clock, *, kernel_started: bool = False) -> None:
    """Booted to its script, its kernel and initrd fetched (and the kernel's first words on its
    console, where ``kernel_started``)."""
    boot_to_script(tl, clock)
    tl.cache_fetch(IP, KERNEL, 200, 9000, 0.0)
    tl.cache_fetch(IP, INITRD, 200, 9000, 0.0)
    if kernel_started:
        tl.console("n1", Step.KERNEL_STARTED, "Linux version 6.1")


def boot_ordered_after_clean_up(tl: Timelines, clock: Clock, device: str) -> None:
    """Prepared and cleaned up; 5 s later bmc.boot ``device`` and bmc.power on."""
    prepare(tl, clock)
    tl.cleaned("n1")
    clock.step(5)
    tl.boot_device("n1", device)
    tl.power("n1", "on")


def ev(clock: Clock, step: str, detail: str = "") -> BootEvent:
    return BootEvent(clock.now, step, detail)


def test_the_table_is_whole() -> None:
    assert len(set(NAMES)) == len(NAMES) == len(RULES)
    with pytest.raises(ValueError, match="no such rule"):
        Diagnosis({"nope": 1})


def test_a_boot_that_joins_has_no_cause(tl: Timelines, clock: Clock) -> None:
    boot_to_files(tl, clock, kernel_started=True)
    tl.console("n1", Step.JOINED, "connected to gateway gw at 10.0.0.1:7443")
    assert cause(tl, clock, 10_000) == ""
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.JOINED
    assert [e.step for e in a.events] == [
        "prepared", "power_on", "dhcp_offer", "chain_script", "node_script", "kernel", "initrd",
        "kernel_started", "joined"]


def test_refused(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock)
    tl.verdict("n1", False, "attestation: PCR 7 differs")
    assert cause(tl, clock) == "refused"
    assert "PCR 7" in (tl.last("n1") or pytest.fail()).cause_detail


def test_digest_refused(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock)
    tl.digest_refused("n1", "kernel: sha256 mismatch")
    assert cause(tl, clock) == "digest_refused"


def test_kernel_panic_at_once(tl: Timelines, clock: Clock) -> None:
    boot_to_script(tl, clock)
    tl.console("n1", Step.PANIC, "Kernel panic - not syncing: VFS: Unable to mount root fs")
    assert cause(tl, clock) == "kernel_panic"


def test_not_registered_and_expired(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock, ttl=5)
    clock.step(10)
    tl.by_mac(MAC, ev(clock, Step.DHCP_IGNORED, MAC))
    assert cause(tl, clock) == "not_registered"
    assert "expired" in (tl.last("n1") or pytest.fail()).cause_detail


def test_not_registered_then_offered_is_not_named(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock)
    tl.by_mac(MAC, ev(clock, Step.DHCP_IGNORED, MAC))
    tl.by_mac(MAC, ev(clock, Step.DHCP_OFFER))
    fetch(tl, Step.CHAIN_SCRIPT)
    a = tl.last("n1")
    assert a is not None and a.cause == "not_registered"   # named when it was so
    tl.evaluate()
    # the next rules do not fire: the boot went on


def test_no_boot_loader_waits_for_its_time(tl: Timelines, clock: Clock) -> None:
    offered(tl, clock)
    assert cause(tl, clock, 59) == ""
    assert cause(tl, clock, 2) == "no_boot_loader"


def test_no_boot_loader_at_once_when_the_firmware_asks_another_file(tl: Timelines, clock: Clock) -> None:
    offered(tl, clock, "boot server: undionly.kpxe")
    tl.learn_ip(IP, MAC)
    tl.by_ip(IP, ev(clock, Step.TFTP_MISSING, "snponly.efi"))
    assert cause(tl, clock) == "no_boot_loader"
    assert "snponly.efi" in (tl.last("n1") or pytest.fail()).cause_detail


def test_no_script(tl: Timelines, clock: Clock) -> None:
    offered(tl, clock)
    tl.learn_ip(IP, MAC)
    tl.by_ip(IP, ev(clock, Step.TFTP_SENT, "undionly.kpxe"))
    assert cause(tl, clock, 30) == ""
    assert cause(tl, clock, 31) == "no_script"


def test_no_script_at_once_when_refused(tl: Timelines, clock: Clock) -> None:
    offered(tl, clock)
    fetch(tl, Step.NODE_SCRIPT, status=404, mac=MAC)
    assert cause(tl, clock) == "no_script"


def test_no_kernel(tl: Timelines, clock: Clock) -> None:
    boot_to_script(tl, clock)
    assert cause(tl, clock, 50) == ""
    assert cause(tl, clock, 11) == "no_kernel"


def test_no_kernel_at_once_when_its_fetch_fails(tl: Timelines, clock: Clock) -> None:
    boot_to_script(tl, clock)
    tl.cache_fetch(IP, KERNEL, 404, 0, 0.0)
    assert cause(tl, clock) == "no_kernel"


def test_a_script_of_its_own_is_not_no_kernel(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock, script_url=True)
    fetch(tl, Step.NODE_SCRIPT, mac=MAC)
    assert cause(tl, clock, 100) == ""


def test_no_initrd(tl: Timelines, clock: Clock) -> None:
    boot_to_script(tl, clock)
    tl.cache_fetch(IP, KERNEL, 200, 9000, 0.0)
    assert (tl.last("n1") or pytest.fail()).events[-1].step == "kernel"
    assert cause(tl, clock, 61) == "no_initrd"


def test_no_initrd_at_once_when_its_fetch_fails(tl: Timelines, clock: Clock) -> None:
    boot_to_script(tl, clock)
    tl.cache_fetch(IP, KERNEL, 200, 9000, 0.0)
    tl.cache_fetch(IP, INITRD, 404, 0, 0.0)
    assert cause(tl, clock) == "no_initrd"


def test_no_dhcp_request(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock)
    tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16)")
    assert cause(tl, clock, 170) == ""
    assert cause(tl, clock, 11) == "no_dhcp_request"
    assert "SeaBIOS" in (tl.last("n1") or pytest.fail()).cause_detail


def test_no_network_and_gateway_unreachable(tl: Timelines, clock: Clock) -> None:
    boot_to_files(tl, clock, kernel_started=True)
    tl.console("n1", Step.NO_NETWORK, "gateway 10.0.0.1:7443: the network is not up yet")
    assert cause(tl, clock, 100) == ""
    assert cause(tl, clock, 21) == "no_network"


def test_gateway_unreachable(tl: Timelines, clock: Clock) -> None:
    boot_to_script(tl, clock)
    tl.console("n1", Step.KERNEL_STARTED, "Linux version 6.1")
    tl.console("n1", Step.GATEWAY_UNREACHABLE, "gateway 10.9.9.9:7443: [Errno 111] refused")
    assert cause(tl, clock, 91) == "gateway_unreachable"


def test_never_joined_with_the_console_last_word(tl: Timelines, clock: Clock) -> None:
    boot_to_files(tl, clock)
    tl.console("n1", Step.CONSOLE, "attached")
    tl.console("n1", Step.AGENT_STARTED, "bc-init [3.2]: starting agent")
    assert cause(tl, clock, 299) == ""
    assert cause(tl, clock, 2) == "never_joined"
    assert "agent_started" in (tl.last("n1") or pytest.fail()).cause_detail


def test_never_joined_is_not_named_without_a_console(tl: Timelines, clock: Clock) -> None:
    """Without a kept console the site cannot see a join: it names none rather than a wrong one."""
    boot_to_files(tl, clock)
    assert cause(tl, clock, 1000) == ""


@pytest.mark.parametrize("lost", ["busy: another session took the node's SOL (the BMC's session 0x2, "
                                  "not the site's 0x1)", "dropped: the session ended"])
def test_never_joined_is_not_named_when_the_console_was_not_the_sites_the_whole_time(
        tl: Timelines, clock: Clock, lost: str) -> None:
    """A client that takes the node's console at its kernel's fetch gets the agent's join line:
    the site, its console busy (or dropped and back) in the window a join would have shown,
    cannot tell a join from none and names no never_joined, however long it waits."""
    boot_to_script(tl, clock)
    tl.console("n1", Step.CONSOLE, "attached")
    clock.step(2)
    tl.console("n1", Step.CONSOLE, lost)
    tl.fetch(IP, Step.KERNEL, "", 200, 5_000_000, 1.0)
    tl.cache_fetch(IP, INITRD, 200, 20_000_000, 2.0)
    clock.step(40)
    tl.console("n1", Step.CONSOLE, "attached")
    assert cause(tl, clock, 1000) == ""
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.BOOTING


def test_never_joined_is_named_when_the_console_is_lost_only_after_its_window(
        tl: Timelines, clock: Clock) -> None:
    """Lost after the wait had passed (the rule fired already): the cause stands."""
    boot_to_files(tl, clock)
    tl.console("n1", Step.CONSOLE, "attached")
    assert cause(tl, clock, 301) == "never_joined"
    tl.console("n1", Step.CONSOLE, "busy: another session took the node's SOL")
    assert cause(tl, clock, 10) == "never_joined"


def test_disk_not_bootable(tl: Timelines, clock: Clock) -> None:
    tl.power("n1", "cycle")          # nothing prepared: a disk boot
    a = tl.last("n1")
    assert a is not None and a.method == "disk"
    tl.console("n1", Step.NO_BOOT_DEVICE, "Boot failed: not a bootable disk")
    assert cause(tl, clock) == "disk_not_bootable"


def test_disk_not_bootable_when_late_with_a_console(tl: Timelines, clock: Clock) -> None:
    tl.power("n1", "on")
    tl.console("n1", Step.CONSOLE, "attached")
    tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16)")
    assert cause(tl, clock, 179) == ""
    assert cause(tl, clock, 2) == "disk_not_bootable"


def test_disk_boot_without_a_console_is_not_guessed(tl: Timelines, clock: Clock) -> None:
    tl.power("n1", "on")
    assert cause(tl, clock, 1000) == ""


def test_waits_are_settable(tmp_path: Path, clock: Clock) -> None:
    tl = timelines(tmp_path / "t", clock, Diagnosis({"no_kernel": 2}))
    boot_to_script(tl, clock)
    assert cause(tl, clock, 3) == "no_kernel"


def test_an_unregistered_mac_booting_on_its_own_is_named(tl: Timelines, clock: Clock) -> None:
    """A node cleaned up reboots by PXE on its own: a new attempt, named not_registered at once."""
    prepare(tl, clock)
    tl.console("n1", Step.JOINED, "connected to gateway")
    tl.cleaned("n1")
    clock.step(100)
    tl.by_mac(MAC, ev(clock, Step.DHCP_IGNORED, MAC))
    attempts = tl.attempts("n1")
    assert [(a.number, a.trigger, a.method) for a in attempts] == [
        (1, "boot.prepareRamdisk", "pxe"), (2, "a PXE request seen", "pxe")]
    assert attempts[-1].cause == "not_registered" and "no boot entry" in attempts[-1].cause_detail


def test_a_pxe_boot_ordered_after_clean_up_is_not_registered_not_a_disk(tl: Timelines, clock: Clock) -> None:
    """bmc.boot pxe and bmc.power on of a node whose entry was cleaned up (nothing prepared, so
    the timeline counts it a PXE attempt): the ignored PXE request names it not_registered, and the
    firmware falling through to "No bootable device" afterwards does not make it a disk that
    does not boot (the QEMU fault matrix, tests/site/observe/test_faults_qemu.py, saw this)."""
    boot_ordered_after_clean_up(tl, clock, "pxe")
    tl.console("n1", Step.CONSOLE, "attached")
    tl.by_mac(MAC, ev(clock, Step.DHCP_IGNORED, MAC))
    tl.console("n1", Step.NO_BOOT_DEVICE, "Boot failed: could not read the boot disk")
    a = tl.last("n1")
    assert a is not None and a.method == "pxe" and a.trigger == "bmc.power on"
    assert cause(tl, clock) == "not_registered"
    assert "no boot entry" in a.cause_detail


def test_a_disk_boot_device_falling_through_to_pxe_is_still_a_disk_not_bootable(
        tl: Timelines, clock: Clock) -> None:
    boot_ordered_after_clean_up(tl, clock, "disk")
    tl.by_mac(MAC, ev(clock, Step.DHCP_IGNORED, MAC))
    assert cause(tl, clock) == "disk_not_bootable"
    assert "fell through" in (tl.last("n1") or pytest.fail()).cause_detail


def test_a_reboot_loop_without_a_panic_is_named_boot_loop(tl: Timelines, clock: Clock) -> None:
    """Eight attempts in three minutes, each reaching iPXE and its kernel and rebooting (no
    panic, no rule of its own fires): the eighth is named boot_loop, at once."""
    prepare(tl, clock, script_url=True)
    for n in range(8):
        tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16.3)")
        tl.console("n1", Step.BOOT_LOADER, "iPXE 1.21.1 -- Open Source Network Boot Firmware")
        a = tl.last("n1")
        assert a is not None and a.cause == ("boot_loop" if n == 7 else ""), (n, a.cause, a.cause_detail)
        clock.step(20)
    assert a is not None and a.number == 8 and "8 boot attempts in 140s" in a.cause_detail


def test_attempts_further_apart_or_joined_are_no_boot_loop(tl: Timelines, clock: Clock) -> None:
    prepare(tl, clock, script_url=True)
    for _ in range(8):
        tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16.3)")
        tl.console("n1", Step.BOOT_LOADER, "iPXE 1.21.1")
        clock.step(30)      # 8 attempts in 210 s
    assert cause(tl, clock) == ""
    for _ in range(8):
        tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16.3)")
        tl.console("n1", Step.JOINED, "agent.link.session: connected to gateway")
        clock.step(5)
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.JOINED and not a.cause


@pytest.mark.parametrize("line", [
    "agent.link.session: gateway 10.0.2.100:443: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
    "failed: Hostname mismatch, certificate is not valid for '10.0.2.100'. (_ssl.c:1000)",
    "agent.link.session: gateway 10.0.2.100:443: unauthenticated: gateway refused the session: enrollment "
    "token already used: it joined node n1's boot b1; a boot token is good for one boot's join",
])
def test_a_gateway_that_answers_and_refuses_is_not_unreachable(
        tl: Timelines, clock: Clock, line: str) -> None:
    """The agent reached its gateway and TLS failed (a certificate for another name) or the
    gateway refused the session: named gateway_refused with the line, not "cannot reach"."""
    from agent.site.observe.console import milestone

    boot_to_files(tl, clock, kernel_started=True)
    step = milestone(line)
    assert step == Step.GATEWAY_REFUSED
    tl.console("n1", step, line)
    assert cause(tl, clock, 91) == "gateway_refused"
    a = tl.last("n1")
    assert a is not None and "reaches its gateway but is refused" in a.cause_detail
    assert line[:60] in a.cause_detail
    assert milestone("agent.link.session: gateway 10.0.2.100:444: [Errno 111] Connection refused") == \
        Step.GATEWAY_UNREACHABLE


def test_never_joined_with_a_silent_console_says_console_is_missing(tl: Timelines, clock: Clock) -> None:
    """A kernel command line without console=: the console, attached and the site's, shows iPXE
    and then nothing. The cause says the console went silent after the kernel and why that
    usually is, not a console state ("the console's last word: console (attached)")."""
    boot_to_script(tl, clock)
    tl.console("n1", Step.CONSOLE, "attached")
    tl.console("n1", Step.BOOT_LOADER, "iPXE 1.21.1 -- Open Source Network Boot Firmware")
    tl.cache_fetch(IP, KERNEL, 200, 9000, 0.0)
    tl.cache_fetch(IP, INITRD, 200, 9000, 0.0)
    assert cause(tl, clock, 301) == "never_joined"
    a = tl.last("n1")
    assert a is not None and "went silent after the kernel (its last line: iPXE 1.21.1" in a.cause_detail
    assert "without console=" in a.cause_detail and "console (attached)" not in a.cause_detail


def test_the_rules_waits_are_settings_of_the_daemon(tmp_path: Path) -> None:
    """site_cause_waits (``--site-cause-wait RULE=SECONDS``, repeatable; a config file's list;
    ``bc.site_cause_wait=``) reaches the running site's rules; an unknown rule or a wait out of
    bounds is refused by name before anything starts."""
    from agent.cli.settings import load
    from agent.errors import InvalidParameters
    from agent.site.services import ServiceSettings, SiteServices

    loaded = load({"site_cause_waits": ["no_kernel=5", "boot_loop=600"], "state_dir": str(tmp_path)})
    settings = ServiceSettings.from_config(loaded.config)
    assert settings.cause_waits == (("no_kernel", 5.0), ("boot_loop", 600.0))
    assert load({}, cmdline_text="bc.site_cause_wait=never_joined=60").config.site_cause_waits == \
        (("never_joined", 60.0),)
    for bad in ("no_such_rule=5", "no_kernel", "no_kernel=-1", "no_kernel=abc"):
        with pytest.raises(InvalidParameters, match="site_cause_waits"):
            load({"site_cause_waits": [bad]})
    site = SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                        secrets_dir=tmp_path / "secrets", cause_waits=settings.cause_waits))
    try:
        assert site.observe.timelines.diagnose is not None
        diagnosis = site.observe.timelines.diagnose
        assert isinstance(diagnosis, Diagnosis) and diagnosis.waits["no_kernel"] == 5.0
        assert diagnosis.waits["boot_loop"] == 600.0 and diagnosis.waits["no_initrd"] == 60
    finally:
        site.http.server.server_close()
