"""How an attempt's method is told when nothing is prepared: a node whose entry was removed
(boot.cleanUp) and that is then set to boot from the network and powered on is a PXE attempt,
so its request ignored by the proxy DHCP is named not_registered (the demo's
``--break unregistered-mac``: qemu/sitebreak.py), while a disk boot that falls through to the
network stays disk_not_bootable."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.site.observe.causes import Diagnosis
from agent.site.observe.timeline import BootEvent, Prepared, Step, Timelines

MAC = "52:54:00:00:00:07"


@pytest.fixture
def tl(tmp_path: Path) -> Timelines:
    t = Timelines(tmp_path / "timeline", diagnose=Diagnosis(), clock=lambda: 1_800_000_000.0)
    t.arp = lambda ip: ""
    t.load()
    t.prepared("n1", Prepared("pxe", MAC, 1_800_003_600.0, "a" * 64, "b" * 64))
    t.cleaned("n1")
    return t


def ignored(tl: Timelines) -> None:
    tl.by_mac(MAC, BootEvent(tl.clock(), Step.DHCP_IGNORED, MAC))


def test_an_unregistered_node_set_to_pxe_is_not_registered(tl: Timelines) -> None:
    tl.boot_device("n1", "pxe")
    tl.power("n1", "on")
    ignored(tl)
    a = tl.last("n1")
    assert a is not None and (a.number, a.method, a.trigger) == (2, "pxe", "bmc.power on")
    assert a.cause == "not_registered" and "no boot entry" in a.cause_detail, a


def test_a_disk_boot_falling_through_to_the_network_is_still_the_disk_s(tl: Timelines) -> None:
    tl.boot_device("n1", "disk")
    tl.power("n1", "on")
    ignored(tl)
    a = tl.last("n1")
    assert a is not None and a.method == "disk" and a.cause == "disk_not_bootable", a
