"""The release report's wipe certificates (expect.state.wipes), through the Agent in process:
disk.wipe's result is kept as the runtime signed it, and the release in the same boot carries
the certificate of each disk named with that signed result; a disk without a verified
certificate of this boot is a finding, named, that no remedy puts back; a new boot (a new
agent on the same state directory) starts with none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from agent.commands.inventory import InventoryRefresh
from agent.errors import InvalidParameters
from agent.proto import agent_pb2, common_pb2, session_pb2
from agent.runtime.core import Agent
from agent.security.trust import verify_result
from tests.hw.fake_machine import build_machine
from tests.runtime.core_harness import Quick, World, accepted, world_in

DISKS = (("nvme0n1", "S0"), ("nvme1n1", "S1"))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield from world_in(tmp_path)


def wipe(failed: str = "") -> Quick:
    def body(ctx: object) -> agent_pb2.WipeResult:
        return agent_pb2.WipeResult(certificates=[
            agent_pb2.ErasureCertificate(node_id="n", disk=common_pb2.DiskIdentity(name=n, serial=s),
                                         method=agent_pb2.NVME_FORMAT_USER_DATA, verified=n != failed,
                                         error="verification failed" if n == failed else "")
            for n, s in DISKS])
    return Quick("disk.wipe", body)  # type: ignore[arg-type]


def release(world: World, agent: Agent, frames: object, cid: str,
            disks: list[str]) -> agent_pb2.ReleaseReport:
    payload = json_format.ParseDict({"skip_gpus": True, "expect": {"state": {"wipes": {"disks": disks}}}},
                                    agent_pb2.InventoryRefreshRequest())
    accepted(agent.submit(world.command(cid, "inventory.refresh", payload)))
    body: session_pb2.ResultBody = frames.result(cid)  # type: ignore[attr-defined]
    assert body.status == session_pb2.SUCCEEDED, body.message
    result = agent_pb2.InventoryRefreshResult.FromString(body.payload)
    return result.release


def agent_in(world: World, tmp_path: Path, boot: str, failed: str = "") -> tuple[Agent, object]:
    inv = InventoryRefresh()
    inv.root = build_machine(tmp_path / f"root-{boot}", gpus=0, disks=2)
    inv.kernel_log = lambda: []
    return world.agent({"disk.wipe": wipe(failed), "inventory.refresh": inv}, boot_id=boot)


def test_the_report_carries_this_boots_certificates_signed(world: World, tmp_path: Path) -> None:
    agent, frames = agent_in(world, tmp_path, "boot-A")
    report = release(world, agent, frames, "r0", ["S0", "nvme1n1"])
    assert not report.pool_ready and {m.where for m in report.cannot_restore} == {"S0", "nvme1n1"}
    assert {m.check for m in report.cannot_restore} == {"wipe.certificate"}
    assert "wipes" in report.checked and "wipes" not in report.not_checked

    accepted(agent.submit(world.command("w1", "disk.wipe")))
    assert frames.result("w1").status == session_pb2.SUCCEEDED  # type: ignore[attr-defined]
    report = release(world, agent, frames, "r1", ["S0", "nvme1n1"])
    assert report.pool_ready and not report.cannot_restore and report.boot_id == "boot-A"
    assert [c.disk.serial for c in report.wipe_certificates] == ["S0", "S1"]
    assert report.attestation_verdict == ""                   # the gateway's to fill
    (raw,) = report.wipe_results                              # one disk.wipe certified both
    body = verify_result(session_pb2.SignedResult.FromString(raw), agent.node_key.public_raw)
    assert (body.kind, body.command_id, body.boot_id) == ("disk.wipe", "w1", "boot-A")
    assert list(agent_pb2.WipeResult.FromString(body.payload).certificates) == list(report.wipe_certificates)

    agent.stop()                                              # the next boot: the kept ones do not count
    agent, frames = agent_in(world, tmp_path, "boot-B")
    report = release(world, agent, frames, "r2", ["S0"])
    (m,) = report.cannot_restore
    assert m.check == "wipe.certificate" and "signed in boot boot-A, not this one" in m.message
    assert not m.HasField("remedy") and not report.wipe_certificates


def test_a_certificate_that_failed_verification_does_not_count(world: World, tmp_path: Path) -> None:
    agent, frames = agent_in(world, tmp_path, "boot-A", failed="nvme1n1")
    accepted(agent.submit(world.command("w1", "disk.wipe")))
    frames.result("w1")  # type: ignore[attr-defined]
    report = release(world, agent, frames, "r1", ["S0", "S1"])
    assert [m.where for m in report.cannot_restore] == ["S1"]
    assert "nvme1n1: not verified (verification failed)" in report.cannot_restore[0].message
    assert [c.disk.serial for c in report.wipe_certificates] == ["S0"]


def test_disks_named_are_checked_at_the_edge() -> None:
    for disks in (["S0", "S0"], ["-rf"], ["a/b"], [f"S{i}" for i in range(65)]):
        payload = json_format.ParseDict({"expect": {"state": {"wipes": {"disks": disks}}}},
                                        agent_pb2.InventoryRefreshRequest())
        with pytest.raises(InvalidParameters, match=r"expect\.state\.wipes\.disks"):
            InventoryRefresh().parse(payload)
