"""agent.policy.xid: Xid lines of a kernel log found and classified with NVIDIA's catalogue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.hw import kernellog
from agent.policy import xid
from agent.proto import agent_pb2

KERNEL_LOG = (Path(__file__).parents[1] / "hw/data/kmsg-xid.txt").read_text()  # dmesg-formatted


def test_xid_79_and_13_are_classified() -> None:
    events = xid.parse(KERNEL_LOG)
    assert [(e.xid, e.pci_address) for e in events] == [
        (13, "0000:18:00.0"), (13, "0000:18:00.0"), (79, "0000:ab:00.0"), (154, "0000:2a:00.0"),
        (999, "0000:3a:00.0"),
    ]
    thirteen, _, seventy_nine, recovery, unknown = events
    assert (thirteen.action, thirteen.bucket) == (xid.Action.NONE, "RESTART_APP")
    assert thirteen.name == "Graphics Engine Exception" and thirteen.seconds_since_boot == 812.334455
    assert thirteen.message.startswith("pid=4242, name=python3, Graphics SM Warp Exception")
    assert (seventy_nine.action, seventy_nine.bucket) == (xid.Action.REBOOT, "RESTART_BM")
    assert seventy_nine.name == "GPU has fallen off the bus"
    assert recovery.action is xid.Action.REBOOT  # read from the recovery action in its text
    assert (unknown.action, unknown.bucket) == (xid.Action.UNKNOWN, "")
    assert seventy_nine.to_proto().action == agent_pb2.XID_REBOOT


@pytest.mark.parametrize(("code", "action"), [
    (48, "reset_gpu"), (64, "drain"), (94, "none"), (95, "reset_gpu"), (45, "none"), (74, "reset_gpu"),
])
def test_catalogue_buckets(code: int, action: str) -> None:
    assert xid.classify(code)[0] == action


def test_every_bucket_maps_to_an_action() -> None:
    for code, (name, bucket) in xid.CATALOGUE.items():
        assert name
        assert code == 154 or bucket in xid.BUCKETS


def test_a_flood_is_bounded() -> None:
    line = "[ 1.0] NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=x, MMU Fault\n"
    assert len(xid.parse(line * 10_000)) == xid.MAX_EVENTS


def test_lines_that_are_not_xid_events() -> None:
    assert xid.parse("NVRM: Xid (PCI:zzzz): 79, no\nNVRM: loading NVIDIA UNIX x86_64 Kernel Module\n") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="/dev/kmsg is readable by root")
def test_this_machine_kernel_log() -> None:
    events = xid.since_boot()
    assert events is not None  # this machine has no NVIDIA GPU: a readable log and no events
    assert all(e.xid > 0 for e in events)


def test_syslog_level_prefixes() -> None:
    line = "<4>[ 9031.000007] NVRM: Xid (PCI:0000:ab:00): 79, pid=1, GPU has fallen off the bus."
    (event,) = xid.parse(line)
    assert (event.xid, event.pci_address, event.seconds_since_boot) == (79, "0000:ab:00.0", 9031.000007)


@pytest.mark.skipif(os.geteuid() != 0, reason="syslog(2) READ_ALL needs CAP_SYSLOG")
def test_the_ring_buffer_in_one_call() -> None:
    data = kernellog.read_ring_buffer()
    assert data is not None and data.startswith(b"<")  # "<5>[    0.000000] Linux version ..."
