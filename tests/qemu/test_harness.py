"""The QEMU harness without booting: its command line keeps the guest's network closed, the
forwarder relays one connection to the loopback, kernel parameters are checked; arm64's
attestation machine and its GRUB chainloader."""

from __future__ import annotations

import itertools
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.proc import alive
from initramfs import uki
from qemu import harness
from qemu.harness import Disk, Machine, MachineSpec
from tests.runtime.harness import wait_until


def spec(tmp_path: Path, **kw: object) -> MachineSpec:
    base = {"workdir": tmp_path, "kernel": tmp_path / "vmlinuz", "initrd": tmp_path / "initrd",
            "append": "console=ttyS0", "forwards": {443: 40443}}
    base.update(kw)
    return MachineSpec(**base)  # type: ignore[arg-type]


def test_network_is_restricted_and_only_forwards_reach_the_host(tmp_path: Path) -> None:
    argv = Machine(spec(tmp_path)).argv()
    netdev = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in netdev
    assert "hostfwd" not in netdev
    (fwd,) = [p for p in netdev.split(",") if p.startswith("guestfwd=")]
    assert fwd.startswith(f"guestfwd=tcp:{harness.GUEST_HOST}:443-cmd:")
    assert fwd.endswith("forward.py 40443")
    assert "tcg" in argv[argv.index("-accel") + 1]


def test_disks_get_their_serials_and_files(tmp_path: Path) -> None:
    disks = [Disk(tmp_path / "a.img", "SERA", "nvme", 1 << 20),
             Disk(tmp_path / "b.img", "SERB", "virtio", 1 << 20)]
    argv = Machine(spec(tmp_path, disks=disks)).argv()
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert "nvme,serial=SERA,drive=d0" in devices
    assert "virtio-blk-pci,serial=SERB,drive=d1" in devices
    assert (tmp_path / "a.img").stat().st_size == 1 << 20


def test_kernel_args_refuse_spaces() -> None:
    assert "bc.node=n1" in harness.kernel_args(node="n1")
    with pytest.raises(ValueError, match="spaces"):
        harness.kernel_args(node="n 1")


def test_forwarder_relays_a_connection_to_the_loopback_port() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(100)
                if not chunk:
                    break
                data += chunk
            conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    guest, qemu_side = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(Path(harness.__file__).parent / "forward.py"),
                             str(port)], stdin=qemu_side.fileno(), stdout=qemu_side.fileno(),
                            stderr=subprocess.DEVNULL, pass_fds=())
    qemu_side.close()
    guest.sendall(b"hello gateway\n")
    guest.settimeout(30)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = guest.recv(100)
        if not chunk:
            break
        reply += chunk
    assert reply == b"HELLO GATEWAY\n"
    guest.close()
    assert proc.wait(30) == 0
    server.close()


