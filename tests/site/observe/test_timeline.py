"""The timelines' bookkeeping: attempts begun and bounded, events attributed by MAC and by
address (dnsmasq's real log lines), kept across a restart, rendered for a person."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from agent.site.observe import dhcplog, timeline
from agent.site.observe.observer import Observer, ObserverSettings
from agent.site.observe.timeline import (
    Attempt,
    BootEvent,
    Outcome,
    Prepared,
    Step,
    Timelines,
    read_arp,
    render,
)

MAC = "52:54:00:00:00:01"

# Lines dnsmasq 2.90 logged in tests/site/boot/test_boot_network.py (--log-dhcp, the xid first).
LINES = {
    "1389036598 PXE(eth0) 52:54:00:00:00:03 proxy-ignored": (Step.DHCP_IGNORED, "52:54:00:00:00:03", ""),
    "2353434870 PXE(eth0) 52:54:00:00:00:01 proxy": (Step.DHCP_OFFER, MAC, ""),
    "2353434870 PXE(eth0) 10.99.0.50 52:54:00:00:00:01 undionly.kpxe": (Step.DHCP_OFFER, MAC, "10.99.0.50"),
    "sent /tmp/x/site/boot/tftp/undionly.kpxe to 10.99.0.50": (Step.TFTP_SENT, "", "10.99.0.50"),
    "file /tmp/x/site/boot/tftp/snponly.efi not found for 10.99.0.50": (Step.TFTP_MISSING, "", "10.99.0.50"),
}


def test_dnsmasq_lines() -> None:
    for line, (step, mac, ip) in LINES.items():
        got = dhcplog.parse("dnsmasq-dhcp[23780]: " + line)
        assert got is not None and (got.step, got.mac, got.ip) == (step, mac, ip), line
    for other in ("2353434870 tags: known, eth0", "2353434870 bootfile name: undionly.kpxe",
                  "DHCP, proxy on subnet 10.99.0.2", "2353434870 sent size:  1 option: 53 message-type  2"):
        assert dhcplog.parse(other) is None, other


def observer(tmp_path: Path) -> Observer:
    obs = Observer(ObserverSettings(tmp_path / "observe", tmp_path / "secrets"))
    obs.timelines.arp = lambda ip: ""
    obs.start()
    return obs


def test_a_bios_pxe_boot_attributed_from_the_log_and_the_fetches(tmp_path: Path) -> None:
    obs = observer(tmp_path)
    ticks = itertools.count(1_800_000_000, 10)      # each step 10 s after the one before
    obs.timelines.clock = lambda: float(next(ticks))
    obs.prepared("n1", Prepared("pxe", MAC, 4e9, "a" * 64, "b" * 64))
    obs.dnsmasq_line("dnsmasq-dhcp[1]: 2353434870 PXE(eth0) 52:54:00:00:00:01 proxy")
    # the boot server's answer names the client's address: the TFTP transfer to it is the MAC's
    obs.dnsmasq_line("dnsmasq-dhcp[1]: 2353434870 PXE(eth0) 10.99.0.50 52:54:00:00:00:01 undionly.kpxe")
    obs.dnsmasq_line("dnsmasq-tftp[1]: sent /x/tftp/undionly.kpxe to 10.99.0.50")
    obs.http_fetch("10.99.0.50", "/boot.ipxe", 200, 120, 0.01)
    obs.http_fetch("10.99.0.50", "/pxe/52-54-00-00-00-01.ipxe", 200, 300, 0.01)
    obs.http_fetch("10.99.0.50", "/cache/" + "a" * 64, 200, 5_000_000, 0.8)
    obs.http_fetch("10.99.0.50", "/cache/" + "b" * 64, 200, 30_000_000, 2.5)
    a = obs.timelines.last("n1")
    assert a is not None
    steps = [e.step for e in a.events]
    assert steps == ["prepared", "dhcp_offer", "dhcp_offer", "tftp_sent", "chain_script", "node_script",
                     "kernel", "initrd"], steps
    initrd = a.events[-1]
    assert (initrd.bytes, initrd.seconds, initrd.status) == (30_000_000, 2.5, 200)
    assert "initrd" in render("n1", [a])


def test_a_lone_offer_names_the_tftp_client(tmp_path: Path) -> None:
    """UEFI: the proxy offer carries no address; the one MAC offered lately is the client."""
    obs = observer(tmp_path)
    obs.prepared("n1", Prepared("pxe", MAC, 4e9))
    obs.dnsmasq_line("3229746594 PXE(eth0) 52:54:00:00:00:01 proxy")
    obs.dnsmasq_line("sent /x/tftp/ipxe.efi to 10.99.0.77")
    a = obs.timelines.last("n1")
    assert a is not None and a.events[-1].step == "tftp_sent" and a.events[-1].detail == "ipxe.efi"


def test_the_neighbour_table(tmp_path: Path) -> None:
    arp = tmp_path / "arp"
    arp.write_text("IP address       HW type     Flags       HW address            Mask     Device\n"
                   "10.99.0.50       0x1         0x2         52:54:00:00:00:01     *        br0\n")
    assert read_arp("10.99.0.50", arp) == MAC
    assert read_arp("10.99.0.51", arp) == ""


def test_attempts_and_events_are_bounded_and_survive_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "t"
    tl = Timelines(root)
    for _ in range(timeline.KEEP_ATTEMPTS + 3):
        tl.power("n1", "cycle")
    attempts = tl.attempts("n1")
    assert len(attempts) == timeline.KEEP_ATTEMPTS
    assert [a.number for a in attempts] == list(range(4, timeline.KEEP_ATTEMPTS + 4))
    assert all(a.outcome == Outcome.ENDED for a in attempts[:-1])
    for i in range(timeline.MAX_EVENTS + 10):
        tl.console("n1", Step.CONSOLE, f"line {i}")
    last = tl.last("n1")
    assert last is not None and len(last.events) == timeline.MAX_EVENTS and last.dropped == 11
    assert last.events[0].step == "power_on" and last.events[-1].detail == f"line {timeline.MAX_EVENTS + 9}"
    assert not (root / "n1.json").exists()      # written by the flush, off the event's path
    assert tl.flush() == 1 and tl.flush() == 0
    again = Timelines(root)
    assert again.load() == 1
    assert [a.number for a in again.attempts("n1")] == [a.number for a in attempts]
    assert json.loads((root / "n1.json").read_text())["node_id"] == "n1"
    (root / "bad.json").write_text("{")
    assert Timelines(root).load() == 1 and not (root / "bad.json").exists()


def test_nodes_are_bounded(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    mp = pytest.MonkeyPatch()
    mp.setattr(timeline, "MAX_NODES", 3)
    try:
        tl = Timelines(tmp_path / "t")
        for n in range(5):
            tl.power(f"n{n}", "on")
        assert tl.nodes() == ["n2", "n3", "n4"]
        tl.flush()
        assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["n2.json", "n3.json", "n4.json"]
    finally:
        mp.undo()


def test_a_reboot_seen_on_the_console_is_a_new_attempt(tmp_path: Path) -> None:
    tl = Timelines(tmp_path / "t")
    tl.power("n1", "on")
    tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16)")
    tl.console("n1", Step.KERNEL_STARTED, "Linux version 6.1")
    tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16)")
    attempts = tl.attempts("n1")
    assert [a.trigger for a in attempts] == ["bmc.power on", "reboot seen on the console"]


def test_a_reboot_of_a_quiet_kernel_is_a_new_attempt_and_a_power_on_is_not_split(tmp_path: Path) -> None:
    """The ramdisk boots ``quiet``: no "Linux version" ever. The console reports each milestone
    once per boot and the firmware again at a new boot (console.py): the firmware reported in
    an attempt that holds any console milestone begins the next attempt; the first firmware
    after a power on stays in the attempt the power on began."""
    tl = Timelines(tmp_path / "t")
    tl.power("n1", "on")
    for _ in range(3):          # the demo's panicking node, rebooting on its own
        for step in (Step.FIRMWARE, Step.BOOT_LOADER, Step.INIT, Step.PANIC):
            tl.console("n1", step, step)
    tl.power("n1", "reset")
    tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16)")
    tl.console("n1", Step.NO_BOOT_DEVICE, "No bootable device.")
    tl.console("n1", Step.FIRMWARE, "SeaBIOS (version 1.16)")
    attempts = tl.attempts("n1")
    assert [a.trigger for a in attempts] == ["bmc.power on"] + ["reboot seen on the console"] * 2 + [
        "bmc.power reset", "reboot seen on the console"]
    assert [[e.step for e in a.events] for a in attempts[1:3]] == [
        ["firmware", "boot_loader", "init", "panic"]] * 2
    assert [e.step for e in attempts[3].events] == ["power_on", "firmware", "no_boot_device"]


def test_a_node_that_panics_and_reboots_shows_its_cause_between_boots(tmp_path: Path) -> None:
    """With ``panic=-1`` the next boot's firmware comes a moment after the panic: the new
    attempt carries the boot before's cause until its own events name one (counted then, once
    per boot), and a boot that joins is joined."""
    named: list[tuple[int, str]] = []

    def panicked(a: Attempt, prepared: object, now: float) -> tuple[str, str] | None:
        panic = a.last(Step.PANIC)
        return ("kernel_panic", panic.detail) if panic is not None else None

    tl = Timelines(tmp_path / "t", diagnose=panicked,
                   on_cause=lambda node, a: named.append((a.number, a.cause_detail)))
    tl.power("n1", "on")
    for n in range(2):
        for step in (Step.FIRMWARE, Step.BOOT_LOADER, Step.INIT, Step.PANIC):
            tl.console("n1", step, f"{step} {n}")
    tl.console("n1", Step.FIRMWARE, "firmware 2")
    a = tl.last("n1")
    assert a is not None and (a.number, a.outcome, a.cause, a.carried) == (3, "failed", "kernel_panic", True)
    assert a.cause_detail == "the boot before (attempt 2): panic 1", a.cause_detail
    assert named == [(1, "panic 0"), (2, "panic 1")]
    for step in (Step.BOOT_LOADER, Step.INIT, Step.AGENT_STARTED, Step.JOINED):
        tl.console("n1", step, str(step))
    a = tl.last("n1")
    assert a is not None and a.outcome == "joined" and a.number == 3


def test_an_unknown_mac_is_dropped_and_pending_addresses_expire(tmp_path: Path) -> None:
    tl = Timelines(tmp_path / "t")
    tl.arp = lambda ip: ""
    assert not tl.by_mac("52:54:00:99:99:99", BootEvent(1.0, Step.DHCP_IGNORED))
    tl.by_ip("10.0.0.9", BootEvent(1.0, Step.TFTP_SENT))
    tl.expire_pending(now=1.0 + timeline.PENDING_SECONDS + 1)
    tl.power("n1", "on")
    tl.prepared("n1", Prepared("pxe", MAC, 4e9))
    tl.learn_ip("10.0.0.9", MAC)
    a = tl.last("n1")
    assert a is not None and all(e.step != "tftp_sent" for e in a.events)


def test_a_request_node_id_that_is_no_id_names_no_file(tmp_path: Path) -> None:
    from agent.site.observe.console import Bmc

    obs = observer(tmp_path)
    obs.bmc_done("../../escape", Bmc("127.0.0.1:9", "redfish", "r"), "bmc.power", "on")
    obs.http_fetch("10.0.0.1", "/pxe/../../x.ipxe", 404, 0, 0.0)
    assert obs.timelines.nodes() == []
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "observe" / "bmcs.json").exists()


def test_the_next_boots_set_up_after_a_clean_up_is_its_own_attempt(tmp_path: Path) -> None:
    """The demo's second boot: boot.cleanUp, bmc.boot disk, the console attached, bmc.power
    cycle: one new disk attempt begun by the power cycle, the boot device in it."""
    tl = Timelines(tmp_path / "t")
    tl.prepared("n1", Prepared("pxe", MAC, 4e9))
    tl.power("n1", "on")
    tl.console("n1", Step.JOINED, "connected to gateway")
    tl.cleaned("n1")
    tl.console("n1", Step.CONSOLE, "released")
    tl.boot_device("n1", "disk")
    tl.console("n1", Step.CONSOLE, "attached")
    tl.power("n1", "cycle")
    first, second = tl.attempts("n1")
    assert [e.step for e in first.events] == ["prepared", "power_on", "joined", "cleaned", "console"]
    assert (second.trigger, second.method) == ("bmc.power cycle", "disk")
    assert [e.step for e in second.events] == ["boot_device", "console", "power_on"]
