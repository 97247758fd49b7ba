"""qemu/powered.py: a QEMU node powered and re-booted from outside, through the same
command line ipmi_sim's chassis_control and the Redfish emulator's hook use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from qemu.powered import NodeSpec, PoweredNode
from tests.runtime.harness import wait_until

ROOT = Path(__file__).resolve().parents[2]


def cli(node_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qemu.powered", str(node_dir), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def node(powered_node: PoweredNode) -> PoweredNode:
    return powered_node


def test_chassis_control_protocol_without_booting(tmp_path: Path) -> None:
    PoweredNode(tmp_path).configure(NodeSpec(kernel="/nonexistent", initrd="/nonexistent"))
    assert cli(tmp_path, "chassis-control", "0x20", "get", "power", "boot").stdout.split() == [
        "power:0", "boot:default"]
    assert cli(tmp_path, "chassis-control", "0x20", "set", "boot", "pxe").returncode == 0
    assert cli(tmp_path, "chassis-control", "0x20", "get", "boot").stdout.strip() == "boot:pxe"
    bad = cli(tmp_path, "chassis-control", "0x20", "set", "boot", "floppy")
    assert bad.returncode == 1 and "invalid boot value" in bad.stdout
    assert cli(tmp_path, "chassis-control", "0x20", "get", "voltage").returncode == 1
    assert cli(tmp_path, "chassis-control", "0x20", "set", "power").returncode == 1
    # Power-on of a node whose kernel is missing fails clearly and leaves it off.
    on = cli(tmp_path, "chassis-control", "0x20", "set", "power", "1")
    assert on.returncode == 1 and "did not start" in on.stdout
    assert cli(tmp_path, "status").stdout.strip() == "off"


def test_a_machineless_nodes_shell_chassis_control_answers_as_the_python_one(tmp_path: Path) -> None:
    """The sh chassis_control of a machineless node (a BMC fleet's) and PoweredNode's own (what
    ``python -m qemu.powered DIR chassis-control`` prints) give the same answers, exit statuses
    and node state, call by call."""
    nodes = [PoweredNode(tmp_path / name).configure(NodeSpec(
        kernel="/nonexistent", initrd="/nonexistent", machine=False)) for name in ("sh", "py")]
    script = nodes[0].write_chassis_control(tmp_path / "chassis-control")
    calls = [
        ("get", "power", "boot"), ("set", "reset", "1"), ("set", "boot", "pxe"),
        ("get", "boot", "power"), ("set", "power", "1"), ("set", "power", "1"),
        ("set", "boot", "cdrom", "reset", "1"), ("get", "boot"), ("set", "boot", "floppy"),
        ("set", "boot", "bios"), ("get", "voltage"), ("get", "power", "voltage"), ("set", "power"),
        ("set", "identify", "1"), ("set", "shutdown", "0"), ("get", "power"), ("set", "shutdown", "1"),
        ("set", "power", "1", "power", "0"), ("set", "wattage", "9"), ("poke",), ("get", "power"),
    ]
    for call in calls:
        by_sh = subprocess.run([str(script), "0x20", *call], capture_output=True, text=True, timeout=30)
        rc, out = nodes[1].chassis_control(call[0], list(call[1:]))   # what the CLI prints
        assert (by_sh.returncode, by_sh.stdout) == (rc, out + "\n" if out else ""), call
    sh, py = nodes
    assert (sh.status(), sh.boot_device()) == (py.status(), py.boot_device()) == ("off", "disk")
    assert [(b.device, b.how) for b in sh.boots()] == [(b.device, b.how) for b in py.boots()] == [
        ("pxe", "start"), ("cdrom", "reset"), ("disk", "start")]


def test_an_arm64_node_with_pflash_runs_it_with_its_own_variables_across_a_reload(tmp_path: Path) -> None:
    """A node's pflash (AAVMF's code, the node's copy of its variables) survives node.json and
    reaches QEMU's command line for a PXE boot, instead of -bios; none: -bios as before."""
    from qemu.harness import Machine

    code, variables = tmp_path / "AAVMF_CODE.fd", tmp_path / "n1" / "AAVMF_VARS.fd"
    PoweredNode(tmp_path / "n1").configure(NodeSpec(
        kernel="/nonexistent", initrd="/nonexistent", arch="arm64", uefi=True, tap="tap0",
        tpm_state=str(tmp_path / "tpm"), pflash_code=str(code), pflash_vars=str(variables)))
    again = PoweredNode(tmp_path / "n1")          # as the detached supervisor reads it
    argv = Machine(again.machine_spec("pxe")).argv()
    drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
    assert drives[:2] == [f"if=pflash,format=raw,readonly=on,file={code}",
                          f"if=pflash,format=raw,file={variables}"]
    assert "-bios" not in argv and "-kernel" not in argv
    assert "tpm-tis-device,tpmdev=tpm0" in argv
    PoweredNode(tmp_path / "n2").configure(NodeSpec(kernel="/nonexistent", initrd="/nonexistent",
                                                    arch="arm64", tap="tap1"))
    plain = Machine(PoweredNode(tmp_path / "n2").machine_spec("pxe")).argv()
    assert "-bios" in plain and not any(a.startswith("if=pflash") for a in plain)


@pytest.mark.qemu
def test_power_on_pxe_reset_and_off_from_outside(node: PoweredNode) -> None:
    assert cli(node.dir, "boot", "pxe").returncode == 0
    assert cli(node.dir, "chassis-control", "0x20", "set", "power", "1").returncode == 0
    assert node.status() == "on"
    # The guest really boots from the network: iPXE fetches the kernel from the node's server.
    wait_until(lambda: any(b.how == "pxe-fetch" for b in node.boots()), 90, "the PXE fetch")
    assert cli(node.dir, "chassis-control", "0x20", "set", "reset", "1").returncode == 0
    wait_until(lambda: sum(b.how == "pxe-fetch" for b in node.boots()) == 2, 90, "the PXE fetch after reset")
    assert cli(node.dir, "chassis-control", "0x20", "set", "power", "0").returncode == 0
    assert node.status() == "off"
    assert cli(node.dir, "chassis-control", "0x20", "get", "power").stdout.strip() == "power:0"


@pytest.mark.qemu
def test_disk_boot_and_the_guest_dies_with_its_owner(node: PoweredNode, tmp_path: Path) -> None:
    spec = node.spec()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        node.configure(NodeSpec(**{**spec.__dict__, "owner_pid": owner.pid}))
        node.set_boot("disk")
        node.start()
        wait_until(lambda: "Linux version" in (node.dir / "node-console.log").read_text(errors="replace"),
                 90, "the kernel's banner on the console")
        assert not any(b.how == "pxe-fetch" for b in node.boots())
    finally:
        owner.kill()
        owner.wait()
    wait_until(lambda: node.status() == "off", 15, "the node to power off with its owner")


def test_virtual_media_without_qemu(tmp_path: Path) -> None:
    node = PoweredNode(tmp_path).configure(NodeSpec(kernel="/nonexistent", initrd="/nonexistent"))
    (tmp_path / "a.iso").write_bytes(b"an image")
    assert cli(tmp_path, "insert", "cd", str(tmp_path / "a.iso")).returncode == 0
    assert node.media() == {"cd": str(tmp_path / "media-cd.iso")}
    assert (tmp_path / "media-cd.iso").read_bytes() == b"an image"
    missing = cli(tmp_path, "insert", "usb", str(tmp_path / "none.iso"))
    assert missing.returncode == 1 and "virtual media usb" in missing.stdout
    assert "usb" not in node.media() and not list(tmp_path.glob(".media-*"))
    assert cli(tmp_path, "insert", "floppy", "x").returncode == 2  # argparse: not a drive
    assert cli(tmp_path, "boot", "cdrom").returncode == 0 and node.boot_device() == "cdrom"
    assert cli(tmp_path, "chassis-control", "0x20", "get", "boot").stdout.strip() == "boot:cdrom"
    assert cli(tmp_path, "eject", "cd").returncode == 0
    assert node.media() == {} and not (tmp_path / "media-cd.iso").exists()


@pytest.mark.qemu
def test_virtual_media_changed_in_a_running_guest(node: PoweredNode, tmp_path: Path) -> None:
    from tests.loopback_http import LoopbackServer

    node.start()
    try:
        with LoopbackServer() as srv:
            url = srv.add("/config.iso", b"\0" * 4096)
            assert cli(node.dir, "insert", "usb", url).returncode == 0

        def drives() -> dict[str, str]:
            reply = node._qmp("query-block")
            out = {}
            for d in reply["return"]:  # type: ignore[attr-defined]  # QMP's JSON
                if str(d.get("qdev", "")).startswith("cdrom"):
                    out[d["qdev"]] = d.get("inserted", {}).get("file", "")
            return out

        assert drives() == {"cdrom0": "", "cdrom1": str(node.dir / "media-usb.iso")}
        assert cli(node.dir, "eject", "usb").returncode == 0
        assert drives() == {"cdrom0": "", "cdrom1": ""}
    finally:
        node.stop(force=True)