def test_qemu_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A test runner killed outright (a timeout's SIGKILL) must not leave its QEMU running."""
    fake = tmp_path / "fake-qemu"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    starter = (
        "import dataclasses, sys, time\n"
        "from pathlib import Path\n"
        "from qemu import harness\n"
        "amd64 = harness.PLATFORMS['amd64']\n"
        f"harness.PLATFORMS['amd64'] = dataclasses.replace(amd64, qemu={str(fake)!r})\n"
        f"m = harness.Machine(harness.MachineSpec(Path({str(tmp_path)!r}), Path('k'), Path('i')))\n"
        "m.start()\n"
        "print(m.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", starter], cwd=Path(harness.ROOT),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None
        qemu_pid = int(runner.stdout.readline())
        assert Path(f"/proc/{qemu_pid}").exists()
        # setpriv sets the parent-death signal before it execs: kill the starter only once the
        # fake QEMU runs (on a loaded machine setpriv may not have got that far yet).
        wait_until(lambda: Path(f"/proc/{qemu_pid}/comm").read_text().strip() == "sleep", 10,
                   "the fake QEMU to start")
        runner.kill()
        runner.wait(10)
        wait_until(lambda: not alive(qemu_pid), 10, "QEMU to end with the process that started it")
    finally:
        runner.kill()


def test_arm64_is_a_virt_machine_booted_by_uefi_with_a_virtio_console_shell(tmp_path: Path) -> None:
    argv = Machine(spec(tmp_path, arch="arm64")).argv()
    assert argv[0] == "qemu-system-aarch64"
    assert argv[argv.index("-machine") + 1] == "virt"
    assert argv[argv.index("-bios") + 1] == "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"
    assert "virtconsole,chardev=sh0" in argv
    assert argv.count("-serial") == 1  # virt has one UART: the console
    assert "console=ttyAMA0,115200" in harness.kernel_args(harness.PLATFORMS["arm64"].console)


def test_arm64_pxe_is_the_firmwares_own_loading_grub_not_an_x86_nic_rom(tmp_path: Path) -> None:
    machine = Machine(spec(tmp_path, arch="arm64", pxe=True))
    machine.http = harness.BootFileServer(tmp_path)  # as start() would have, not started
    try:
        argv = machine.argv()
    finally:
        machine.http.httpd.server_close()
    netdev = argv[argv.index("-netdev") + 1]
    assert ",bootfile=bootaa64.efi" in netdev
    nic = [argv[i + 1] for i, a in enumerate(argv) if a == "-device" and argv[i + 1].startswith("virtio-net")]
    assert nic == ["virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56,bootindex=1,romfile="]


def test_firmware_pxe_on_amd64_leaves_the_nic_without_qemus_ipxe_rom(tmp_path: Path) -> None:
    """The site lab's attested node (qemu/siteattest.py): OVMF's own PXE on a tap, a TPM; the
    plain x86 PXE node keeps QEMU's iPXE ROM (the romfile default)."""
    def nic(**kw: object) -> list[str]:
        argv = Machine(spec(tmp_path, pxe=True, uefi=True, tap="tap0", **kw)).argv()
        return [d for a, d in itertools.pairwise(argv) if a == "-device" and d.startswith("virtio-net")]

    assert nic() == ["virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56,bootindex=1"]
    assert nic(firmware_pxe=True) == ["virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56,bootindex=1,romfile="]
    argv = Machine(spec(tmp_path, pxe=True, uefi=True, tap="tap0", firmware_pxe=True,
                        tpm=tmp_path / "swtpm.sock")).argv()
    assert "tpm-tis,tpmdev=tpm0" in argv and "-kernel" not in argv
    assert argv[argv.index("-netdev") + 1] == "tap,id=net0,ifname=tap0,script=no,downscript=no"


def test_uefi_on_amd64_is_ovmf_and_disk_boot_boots_the_first_disk(tmp_path: Path) -> None:
    plain = Machine(spec(tmp_path)).argv()
    assert "-bios" not in plain and "-kernel" in plain
    disks = [Disk(tmp_path / "a.img", "SERA", "nvme", 1 << 20),
             Disk(tmp_path / "b.img", "SERB", "nvme", 1 << 20)]
    argv = Machine(spec(tmp_path, uefi=True, disk_boot=True, disks=disks)).argv()
    assert argv[argv.index("-bios") + 1] == "/usr/share/ovmf/OVMF.fd"
    assert "-kernel" not in argv
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert "nvme,serial=SERA,drive=d0,bootindex=1" in devices
    assert "nvme,serial=SERB,drive=d1" in devices


def test_arm64_attestation_is_a_tis_device_aavmf_on_pflash_and_the_esp_not_kernel(tmp_path: Path) -> None:
    code, variables = tmp_path / "AAVMF_CODE.fd", tmp_path / "AAVMF_VARS.fd"
    argv = Machine(spec(tmp_path, arch="arm64", tpm=tmp_path / "swtpm.sock", esp=tmp_path / "esp",
                        pflash=(code, variables))).argv()
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert "tpm-tis-device,tpmdev=tpm0" in devices and "tpm-tis,tpmdev=tpm0" not in devices
    drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
    assert drives[:2] == [f"if=pflash,format=raw,readonly=on,file={code}",
                          f"if=pflash,format=raw,file={variables}"]
    assert "-bios" not in argv and "-kernel" not in argv
    assert f"if=none,id=esp,format=raw,readonly=on,file=fat:{tmp_path / 'esp'}" in drives


def test_secure_boot_is_ovmf_on_pflash_with_smm_and_the_pflash_secure(tmp_path: Path) -> None:
    """OVMF's Secure Boot build writes its authenticated variables from SMM only: the machine
    gets SMM and the flash its secure property (qemu/secureboot.py); never without pflash; on
    arm64 AAVMF on pflash as ever."""
    code, variables = tmp_path / "OVMF_CODE_4M.secboot.fd", tmp_path / "OVMF_VARS_4M.fd"
    argv = Machine(spec(tmp_path, uefi=True, pflash=(code, variables), secure_boot=True)).argv()
    assert argv[argv.index("-machine") + 1] == "q35,smm=on"
    assert argv[argv.index("-global") + 1] == "driver=cfi.pflash01,property=secure,value=on"
    drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
    assert drives[:2] == [f"if=pflash,format=raw,readonly=on,file={code}",
                          f"if=pflash,format=raw,file={variables}"]
    assert "-bios" not in argv
    plain = Machine(spec(tmp_path, uefi=True, pflash=(code, variables))).argv()
    assert plain[plain.index("-machine") + 1] == "q35" and "-global" not in plain
    with pytest.raises(ValueError, match="Secure Boot firmware on pflash"):
        Machine(spec(tmp_path, uefi=True, secure_boot=True)).argv()
    # arm64: AAVMF with the fleet's keys in its variables; QEMU's virt has no SMM to ask for.
    arm = Machine(spec(tmp_path, arch="arm64", pflash=(code, variables), secure_boot=True)).argv()
    assert arm[arm.index("-machine") + 1] == "virt" and "-global" not in arm
    assert f"if=pflash,format=raw,file={variables}" in arm


def test_grub_chainloader_starts_one_image_and_takes_no_script_from_a_path() -> None:
    with pytest.raises(ValueError, match="GRUB's script"):
        harness.grub_chainloader(Path("/nonexistent/BOOTAA64.EFI"), "/EFI/Linux/a.efi\nlinux /x")
    with pytest.raises(ValueError, match="GRUB's script"):
        harness.grub_chainloader(Path("/nonexistent/BOOTAA64.EFI"), "EFI/Linux/ramdisk.efi; boot")


def test_grub_chainloader_is_an_arm64_efi_image_with_its_script(tmp_path: Path) -> None:
    if shutil.which("grub-mkimage") is None:
        pytest.skip("grub-mkimage is not installed (apt-get install grub-common)")
    known = subprocess.run(["apt-cache", "show", "--no-all-versions", "grub-efi-arm64-bin:arm64"],
                           capture_output=True, check=False)
    if known.returncode != 0:
        pytest.skip("apt does not know arm64 packages here (dpkg --add-architecture arm64; apt-get update)")
    target = harness.grub_chainloader(tmp_path / "EFI" / "BOOT" / "BOOTAA64.EFI", "/EFI/Linux/ramdisk.efi")
    data = target.read_bytes()
    assert uki.pe_arch(data) == "arm64"
    assert b"chainloader /EFI/Linux/ramdisk.efi\nboot\n" in data  # the embedded script
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["BOOT", "BOOTAA64.EFI", "EFI"]  # nothing beside it


def test_a_keyboard_is_a_qmp_socket_only_when_asked_for_and_takes_key_names_only(tmp_path: Path) -> None:
    assert "-qmp" not in Machine(spec(tmp_path)).argv()
    machine = Machine(spec(tmp_path, qmp=True))
    argv = machine.argv()
    assert argv[argv.index("-qmp") + 1] == f"unix:{machine.qmp_socket},server=on,wait=off"
    with pytest.raises(ValueError, match="without a keyboard"):
        Machine(spec(tmp_path)).press("f12")
    with pytest.raises(ValueError, match="not a QEMU key name"):
        machine.press('f12"}]}')


def test_qmp_answers_a_command_and_names_an_error(tmp_path: Path) -> None:
    """A real QEMU's monitor (no machine: -M none starts in a moment and runs nothing)."""
    if shutil.which(harness.QEMU) is None:
        pytest.skip(f"{harness.QEMU} is not installed")
    sock = tmp_path / "qmp.sock"
    qemu = subprocess.Popen([harness.QEMU, "-M", "none", "-nodefaults", "-display", "none",
                             "-qmp", f"unix:{sock},server=on,wait=off"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, 30, "QEMU's QMP socket")
        assert harness.qmp(sock, "query-status")["return"]["status"] in ("prelaunch", "running", "paused")
        with pytest.raises(harness.QmpError, match="no-such-command"):
            harness.qmp(sock, "no-such-command")
        with pytest.raises(harness.QmpError, match="send-key"):
            harness.qmp(sock, "send-key", {"keys": [{"type": "qcode", "data": "no-such-key"}]})
    finally:
        qemu.kill()
        qemu.wait(10)
