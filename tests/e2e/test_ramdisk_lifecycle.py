"""A ramdisk node's life, driven through the reference gateway: it boots by PXE (iPXE from the
user network's TFTP, kernel and initramfs over HTTP), joins, reports its NVMe disks, gets an
image deployed by serial hint, wipes its second disk with a certificate, runs diag.nvml
against the fake NVML baked into this test ramdisk, survives its agent being killed in the
middle of a retry-safe command, and finally kexecs into the deployed OS where the node agent
rejoins with a new boot id.

One guest for the module (a boot costs about a minute under TCG); the tests run in file order
and the last one (kexec) ends the ramdisk. Each test asserts on what the node reports and
checks it independently where it can (disk contents read from the backing files).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway import State
from agent.proto import session_pb2
from agent.security.trust import verify_result
from qemu.harness import Disk, Machine
from qemu.lab import Lab
from qemu.nodeimage import NodeImage, build_node_image, sha256
from tests.e2e.conftest import COMMAND_TIMEOUT, JOIN_TIMEOUT, run_command

pytestmark = [pytest.mark.qemu, pytest.mark.slow, pytest.mark.root]

NODE = "ram-1"
NVML_JSON = "/etc/bettercompute/fake-nvml.json"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def disks(lab: Lab) -> list[Disk]:
    d = lab.standard_disks(NODE, size=160 * MiB)
    # The disk to wipe starts full of a pattern, so zeros afterwards prove the wipe.
    with d[1].path.open("wb") as f:
        block = hashlib.sha256(b"old tenant data").digest() * (MiB // 32)
        for _ in range(d[1].size // MiB):
            f.write(block)
    return d


@pytest.fixture(scope="module")
def node(lab: Lab, disks: list[Disk], fake_nvml: Path) -> Iterator[Machine]:
    gpus = {"gpus": [{"model": "H100"}, {"model": "H100"}]}
    machine = lab.boot(
        NODE, disks=disks, pxe=True,
        files={"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": fake_nvml.read_bytes(),
               NVML_JSON: json.dumps(gpus).encode()},
        env={"FAKE_NVML_CONFIG": NVML_JSON},
    )
    lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
    yield machine
    machine.stop()


@pytest.fixture(scope="module")
def image(lab: Lab) -> NodeImage:
    img = build_node_image(lab, NODE, lab.workdir / "node-image")
    os.link(img.zst, lab.www / "node.img.zst")
    return img


def test_pxe_booted_node_joins_and_reports_nvme_serials(lab: Lab, node: Machine, disks: list[Disk]) -> None:
    rec = lab.gateway.nodes[NODE]
    assert rec.hello.role == "ramdisk"
    # It came by iPXE: the boot files were fetched over HTTP, and iPXE set the initrd= parameter.
    assert node.pxe_served[:2] == ["GET /vmlinuz 200", "GET /initrd.img 200"], node.pxe_served
    status, cmdline = node.shell("cat /proc/cmdline")
    assert status == 0 and "initrd=initrd.img" in cmdline and f"bc.node={NODE}" in cmdline
    _, _, result = run_command(lab, node, NODE, "inventory.refresh", {})
    by_serial = {d.identity.serial: d.identity for d in result.inventory.disks}
    for disk in disks:
        assert disk.serial in by_serial, f"{disk.serial} missing from {sorted(by_serial)}"
        assert by_serial[disk.serial].size_bytes == disk.size
    assert by_serial[disks[0].serial].transport == "nvme"
    assert by_serial[disks[2].serial].transport == "virtio"


@pytest.fixture(scope="module")
def deployed(lab: Lab, node: Machine, disks: list[Disk], image: NodeImage):  # type: ignore[no-untyped-def]
    """deploy.image of the node image onto the first NVMe disk, chosen by its serial."""
    payload = {"url": lab.url("node.img.zst"), "format": "ZSTD",
               "digest": {"algorithm": "sha256", "hex": image.zst_sha256},
               "target": {"serial": disks[0].serial}, "verify_readback": True}
    _, _, result = run_command(lab, node, NODE, "deploy.image", payload)
    return result


def test_deploy_image_to_the_disk_chosen_by_serial(deployed, disks: list[Disk],  # type: ignore[no-untyped-def]
                                                   image: NodeImage) -> None:
    result = deployed
    assert result.disk.serial == disks[0].serial
    assert result.digest.hex == image.zst_sha256
    assert result.image_bytes == image.raw.stat().st_size
    # The disk now holds the image: compare the backing file's first bytes with it.
    with disks[0].path.open("rb") as f:
        written = f.read(result.image_bytes)
    assert hashlib.sha256(written).hexdigest() == image.raw_sha256
    text = str(result)
    assert "bcroot" in text or result.partitions, "the deployed partitions are reported"


def test_wipe_second_disk_best_available_with_certificate(lab: Lab, node: Machine, disks: list[Disk]) -> None:
    target = disks[1]
    signed: list[session_pb2.SignedResult] = []

    def keep_results(node_id: str, frame: session_pb2.Frame) -> None:
        if frame.HasField("result"):
            signed.append(frame.result)

    lab.gateway.fault_hook = keep_results
    try:
        cid, _, result = run_command(lab, node, NODE, "disk.wipe",
                                        {"disks": [{"serial": target.serial}], "method": "BEST_AVAILABLE",
                                         "verify": "FULL"})
    finally:
        lab.gateway.fault_hook = None
    # Attested: the gateway accepted it only after checking the node key's signature; check
    # that signature here too, against the public key of this session's Hello.
    assert lab.gateway.commands[cid].state is State.FINISHED
    assert not [e for e in lab.gateway.events_for(cid) if e.what == "result_rejected"]
    ours = [s for s in signed if verify_result(s, lab.gateway.nodes[NODE].public_key).command_id == cid]
    assert ours and ours[0].signature
    (cert,) = result.certificates
    assert cert.disk.serial == target.serial
    assert cert.verified and not cert.error, cert
    assert cert.node_id == NODE
    # The disk reads zeros: in the guest, and in the backing file.
    status, out = node.shell(f"dev=$(for d in /sys/block/*; do [ \"$(cat $d/device/serial 2>/dev/null"
                             f" | tr -d ' ')\" = {target.serial} ] && echo ${{d##*/}}; done); "
                             "dd if=/dev/$dev bs=1M 2>/dev/null | md5sum", timeout=600)
    assert status == 0, out
    zeros = hashlib.md5(bytes(target.size)).hexdigest()
    assert zeros in out, out
    with target.path.open("rb") as f:
        assert not any(f.read()), "the backing file still holds non-zero bytes"


def test_diag_nvml_against_the_fake_library(lab: Lab, node: Machine) -> None:
    _, _, result = run_command(lab, node, NODE, "diag.nvml", {"thresholds": {"expected_gpu_count": 2}})
    assert result.driver_present, result.message
    assert len(result.gpus) == 2
    assert all("H100" in g.name for g in result.gpus)


def test_agent_killed_mid_command_is_restarted_and_reruns_it(lab: Lab, node: Machine) -> None:
    before = lab.gateway.nodes[NODE].sessions
    # inventory.refresh with LLDP listens for ~30 s: a retry-safe command long enough to kill.
    cid = lab.gateway.send(NODE, "inventory.refresh", {"include_lldp": True})
    lab.gateway.wait_for(lambda: lab.gateway.commands[cid].state is State.ACCEPTED, 120, "accepted")
    mark = len(node.console())
    status, out = node.shell("kill -9 $(cat /run/bettercompute-agent.pid)")
    assert status == 0, out
    node.wait_console(r"agent exited with status 137; restarting", 60, after=mark)
    lab.wait_joined(node, NODE, JOIN_TIMEOUT, sessions=before + 1)
    body, result = lab.gateway.wait_result(cid, COMMAND_TIMEOUT)
    assert body.status == session_pb2.SUCCEEDED, body.message
    assert result.inventory.disks
    node.wait_console(r"1 command\(s\) re-run", 30, after=mark)


def test_no_python_module_was_compiled_in_the_guest(node: Machine) -> None:
    # Every module the agent imported since boot (join, deploy, wipe, NVML, a restart) came
    # with bytecode the guest could use: a .pyc written here is one compiled at every boot.
    # The archive's files all carry mtime 0, as /init does.
    status, out = node.shell("new=$(find / -xdev -name '*.pyc' -newer /init); echo \"$new\";"
                             " echo \"pyc files written: $(echo -n \"$new\" | grep -c .)\"")
    assert status == 0, out
    m = re.search(r"pyc files written: (\d+)", out)
    assert m and m.group(1) == "0", out


def test_kexec_into_the_deployed_node_rejoins_with_a_new_boot_id(  # type: ignore[no-untyped-def]
        lab: Lab, node: Machine, disks: list[Disk], image: NodeImage, deployed) -> None:
    old = lab.gateway.nodes[NODE]
    old_boot, sessions = old.boot_id, old.sessions


    cid = lab.gateway.send(NODE, "boot.kexec", image.kexec_payload(disks[0].serial))
    try:
        rec = lab.gateway.wait(cid, COMMAND_TIMEOUT)
    except TimeoutError:
        raise node.fail("boot.kexec did not complete") from None
    assert rec.state is State.COMPLETED, f"{rec.state}: {lab.gateway.events_for(cid)}\n{node.console_tail()}"
    new = lab.gateway.nodes[NODE]
    assert new.sessions > sessions
    assert new.hello.role == "node"
    assert new.boot_id and new.boot_id != old_boot
    assert rec.completion is not None and rec.completion.ok
    assert sha256(image.kernel) == image.kernel_sha256
