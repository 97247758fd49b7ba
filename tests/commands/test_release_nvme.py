"""A drive's namespaces put back to its factory layout (the nvme driver's factory_layout, the
release's remedy for nvme.*), against the fake nvme-cli (tests/fakes/nvme): the steps nvme-cli is
asked for, in order; a namespace in use refuses the whole operation before any step; a drive
without namespace management, or a baseline that does not say what to put back, has no remedy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.errors import InvalidParameters, ProtectedDevice, Unsupported
from agent.proto import agent_pb2
from tests.commands.test_release import GIB, Node, node

__all__ = ["node"]


def log_of(node: Node) -> list[str]:
    path = Path(str(node.nvme_state) + ".log")
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(autouse=True)
def nvme_log(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVME_LOG", str(node.nvme_state) + ".log")


def invoke(node: Node, request: agent_pb2.DriverInvokeRequest) -> str:
    handler = DriverInvoke()
    handler.root = node.root
    result = handler.run(Context.local("driver.invoke", node.config), handler.parse(request))
    assert isinstance(result, agent_pb2.DriverInvokeResult)
    return result.stdout.decode()


def carve(node: Node) -> None:
    node.nvme["nvme0"]["namespaces"] = {"1": {"size": 1000 * GIB, "flbas": 1},
                                        "2": {"size": 1000 * GIB, "flbas": 0, "detached": True}}
    node.save()


def test_a_carved_drive_is_put_back_in_4k_blocks_by_the_steps_nvme_cli_is_asked_for(node: Node) -> None:
    carve(node)
    baseline = {"nvme": {"namespaces": 1, "full_capacity": True, "lba_data_size": 4096}}
    report = node.check(baseline).release
    assert {m.check for m in report.restorable} == {"nvme.namespaces", "nvme.capacity", "nvme.lba_size"}
    assert not report.cannot_restore                    # nvme1 is one 512-byte namespace: the 4 KiB too
    for_nvme0 = [m for m in report.restorable if m.where.startswith("nvme0")]
    remedies = {m.remedy.SerializeToString(deterministic=True) for m in for_nvme0}
    assert len(remedies) == 1                           # one remedy for the controller's findings
    remedy = for_nvme0[0].remedy
    assert (remedy.driver, remedy.operation, remedy.arguments["device"].string_value,
            remedy.arguments["namespaces"].int_value, remedy.arguments["lba_data_size"].int_value) == (
        "nvme", "factory_layout", "/dev/nvme0", 1, 4096)
    before = len(log_of(node))
    out = invoke(node, remedy)
    steps = [line.split(" /dev/")[0] + " " + " ".join(a for a in line.split()[2:]
                                                      if not a.startswith("--output"))
             for line in log_of(node)[before:]]
    blocks = 3840 * GIB // 4096
    assert steps == [
        "id-ctrl ", "id-ns --namespace-id=0xffffffff", "list-ns --all",
        "detach-ns --namespace-id=1 --controllers=1", "delete-ns --namespace-id=1",
        "detach-ns --namespace-id=2 --controllers=1", "delete-ns --namespace-id=2",
        f"create-ns --nsze={blocks} --ncap={blocks} --flbas=1", "attach-ns --namespace-id=1 --controllers=1",
        "ns-rescan "]
    assert "created 1" in out and "rescanned" in out
    state = json.loads(node.nvme_state.read_text())["nvme0"]["namespaces"]
    assert state == {"1": {"size": 3840 * GIB, "flbas": 1, "detached": False}}
    assert (node.root / "sys/block/nvme0n1").is_dir()
    after = node.check(baseline).release
    assert [m.where for m in after.restorable] == ["nvme1n1"]   # nvme1 still 512: its own remedy


def test_a_namespace_in_use_refuses_before_any_step(node: Node) -> None:
    carve(node)
    (node.root / "sys/block/nvme0n1/dev").write_text("259:0\n")
    mountinfo = node.root / "proc/self/mountinfo"
    mountinfo.parent.mkdir(parents=True, exist_ok=True)
    mountinfo.write_text("36 25 259:0 / /srv rw,relatime - ext4 /dev/nvme0n1 rw\n")
    remedy = next(m.remedy for m in node.check().release.restorable if m.where.startswith("nvme0"))
    before = len(log_of(node))
    with pytest.raises(ProtectedDevice, match="mounted at /srv"):
        invoke(node, remedy)
    assert log_of(node)[before:] == []                  # not even a question to the drive
    assert "2" in json.loads(node.nvme_state.read_text())["nvme0"]["namespaces"]


def test_a_drive_without_namespace_management_has_no_remedy(node: Node) -> None:
    carve(node)
    node.nvme["nvme0"]["namespace_management"] = False
    node.save()
    report = node.check().release
    mine = [m for m in report.cannot_restore if m.where.startswith("nvme0")]
    assert {m.check for m in mine} == {"nvme.capacity", "nvme.lba_size"}   # namespace 2 unseen: detached
    assert all("no namespace management" in m.message for m in mine) and not report.restorable
    request = agent_pb2.DriverInvokeRequest(driver="nvme", operation="factory_layout")
    request.arguments["device"].string_value = "/dev/nvme0"
    request.arguments["namespaces"].int_value = 1
    request.arguments["lba_data_size"].int_value = 512
    with pytest.raises(Unsupported, match="no namespace management"):
        invoke(node, request)


def test_a_baseline_without_the_layout_to_put_back_has_no_remedy(node: Node) -> None:
    carve(node)
    report = node.check({"nvme": {"namespaces": 1, "full_capacity": True}}).release
    assert {m.check for m in report.cannot_restore} == {"nvme.namespaces", "nvme.capacity"}
    assert all("names no namespace count and LBA size" in m.message for m in report.cannot_restore)


def test_the_arguments_are_checked_before_anything_runs() -> None:
    for device, count, size in (("/dev/nvme0n1", 1, 512), ("/dev/sda", 1, 512), ("/dev/nvme0", 0, 512),
                                ("/dev/nvme0", 1, 8192)):
        request = agent_pb2.DriverInvokeRequest(driver="nvme", operation="factory_layout")
        request.arguments["device"].string_value = device
        request.arguments["namespaces"].int_value = count
        request.arguments["lba_data_size"].int_value = size
        with pytest.raises(InvalidParameters):
            DriverInvoke().parse(request)
