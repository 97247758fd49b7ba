"""Boot the ramdisk in QEMU: NVMe and virtio disks, a serial console log, and a user-mode
network that reaches nothing but the test gateway (and, for a PXE boot, a boot file server)
on the host's loopback.

    with Machine(MachineSpec(workdir, kernel=..., initrd=..., append=..., forwards={443: port})) as m:
        m.start()
        m.wait_console(r"agent .* serving", timeout=120)

The network is ``-netdev user,restrict=on`` (the guest cannot reach the host or the outside)
with one ``guestfwd`` per forwarded port: a connection the guest opens to 10.0.2.100:PORT runs
qemu/forward.py, which dials 127.0.0.1:HOSTPORT. (A ``guestfwd`` to a ``tcp:`` chardev would
connect only once, when QEMU starts; the ``cmd:`` form runs one forwarder per connection.)

Software emulation (TCG) unless ``kvm=True`` is asked for: nested KVM on CI machines hangs
rather than fails. Every wait is bounded; on a timeout the guest is killed and the error
carries the tail of its console log. The console log is kept in the work directory.

PXE: ``MachineSpec.pxe`` boots from the network the way production does: QEMU's iPXE ROM gets
``boot.ipxe`` from the user network's built-in TFTP server; that script fetches the kernel and
initramfs over HTTP from a server on the host's loopback (through guestfwd) and boots them
with the given kernel command line.

Architectures and firmware (``MachineSpec.arch``, ``MachineSpec.uefi``): amd64 is a q35
machine with SeaBIOS, or OVMF (Debian's ``ovmf``) with ``uefi=True``, its PXE then done by the
EFI build of the same iPXE ROM; arm64 is ``-M virt`` with a Cortex-A72 and always UEFI (Debian's
``qemu-efi-aarch64``), which boots ``-kernel`` through QEMU's fw_cfg as a boot loader would.
Its console is the PL011 (ttyAMA0) and the test ramdisk's shell is on a virtio console (hvc0):
``virt`` has one UART. arm64 PXE: QEMU's NIC ROMs are x86 iPXE builds, so the firmware's own
PXE (edk2) fetches a GRUB EFI image by TFTP whose script does what boot.ipxe does (see
grub_netboot()). ``disk_boot=True`` boots the first disk through the firmware (an
installed node's ESP under UEFI) instead of ``-kernel`` or the network.

PCIe slots (amd64's q35): a Disk or an ExtraNic with a ``PciePort`` sits behind its own
``pcie-root-port`` whose link capability is that port's ``x-speed`` and ``x-width`` (a narrow
riser or a misset bifurcation, to the guest). QEMU 7.2's emulated endpoints (nvme,
virtio-net-pci) advertise and train x1 at 2.5 GT/s whatever the port is: the port's own
maximum is what the guest sees change, the device always trains at its own maximum.

QEMU's monitor (``MachineSpec.qmp``): a QMP socket, ``qmp()`` one command on it. A test's
keyboard: ``Machine.press`` sends a key to the machine's PS/2 keyboard, as an operator answers
a firmware prompt (OVMF's TPM Physical Presence confirmation) at a BMC's KVM console; a BMC's
power control (qemu/powered.py).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.proc import kill_group, run, spawn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GUEST_HOST = "10.0.2.100"   # the address the guest dials for every forwarded service
HTTP_PORT = 80              # guest-side port of the PXE boot file server
QEMU = "qemu-system-x86_64"


@dataclass(frozen=True)
class Platform:
    """How QEMU emulates one architecture (Debian's name is the key)."""
    qemu: str
    machine: str
    cpu: str                 # under TCG
    console: str             # the kernel's name for the first serial port
    shell_tty: str           # the test ramdisk's debug shell's port
    uefi_firmware: str       # Debian's UEFI build for it
    package: str             # what installs ``qemu``
    firmware_package: str    # what installs ``uefi_firmware``
    always_uefi: bool = False
    pxe_bootfile: str = "boot.ipxe"   # what the user network's DHCP names (TFTP)


PLATFORMS = {
    # qemu64 rather than max under TCG: glibc and OpenSSL then take their SSE2 paths, which
    # TCG translates and runs faster than the AVX2 ones (join 19.3 s against 20.7 s, median of
    # 3 boots); the guest needs nothing newer (Debian's baseline is x86-64).
    "amd64": Platform(QEMU, "q35", "qemu64", "ttyS0", "ttyS1", "/usr/share/ovmf/OVMF.fd", "qemu-system-x86",
                      "ovmf"),
    # cortex-a72 rather than max: max's pointer authentication is slow under TCG, and Debian's
    # baseline is ARMv8.0.
    "arm64": Platform("qemu-system-aarch64", "virt", "cortex-a72", "ttyAMA0", "hvc0",
                      "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd", "qemu-system-arm",
                      "qemu-efi-aarch64", always_uefi=True, pxe_bootfile="bootaa64.efi"),
}

# arm64's UEFI on pflash (Debian's qemu-efi-aarch64): the build whose measured boot is checked
# (MachineSpec.pflash: the code, and a writable copy of the variables for each machine).
AAVMF_CODE = Path("/usr/share/AAVMF/AAVMF_CODE.fd")
AAVMF_VARS = Path("/usr/share/AAVMF/AAVMF_VARS.fd")


class BootError(RuntimeError):
    """The guest did not do what was awaited in time, or QEMU died; the message carries the
    tail of the console log."""


class QmpError(RuntimeError):
    """QEMU's monitor answered a command with an error."""


class QmpClosed(QmpError):
    """QEMU's monitor hung up before its answer (as it may after ``quit``)."""


@dataclass(frozen=True)
class PciePort:
    """A pcie-root-port's link capability, in QEMU's words (its defaults: 16 GT/s, x32)."""
    speed: str = "16"             # x-speed: 2_5, 5, 8, 16
    width: int = 32               # x-width: 1, 2, 4, 8, 12, 16, 32


@dataclass(frozen=True)
class Disk:
    path: Path
    serial: str
    interface: str = "nvme"       # "nvme" or "virtio"
    size: int = 64 * 1024 * 1024  # bytes; used only when the file is created
    port: PciePort | None = None  # behind a pcie-root-port of its own (q35)

    def create(self) -> None:
        if not self.path.exists():
            with self.path.open("wb") as f:
                f.truncate(self.size)


@dataclass(frozen=True)
class ExtraNic:
    """A second (third, ...) virtio NIC on a user network of its own (10.0.3.0/24, ...) that
    reaches nothing."""
    speed_mbps: int = 0           # the link speed it reports (virtio-net-pci's speed=)
    port: PciePort | None = None


@dataclass(frozen=True)
class MachineSpec:
    workdir: Path
    kernel: Path
    initrd: Path
    append: str = ""
    disks: Sequence[Disk] = ()
    forwards: Mapping[int, int] = field(default_factory=dict)  # guest port on GUEST_HOST -> host port
    memory_mb: int = 1024
    cpus: int = 2
    kvm: bool = False
    pxe: bool = False             # boot by iPXE over the network instead of -kernel
    pxe_chain: str = ""           # with pxe (x86): boot.ipxe chains this URL (a site's /boot.ipxe)
    pxe_loader: Path | None = None  # with pxe (arm64): the EFI image TFTP serves (a site's GRUB)
    # With pxe on x86 UEFI: the NIC has no option ROM (QEMU's is iPXE, a driver in PCR 2), so
    # the firmware's own PXE boots what the network offers: on a site's network the ipxe.efi
    # its TFTP serves, started by LoadImage and measured into PCR 4, as on a server's NIC.
    firmware_pxe: bool = False
    name: str = "node"
    arch: str = "amd64"           # a key of PLATFORMS
    uefi: bool = False            # UEFI firmware (always on arm64)
    disk_boot: bool = False       # the firmware boots the first disk (kernel, initrd unused)
    # CD drives on a virtio-scsi controller (a BMC's virtual media: qemu/powered.py), each an
    # ISO's path or "" for a drive without a medium (QMP blockdev-change-medium fills it later,
    # drive "cdrom<i>"); with ``media_boot`` the firmware boots the first one.
    media: Sequence[str] = ()
    media_boot: bool = False
    # Attestation (docs/attestation.md): a TPM 2.0 on the machine (tpm-tis on q35,
    # tpm-tis-device on arm64's virt), served by swtpm on this control socket (qemu/tpm.py);
    # and a folder the firmware boots as a FAT disk (a UKI at EFI/BOOT/BOOTX64.EFI, BOOTAA64.EFI
    # on arm64), instead of -kernel.
    tpm: Path | None = None
    esp: Path | None = None
    # Another UEFI build on pflash instead of -bios: (code, a writable copy of its variables);
    # on arm64 AAVMF, whose measured boot is checked (tests/e2e/test_attest_arm64.py).
    pflash: tuple[Path, Path] | None = None
    # With ``pflash``, its variables holding a fleet's keys (qemu/secureboot.py): on amd64 the
    # Secure Boot build of OVMF, which needs SMM and the pflash's secure property (only SMM code
    # writes its authenticated variables); on arm64 AAVMF as ever (Debian builds it with Secure
    # Boot: its .ms and .snakeoil names are links to it), whose ``virt`` machine has no SMM.
    secure_boot: bool = False

    @property
    def platform(self) -> Platform:
        return PLATFORMS[self.arch]

    @property
    def firmware(self) -> str | None:
        """The UEFI firmware image, or None for QEMU's default BIOS."""
        p = self.platform
        return p.uefi_firmware if self.uefi or p.always_uefi else None
    # A tap device (made by the caller, e.g. on a bridge in a network namespace: qemu/sitelab.py)
    # instead of the user network: no guestfwd, no built-in TFTP; with ``pxe`` the NIC's iPXE
    # ROM boots from whatever DHCP and boot servers that network has.
    tap: str = ""
    # The first serial port also on this TCP port of 127.0.0.1, which QEMU dials at start (the
    # line to the emulated BMC's SOL: qemu/serialrelay.py), its output still logged; 0: the log alone.
    serial_port: int = 0
    mac: str = "52:54:00:12:34:56"
    nics: Sequence[ExtraNic] = ()
    # QEMU's monitor on a QMP socket (``Machine.qmp_socket``): power control from outside, and
    # a keyboard a test can press (``Machine.press``: send-key reaches the machine's PS/2
    # keyboard as an operator's keys at a BMC's KVM console do). Not the serial line: OVMF's
    # serial console is a PC ANSI terminal (its ConIn device path), for which edk2's TerminalDxe
    # maps no F11 or F12, and the ESC that starts every other terminal's F12 reads as Escape.
    qmp: bool = False

    @property
    def console_log(self) -> Path:
        return self.workdir / f"{self.name}-console.log"


def qemu_available(arch: str = "amd64", *, uefi: bool = False) -> str | None:
    """Why QEMU boots of ``arch`` cannot run here, or None when they can."""
    p = PLATFORMS[arch]
    if shutil.which(p.qemu) is None:
        return f"{p.qemu} is not installed (apt-get install {p.package})"
    if (uefi or p.always_uefi) and not Path(p.uefi_firmware).is_file():
        return f"no UEFI firmware {p.uefi_firmware} (apt-get install {p.firmware_package})"
    return None


def kvm_wanted() -> bool:
    return os.environ.get("BC_QEMU_KVM", "") == "1" and os.access("/dev/kvm", os.R_OK | os.W_OK)


def kernel_args(console: str = "ttyS0", **params: str) -> str:
    """``bc.*`` kernel parameters (values must not contain spaces) after the console ones.
    ``cryptomgr.notests``: the kernel's boot-time self-tests of its crypto algorithms took
    ~0.9 s of the boot under TCG; nothing in the ramdisk relies on kernel crypto being
    re-verified at boot (TLS, hashes and signatures are userspace OpenSSL). ``console``: the
    serial port's name (ttyAMA0 on arm64, see PLATFORMS)."""
    words = [f"console={console},115200", "panic=-1", "quiet", "loglevel=4", "cryptomgr.notests"]
    for key, value in params.items():
        if any(c.isspace() for c in value):
            raise ValueError(f"bc.{key}: a kernel parameter cannot hold spaces: {value!r}")
        words.append(f"bc.{key}={value}")
    return " ".join(words)


def tied_to_this_process(argv: list[str]) -> list[str]:
    """``argv`` run so that it is killed when this process dies, however it dies: a test run
    stopped by a timeout's SIGTERM or a SIGKILL skips every ``finally`` and ``stop()``, and
    its QEMU would go on spinning a host core (with ``panic=-1`` a guest that cannot boot
    reboots forever), slowing every later boot and benchmark on the machine. util-linux's
    setpriv sets the parent-death signal and execs. The tie is to the thread that starts the
    machine: start machines from threads that outlive them (the main one here)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    served: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.served.append(f"{self.command} {self.path} {code}")

    def do_GET(self) -> None:
        """As SimpleHTTPRequestHandler, and one ``Range: bytes=a-b`` (or ``a-``) of a file
        answered 206, as the object stores and web servers images come from do (a site route
        with a manifest fetches each chunk so)."""
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if rng is None or not path.is_file():
            super().do_GET()
            return
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = int(rng.group(1))
            end = min(size, int(rng.group(2)) + 1) if rng.group(2) else size
            if start >= size or end <= start:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.flush()
            self.connection.sendfile(f, start, end - start)


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-body (a deploy that has all it needs, a relay that
        stopped) is not an error of the server's: say nothing; anything else as usual."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]  # the socket


class BootFileServer:
    """An HTTP server on 127.0.0.1 serving one directory (the PXE boot files)."""

    def __init__(self, directory: Path) -> None:
        self.served: list[str] = []   # "GET /vmlinuz 200", in order
        handler = functools.partial(type("Handler", (_QuietHandler,), {"served": self.served}),
                                    directory=str(directory))
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="pxe-http")

    def start(self) -> BootFileServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Machine:
    """One QEMU guest. Use as a context manager: leaving it kills the guest."""

    def __init__(self, spec: MachineSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.http: BootFileServer | None = None
        self.pxe_served: list[str] = []  # the PXE HTTP requests of the last boot
        self.shell_socket = spec.workdir / f"{spec.name}-shell.sock"
        self.qmp_socket = spec.workdir / f"{spec.name}-qmp.sock"
        self._shell: socket.socket | None = None
        self._shell_buf = b""
        self._shell_seq = 0

    # -- lifecycle ------------------------------------------------------------------------

    def argv(self) -> list[str]:
        spec = self.spec
        fwd = dict(spec.forwards)
        if spec.tap:
            netdev = f"tap,id=net0,ifname={spec.tap},script=no,downscript=no"
        else:
            netdev = "user,id=net0,restrict=on,net=10.0.2.0/24,host=10.0.2.2"
            if spec.pxe:
                assert self.http is not None
                fwd[HTTP_PORT] = self.http.port
                netdev += f",tftp={self._pxe_dir()},bootfile={spec.platform.pxe_bootfile}"
            for guest_port, host_port in sorted(fwd.items()):
                cmd = f"{sys.executable} -I -S {HERE / 'forward.py'} {int(host_port)}"
                netdev += f",guestfwd=tcp:{GUEST_HOST}:{int(guest_port)}-cmd:{cmd}"
        accel = "kvm" if spec.kvm else "tcg,thread=multi"
        plat = spec.platform
        cpu = "host" if spec.kvm else os.environ.get("BC_QEMU_CPU", plat.cpu)
        machine = plat.machine
        if spec.secure_boot:
            if spec.pflash is None:
                raise ValueError("secure_boot: a Secure Boot firmware on pflash (qemu/secureboot.py)")
            if spec.arch == "amd64":
                machine += ",smm=on"
        argv = [
            plat.qemu, "-machine", machine, "-accel", accel, "-cpu", cpu,
            "-m", str(spec.memory_mb), "-smp", str(spec.cpus),
            "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
            "-chardev", f"file,id=con0,path={spec.console_log}" if not spec.serial_port else
            f"socket,id=con0,host=127.0.0.1,port={spec.serial_port},server=off,"
            f"logfile={spec.console_log}", "-serial", "chardev:con0",
            "-chardev", f"socket,id=sh0,path={self.shell_socket},server=on,wait=off",
        ]
        if plat.shell_tty.startswith("hvc"):
            argv += ["-device", "virtio-serial-pci", "-device", "virtconsole,chardev=sh0"]
        else:
            argv += ["-serial", "chardev:sh0"]
        if spec.pflash is not None:
            if spec.secure_boot and spec.arch == "amd64":
                argv += ["-global", "driver=cfi.pflash01,property=secure,value=on"]
            argv += ["-drive", f"if=pflash,format=raw,readonly=on,file={spec.pflash[0]}",
                     "-drive", f"if=pflash,format=raw,file={spec.pflash[1]}"]
        elif spec.firmware is not None:
            argv += ["-bios", spec.firmware]
        elif spec.serial_port and spec.arch == "amd64":
            # A BMC's SOL line: SeaBIOS writes its screen to the serial port too (its "sercon",
            # a server's BIOS console redirection); the fw_cfg file holds the port, 0x3f8.
            sercon = spec.workdir / "sercon-port.bin"
            sercon.write_bytes((0x3F8).to_bytes(2, "little"))
            argv += ["-fw_cfg", f"name=etc/sercon-port,file={sercon}"]
        argv += [
            "-netdev", netdev,
            "-device", f"virtio-net-pci,netdev=net0,mac={spec.mac}"
            + (",bootindex=1" if spec.pxe else "")
            # QEMU's NIC ROM is iPXE for x86: arm64's firmware (and firmware_pxe) does PXE itself.
            + ("" if spec.pxe and spec.arch == "amd64" and not spec.firmware_pxe else ",romfile="),
            "-device", "virtio-rng-pci",
        ]
        ports: list[str] = []

        def behind(port: PciePort | None) -> str:
            """",bus=rpN" for a device behind a new root port with ``port``'s link, or ""."""
            if port is None:
                return ""
            n = len(ports) + 1
            ports.append(f"pcie-root-port,id=rp{n},chassis={n},x-speed={port.speed},x-width={port.width}")
            argv.extend(["-device", ports[-1]])
            return f",bus=rp{n}"

        for i, disk in enumerate(spec.disks):
            disk.create()
            argv += ["-drive", f"file={disk.path},if=none,id=d{i},format=raw,cache=unsafe,discard=unmap"]
            boot = ",bootindex=1" if spec.disk_boot and i == 0 else ""
            bus = behind(disk.port)
            if disk.interface == "nvme":
                argv += ["-device", f"nvme,serial={disk.serial},drive=d{i}{boot}{bus}"]
            else:
                argv += ["-device", f"virtio-blk-pci,serial={disk.serial},drive=d{i}{boot}{bus}"]
        for i, nic in enumerate(spec.nics, start=1):
            bus = behind(nic.port)
            speed = f",speed={nic.speed_mbps},duplex=full" if nic.speed_mbps else ""
            mac = f"52:54:00:12:35:{i:02x}"
            # A subnet of its own: were it 10.0.2.0/24 too, the guest would have two routes to
            # the gateway's 10.0.2.100 and could ARP for it on this network, which has none.
            argv += ["-netdev", f"user,id=nic{i},restrict=on,net=10.0.{2 + i}.0/24",
                     "-device", f"virtio-net-pci,netdev=nic{i},mac={mac},romfile={speed}{bus}"]
        if spec.media:
            argv += ["-device", "virtio-scsi-pci,id=scsi0"]
            for i, iso in enumerate(spec.media):
                if "," in iso:
                    raise ValueError(f"a medium's path with a comma (QEMU's option separator): {iso!r}")
                medium = f",file={iso},format=raw" if iso else ""
                boot = ",bootindex=1" if spec.media_boot and i == 0 else ""
                argv += ["-drive", f"if=none,id=cd{i},media=cdrom,readonly=on{medium}",
                         "-device", f"scsi-cd,bus=scsi0.0,drive=cd{i},id=cdrom{i}{boot}"]
        if spec.tpm is not None:
            device = "tpm-tis" if spec.arch == "amd64" else "tpm-tis-device"
            argv += ["-chardev", f"socket,id=chrtpm,path={spec.tpm}",
                     "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", f"{device},tpmdev=tpm0"]
        if spec.esp is not None:
            if "," in str(spec.esp):
                raise ValueError(f"an ESP folder with a comma (QEMU's option separator): {spec.esp}")
            argv += ["-drive", f"if=none,id=esp,format=raw,readonly=on,file=fat:{spec.esp}",
                     "-device", "virtio-blk-pci,drive=esp,bootindex=1"]
        if not spec.pxe and not spec.disk_boot and not spec.media_boot and spec.esp is None:
            argv += ["-kernel", str(spec.kernel), "-initrd", str(spec.initrd), "-append", spec.append]
        if spec.qmp:
            argv += ["-qmp", f"unix:{self.qmp_socket},server=on,wait=off"]
        return argv

    def _pxe_dir(self) -> Path:
        return self.spec.workdir / f"{self.spec.name}-pxe"

    def _prepare_pxe(self) -> None:
        d = self._pxe_dir()
        d.mkdir(parents=True, exist_ok=True)
        for src, name in ((self.spec.kernel, "vmlinuz"), (self.spec.initrd, "initrd.img")):
            target = d / name
            if target.exists() or target.is_symlink():
                target.unlink()
            os.link(src, target) if src.stat().st_dev == d.stat().st_dev else shutil.copyfile(src, target)
        base = f"http://{GUEST_HOST}:{HTTP_PORT}"
        if self.spec.arch == "arm64" and self.spec.pxe_loader is not None:
            shutil.copyfile(self.spec.pxe_loader, d / self.spec.platform.pxe_bootfile)
        elif self.spec.arch == "arm64":
            grub_netboot(d / self.spec.platform.pxe_bootfile, self.spec.append)
            kernel = (d / "vmlinuz").read_bytes()
            if kernel[:2] == b"\x1f\x8b":  # GRUB's gzio cannot size a gzipped file over HTTP
                (d / "vmlinuz").unlink()
                (d / "vmlinuz").write_bytes(gzip.decompress(kernel))
        if self.spec.pxe_chain:
            if any(c.isspace() or c in "${}|&;" for c in self.spec.pxe_chain):
                raise ValueError(f"not a URL an iPXE script can hold: {self.spec.pxe_chain!r}")
            (d / "boot.ipxe").write_text(f"#!ipxe\nchain {self.spec.pxe_chain}\n")
        else:
            (d / "boot.ipxe").write_text(
                "#!ipxe\n"
                "echo bc-pxe: fetching the ramdisk over HTTP\n"
                f"kernel {base}/vmlinuz initrd=initrd.img {self.spec.append}\n"
                f"initrd {base}/initrd.img\n"
                "boot\n"
            )
        self.http = BootFileServer(d).start()
        self.pxe_served = self.http.served

    def start(self) -> Machine:
        self.spec.workdir.mkdir(parents=True, exist_ok=True)
        self.spec.console_log.unlink(missing_ok=True)
        self.shell_socket.unlink(missing_ok=True)
        self.qmp_socket.unlink(missing_ok=True)
        if self.spec.pxe and not self.spec.tap:
            self._prepare_pxe()
        log = (self.spec.workdir / f"{self.spec.name}-qemu.log").open("wb")
        self.started_at = time.monotonic()
        self.proc = spawn(tied_to_this_process(self.argv()), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def stop(self) -> None:
        if self._shell is not None:
            self._shell.close()
            self._shell = None
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, grace=1.0)
        if self.http is not None:
            self.http.stop()
            self.http = None

    def __enter__(self) -> Machine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    # -- console --------------------------------------------------------------------------

    def console(self) -> str:
        try:
            return self.spec.console_log.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def console_tail(self, lines: int = 40) -> str:
        tail = self.console().replace("\r", "").splitlines()[-lines:]
        qlog = self.spec.workdir / f"{self.spec.name}-qemu.log"
        qemu_out = qlog.read_text(errors="replace").strip() if qlog.exists() else ""
        text = "\n".join(tail)
        if qemu_out:
            text += "\n-- qemu --\n" + qemu_out[-2000:]
        return text

    def fail(self, what: str) -> BootError:
        """Kill the guest and describe the failure with the console's tail."""
        tail = self.console_tail()
        self.stop()
        return BootError(f"{self.spec.name}: {what} (after {self.elapsed():.0f}s); "
                         f"console log {self.spec.console_log}:\n{tail}")

    def wait_console(self, pattern: str, timeout: float, *, after: int = 0) -> re.Match[str]:
        """Wait until the console log (from offset ``after``) matches ``pattern``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = regex.search(self.console(), after)
            if m:
                return m
            if not self.alive:
                raise self.fail(f"QEMU exited while waiting for /{pattern}/")
            if time.monotonic() > deadline:
                raise self.fail(f"timed out after {timeout:g}s waiting for /{pattern}/ on the console")
            time.sleep(0.2)

    # -- the keyboard (MachineSpec.qmp) ---------------------------------------------------

    def press(self, key: str, timeout: float = 10.0) -> None:
        """Press and release ``key`` (QEMU's name for it, a qcode: "f12", "esc", "ret") on the
        machine's keyboard."""
        if not self.spec.qmp:
            raise ValueError(f"{self.spec.name}: booted without a keyboard (MachineSpec.qmp)")
        if not re.fullmatch(r"[a-z0-9_]+", key):
            raise ValueError(f"not a QEMU key name: {key!r}")
        qmp(self.qmp_socket, "send-key", {"keys": [{"type": "qcode", "data": key}]}, timeout)

    # -- the debug shell (test ramdisks only) ---------------------------------------------

    def shell(self, command: str, timeout: float = 60.0) -> tuple[int, str]:
        """Run a shell command in the guest through its second serial port (a test ramdisk
        starts a shell there, see tests/e2e/conftest.py); (exit status, output)."""
        if self._shell is None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(str(self.shell_socket))
                    break
                except OSError:
                    s.close()
                    if time.monotonic() > deadline or not self.alive:
                        raise self.fail("the guest's debug shell socket did not open") from None
                    time.sleep(0.2)
            self._shell = s
        self._shell_seq += 1
        tag = f"__BC_DONE_{self._shell_seq}__"
        self._shell.sendall(f"{command}; echo {tag} $?\n".encode())
        regex = re.compile(rf"(?m)^{tag} (\d+)\s*$")
        deadline = time.monotonic() + timeout
        self._shell.settimeout(0.5)
        while True:
            text = self._shell_buf.decode("utf-8", "replace").replace("\r", "")
            m = regex.search(text)
            if m:
                out = text[: m.start()]
                self._shell_buf = self._shell_buf[len(text[: m.end()].encode()):]
                return int(m.group(1)), out
            if time.monotonic() > deadline:
                raise self.fail(f"shell command timed out after {timeout:g}s: {command}")
            with contextlib.suppress(TimeoutError):
                chunk = self._shell.recv(65536)
                if not chunk:
                    raise self.fail("the guest's debug shell closed")
                self._shell_buf += chunk


def qmp(path: Path, command: str, arguments: Mapping[str, object] | None = None,
        timeout: float = 10.0) -> dict[str, object]:
    """One command to the QEMU monitor listening on the unix socket ``path`` (``-qmp
    unix:PATH,server=on,wait=off``), on a connection of its own: the greeting, capabilities
    negotiation, the command; its answer (``{"return": ...}``). Events in between are skipped.
    QmpError for an error answer, QmpClosed for a connection closed before it; OSError where
    the socket cannot be reached."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        f = s.makefile("rwb")
        f.readline()  # the greeting
        answer: dict[str, object] = {}
        for cmd, args in (("qmp_capabilities", None), (command, arguments)):
            f.write(json.dumps({"execute": cmd, **({"arguments": dict(args)} if args else {})}).encode()
                    + b"\n")
            f.flush()
            while True:
                line = f.readline()
                if not line:
                    raise QmpClosed(f"QMP {cmd}: the monitor closed the connection")
                answer = json.loads(line)
                if "event" in answer:
                    continue
                if "error" in answer:
                    raise QmpError(f"QMP {cmd}: {answer['error']}")
                break
        return answer


GRUB_MODULES = ("efinet", "tftp", "http", "linux", "gzio", "echo", "boot")


def grub_netboot(target: Path, append: str) -> Path:
    """arm64's PXE boot loader: the firmware's own PXE (edk2's, over the virtio NIC) fetches
    ``target`` by TFTP and runs it: a GRUB EFI image (Debian's grub-efi-arm64-bin modules,
    the .deb downloaded and unpacked, not installed; the host's grub-mkimage) whose embedded
    script fetches the kernel and initramfs over HTTP and boots them with ``append``, as
    boot.ipxe does on x86. The kernel is served as the Image, unpacked: GRUB's gzio cannot
    size a gzipped file over HTTP ("out of memory")."""
    if any(c in append for c in "\"'$;{}|&<>\\\n"):
        raise ValueError(f"kernel command line with characters GRUB's script would parse: {append!r}")
    script = target.with_suffix(".cfg")
    server = f"(http,{GUEST_HOST})"
    script.write_text("echo bc-pxe: GRUB fetching the ramdisk over HTTP\n"
                      f"linux {server}/vmlinuz {append}\n"
                      f"initrd {server}/initrd.img\n"
                      "boot\n")
    run(["grub-mkimage", "-O", "arm64-efi", "-d", str(arm64_grub_modules()), "-o", str(target),
         "-p", "/", "-c", str(script), *GRUB_MODULES], timeout=120)
    return target


def arm64_grub_modules() -> Path:
    """The arm64-efi modules of Debian's grub-efi-arm64-bin (the .deb downloaded and unpacked
    into initramfs/out/arm64/grub, not installed), for the host's grub-mkimage."""
    from initramfs import build as ramdisk

    arch = ramdisk.ARCHES["arm64"]
    if shutil.which("grub-mkimage") is None:
        raise FileNotFoundError("grub-mkimage is missing (apt-get install grub-common)")
    out = ramdisk.out_dir(arch)
    (deb,) = ramdisk.download(["grub-efi-arm64-bin"], out / "debs", arch)
    return ramdisk.unpacked(deb, out / "grub") / "usr/lib/grub/arm64-efi"


GRUB_CHAIN_MODULES = ("part_msdos", "part_gpt", "fat", "chain", "echo", "boot")


def grub_chainloader(target: Path, image: str) -> Path:
    """An arm64 GRUB EFI image at ``target`` whose embedded script starts the EFI image
    ``image`` (a path on the disk GRUB was loaded from: a UKI in an ESP) with ``chainloader``
    and no arguments of its own: the UKI's command line is its own, and the firmware's
    LoadImage measures it into PCR 4 after GRUB (docs/attestation.md, ``loaders``)."""
    if not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", image):
        raise ValueError(f"an EFI image path GRUB's script would parse: {image!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "grub.cfg"
        script.write_text(f"echo bc-grub: starting {image}\nchainloader {image}\nboot\n")
        run(["grub-mkimage", "-O", "arm64-efi", "-d", str(arm64_grub_modules()), "-o", str(target),
             "-p", "/EFI/BOOT", "-c", str(script), *GRUB_CHAIN_MODULES], timeout=120)
    return target


def make_disk_image(path: Path, size: int) -> Path:
    """A sparse raw file of ``size`` bytes."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


@contextlib.contextmanager
def booted(spec: MachineSpec) -> Iterator[Machine]:
    machine = Machine(spec)
    try:
        yield machine.start()
    finally:
        machine.stop()


def qemu_version(arch: str = "amd64") -> str:
    return run([PLATFORMS[arch].qemu, "--version"], timeout=30).text.splitlines()[0]
