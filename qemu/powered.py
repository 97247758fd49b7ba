"""A QEMU node whose power and next boot device are driven from outside, the way a BMC
drives a server: by short-lived programs (ipmi_sim's ``chassis_control``, the Redfish
emulator's hook, a test) that share nothing but one directory, the node directory.

Interface (stable: the IPMI and Redfish emulator fixtures both use it)::

    node = PoweredNode(Path(dir))
    node.configure(NodeSpec(kernel=..., initrd=..., append=..., owner_pid=os.getpid()))
    node.set_boot("pxe")           # next start boots by PXE ("pxe"), from "disk" or the "cdrom"
    node.insert_media("cd", URL)   # virtual media: the ISO at URL (or a local path) downloaded
                                   # into the node directory and put in the drive (QMP when on)
    node.eject_media("cd")         # the drive emptied ("usb": the second drive, the same way)
    node.start()                   # power on: QEMU starts (no-op when already on)
    node.status()                  # "on" | "off"
    node.reset()                   # QMP system_reset: the guest re-boots, QEMU stays
    node.stop(force=False)         # QMP system_powerdown: ACPI power button (the guest decides)
    node.stop(force=True)          # QMP quit, then SIGKILL: power pulled
    node.boots()                   # one BootRecord per start or reset, oldest first
    node.write_chassis_control(p)  # the program ipmi_sim runs as its chassis_control (below)

The same from a shell (what an emulator runs)::

    python -m qemu.powered DIR status | start | stop [--force] | reset | boot [pxe|disk|cdrom]
    python -m qemu.powered DIR insert cd|usb URL | eject cd|usb
    python -m qemu.powered DIR chassis-control MC get power boot
    python -m qemu.powered DIR chassis-control MC set power 1 | power 0 | shutdown 1 | reset 1
                                                   | boot pxe|default|cdrom|bios|none

``chassis-control`` speaks OpenIPMI ipmi_sim's chassis_control protocol: ``get`` prints one
``parm:value`` line per parameter, ``set`` prints nothing on success; on error a message on
stdout and exit 1. ipmi_sim maps ``chassis power soft`` to ``set shutdown 1``, ``power off``
to ``set power 0``, ``reset`` to ``set reset 1`` and ``cycle`` to off then on.

The node directory holds ``node.json`` (the NodeSpec), ``boot`` (the next boot device),
``supervisor.pid``, ``qmp.sock``, ``boots.log`` (one line per boot: time, device, how),
``swtpm.sock`` where the node has a TPM (``tpm_state``: swtpm serves that state folder to each
power-on, so the TPM keeps its keys and is reset at power on as a server's is) and the
harness's console and QEMU logs. A start runs a small supervisor, detached from the
caller (the chassis_control process exits at once), which runs qemu/harness.py's Machine
with a QMP socket added, serves the PXE files when booting by PXE, records each PXE boot in
``boots.log`` and ends with QEMU. It also ends QEMU when ``owner_pid`` (the test run) dies,
so that no guest outlives the run that made it, however that run ends.

"disk" stands for the installed OS: QEMU boots the kernel and initrd directly (-kernel), no
network boot. "pxe" boots through QEMU's iPXE ROM, which fetches the kernel and initrd over
HTTP from the supervisor (qemu/harness.py's PXE set-up); each fetch of the kernel is a boot
from the network, recorded as such. "cdrom" boots what is in the first virtual-media drive
through the firmware (SeaBIOS or OVMF, El Torito), as a BMC's virtual CD does.

Virtual media: the node always has two CD drives on a virtio-scsi controller, "cd" (the one a
"cdrom" boot boots) and "usb" (a BMC's second, removable medium: to the guest a second CD;
the ramdisk finds its config medium by label, not by drive). ``insert_media`` downloads the
image from its URL (or copies a local file: sushy-tools' emulator hands over the file it
downloaded) to ``media-<slot>.iso`` in the node directory, records it in ``media.json`` and,
when QEMU runs, changes the drive's medium through QMP; ``eject_media`` takes it out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent import proc
from agent.errors import AgentError

if TYPE_CHECKING:
    from qemu.harness import MachineSpec

BOOT_DEVICES = ("pxe", "disk", "cdrom")
# ipmi_sim's boot values -> ours; what the node cannot do (bios) boots from disk.
IPMI_BOOT = {"pxe": "pxe", "default": "disk", "none": "disk", "cdrom": "cdrom", "bios": "disk"}
MEDIA_SLOTS = ("cd", "usb")     # the virtual-media drives, in QEMU's order (cdrom0, cdrom1)


def default_boot_files() -> tuple[Path, Path] | None:
    """A kernel and an initrd to boot: the project's ramdisk (initramfs/out/) when built,
    else the host's Debian cloud kernel and its initrd; None when neither is there."""
    out = Path(__file__).resolve().parent.parent / "initramfs" / "out"
    if (out / "vmlinuz").is_file() and (out / "initramfs.img").is_file():
        return out / "vmlinuz", out / "initramfs.img"
    for kernel in sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"), reverse=True):
        initrd = kernel.with_name(kernel.name.replace("vmlinuz-", "initrd.img-"))
        if initrd.is_file():
            return kernel, initrd
    return None


