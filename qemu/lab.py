"""A test lab: the reference gateway on the host's loopback, a development PKI, and ramdisk
nodes booted in QEMU that dial it. Shared by tests/e2e and the demo.

    with Lab(workdir) as lab:
        node = lab.boot("node-1", disks=lab.standard_disks("node-1"))
        lab.gateway.wait_node("node-1", timeout=120)
        cid = lab.gateway.send("node-1", "inventory.refresh", {})

Each node gets a small archive appended to the prebuilt ramdisk (initramfs/out/base.img): /init,
the agent zipapp, the CA and the control-plane public key, and for test ramdisks a debug
shell on the second serial port and any extra files (the fake NVML library). The settings go
on the kernel command line as production passes them (bc.gateway, bc.node, bc.token, bc.ca,
bc.trust).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.gateway import Gateway
from agent.gateway.certs import DevPki, make_dev_pki
from initramfs import build as ramdisk
from initramfs import cpio
from qemu.harness import (
    GUEST_HOST,
    PLATFORMS,
    BootFileServer,
    Disk,
    ExtraNic,
    Machine,
    MachineSpec,
    kernel_args,
    kvm_wanted,
    qemu_available,
)

GATEWAY_PORT = 443                       # as the guest sees it, on GUEST_HOST
FILES_PORT = 8080                        # the lab's file server (images), on GUEST_HOST
GUEST_CA = "/etc/bettercompute/ca.pem"
GUEST_TRUST = "/etc/bettercompute/signing.pub"


@dataclass(frozen=True)
class Ramdisk:
    kernel: Path
    base: Path      # the compressed userland without /init and the agent
    agent: Path     # the agent zipapp for the ramdisk (no native wheels; bytecode added)
    arch: str = "amd64"


# What ensure_ramdisk gave in this process, by (out, rebuild_agent, arch): the tree does not
# change under a running test session or demo, so its agent and ramdisk are the same ones.
_ENSURED: dict[tuple[Path, bool, str], Ramdisk] = {}


def ensure_ramdisk(out: Path | None = None, *, rebuild_agent: bool = True, arch: str = "amd64") -> Ramdisk:
    """The prebuilt ramdisk pieces for ``arch``, built (cached) if missing; the agent from
    this tree. Once per process: a later call returns the same pieces while their files are
    there (each call otherwise rebuilds the agent zipapp and resolves the packages again, and
    apt-cache, without its binary cache in Debian's container images, takes seconds a call:
    ~20-120 s for each arm64 test module on the 2-core CI machine). Built under the tree's
    build lock (initramfs/build.py build_lock): another builder is waited for."""
    target = ramdisk.ARCHES[arch]
    out = ramdisk.out_dir(target) if out is None else out
    key = (out.resolve(), rebuild_agent, arch)
    done = _ENSURED.get(key)
    if done is not None and all(p.is_file() for p in (done.kernel, done.base, done.agent)):
        return done
    with ramdisk.build_lock():   # a demo and a test run in one tree: the second waits
        agent = ramdisk.build_agent(out / "agent.pyz") if rebuild_agent or not (out / "agent.pyz").exists() \
            else out / "agent.pyz"
        built = ramdisk.build(agent, out, arch=target)
    assert built.agent is not None
    _ENSURED[key] = Ramdisk(built.kernel, built.base, built.agent, arch)
    return _ENSURED[key]


def missing_prerequisites(arch: str = "amd64", *, uefi: bool = False) -> str | None:
    """Why the QEMU lab cannot boot ``arch`` on this machine, or None."""
    import shutil

    for tool in ("apt-get", "dpkg-deb", "zstd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not ramdisk.ARCHES[arch].native():
        emulator = ramdisk.ARCHES[arch].emulator
        if shutil.which(emulator) is None:
            return f"{emulator} is not installed (apt-get install qemu-user-static)"
    elif not list(Path("/boot").glob(f"vmlinuz-*-cloud-{arch}")):
        return f"no /boot/vmlinuz-*-cloud-{arch} (apt-get install linux-image-cloud-{arch})"
    return qemu_available(arch, uefi=uefi)


class Lab:
    def __init__(self, workdir: Path, ramdisk_parts: Ramdisk | None = None, *,
                 gateway_host: str = "127.0.0.1", gateway_port: int = 0) -> None:
        """``gateway_host``/``gateway_port``: where the gateway listens (qemu/sitelab.py
        binds it on the provisioning bridge, at GUEST_HOST:GATEWAY_PORT)."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.ramdisk = ramdisk_parts or ensure_ramdisk()
        self.pki: DevPki = make_dev_pki(workdir / "pki", hosts=(GUEST_HOST, "127.0.0.1"))
        self.tokens: dict[str, str] = {}
        self.gateway = Gateway(cert=self.pki.gateway_cert, key=self.pki.gateway_key,
                               client_ca=self.pki.ca, signing_key=self.pki.signing_key,
                               tokens=self.tokens, heartbeat_seconds=5.0,
                               host=gateway_host, port=gateway_port).start()
        self.www = workdir / "www"
        self.www.mkdir(exist_ok=True)
        self.files = BootFileServer(self.www).start()
        self.machines: list[Machine] = []

    def url(self, name: str) -> str:
        """The URL under which the guest reaches ``self.www / name``."""
        return f"http://{GUEST_HOST}:{FILES_PORT}/{name}"

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for m in self.machines:
            m.stop()
        self.gateway.stop()
        self.files.stop()

    # -- nodes ----------------------------------------------------------------------------

    def standard_disks(self, name: str, *, size: int = 256 * 1024 * 1024) -> list[Disk]:
        """Two NVMe disks with distinct serials and one virtio disk."""
        d = self.workdir / f"{name}-disks"
        d.mkdir(parents=True, exist_ok=True)
        tag = name.upper().replace("-", "")[:8]
        return [
            Disk(d / "nvme0.img", f"NVME{tag}A", "nvme", size),
            Disk(d / "nvme1.img", f"NVME{tag}B", "nvme", size),
            Disk(d / "vd0.img", f"VIRT{tag}C", "virtio", 64 * 1024 * 1024),
        ]

    def token_for(self, node_id: str) -> str:
        for token, node in self.tokens.items():
            if node == node_id:
                return token
        token = secrets.token_urlsafe(18)
        self.tokens[token] = node_id
        self.gateway.tokens[token] = node_id
        return token

    def settings(self, node_id: str, **extra: str) -> dict[str, str]:
        """The bc.* settings a node boots with (without the ``bc.`` prefix)."""
        return {"gateway": f"{GUEST_HOST}:{GATEWAY_PORT}", "node": node_id,
                "token": self.token_for(node_id), "ca": GUEST_CA, "trust": GUEST_TRUST,
                "reconnect_min": "0.5", "reconnect_max": "3", **extra}

    def overlay(self, *, test: bool = True, files: Mapping[str, bytes] | None = None,
                env: Mapping[str, str] | None = None) -> bytes:
        """The archive appended to the base ramdisk for a node (compressed)."""
        entries = ramdisk.top_entries(self.ramdisk.agent)
        entries += [cpio.file(GUEST_CA, self.pki.ca.read_bytes()),
                    cpio.file(GUEST_TRUST, self.pki.signing_pub.read_bytes())]
        if test:  # the marker names the shell's port
            tty = PLATFORMS[self.ramdisk.arch].shell_tty
            entries.append(cpio.file("/etc/bettercompute/debug-shell", f"{tty}\n".encode()))
        if env:
            text = "".join(f"export {k}='{v}'\n" for k, v in env.items())
            entries.append(cpio.file("/etc/bettercompute/agent.env", text.encode()))
        for path, data in (files or {}).items():
            entries.append(cpio.file(path, data, 0o755 if path.endswith((".so", ".so.1")) else 0o644))
        return ramdisk.compress(cpio.archive(entries), 3)

    def uki(self, node_id: str, *, test: bool = True, files: Mapping[str, bytes] | None = None,
            settings: Mapping[str, str] | None = None,
            sign: Callable[[Path], object] | None = None) -> tuple[Path, dict[str, Any]]:
        """The node's ramdisk as a UKI (initramfs/uki.py) in a folder the firmware boots as its
        ESP (``boot(esp=...)``), and the UKI's reference values (docs/attestation.md).
        ``settings``: the bc.* settings of its command line instead of the node's own (a site's
        UKI names the site and nothing per node: tests/e2e/test_attest_site.py). ``sign``:
        signs the UKI in place before its values are taken (Secure Boot: initramfs/signing.py)."""
        from initramfs import uki

        esp = self.workdir / f"{node_id}-esp"
        (esp / "EFI" / "BOOT").mkdir(parents=True, exist_ok=True)
        initrd = self.initrd(node_id, self.overlay(test=test, files=files))
        append = kernel_args(PLATFORMS[self.ramdisk.arch].console,
                             **(self.settings(node_id) if settings is None else settings))
        name = "BOOTX64.EFI" if self.ramdisk.arch == "amd64" else "BOOTAA64.EFI"
        image = esp / "EFI" / "BOOT" / name
        uki.build(uki.find_stub(self.ramdisk.arch), self.ramdisk.kernel, initrd, append, image)
        if sign is not None:
            sign(image)
        return esp, uki.reference_values(image, build_id=f"{node_id}-uki")

    def initrd(self, name: str, overlay: bytes) -> Path:
        path = self.workdir / f"{name}-initrd.img"
        path.write_bytes(self.ramdisk.base.read_bytes() + overlay)
        return path

    def boot(
        self,
        node_id: str,
        *,
        disks: Sequence[Disk] = (),
        pxe: bool = False,
        test: bool = True,
        files: Mapping[str, bytes] | None = None,
        env: Mapping[str, str] | None = None,
        settings: Mapping[str, str] | None = None,
        memory_mb: int = 1024,
        kernel: Path | None = None,
        initrd: Path | None = None,
        append: str | None = None,
        uefi: bool = False,
        disk_boot: bool = False,
        nics: Sequence[ExtraNic] = (),
        media: Sequence[str] = (),
        tpm: Path | None = None,
        esp: Path | None = None,
        pflash: tuple[Path, Path] | None = None,
        secure_boot: bool = False,
        pxe_chain: str = "",
        pxe_loader: Path | None = None,
        forwards: Mapping[int, int] | None = None,
        keyboard: bool = False,
    ) -> Machine:
        """Start a ramdisk node (returns at once; wait with gateway.wait_node). ``kernel``,
        ``initrd`` and ``append`` boot something else (an installed node's kernel);
        ``disk_boot`` lets the firmware boot the first disk. The architecture is the ramdisk's;
        ``uefi`` (always on arm64) boots UEFI firmware; ``media`` (ISO paths in CD drives)
        boots the first one through the firmware, as a BMC's virtual CD. ``pxe_chain``: with
        ``pxe``, the URL iPXE chains (a site's /boot.ipxe) instead of the lab's kernel;
        ``pxe_loader``: with ``pxe`` on arm64, the EFI image the firmware's PXE starts (a
        site's GRUB, initramfs/netgrub.py) instead of the lab's GRUB;
        ``forwards``: more guest ports on GUEST_HOST to host ports (a site's HTTP service);
        ``keyboard``: keys a test presses at the firmware's prompts (``Machine.press``);
        ``secure_boot``: ``pflash`` is OVMF's Secure Boot build (SMM; qemu/secureboot.py)."""
        arch = self.ramdisk.arch
        if initrd is None:
            initrd = self.initrd(node_id, self.overlay(test=test, files=files, env=env))
        if append is None:
            append = kernel_args(PLATFORMS[arch].console, **(settings or self.settings(node_id)))
        forwards = {GATEWAY_PORT: self.gateway.port, FILES_PORT: self.files.port, **(forwards or {})}
        spec = MachineSpec(self.workdir, kernel=kernel or self.ramdisk.kernel, initrd=initrd,
                           append=append, disks=tuple(disks), forwards=forwards,
                           kvm=kvm_wanted() and ramdisk.ARCHES[arch].native(), pxe=pxe, name=node_id,
                           memory_mb=memory_mb, arch=arch, uefi=uefi, disk_boot=disk_boot,
                           nics=tuple(nics), media=tuple(media), media_boot=bool(media),
                           tpm=tpm, esp=esp, pflash=pflash, secure_boot=secure_boot, pxe_chain=pxe_chain,
                           pxe_loader=pxe_loader, qmp=keyboard)
        machine = Machine(spec)
        self.machines.append(machine)
        return machine.start()

    def wait_joined(self, machine: Machine, node_id: str, timeout: float, *, sessions: int = 1) -> float:
        """Seconds from QEMU start until the node's session is up; on a timeout the guest is
        killed and the error carries its console."""
        try:
            self.gateway.wait_node(node_id, timeout, sessions=sessions)
        except TimeoutError:
            raise machine.fail(f"{node_id} did not join the gateway within {timeout:g}s") from None
        return machine.elapsed()


def wait_until(predicate, timeout: float, what: str, machine: Machine | None = None):  # type: ignore[no-untyped-def]  # any predicate
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            if machine is not None:
                raise machine.fail(f"timed out after {timeout:g}s waiting for {what}")
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)
