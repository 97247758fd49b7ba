"""The lifecycle handlers through the real Agent core: the command is accepted, the action
runs only after the journal holds the proof, and the next agent (new boot id, or a new
kernel command line after a kexec whose tmpfs journal is gone) reports the Completion.
The final syscalls are recording doubles."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from agent.catalog import Role
from agent.commands.kexec import KexecHandler
from agent.commands.reboot import RebootHandler
from agent.hw import kexec, power
from agent.proto import agent_pb2, common_pb2, session_pb2
from tests.hw.test_kexec import RecordingRunner, RecordingSyscalls
from tests.runtime.core_harness import World
from tests.runtime.harness import wait_until


def completions(hello: session_pb2.Hello) -> dict[str, session_pb2.Completion]:
    return {c.command_id: c for c in hello.completions}


def test_node_reboot_completes_when_the_agent_rejoins_with_a_new_boot(world: World, tmp_path: Path) -> None:
    sc = RecordingSyscalls()
    pw = power.Power(sc, RecordingRunner(), efivars=tmp_path / "none", systemd_marker=tmp_path / "none")
    agent, _ = world.agent({"node.reboot": RebootHandler(pw)}, role=Role.NODE, boot_id="boot-A")
    payload = agent_pb2.NodeRebootRequest(mode=agent_pb2.FORCED)
    answer = agent.submit(world.command("reboot-1", "node.reboot", payload))
    assert isinstance(answer, session_pb2.Accept), answer
    wait_until(lambda: ("reboot", kexec.LINUX_REBOOT_CMD_RESTART) in sc.calls, 30, "the reboot syscall")
    assert sc.calls == [("sync", None), ("reboot", kexec.LINUX_REBOOT_CMD_RESTART)]
    agent.stop(timeout=2)
    # Same boot: the reboot did not happen.
    again, _ = world.agent({"node.reboot": RebootHandler(pw)}, role=Role.NODE, boot_id="boot-A")
    c = completions(again.hello())["reboot-1"]
    assert not c.ok and c.reason == "interrupted"
    again.stop(timeout=2)
    after, _ = world.agent({"node.reboot": RebootHandler(pw)}, role=Role.NODE, boot_id="boot-B")
    c = completions(after.hello())["reboot-1"]
    assert c.ok and c.new_boot_id == "boot-B" and c.kind == "node.reboot"


def test_unsigned_reboot_is_refused_and_nothing_reboots(world: World, tmp_path: Path) -> None:
    sc = RecordingSyscalls()
    pw = power.Power(sc, RecordingRunner(), efivars=tmp_path / "none", systemd_marker=tmp_path / "none")
    agent, _ = world.agent({"node.reboot": RebootHandler(pw)}, role=Role.NODE)
    answer = agent.submit(world.command("reboot-2", "node.reboot", sign=False))
    assert isinstance(answer, session_pb2.Reject) and answer.reason == "signature_missing"
    # refused at admission: nothing was journaled or queued that could reboot later
    assert "reboot-2" not in agent.journal.entries and agent.scheduler.busy() == []
    assert sc.calls == []


def test_kexec_rejoin_travels_on_the_new_kernel_command_line(world: World, tmp_path: Path) -> None:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"MZ" + os.urandom(4096))
    sc = RecordingSyscalls()
    handler = KexecHandler(kexec.Kexec(sc))
    agent, _ = world.agent({"boot.kexec": handler}, role=Role.RAMDISK, boot_id="boot-A")
    payload = agent_pb2.KexecRequest(
        kernel=common_pb2.FileSource(local_path=str(kernel), digest=common_pb2.Digest(
            algorithm="sha256", hex=hashlib.sha256(kernel.read_bytes()).hexdigest())),
        cmdline="console=ttyS0 bc.gateway=10.0.2.2:7443 bc.role=node",
    )
    assert isinstance(agent.submit(world.command("kexec-1", "boot.kexec", payload)), session_pb2.Accept)
    wait_until(lambda: ("reboot", kexec.LINUX_REBOOT_CMD_KEXEC) in sc.calls, 30, "the kexec syscall")
    (_, (_, _, cmdline, _)) = sc.calls[0]
    agent.stop(timeout=2)
    # The new kernel: a fresh tmpfs (no journal), its command line is what was loaded.
    world.state = tmp_path / "fresh-state"
    after, _ = world.agent({"boot.kexec": KexecHandler(kexec.Kexec(RecordingSyscalls()))}, role=Role.NODE,
                           boot_id="boot-B", cmdline=cmdline.decode())
    c = completions(after.hello())["kexec-1"]
    assert c.ok and c.kind == "boot.kexec" and c.new_boot_id == "boot-B", c