ROOT = Path(__file__).resolve().parent.parent

# chassis_control for a machineless node, in sh (write_chassis_control says why); the same
# answers and files as PoweredNode.chassis_control. "$d" is the node directory.
_MACHINELESS_CHASSIS_CONTROL = r"""
power() { [ "$(cat "$d/power" 2>/dev/null)" = on ] && echo on || echo off; }
boot() { b=$(cat "$d/boot" 2>/dev/null); case $b in pxe|disk|cdrom) echo "$b";; *) echo disk;; esac; }
put() { printf '%s\n' "$2" > "$d/$1.tmp" && mv -f "$d/$1.tmp" "$d/$1"; }
record() { echo "$(date +%s.%3N) $1 $2" >> "$d/boots.log"; }
[ -f "$d/node.json" ] || { echo "qemu.powered: $d: not a configured node (no node.json)"; exit 1; }
op=$2; shift 2
case $op in
get)
  out=""
  for parm in "$@"; do
    case $parm in
    power) [ "$(power)" = on ] && line=power:1 || line=power:0;;
    boot) case $(boot) in pxe|cdrom) line="boot:$(boot)";; *) line=boot:default;; esac;;
    *) echo "invalid parameter: $parm"; exit 1;;
    esac
    out="$out$line
"
  done
  printf '%s' "$out";;
set)
  [ $(($# % 2)) -eq 0 ] || { echo "parameter and value pairs are required"; exit 1; }
  while [ $# -gt 0 ]; do
    parm=$1 value=$2; shift 2
    case $parm in
    power)
      if [ "$value" = 1 ]; then
        [ "$(power)" = on ] || { record "$(boot)" start; put power on; }
      else
        put power off
      fi;;
    shutdown) [ "$value" != 1 ] || put power off;;
    reset)
      if [ "$value" = 1 ]; then
        [ "$(power)" = on ] || { echo "the node is off: nothing to reset"; exit 1; }
        running=$(cat "$d/running-boot" 2>/dev/null || boot)
        record "$running" reset
      fi;;
    boot)
      case $value in
      pxe) put boot pxe;; cdrom) put boot cdrom;; default|none|bios) put boot disk;;
      *) echo "invalid boot value: $value"; exit 1;;
      esac;;
    identify) ;;
    *) echo "invalid parameter: $parm"; exit 1;;
    esac
  done;;
*) echo "unknown operation: $op"; exit 1;;
esac
"""


class PowerError(RuntimeError):
    """The node could not be driven as asked; the message says why."""


