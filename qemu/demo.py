"""The demo: one node's life in QEMU, driven through the reference gateway, as a timeline.

    python -m qemu.demo [--workdir qemu/out/demo] [--no-install] [--user-net] [--uefi] [--arch arm64]
    python -m qemu.demo --nodes 3 [--break unregistered-mac|bad-cmdline]
    python -m qemu.demo --secure-boot [--break unsigned|other-key|revoked]

On a fresh Debian bookworm machine (as root) it installs the Debian packages it needs, builds
what is missing (the agent zipapp, the ramdisk, a bootable node image), then runs the
site-driven lifecycle (qemu/sitedemo.py: BMC, the site's PXE boot service and proxy routes,
the gateway; every step with its duration and evidence). With ``--user-net``, the former
sequence on QEMU's user network:

  1. boots a bare-metal-like guest by PXE (iPXE, kernel and initramfs over HTTP) with two NVMe
     disks and a virtio disk; the ramdisk agent joins the gateway;
  2. inventory.refresh: the disks with their serials;
  3. deploy.image of the node image onto the first NVMe disk, chosen by serial, with progress,
     each chunk verified against the image's manifest (`agent manifest`) before it is written;
  4. disk.wipe of the second NVMe disk, best available method, with its erasure certificate;
  5. diag.nvml against a fake NVML library (when a C compiler is there to build it);
  6. boot.kexec into the deployed kernel; the node agent rejoins from the disk with a new boot id.

TCG by default (BC_QEMU_KVM=1 uses KVM where /dev/kvm works). Takes a few minutes.

``--uefi`` and ``--arch arm64`` run that former sequence. ``--uefi``: the machine boots OVMF
(UEFI) and PXE is done by the EFI build of the iPXE ROM; the node image carries an EFI system
partition (systemd-boot) too; before the node's life, two more machines show attestation
(qemu/attestdemo.py, docs/attestation.md): the ramdisk as a UKI on a machine with a TPM (swtpm),
attested, and the same with one byte changed in its initramfs, refused. ``--arch arm64``: an arm64
node (``-M virt``, UEFI firmware, Debian's arm64 ramdisk; its PXE loads GRUB, which fetches
the ramdisk over HTTP), without the fake NVML library (built for x86 only).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qemu import sitedemo
from qemu.harness import Machine
from qemu.sitebreak import BREAKS
from qemu.sitesecure import BREAKS as SECURE_BOOT_BREAKS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NODE = "demo-node"
PACKAGES = ("qemu-system-x86", "ipxe-qemu", "linux-image-cloud-amd64", "zstd", "fdisk", "e2fsprogs",
            "dpkg", "apt")
TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "zstd": "zstd", "sfdisk": "fdisk", "mkfs.ext4": "e2fsprogs"}


MIB = 2**20
# deploy.image's progress message (agent/commands/deploy/): the image's own bytes so far,
# while done/total count the bytes read of the (compressed) source.
_DEPLOYED_SO_FAR = re.compile(r"(\d+) image bytes, (\d+) written, (\d+) skipped")


def mib(n: float) -> str:
    """Every size and rate of the demo in one unit."""
    return f"{n / MIB:.1f} MiB"


def deployed(image: int, written: int, skipped: int) -> str:
    """The same words for deploy.image's progress and its result."""
    return f"{mib(image)} of image ({mib(written)} written, {mib(skipped)} of zero blocks skipped)"


def progress_line(kind: str, p: Any) -> str:
    """A session_pb2.Progress as one timeline line: a percentage only where the command knows
    one (a kexec's fetch does not: it shows the bytes fetched), sizes in MiB. done/total are
    bytes, except a few counts (disk.wipe's "verifying samples"), told apart by a total
    under 1 MiB and shown as they are."""
    parts = [kind]
    if p.fraction >= 0:
        parts.append(f"{p.fraction * 100:5.1f}%")
    so_far = _DEPLOYED_SO_FAR.fullmatch(p.message)
    if so_far:
        parts.append(deployed(*map(int, so_far.groups())) + " so far;")
    elif p.message:
        parts.append(p.message + ("," if p.done or p.rate > 0 else ""))
    if p.total >= MIB:
        parts.append(f"{mib(p.done)} of {mib(p.total)} {'read' if so_far else 'done'}")
    elif p.total:
        parts.append(f"{p.done} of {p.total}")
    elif p.done:
        parts.append(f"{mib(p.done)} so far")
    if p.rate > 0:
        parts.append(f"at {mib(p.rate)}/s")
    return " ".join(parts)


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, what: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {what}", flush=True)


