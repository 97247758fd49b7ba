"""Crash campaign for deploy.image with a manifest: the real agent (`python -m agent run`, its real
deploy handler) writes a GPT image from a slow loopback HTTP server onto a loop device, and is
SIGKILLed at a random point of each deploy. After every kill the disk holds no bootable image
(no MBR signature, no GPT header at either end: the old image's tables were cleared first and
the new ones are written last) unless the kill came after the deploy's last write (then it is
the whole new image, every chunk verified), and the restarted agent reports the deploy
interrupted and has cleared the target's start and end (DeployImage.on_interrupted, called by
the core's replay): after every restart, no bootable image is left."""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import pytest

from agent.gateway import Gateway, State
from agent.gateway.certs import DevPki
from agent.images import manifest
from agent.proto import session_pb2
from tests.diskfixtures import MiB, gpt_image, loop_device
from tests.loopback_http import Fault, LoopbackServer
from tests.runtime.harness import AgentProcess

KILLS = 20
DISK = 48 * MiB


class RealAgent(AgentProcess):
    """The agent with its real handlers (the product's entry point, not the tests')."""

    entry = ("-m", "agent")


def bootable(dev: Path, size: int) -> str:
    """What would let firmware boot the disk: an MBR signature, a GPT header at either end."""
    with open(dev, "rb") as f:
        head = f.read(8192)
        f.seek(size - 4096)
        tail = f.read(4096)
    found = []
    if head[510:512] == b"\x55\xaa":
        found.append("MBR signature")
    if b"EFI PART" in (head[512:520], head[4096:4104]):
        found.append("primary GPT")
    if b"EFI PART" in (tail[-512:-504], tail[:8]):
        found.append("backup GPT")
    return ", ".join(found)


@pytest.mark.slow
def test_sigkill_during_manifest_deploys(pki: DevPki, gateway: Gateway, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a loop device")
    rng = random.Random(20261201)
    image = gpt_image(tmp_path / "new.img", 32 * MiB)
    with open(image, "r+b") as f:  # data in most chunks, so that the deploy takes a while
        for off in range(10 * MiB, 32 * MiB, 2 * MiB):
            f.seek(off)
            f.write(os.urandom(MiB))
    m_path, m_digest, m = manifest.write(image, chunk_size=MiB)
    old = gpt_image(tmp_path / "old.img", DISK).read_bytes()  # a bootable old image on the disk
    backing = tmp_path / "disk"
    backing.write_bytes(old)
    agent = RealAgent(pki, gateway, tmp_path / "agent")
    kills, finished_first, whole, statuses = 0, 0, 0, []
    with loop_device(backing) as disk, LoopbackServer() as srv:
        url = srv.add("/new.img", image.read_bytes(), fault=Fault(delay=0.004))
        srv.add("/new.img.manifest", m_path.read_bytes())
        payload = {"url": url, "target": {"name": disk.name},
                   "manifest": {"url": url + ".manifest", "digest": {"algorithm": "sha256", "hex": m_digest}}}
        agent.start()
        try:
            for attempt in range(2 * KILLS):
                if kills >= KILLS:
                    break
                with open(disk.path, "r+b") as f:  # the old image back, through the device's cache
                    f.write(old)
                    f.flush()
                    os.fsync(f.fileno())
                assert bootable(disk.path, DISK)
                gateway.wait_node("node-1", 60)
                cid = gateway.send("node-1", "deploy.image", payload, command_id=f"deploy-{attempt:02d}")
                rec = gateway.commands[cid]
                deadline = time.monotonic() + 60
                while rec.progress is None and rec.state is not State.FINISHED \
                        and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 1.2))  # a random point of the deploy: reading, hashing, writing
                sessions = gateway.nodes["node-1"].sessions
                if rec.state is State.FINISHED:
                    finished_first += 1  # it won the race: a whole, verified image
                    ok = rec.result is not None and rec.result.status == session_pb2.SUCCEEDED
                    assert ok, agent.logs()[-2000:]
                    with open(disk.path, "rb") as f:
                        assert f.read(len(image.read_bytes())) == image.read_bytes()
                    continue
                agent.kill()
                kills += 1
                left = bootable(disk.path, DISK)
                if left:  # killed between its last write and its result: the whole image, verified
                    whole += 1
                    with open(disk.path, "rb") as f:
                        assert f.read(len(image.read_bytes())) == image.read_bytes(), f"kill {kills}: {left}"
                agent.start()
                gateway.wait_node("node-1", 60, sessions=sessions + 1)
                gateway.wait(cid, 60)
                assert rec.result is not None
                statuses.append(session_pb2.Status.Name(rec.result.status))
                assert rec.result.status == session_pb2.INTERRUPTED, (rec.result, agent.logs()[-3000:])
                assert not bootable(disk.path, DISK), f"kill {kills}: a bootable image after the restart"
        finally:
            agent.kill()  # a failed assertion too: no agent outlives the test
    print(f"\ndeploy crash campaign: {kills} SIGKILLs mid-deploy ({whole} after the last write: the whole"
          f" image), {finished_first} deploys finished before the kill, {agent.starts} agent starts;"
          f" results after restart {sorted(set(statuses))}; manifest {m.chunk_count} chunks, sha256"
          f" {hashlib.sha256(m_path.read_bytes()).hexdigest()[:12]}")
    assert kills >= KILLS