@dataclass(frozen=True)
class NodeSpec:
    kernel: str
    initrd: str
    append: str = ""
    memory_mb: int = 512
    cpus: int = 1
    kvm: bool = False
    disks: list[str] = field(default_factory=list)   # raw image paths (virtio, created 64 MiB)
    owner_pid: int = 0       # the guest is killed when this process dies (0: never)
    name: str = "node"
    tap: str = ""            # a tap device to attach the NIC to (harness MachineSpec.tap); "" = user network
    mac: str = "52:54:00:12:34:56"
    uefi: bool = False       # UEFI firmware (OVMF on amd64) instead of SeaBIOS
    arch: str = "amd64"      # a key of qemu.harness.PLATFORMS (arm64: -M virt, always UEFI)
    serial_port: int = 0     # the serial line's TCP port QEMU dials (qemu/serialrelay.py: the BMC's SOL)
    disk_firmware: bool = False  # a "disk" boot is the firmware's boot of the first disk, as a
                                 # real server's (not -kernel): an empty disk fails as one does
    machine: bool = True     # False: no guest at all (a fleet of emulated BMCs): power is the
                             # ``power`` file, a start or reset is recorded, a power button obeyed
    tpm_state: str = ""      # a TPM 2.0 state folder (qemu/tpm.py's manufacture): each power-on
                             # gets a TPM, swtpm serving it, reset as a server's is; "" = none
    firmware_pxe: bool = False  # x86 UEFI: a "pxe" boot is the firmware's own PXE (no NIC ROM)
    pflash_code: str = ""    # UEFI on pflash instead of -bios (an arm64 node with a TPM: AAVMF,
    pflash_vars: str = ""    # harness.AAVMF_CODE): its code; the node's own copy of its variables
    secure_boot: bool = False  # pflash_code is OVMF's Secure Boot build (SMM; qemu/secureboot.py)


@dataclass(frozen=True)
class BootRecord:
    time: float
    device: str              # "pxe" | "disk" | "cdrom"
    how: str                 # "start" | "pxe-fetch"