def install_packages(arch: str = "amd64", uefi: bool = False, extra: Sequence[str] = ()) -> None:
    from qemu.harness import PLATFORMS

    plat = PLATFORMS[arch]
    tools = {**TOOLS, plat.qemu: plat.package}
    if arch != "amd64":
        tools.update({"qemu-aarch64-static": "qemu-user-static", "grub-mkimage": "grub-common"})
    if uefi:
        tools.update({"mkfs.vfat": "dosfstools", "mcopy": "mtools", "objcopy": "binutils",
                      "swtpm": "swtpm", "swtpm_setup": "swtpm-tools"})  # the UKI, the TPM
    missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    missing += extra
    if (uefi or plat.always_uefi) and not Path(plat.uefi_firmware).is_file():
        missing.append(plat.firmware_package)
    if uefi and not Path("/usr/lib/systemd/boot/efi/systemd-bootx64.efi").is_file():
        missing.append("systemd-boot-efi")
    if not list(Path("/boot").glob("vmlinuz-*-cloud-amd64")):
        missing.append("linux-image-cloud-amd64")
    if not Path("/usr/lib/ipxe/qemu").is_dir():
        missing.append("ipxe-qemu")
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(f"demo: missing Debian packages {missing}; install them (as root: apt-get install ...)")
    from agent.proc import run

    print(f"demo: installing {' '.join(missing)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], timeout=900, env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], timeout=1800, env=env)


def fake_nvml(workdir: Path) -> bytes | None:
    path = ROOT / "tests" / "fakes" / "nvml" / "fakenvml.py"
    if not path.exists() or shutil.which("gcc") is None:
        return None
    spec = importlib.util.spec_from_file_location("fakenvml_demo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.build_library(workdir / "nvml")).read_bytes()


def wait_result(lab, machine: Machine, cid: str, what: str, timeout: float = 1800.0):  # type: ignore[no-untyped-def]  # a demo script
    from agent.proto import session_pb2

    try:
        body, result = lab.gateway.wait_result(cid, timeout)
    except TimeoutError:
        raise machine.fail(f"{what} did not finish in {timeout:g}s") from None
    if body.status != session_pb2.SUCCEEDED:
        raise machine.fail(f"{what} {session_pb2.Status.Name(body.status)}: {body.reason}: {body.message}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qemu.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=HERE / "out" / "demo")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install what is missing")
    parser.add_argument("--user-net", action="store_true",
                        help="the former demo: PXE from QEMU's user network, then kexec")
    parser.add_argument("--uefi", action="store_true",
                        help="the former demo under UEFI (OVMF), PXE by iPXE's EFI build; an ESP on the node "
                             "image")
    parser.add_argument("--nodes", type=int, default=1, choices=range(1, 9), metavar="N",
                        help="N nodes at once through the site daemon (1-8): routes served from the "
                             "site's chunk store, each node's timeline, the bytes from the upstream "
                             "and from the cache")
    parser.add_argument("--break", dest="break_way", choices=sorted({*BREAKS, *SECURE_BOOT_BREAKS}),
                        default="", metavar="WAY",
                        help="with --nodes N (2-8): break the last node on purpose, one of "
                             + ", ".join(f"{b.name} ({b.cause})" for b in BREAKS.values())
                             + "; the site's cause for it is shown beside the others' success. With "
                             "--secure-boot: after the signed boot, the node is served a UKI that is "
                             + ", ".join(SECURE_BOOT_BREAKS) + " (secure_boot_violation)")
    parser.add_argument("--secure-boot", action="store_true",
                        help="UEFI Secure Boot on with the fleet's own keys (OVMF's Secure Boot build): "
                             "the site's signed iPXE chains its signed UKI, the join attested with PCR 7 "
                             "judged (--uefi implied)")
    parser.add_argument("--arch", choices=("amd64", "arm64"), default="amd64",
                        help="the node's architecture (arm64: the former demo on -M virt, UEFI PXE through "
                             "GRUB)")
    parser.add_argument("--virtual-media", action="store_true",
                        help="no PXE and no DHCP: the BMC (Redfish, sushy-tools' emulator) mounts the "
                             "ramdisk ISO and the node's config medium (with --uefi: under OVMF)")
    args = parser.parse_args(argv)
    if args.secure_boot:
        if args.nodes > 1 or args.user_net or args.arch != "amd64" or args.virtual_media:
            parser.error("--secure-boot: one amd64 node through the site's PXE (not with --nodes, "
                         "--user-net, --arch arm64, --virtual-media)")
        if args.break_way and args.break_way not in SECURE_BOOT_BREAKS:
            parser.error(f"--secure-boot --break: one of {', '.join(SECURE_BOOT_BREAKS)}")
        if os.geteuid() != 0:
            sys.exit("demo: run as root (the ramdisk builder chroots; network namespaces)")
        if not args.no_install:
            signer = ["sbsigntool"] if shutil.which("sbsign") is None else []
            install_packages(args.arch, True, sorted({*sitedemo.missing_packages(), *signer}))
        shutil.rmtree(args.workdir, ignore_errors=True)
        sitedemo.run_secure_boot(args.workdir, Timeline().say, args.break_way)
        return 0
    if args.break_way and (args.break_way not in BREAKS or args.nodes < 2 or args.user_net or args.uefi
                           or args.arch != "amd64" or args.virtual_media):
        parser.error("--break: with --nodes N of 2 or more, the site-driven demo (one node broken, the "
                     "others succeeding)")
    if args.virtual_media:
        if os.geteuid() != 0:
            sys.exit("demo: run as root (network namespaces, QEMU on a tap device)")
        if not args.no_install:
            iso_tools = {"xorriso": "xorriso", "grub-mkimage": "grub-common", "mkfs.vfat": "dosfstools",
                         "mcopy": "mtools", "ip": "iproute2"}
            install_packages(args.arch, args.uefi, sorted({p for t, p in iso_tools.items()
                                                           if shutil.which(t) is None}))
        shutil.rmtree(args.workdir, ignore_errors=True)
        sitedemo.run_virtual_media(args.workdir, Timeline().say, uefi=args.uefi)
        return 0
    user_net = args.user_net or args.uefi or args.arch != "amd64"
    if os.geteuid() != 0:
        sys.exit("demo: run as root (the ramdisk builder chroots into the ramdisk's root)")
    if not args.no_install:
        install_packages(args.arch, args.uefi, () if user_net else sitedemo.missing_packages())
    if args.nodes > 1 and user_net:
        parser.error("--nodes: the site-driven demo only (not with --user-net, --uefi, --arch)")
    if not user_net:
        shutil.rmtree(args.workdir, ignore_errors=True)
        if args.nodes > 1:
            sitedemo.run_fleet(args.workdir, args.nodes, Timeline().say, args.break_way)
        else:
            sitedemo.run(args.workdir, Timeline().say)
        return 0

    from agent.proto import session_pb2
    from qemu.lab import Lab, ensure_ramdisk
    from qemu.nodeimage import build_node_image

    tl = Timeline()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    tl.say(f"building the agent zipapp and the {args.arch} ramdisk (cached under initramfs/out/)")
    parts = ensure_ramdisk(arch=args.arch)
    size = parts.kernel.stat().st_size + (parts.kernel.parent / "initramfs.img").stat().st_size
    tl.say(f"ramdisk ready: kernel + initramfs {mib(size)} compressed")

    with Lab(args.workdir, parts) as lab:
        image = build_node_image(lab, NODE, args.workdir / "node-image", esp=args.uefi)
        os.link(image.zst, lab.www / "node.img.zst")
        tl.say(f"node image built: {mib(image.raw.stat().st_size)} GPT disk, "
               f"{'an EFI system partition with systemd-boot, ' if image.esp else ''}ext4 root with kernel, "
               f"initramfs and the node agent ({mib(image.zst.stat().st_size)} as node.img.zst)")
        if args.uefi and args.arch == "amd64":  # attestation: a UKI on a machine with a TPM; a tampered one
            from qemu import attestdemo

            attestdemo.run(lab, args.workdir, tl.say)
        last_step: dict[str, int] = {}

        def on_event(ev, rec) -> None:  # type: ignore[no-untyped-def]  # the gateway's listener
            if ev.what == "progress" and rec is not None and rec.progress is not None:
                p = rec.progress
                step = int(p.fraction * 10) if p.fraction >= 0 else -1
                if step > last_step.get(ev.command_id, -1) or (step < 0 and ev.command_id not in last_step):
                    last_step[ev.command_id] = step
                    tl.say("  " + progress_line(rec.kind, p))

        lab.gateway.listeners.append(on_event)
        disks = lab.standard_disks(NODE, size=(224 if args.uefi else 160) * 2**20)
        nvml = fake_nvml(args.workdir) if args.arch == "amd64" else None
        files = {}
        env = {}
        if nvml is not None:
            files["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] = nvml
            gpus = {"gpus": [{"model": "H100"}] * 2}
            files["/etc/bettercompute/fake-nvml.json"] = json.dumps(gpus).encode()
            env["FAKE_NVML_CONFIG"] = "/etc/bettercompute/fake-nvml.json"
        firmware = "UEFI" if args.uefi or args.arch != "amd64" else "BIOS"
        how = "PXE boot (" + ("iPXE" if args.arch == "amd64" else "GRUB") + " over the user network)"
        tl.say(f"powering on {NODE} ({args.arch}, {firmware}): {how}, disks "
               + ", ".join(f"{d.interface}:{d.serial}" for d in disks))
        machine = lab.boot(NODE, disks=disks, pxe=True, uefi=args.uefi, files=files, env=env)
        joined = lab.wait_joined(machine, NODE, 600)
        hello = lab.gateway.nodes[NODE].hello
        fetched = f"; fetched {', '.join(r.split()[1] for r in machine.pxe_served)} over HTTP"
        tl.say(f"JOINED: {NODE} in role {hello.role}, agent {hello.agent_version}, boot id "
               f"{hello.boot_id[:8]} ({joined:.1f}s after power-on{fetched})")

        cid = lab.gateway.send(NODE, "inventory.refresh", {})
        inv = wait_result(lab, machine, cid, "inventory.refresh")
        for d in inv.inventory.disks:
            i = d.identity
            tl.say(f"INVENTORY: disk {i.name} {i.transport} serial {i.serial} {mib(i.size_bytes)}")
        tl.say(f"INVENTORY: {inv.inventory.cpu.architecture}, {inv.inventory.system.boot_mode} boot, "
               f"{inv.inventory.cpu.threads} CPU threads, {len(inv.inventory.nics)} NIC(s), "
               f"collected in {inv.seconds:.2f}s")

        target, wipe_disk = disks[0], disks[1]
        tl.say(f"DEPLOYING node.img.zst to the disk with serial {target.serial}")
        from agent.gateway.images import deploy_payload

        payload = deploy_payload(lab.www / "node.img.zst", lab.url("node.img.zst"), format="ZSTD",
                                 target={"serial": target.serial}, verify_readback=True)
        assert payload["digest"]["hex"] == image.zst_sha256
        cid = lab.gateway.send(NODE, "deploy.image", payload)
        dep = wait_result(lab, machine, cid, "deploy.image")
        tl.say(f"DEPLOYED: {deployed(dep.image_bytes, dep.bytes_written, dep.bytes_skipped)} to "
               f"{dep.disk.name}; {dep.verification}: {dep.chunks_verified} chunks verified before "
               f"writing, {dep.zero_chunks} zero chunks never hashed; read back "
               f"{'verified' if dep.readback_verified else 'not checked'}")

        tl.say(f"WIPING the disk with serial {wipe_disk.serial} (best available method)")
        cid = lab.gateway.send(NODE, "disk.wipe", {"disks": [{"serial": wipe_disk.serial}],
                                                   "method": "BEST_AVAILABLE", "verify": "FULL"})
        wipe = wait_result(lab, machine, cid, "disk.wipe")
        from agent.proto import agent_pb2, common_pb2

        for c in wipe.certificates:
            tl.say(f"WIPED: certificate for {c.disk.serial}: {agent_pb2.WipeMethod.Name(c.method)} "
                   f"(NIST {agent_pb2.NistLevel.Name(c.level)}), verified={c.verified} "
                   f"({c.verification_detail}), signed by the node key and checked by the gateway")

        if nvml is not None:
            cid = lab.gateway.send(NODE, "diag.nvml", {"thresholds": {"expected_gpu_count": 2}})
            diag = wait_result(lab, machine, cid, "diag.nvml")
            tl.say(f"DIAG: {len(diag.gpus)} GPU(s) through NVML (fake library), verdict "
                   f"{common_pb2.Verdict.Name(diag.verdict)}")
        else:
            why = "no gcc to build the fake NVML library" if args.arch == "amd64" else \
                "the fake NVML library is built for the host, x86"
            tl.say(f"DIAG: skipped ({why})")

        old_boot = hello.boot_id
        sessions = lab.gateway.nodes[NODE].sessions

        tl.say("KEXEC into the deployed kernel (/boot/vmlinuz on the bcroot partition)")
        cid = lab.gateway.send(NODE, "boot.kexec", image.kexec_payload(target.serial))
        try:
            rec = lab.gateway.wait(cid, 900)
        except TimeoutError:
            raise machine.fail("boot.kexec did not complete") from None
        node = lab.gateway.nodes[NODE]
        if rec.completion is None or not rec.completion.ok or node.sessions <= sessions:
            raise machine.fail(f"boot.kexec ended {rec.state}: {lab.gateway.events_for(cid)}")
        tl.say(f"REJOINED: {NODE} in role {node.hello.role} from its disk, boot id {old_boot[:8]} -> "
               f"{node.boot_id[:8]}; boot.kexec {rec.state} "
               f"({session_pb2.Status.Name(session_pb2.SUCCEEDED)} by rejoin proof)")
        tl.say(f"done; console log: {machine.spec.console_log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