class PoweredNode:
    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    # -- files ----------------------------------------------------------------------------

    @property
    def qmp_socket(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def pid_file(self) -> Path:
        return self.dir / "supervisor.pid"

    @property
    def boots_log(self) -> Path:
        return self.dir / "boots.log"

    def spec(self) -> NodeSpec:
        try:
            data = json.loads((self.dir / "node.json").read_text())
        except FileNotFoundError:
            raise PowerError(f"{self.dir}: not a configured node (no node.json)") from None
        return NodeSpec(**data)

    def configure(self, spec: NodeSpec) -> PoweredNode:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / "node.json.tmp"
        tmp.write_text(json.dumps(asdict(spec), indent=2))
        tmp.replace(self.dir / "node.json")
        if not (self.dir / "boot").exists():
            self.set_boot("disk")
        return self

    def set_boot(self, device: str) -> None:
        if device not in BOOT_DEVICES:
            raise PowerError(f"boot device {device!r}: one of {', '.join(BOOT_DEVICES)}")
        tmp = self.dir / "boot.tmp"
        tmp.write_text(device + "\n")
        tmp.replace(self.dir / "boot")

    def boot_device(self) -> str:
        try:
            device = (self.dir / "boot").read_text().strip()
        except FileNotFoundError:
            return "disk"
        return device if device in BOOT_DEVICES else "disk"

    # -- virtual media --------------------------------------------------------------------

    def media(self) -> dict[str, str]:
        """slot -> the medium's path in the node directory, for the drives that hold one."""
        try:
            data = json.loads((self.dir / "media.json").read_text())
        except FileNotFoundError:
            return {}
        return {k: v for k, v in data.items() if k in MEDIA_SLOTS and v}

    def _set_media(self, media: dict[str, str]) -> None:
        tmp = self.dir / "media.json.tmp"
        tmp.write_text(json.dumps(media, sort_keys=True))
        tmp.replace(self.dir / "media.json")

    def insert_media(self, slot: str, source: str) -> Path:
        """Put the image at ``source`` (an http(s) URL, downloaded, or a local file, copied)
        in drive ``slot``; at once when QEMU runs, else at the next start."""
        if slot not in MEDIA_SLOTS:
            raise PowerError(f"virtual media drive {slot!r}: one of {', '.join(MEDIA_SLOTS)}")
        from agent.net import http

        target = self.dir / f"media-{slot}.iso"
        tmp = self.dir / f".media-{slot}.tmp"
        try:
            if source.startswith(("http://", "https://")):
                http.download_to(source, tmp, http.HttpOptions(timeout=60.0, max_retries=2))
            else:
                shutil.copyfile(source, tmp)
            if self.status() == "on":  # out of the drive before its file is replaced
                self._qmp("eject", {"id": f"cdrom{MEDIA_SLOTS.index(slot)}", "force": True})
            tmp.replace(target)
        except (OSError, AgentError) as exc:
            raise PowerError(f"virtual media {slot}: {source}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        self._set_media({**self.media(), slot: str(target)})
        if self.status() == "on":
            self._qmp("blockdev-change-medium", {"id": f"cdrom{MEDIA_SLOTS.index(slot)}",
                                                 "filename": str(target), "format": "raw",
                                                 "read-only-mode": "read-only"})
        return target

    def eject_media(self, slot: str) -> None:
        if slot not in MEDIA_SLOTS:
            raise PowerError(f"virtual media drive {slot!r}: one of {', '.join(MEDIA_SLOTS)}")
        media = self.media()
        media.pop(slot, None)
        self._set_media(media)
        if self.status() == "on":
            self._qmp("eject", {"id": f"cdrom{MEDIA_SLOTS.index(slot)}", "force": True})
        (self.dir / f"media-{slot}.iso").unlink(missing_ok=True)

    def boots(self) -> list[BootRecord]:
        try:
            lines = self.boots_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            when, device, how = line.split()
            out.append(BootRecord(float(when), device, how))
        return out

    def _supervisor_pid(self) -> int:
        try:
            return int(self.pid_file.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    # -- power ----------------------------------------------------------------------------

    def _machineless(self) -> bool:
        return not self.spec().machine

    def _set_power(self, state: str) -> None:
        tmp = self.dir / "power.tmp"
        tmp.write_text(state + "\n")
        tmp.replace(self.dir / "power")

    def status(self) -> str:
        if self._machineless():
            with contextlib.suppress(FileNotFoundError):
                return "on" if (self.dir / "power").read_text().strip() == "on" else "off"
            return "off"
        return "on" if proc.alive(self._supervisor_pid()) else "off"

    def start(self, timeout: float = 30.0) -> None:
        """Power on; returns once QEMU's QMP socket answers. No-op when already on."""
        if self.status() == "on":
            return
        spec = self.spec()
        if not spec.machine:
            self._record(self.boot_device(), "start")
            self._set_power("on")
            return
        self.qmp_socket.unlink(missing_ok=True)
        log = (self.dir / "supervisor.log").open("ab")
        # Detached: the caller (a chassis_control run) exits at once; the supervisor lives
        # until QEMU ends. Not tied to the caller's death, but to spec.owner_pid's.
        child = subprocess.Popen(
            [sys.executable, "-m", "qemu.powered", str(self.dir), "_supervise"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=str(Path(__file__).resolve().parent.parent), start_new_session=True,
        )
        log.close()
        self.pid_file.write_text(f"{child.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise PowerError(f"{spec.name}: QEMU did not start; see {self.dir / 'supervisor.log'}")
            with contextlib.suppress(OSError, PowerError):
                self._qmp("query-status")
                return
            time.sleep(0.1)
        raise PowerError(f"{spec.name}: QEMU's QMP socket did not answer within {timeout:g}s")

    def stop(self, *, force: bool, timeout: float = 10.0) -> None:
        """Graceful: the ACPI power button (the guest may ignore it; the node stays on).
        Forced: QMP quit, then SIGTERM/SIGKILL of the supervisor's group at ``timeout``."""
        if self._machineless():
            self._set_power("off")
            return
        pid = self._supervisor_pid()
        if not proc.alive(pid):
            return
        if not force:
            self._qmp("system_powerdown")
            return
        with contextlib.suppress(OSError, PowerError):
            self._qmp("quit")
        deadline = time.monotonic() + timeout
        while proc.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not proc.alive(pid):
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            end = time.monotonic() + 3
            while proc.alive(pid) and time.monotonic() < end:
                time.sleep(0.1)
        if proc.alive(pid):
            raise PowerError(f"supervisor {pid} of {self.dir} would not die")

    def reset(self) -> None:
        if self.status() != "on":
            raise PowerError("the node is off: nothing to reset")
        self._record(self.boot_device_of_running(), "reset")
        if not self._machineless():
            self._qmp("system_reset")

    def boot_device_of_running(self) -> str:
        try:
            return (self.dir / "running-boot").read_text().strip()
        except FileNotFoundError:
            return self.boot_device()

    def _record(self, device: str, how: str) -> None:
        with self.boots_log.open("a") as f:
            f.write(f"{time.time():.3f} {device} {how}\n")

    # -- QMP ------------------------------------------------------------------------------

    def _qmp(self, command: str, arguments: dict[str, object] | None = None,
             timeout: float = 5.0) -> dict[str, object]:
        from qemu import harness

        try:
            return harness.qmp(self.qmp_socket, command, arguments, timeout)
        except harness.QmpClosed:
            if command == "quit":
                return {}
            raise PowerError(f"QMP {command}: connection closed") from None
        except harness.QmpError as exc:
            raise PowerError(str(exc)) from exc

    # -- the supervisor (runs detached, one per power-on) ---------------------------------

    def machine_spec(self, device: str) -> MachineSpec:
        """The QEMU machine this node runs for a boot from ``device``."""
        from qemu.harness import Disk, MachineSpec

        spec = self.spec()
        return MachineSpec(
            workdir=self.dir, kernel=Path(spec.kernel), initrd=Path(spec.initrd),
            append=spec.append, memory_mb=spec.memory_mb, cpus=spec.cpus, kvm=spec.kvm,
            pxe=device == "pxe", name=spec.name, tap=spec.tap, mac=spec.mac, uefi=spec.uefi, arch=spec.arch,
            media=[self.media().get(slot, "") for slot in MEDIA_SLOTS], media_boot=device == "cdrom",
            disks=[Disk(Path(p), serial=f"disk{i}", interface="virtio") for i, p in enumerate(spec.disks)],
            serial_port=spec.serial_port, disk_boot=device == "disk" and spec.disk_firmware, qmp=True,
            firmware_pxe=spec.firmware_pxe,
            tpm=self.dir / "swtpm.sock" if spec.tpm_state else None,
            pflash=(Path(spec.pflash_code), Path(spec.pflash_vars)) if spec.pflash_code else None,
            secure_boot=spec.secure_boot,
        )

    def supervise(self) -> int:
        from qemu import tpm
        from qemu.harness import Machine

        spec = self.spec()
        device = self.boot_device()
        (self.dir / "running-boot").write_text(device + "\n")
        machine = Machine(self.machine_spec(device))
        machine.qmp_socket = self.qmp_socket   # QMP from outside: power button, reset, quit
        # The TPM keeps its state across power cycles; swtpm ends with the QEMU it served.
        swtpm = tpm.Swtpm(Path(spec.tpm_state), self.dir / "swtpm.sock").start() if spec.tpm_state else None
        self._record(device, "start")
        seen = 0
        try:
            machine.start()
            while machine.alive:
                if spec.owner_pid and not proc.alive(spec.owner_pid):
                    break
                served = machine.pxe_served
                for entry in served[seen:]:
                    if entry.startswith("GET /vmlinuz "):
                        self._record("pxe", "pxe-fetch")
                seen = len(served)
                time.sleep(0.2)
        finally:
            machine.stop()
            if swtpm is not None:
                swtpm.stop()
            self.qmp_socket.unlink(missing_ok=True)
        return 0

    # -- ipmi_sim's chassis_control -------------------------------------------------------

    def write_chassis_control(self, path: Path) -> Path:
        """Write the program ipmi_sim runs as this node's ``chassis_control`` (``PATH MC get
        ...`` / ``PATH MC set ...``) and return its path.

        ipmi_sim runs it for every power or boot query and answers nothing else meanwhile, so
        its start is what a BMC's answer costs. A node with a machine gets ``python -m
        qemu.powered DIR chassis-control`` (a start needs the supervisor, QMP and the harness).
        A machineless node (a fleet of emulated BMCs) gets the same protocol as a POSIX shell
        script over its ``power``, ``boot`` and ``boots.log`` files: a few milliseconds, where
        a Python start (0.1 s of CPU) times 16 sessions at once outlasted ipmitool's 2 s wait on
        a loaded 2-core machine and lost a BMC of 64. tests/qemu/test_powered.py holds the two
        to the same answers and the same node state."""
        if self.spec().machine:
            # -S: no site-packages (chassis-control needs the standard library and the tree
            # alone), which saves the editable install's import hook at every start.
            body = (f"cd {shlex.quote(str(ROOT))} || exit 1\n"
                    f"exec {shlex.quote(sys.executable)} -S -m qemu.powered {shlex.quote(str(self.dir))} "
                    'chassis-control "$@"\n')
        else:
            body = f"d={shlex.quote(str(self.dir))}\n" + _MACHINELESS_CHASSIS_CONTROL
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o700)
        return path

    def chassis_control(self, op: str, args: list[str]) -> tuple[int, str]:
        """(exit status, stdout) for one ipmi_sim chassis_control call."""
        if op == "get":
            out = []
            for parm in args:
                if parm == "power":
                    out.append(f"power:{1 if self.status() == 'on' else 0}")
                elif parm == "boot":
                    device = self.boot_device()
                    out.append(f"boot:{device if device in ('pxe', 'cdrom') else 'default'}")
                else:
                    return 1, f"invalid parameter: {parm}"
            return 0, "\n".join(out)
        if op == "set":
            if len(args) % 2:
                return 1, "parameter and value pairs are required"
            for parm, value in zip(args[::2], args[1::2], strict=True):
                try:
                    if parm == "power":
                        self.start() if value == "1" else self.stop(force=True)
                    elif parm == "shutdown":
                        if value == "1":
                            self.stop(force=False)
                    elif parm == "reset":
                        if value == "1":
                            self.reset()
                    elif parm == "boot":
                        if value not in IPMI_BOOT:
                            return 1, f"invalid boot value: {value}"
                        self.set_boot(IPMI_BOOT[value])
                    elif parm == "identify":
                        pass
                    else:
                        return 1, f"invalid parameter: {parm}"
                except (PowerError, OSError) as exc:
                    return 1, str(exc)
            return 0, ""
        return 1, f"unknown operation: {op}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qemu.powered", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="the node directory")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status")
    sub.add_parser("start")
    stop = sub.add_parser("stop")
    stop.add_argument("--force", action="store_true")
    sub.add_parser("reset")
    boot = sub.add_parser("boot")
    boot.add_argument("device", nargs="?", choices=BOOT_DEVICES)
    cc = sub.add_parser("chassis-control")
    cc.add_argument("mc")
    cc.add_argument("op")
    cc.add_argument("args", nargs="*")
    insert = sub.add_parser("insert")
    insert.add_argument("slot", choices=MEDIA_SLOTS)
    insert.add_argument("source", help="the image's http(s) URL or a local path")
    eject = sub.add_parser("eject")
    eject.add_argument("slot", choices=MEDIA_SLOTS)
    sub.add_parser("_supervise")
    args = p.parse_args(argv)
    node = PoweredNode(args.dir)
    try:
        if args.cmd == "status":
            print(node.status())
        elif args.cmd == "start":
            node.start()
        elif args.cmd == "stop":
            node.stop(force=args.force)
        elif args.cmd == "reset":
            node.reset()
        elif args.cmd == "boot":
            if args.device:
                node.set_boot(args.device)
            else:
                print(node.boot_device())
        elif args.cmd == "insert":
            node.insert_media(args.slot, args.source)
        elif args.cmd == "eject":
            node.eject_media(args.slot)
        elif args.cmd == "chassis-control":
            rc, out = node.chassis_control(args.op, args.args)
            if out:
                print(out)
            return rc
        elif args.cmd == "_supervise":
            return node.supervise()
    except PowerError as exc:
        print(f"qemu.powered: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
