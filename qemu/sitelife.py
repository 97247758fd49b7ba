"""A node's life driven through the site daemon, each step a command through the reference
gateway: what tests/e2e/test_site_lifecycle.py runs and checks, and what the demo shows.

    bmc.query -> boot.prepareRamdisk -> bmc.boot pxe -> bmc.power on -> (PXE boot through the
    site's proxy DHCP, iPXE, the ramdisk joins) -> site.httpProxy -> deploy.image through the
    route (first gated on a build the node is not: refused, nothing written) -> disk.wipe of
    the second disk -> boot.cleanUp -> [``kexec``: boot.kexec -> (the ramdisk kexecs into the
    deployed kernel, which joins in role node: no power event)] -> bmc.boot disk -> bmc.power
    cycle -> (the node boots its deployed disk and joins in role node)

Each step is checked where it happens and again from outside where it can be (the node
directory's boot device and power, the site daemon's HTTP log, the plain DHCP server's leases,
the disk images' bytes); a failed check raises ``StepFailed`` with what was seen. Every
completed step is a ``Step`` (its duration and one line of evidence), handed to ``on_step``
as it completes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.gateway import State
from agent.images import manifest
from agent.images.filesource import file_digest
from agent.proto import session_pb2
from qemu.harness import Machine, MachineSpec, kernel_args
from qemu.nodeimage import NodeImage, build_node_image, node_cmdline
from qemu.powered import PoweredNode
from qemu.siteattest import Judged, SiteAttestation, pcr4_applications
from qemu.sitelab import SITE_NODE_ID, SiteLab, UploadTarget

MiB = 1024 * 1024
NODE_MAC = "52:54:00:5e:00:01"
JOIN_TIMEOUT = 420.0
COMMAND_TIMEOUT = 900.0
OLD_DATA = hashlib.sha256(b"old tenant data").digest() * (MiB // 32)


class StepFailed(AssertionError):
    """A step did not do what it should; the message says what was seen."""


@dataclass(frozen=True)
class Step:
    name: str            # "bmc.query", "pxe boot + join", ...
    seconds: float
    evidence: str


@dataclass(frozen=True)
class Bmc:
    """How the site daemon reaches the node's BMC."""

    protocol: str        # "ipmi" | "redfish"
    address: str
    credentials_ref: str
    verify_tls: bool = True   # Redfish: False for an emulator's self-signed certificate


@dataclass
class SiteNode:
    """The node of the lifecycle: its power, its disks, its image."""

    name: str
    power: PoweredNode
    deploy_disk: Path            # serial disk0: deploy.image's target
    wipe_disk: Path              # serial disk1: disk.wipe's target
    image: NodeImage
    mac: str = NODE_MAC
    uefi: bool = False           # OVMF firmware, ipxe.efi, boot mode uefi
    steps: list[Step] = field(default_factory=list)


def make_node(lab: SiteLab, name: str, *, mac: str = NODE_MAC, uefi: bool = False,
              network: bytes = b"", tpm_state: Path | None = None,
              firmware_pxe: bool = False, secure_boot_vars: Path | None = None,
              disk_firmware: bool = False,
              image_sign: Callable[[Path], object] | None = None) -> SiteNode:
    """A powered-off node with two virtio disks (the second full of old data) and the image
    of its installed OS, which a "disk" boot runs (the image's kernel and initramfs, its root
    on the first disk: qemu/nodeimage.py); ``network``: the image's static network file;
    ``tpm_state``, ``firmware_pxe``: its TPM and UEFI's own PXE (qemu/siteattest.py);
    ``secure_boot_vars``: OVMF's Secure Boot build with these keys (qemu/secureboot.py).
    ``disk_firmware`` (UEFI): a "disk" boot is the firmware's own boot of the first disk, so the
    image has an EFI system partition (qemu/nodeimage.py ``esp``) and an empty disk fails.
    ``image_sign``: the image's ESP loader is a UKI of its kernel and initramfs, signed by this
    (initramfs/signing.py), and a "disk" boot is the firmware's (``disk_firmware`` implied)."""
    uki = image_sign is not None
    disk_firmware = disk_firmware or uki
    if disk_firmware and not uefi:
        raise ValueError("disk_firmware: a UEFI node (the image's boot loader is an EFI one)")
    image = build_node_image(lab, name, lab.workdir / f"{name}-image", esp=disk_firmware, uki=uki,
                             sign=image_sign, network=network)
    os.link(image.zst, lab.www / f"{name}.img.zst")
    disks = lab.workdir / f"{name}-disks"
    disks.mkdir(parents=True, exist_ok=True)
    deploy, wipe = disks / "disk0.img", disks / "disk1.img"
    with deploy.open("wb") as f:
        f.truncate(256 * MiB)
    with wipe.open("wb") as f:
        for _ in range(64):
            f.write(OLD_DATA)
    power = lab.powered_node(name, kernel=image.kernel, initrd=image.initrd,
                             append=node_cmdline(lab.ramdisk.arch),
                             disks=[deploy, wipe], mac=mac, uefi=uefi, tpm_state=tpm_state,
                             firmware_pxe=firmware_pxe, secure_boot_vars=secure_boot_vars,
                             disk_firmware=disk_firmware)
    return SiteNode(name, power, deploy, wipe, image, mac, uefi)


ROUTE_CHUNK = 1 * MiB   # the chunk size of the manifests routes serve from the site's store


class Lifecycle:
    """One node's life through the site. ``chunk_store``: the route carries the raw image's
    manifest and the site serves it from its chunk store (docs/site.md), the deploy names the
    same manifest; otherwise the route relays the zstd image. ``kexec``: after boot.cleanUp the
    ramdisk kexecs into the deployed system (boot.kexec) before the power cycle to its disk.
    ``bmc`` None: no BMC, only the steps that need none (prepare_ramdisk, power_on_directly,
    pxe_join: tests/e2e/test_site_arm64_pxe.py)."""

    def __init__(self, lab: SiteLab, node: SiteNode, bmc: Bmc | None,
                 on_step: Callable[[Step], None] | None = None, *, chunk_store: bool = False,
                 kexec: bool = False, attest: SiteAttestation | None = None) -> None:
        self.lab = lab
        self.attest = attest             # the node's entry is the site's UKI, its joins judged
        self.last_command = ""           # the id of the last command sent
        self.joins: dict[str, Judged] = {}  # with attest: "ramdisk", "node" -> the judged join
        self.node = node
        self.bmc = bmc
        self.on_step = on_step
        self.proxy_url = ""
        self.chunk_store = chunk_store
        self.chunks: Any = None          # the raw image's manifest (chunk_store)
        self.kexec = kexec
        self.kexec_console = ""          # QEMU's log of the serial line at the kexec'd join

    # -- plumbing -------------------------------------------------------------------------

    def fail(self, what: str) -> StepFailed:
        console = self.lab.console(self.node.power)[-3000:]
        site = self.lab.site_log_text()[-3000:]
        return StepFailed(f"{what}\n-- node console (tail) --\n{console}\n-- site daemon (tail) --\n{site}")

    def command(self, target: str, kind: str, payload: dict[str, Any],
                timeout: float = COMMAND_TIMEOUT) -> tuple[session_pb2.ResultBody, Any]:
        gw = self.lab.gateway
        cid = self.last_command = gw.send(target, kind, payload)
        try:
            body, result = gw.wait_result(cid, timeout)
        except TimeoutError:
            raise self.fail(f"{kind} on {target}: no result within {timeout:g}s; "
                            f"events {gw.events_for(cid)}") from None
        if body.status != session_pb2.SUCCEEDED:
            raise self.fail(f"{kind} on {target}: {session_pb2.Status.Name(body.status)} "
                            f"{body.reason}: {body.message}")
        return body, result

    def site(self, kind: str, payload: dict[str, Any]) -> Any:
        return self.command(SITE_NODE_ID, kind, payload)[1]

    def bmc_op(self, kind: str, operation: str, **parameters: str) -> Any:
        if self.bmc is None:
            raise self.fail(f"{kind} {operation}: this node has no BMC (power_on_directly)")
        return self.site(kind, {"node_id": self.node.name, "bmc_address": self.bmc.address,
                                "protocol": self.bmc.protocol, "operation": operation,
                                "credentials_ref": self.bmc.credentials_ref,
                                "verify_tls": self.bmc.verify_tls, "parameters": parameters})

    def step(self, name: str, started: float, evidence: str) -> None:
        s = Step(name, time.monotonic() - started, evidence)
        self.node.steps.append(s)
        if self.on_step is not None:
            self.on_step(s)

    def wait_joined(self, role: str, sessions: int, timeout: float = JOIN_TIMEOUT) -> Any:
        gw = self.lab.gateway

        def joined() -> Any:
            rec = gw.nodes.get(self.node.name)
            if rec is not None and rec.connected and rec.sessions >= sessions and rec.hello.role == role:
                return rec
            return None

        try:
            return gw.wait_for(joined, timeout, f"{self.node.name} joined in role {role}")
        except TimeoutError:
            raise self.fail(f"{self.node.name} did not join in role {role} within {timeout:g}s") from None

    # -- the steps ------------------------------------------------------------------------

    def run_all(self) -> list[Step]:
        self.query()
        self.prepare_ramdisk()
        self.boot_device("pxe")
        self.power_on()
        self.pxe_join()
        self.http_proxy()
        self.deploy()
        self.wipe()
        self.clean_up()
        if self.kexec:
            self.boot_kexec()
            self.kexec_join()
        self.boot_device("disk")
        self.power_cycle()
        self.disk_join()
        return self.node.steps

    def query(self) -> None:
        t = time.monotonic()
        result = self.bmc_op("bmc.query", "query")
        if result.power_state != "off":
            raise self.fail(f"bmc.query: the node should be off, the BMC says {result.power_state!r}")
        macs = [n.mac_address.lower() for n in result.nics]
        system = result.system
        if macs:
            if self.node.mac not in macs:
                raise self.fail(f"bmc.query: the BMC lists NICs {macs}, not the node's {self.node.mac}")
            found = f"host NIC MAC {self.node.mac} found"
        else:
            # IPMI has no portable way to list the host's NICs (agent/site/bmc/ipmi.py): the MAC
            # is the one the site's inventory holds for the node.
            assert self.bmc is not None   # bmc_op refused otherwise
            found = f"no host NIC over {self.bmc.protocol}; MAC {self.node.mac} from the inventory"
        self.step("bmc.query", t, f"{system.manufacturer} {system.model}, BMC firmware "
                                  f"{system.bmc_firmware_version}, power off; {found}")

    def prepare_ramdisk(self, cmdline_extra: str = "") -> None:
        """``cmdline_extra``: words added to the ramdisk's kernel command line (the demo's
        ``--break bad-cmdline``: qemu/sitebreak.py)."""
        t = time.monotonic()
        lab, name = self.lab, self.node.name
        payload: dict[str, Any] = {"node_id": name, "mac_address": self.node.mac,
                                   "boot_file": "ipxe.efi" if self.node.uefi else "undionly.kpxe",
                                   "ttl_seconds": 1800}
        if self.attest is not None:   # the site's UKI, the node's settings beside it
            payload.update(self.attest.entry(name))
        else:
            kernel, initrd = lab.www / "vmlinuz", lab.www / f"{name}-ramdisk.img"
            with contextlib.suppress(FileExistsError):  # shared by every node of the lab
                os.link(lab.ramdisk.kernel, kernel)
            initrd.unlink(missing_ok=True)
            os.link(lab.initrd(name, lab.overlay(test=True)), initrd)
            payload.update({
                "kernel_url": lab.upstream_url(kernel.name), "kernel_digest": {"hex": file_digest(kernel)},
                "initrd_url": lab.upstream_url(initrd.name), "initrd_digest": {"hex": file_digest(initrd)},
                "kernel_cmdline": " ".join(filter(None, (kernel_args(**lab.settings(name)), cmdline_extra)))})
        result = self.site("boot.prepareRamdisk", payload)
        if not result.entry_id:
            raise self.fail(f"boot.prepareRamdisk: no entry id in {result}")
        what = "a UKI entry (the site's build)" if self.attest is not None else "entry"
        self.step("boot.prepareRamdisk", t, f"{what} {result.entry_id} registered for {self.node.mac}")

    def boot_device(self, device: str) -> None:
        t = time.monotonic()
        mode = {"mode": "uefi"} if self.node.uefi else {}
        result = self.bmc_op("bmc.boot", "set_boot_device", device=device, persistent="true", **mode)
        seen = self.node.power.boot_device()
        if result.boot.device != device or seen != device:
            raise self.fail(f"bmc.boot {device}: the BMC says {result.boot.device!r}, the node "
                            f"will boot from {seen!r}")
        self.step(f"bmc.boot {device}", t, f"boot device read back: {result.boot.device}")

    def power_on(self) -> None:
        t = time.monotonic()
        self.boots_before = len(self.node.power.boots())
        result = self.bmc_op("bmc.power", "on")
        if result.power_state != "on" or self.node.power.status() != "on":
            raise self.fail(f"bmc.power on: the BMC says {result.power_state!r}, the node is "
                            f"{self.node.power.status()}")
        self.step("bmc.power on", t, f"power state read back: {result.power_state}")

    def power_on_directly(self) -> None:
        """Without a BMC: the node's next boot set to PXE and its QEMU started in the lab's
        namespace (where its tap device is), as a BMC's power on would."""
        t = time.monotonic()
        self.boots_before = len(self.node.power.boots())
        self.node.power.set_boot("pxe")
        self.lab.in_lan(self.node.power.start)
        if self.node.power.status() != "on":
            raise self.fail(f"power on without a BMC: the node is {self.node.power.status()}")
        self.step("power on (no BMC)", t, "QEMU started, its next boot PXE")

    def pxe_join(self) -> None:
        t = time.monotonic()
        rec = self.wait_joined("ramdisk", 1)
        log = self.lab.site_log_text()
        hyphens = self.node.mac.replace(":", "-")
        # arm64: the site's GRUB runs /boot.grub and the node's GRUB script, which it names by
        # ${net_default_mac} (colons; iPXE's by hyphens), with no iPXE after it.
        script = "grub" if self.lab.ramdisk.arch == "arm64" else "ipxe"
        by_mac = self.node.mac if script == "grub" else hyphens
        # arm64 under Secure Boot: the firmware started the site's UKI from its TFTP, no script.
        direct = self.attest is not None and self.attest.loader_digest is None
        wanted_lines = [] if direct else [f"GET /boot.{script} -> 200", f"GET /pxe/{by_mac}.{script} -> 200"]
        if self.attest is not None:   # the UKI from the store, the node's settings by its MAC
            wanted_lines += [] if direct else [f"GET /cache/{self.attest.uki_sha256} -> 200"]
            wanted_lines += [f"GET /pxe/{hyphens}.cmdline -> 200"]
        for wanted in wanted_lines:
            if wanted not in log:
                raise self.fail(f"joined, but the site's HTTP service never served {wanted!r}")
        boots = self.node.power.boots()[self.boots_before:]
        if not boots or boots[0].device != "pxe":
            raise self.fail(f"the node's boots since power on: {boots}")
        lease = self.lab.leases().get(self.node.mac, "?")
        firmware = "BIOS"
        if self.node.uefi:
            status, out = guest_shell(self.node, "test -d /sys/firmware/efi && echo efi=yes")
            if status != 0 or "efi=yes" not in out:
                raise self.fail(f"a UEFI node's ramdisk sees no /sys/firmware/efi: {out!r}")
            uefi = "AAVMF" if self.lab.ramdisk.arch == "arm64" else "OVMF"
            firmware = f"UEFI ({uefi}, /sys/firmware/efi in the ramdisk)"
        attested = self.check_attested(rec.boot_id) if self.attest is not None else ""
        chained = ("GRUB ran /boot.grub and the node's script" if script == "grub"
                   else "iPXE chained /boot.ipxe and the node's script")
        if direct:
            chained = "the firmware started the site's UKI from its TFTP"
        self.step("PXE boot + join", t, f"{firmware}: proxy DHCP offer -> {chained}; "
                                        f"address {lease} from the plain "
                                        f"DHCP; joined as {rec.hello.role}, boot {rec.boot_id[:8]}"
                                        f"{attested}")

    def check_attested(self, boot_id: str) -> str:
        """The ramdisk's join attested, PCR 4 matched to the site's UKI, after the loader the
        firmware's PXE started (ipxe.efi, the site's GRUB on arm64: docs/attestation.md); the
        evidence line's part."""
        assert self.attest is not None
        try:
            judged = self.joins["ramdisk"] = self.attest.wait_judged(self.node.name, boot_id)
        except TimeoutError as e:
            raise self.fail(str(e)) from None
        verdict, uki = judged.verdict, self.attest.uki_pcr4
        if not verdict.attested or verdict.matched.get("pcr4") != uki[0].hex():
            raise self.fail(f"the ramdisk's join: {verdict}")
        # What the firmware started: the loader (its PXE), then the UKI (iPXE may load it once
        # more to probe it first) and, on arm64, the kernel in it (x86's stub hands over to it:
        # initramfs/uki.py); nothing else.
        apps = pcr4_applications(judged.evidence)
        loader, name = self.attest.loader_digest, self.attest.loader_name
        n = len(uki)
        if loader is None:   # the firmware started the UKI itself (arm64 under Secure Boot)
            if "secure_boot" in self.attest.policy_doc:   # the stub starts its kernel unmeasured
                uki = uki[:1]
            if apps != uki:
                raise self.fail(f"PCR 4's applications {[a.hex()[:12] for a in apps]}: not the "
                                f"UKI {uki[0].hex()[:12]} ({name}) and what it starts, alone")
            return (f"; attested ({verdict.matched.get('build')}), PCR 4: "
                    + ", ".join("UKI" if a == uki[0] else "kernel" for a in apps))
        if (len(apps) < n + 1 or apps[0] != loader or apps[-n:] != uki
                or any(a != uki[0] for a in apps[1:-n])):
            raise self.fail(f"PCR 4's applications {[a.hex()[:12] for a in apps]}: not {name} "
                            f"{loader.hex()[:12]}, then the UKI {uki[0].hex()[:12]} and what it starts")
        names = {loader: name, uki[0]: "UKI", **{a: "kernel" for a in uki[1:]}}
        return (f"; attested ({verdict.matched.get('build')}), PCR 4: "
                + ", ".join(names.get(a, a.hex()[:12]) for a in apps))

    def http_proxy(self) -> None:
        t = time.monotonic()
        payload: dict[str, Any] = {"node_id": self.node.name, "ttl_seconds": 1800}
        if self.chunk_store:
            name = f"{self.node.name}.img"
            if not (self.lab.www / name).exists():
                os.link(self.node.image.raw, self.lab.www / name)
            self.chunks = manifest.build(self.node.image.raw, chunk_size=ROUTE_CHUNK)
            data = self.chunks.SerializeToString(deterministic=True)
            (self.lab.www / f"{name}.manifest").write_bytes(data)
            payload.update(upstream_url=self.lab.upstream_url(name),
                           max_bytes=2 * self.node.image.raw.stat().st_size,
                           manifest={"url": self.lab.upstream_url(f"{name}.manifest"),
                                     "digest": {"hex": hashlib.sha256(data).hexdigest()}})
        else:
            payload.update(upstream_url=self.lab.upstream_url(f"{self.node.name}.img.zst"),
                           max_bytes=2 * self.node.image.zst.stat().st_size)
        result = self.site("site.httpProxy", payload)
        self.proxy_url = result.proxy_url
        if not re.match(r"^http://10\.0\.2\.2:\d+/r/", self.proxy_url):
            raise self.fail(f"site.httpProxy: unexpected proxy_url {self.proxy_url!r}")
        # From the node itself: the upstream's port on every address of the lab's namespace
        # is closed to it (the upstream listens on that namespace's loopback only).
        port = self.lab.upstream.port
        status, out = guest_shell(self.node, " ; ".join(
            f"wget -q -T 5 -O /dev/null http://{a}:{port}/{self.node.name}.img.zst; echo {a}=$?"
            for a in ("10.0.2.100", "10.0.2.2")), timeout=60)
        direct = dict(re.findall(r"(10\.0\.2\.\d+)=(\d+)", out))
        if status != 0 or len(direct) != 2 or {"0", "127"} & set(direct.values()):
            raise self.fail(f"the node reached the upstream directly, or could not be asked: {out!r}")
        self.step("site.httpProxy", t, f"route {self.proxy_url.split('/r/')[0]}/r/… -> the "
                                       f"images' upstream; the node's own wget to it fails")

    def deploy(self) -> None:
        t = time.monotonic()
        image = self.node.image
        # The image's chunk manifest (`agent manifest`) travels inside the signed payload: each
        # chunk is verified before it is written, zero chunks are never hashed. Through a
        # route with the chunk store the image is the raw one, its manifest the route's.
        if self.chunk_store:
            chunks = self.chunks
            source: dict[str, Any] = {"url": self.proxy_url}
        else:
            chunks = manifest.build(image.zst)
            source = {"url": self.proxy_url, "format": "ZSTD",
                      "digest": {"algorithm": "sha256", "hex": image.zst_sha256}}
        payload = {**source, "manifest_inline": base64.b64encode(chunks.SerializeToString()).decode(),
                   "target": {"serial": "disk0"}, "verify_readback": True}
        refused = self.gate_refused(payload)
        result = self.command(self.node.name, "deploy.image", payload)[1]
        if result.image_bytes != image.raw.stat().st_size or result.verification != "manifest" \
                or result.chunks_verified + result.zero_chunks != chunks.chunk_count:
            raise self.fail(f"deploy.image: {result}")
        with self.node.deploy_disk.open("rb") as f:
            written = hashlib.sha256(f.read(result.image_bytes)).hexdigest()
        if written != image.raw_sha256:
            raise self.fail("deploy.image succeeded but the disk does not hold the image")
        served = re.findall(r"route \w+ \(node " + re.escape(self.node.name) + r"\) request \d+: "
                            r"GET \S+ -> 20[06], (\d+) bytes", self.lab.site_log_text())
        least = image.zst.stat().st_size if not self.chunk_store else sum(
            s.length for s in manifest.from_proto(chunks).segments if s.digest is not None)
        if not served or sum(int(n) for n in served) < least:
            raise self.fail(f"deploy.image succeeded but the route served {served} bytes")
        self.step("deploy.image", t, f"{result.image_bytes // MiB} MiB to disk0, "
                                     f"{sum(int(n) for n in served)} bytes through the route; "
                                     f"{result.chunks_verified} chunks verified before writing by the "
                                     f"manifest, {result.zero_chunks} zero chunks never hashed; disk "
                                     f"read back; {refused}")

    def gate_refused(self, payload: dict[str, Any]) -> str:
        """The control plane's choice, shown: the same deploy gated on a build this node is not
        (two NVMe drives: it has virtio disks) is refused before its disk is opened."""
        with self.node.deploy_disk.open("rb") as f:
            before = hashlib.sha256(f.read(4 * MiB)).hexdigest()
        gw = self.lab.gateway
        cid = gw.send(self.node.name, "deploy.image", {**payload, "gate": {"nvme": {"count": 2}}})
        body, _ = gw.wait_result(cid, COMMAND_TIMEOUT)
        with self.node.deploy_disk.open("rb") as f:
            after = hashlib.sha256(f.read(4 * MiB)).hexdigest()
        if body.status == session_pb2.SUCCEEDED or body.reason != "not_conforming" or after != before:
            raise self.fail(f"deploy.image gated on two NVMe drives: {body.reason}: {body.message}")
        return f"gated first on a build of two NVMe drives: refused ({body.message}), nothing written"

    def wipe(self) -> None:
        t = time.monotonic()
        result = self.command(self.node.name, "disk.wipe", {
            "disks": [{"serial": "disk1"}], "method": "BEST_AVAILABLE", "verify": "FULL"})[1]
        certs = list(result.certificates)
        if len(certs) != 1 or not certs[0].verified or certs[0].error or certs[0].disk.serial != "disk1":
            raise self.fail(f"disk.wipe: {result}")
        attested = ""
        if self.attest is not None:   # an attested kind: verified only from an attested boot
            ok, why = self.lab.gateway.verified(self.last_command)
            if not ok:
                raise self.fail(f"disk.wipe's certificate is not verified by the gateway: {why}")
            attested = "; the gateway counts it verified (signed in the attested boot)"
        with self.node.wipe_disk.open("rb") as f:
            if any(f.read()):
                raise self.fail("disk.wipe succeeded but disk1's backing file holds non-zero bytes")
        self.step("disk.wipe", t, f"disk1 wiped by {certs[0].tool or '?'}, certificate verified "
                                  f"({certs[0].verification_detail}), backing file all zeros{attested}")

    def clean_up(self) -> None:
        t = time.monotonic()
        result = self.site("boot.cleanUp", {"node_id": self.node.name})
        removed = list(result.removed)
        if f"entry {self.node.mac}" not in removed or not any(r.startswith("route ") for r in removed):
            raise self.fail(f"boot.cleanUp removed {removed}")
        self.step("boot.cleanUp", t, "removed: " + ", ".join(r.split()[0] for r in removed))

    def boot_kexec(self) -> None:
        """boot.kexec, as an operator sends it once the PXE entry is gone: the deployed disk's
        kernel and initramfs (read from its root partition, digests checked) with its command
        line. The command completes when the agent rejoins from the new kernel."""
        t = time.monotonic()
        gw, name = self.lab.gateway, self.node.name
        self.sessions_before = gw.nodes[name].sessions
        self.boot_id_before = gw.nodes[name].boot_id
        self.boots_before = len(self.node.power.boots())
        cid = gw.send(name, "boot.kexec", self.node.image.kexec_payload("disk0"))
        try:
            rec = gw.wait(cid, COMMAND_TIMEOUT)
        except TimeoutError:
            raise self.fail(f"boot.kexec did not complete; events {gw.events_for(cid)}") from None
        if rec.completion is None or not rec.completion.ok:
            raise self.fail(f"boot.kexec ended {rec.state}: {gw.events_for(cid)}")
        self.step("boot.kexec", t, f"{rec.state.name.lower()} by the rejoin proof: the deployed "
                                   f"kernel and initramfs from disk0's bcroot partition, digests checked")

    def kexec_join(self) -> None:
        t = time.monotonic()
        rec = self.wait_joined("node", self.sessions_before + 1)
        if rec.boot_id == self.boot_id_before:
            raise self.fail("rejoined after the kexec with the ramdisk's boot id")
        boots = self.node.power.boots()[self.boots_before:]
        if boots or self.node.power.status() != "on":
            raise self.fail(f"a kexec is no power event, but the node's boots since it: {boots}")
        # the agent writes its "connected to gateway" line a moment after the gateway has its
        # hello: QEMU's log of the serial line is taken once it holds the new kernel's join
        deadline, console = time.monotonic() + 30.0, ""
        while time.monotonic() < deadline:
            console = self.lab.console(self.node.power)
            if re.search(r"reboot\(LINUX_REBOOT_CMD_KEXEC\)[\s\S]*node root .* mounted on /sysroot"
                         r"[\s\S]*connected to gateway", console):
                break
            time.sleep(0.2)
        else:
            raise self.fail("joined as node, but the console shows no kexec into the disk's root "
                            "and the join from it")
        self.kexec_console = console
        self.step("kexec + join", t, f"no power event, no firmware: the same QEMU process; root "
                                     f"LABEL=bcroot on disk0; joined as {rec.hello.role}, new boot "
                                     f"{rec.boot_id[:8]}")

    def power_cycle(self) -> None:
        t = time.monotonic()
        self.sessions_before = self.lab.gateway.nodes[self.node.name].sessions
        self.boot_id_before = self.lab.gateway.nodes[self.node.name].boot_id
        self.boots_before = len(self.node.power.boots())
        result = self.bmc_op("bmc.power", "cycle")
        if result.power_state != "on":
            raise self.fail(f"bmc.power cycle: the BMC says {result.power_state!r}")
        self.step("bmc.power cycle", t, f"power state read back: {result.power_state}")

    def disk_join(self) -> None:
        t = time.monotonic()
        rec = self.wait_joined("node", self.sessions_before + 1)
        if rec.boot_id == self.boot_id_before:
            raise self.fail("rejoined with the ramdisk's boot id")
        boots = self.node.power.boots()[self.boots_before:]
        if not boots or any(b.device != "disk" for b in boots):
            raise self.fail(f"the node's boots since the cycle: {boots}")
        console = self.lab.console(self.node.power)
        if not re.search(r"node root .* mounted on /sysroot", console):
            raise self.fail("joined as node, but the console does not show the disk's root mounted")
        verdict = ""
        if self.attest is not None:   # judged, not required to attest: the test says what it is
            try:
                self.joins["node"] = self.attest.wait_judged(self.node.name, rec.boot_id)
            except TimeoutError as e:
                raise self.fail(str(e)) from None
            verdict = f"; {self.joins['node'].verdict}"
        self.step("disk boot + join", t, f"booted from disk (no boot offer), root LABEL=bcroot on "
                                         f"disk0; joined as {rec.hello.role}, new boot "
                                         f"{rec.boot_id[:8]}{verdict}")


class NodeRoleSteps:
    """In role node on the deployed disk: driver.invoke of a real driver, logs.collect and
    instance.snapshot uploaded to ``upload``, then daemon.upgrade to a newer build fetched
    through a site route (the node rejoins with the new version)."""

    def __init__(self, life: Lifecycle, upload: UploadTarget) -> None:
        self.life = life
        self.upload = upload

    def run_all(self, new_build: Path, new_version: str) -> list[Step]:
        self.driver_invoke()
        self.logs_collect()
        self.snapshot()
        self.upgrade(new_build, new_version)
        return self.life.node.steps

    def driver_invoke(self) -> None:
        life, t = self.life, time.monotonic()
        # nvme-cli is in the node's userland (the ramdisk's: ethtool, ipmitool, nvidia-smi are
        # not); the node's disks are virtio, so the version query is what it can answer.
        result = life.command(life.node.name, "driver.invoke", {
            "driver": "nvme", "operation": "version", "arguments": {}})[1]
        out = bytes(result.stdout).decode(errors="replace").strip()
        if result.exit_code != 0 or "nvme version" not in out:
            raise life.fail(f"driver.invoke nvme version: {result}")
        life.step("driver.invoke", t, f"{' '.join(result.argv)} -> {out.splitlines()[0]}")

    def logs_collect(self) -> None:
        life, t = self.life, time.monotonic()
        path = f"/logs/{life.node.name}.tar"
        result = life.command(life.node.name, "logs.collect", {
            "upload_url": self.upload.url(path),   # the agent's own logs, and the kernel's
            "include_kernel_log": True})[1]
        got = self.upload.uploads().get(path)
        if got is None or hashlib.sha256(got).hexdigest() != result.archive_digest.hex:
            raise life.fail(f"logs.collect: upload {'missing' if got is None else 'differs'}: {result}")
        life.step("logs.collect", t, f"{len(result.manifest)} files, {len(got)} bytes uploaded, "
                                     f"sha256 {result.archive_digest.hex[:12]}… matches")

    def snapshot(self) -> None:
        life, t = self.life, time.monotonic()
        path = f"/snapshots/{life.node.name}-disk1.zst"
        result = life.command(life.node.name, "instance.snapshot", {
            "source_path": "/dev/vdb", "upload_url": self.upload.url(path),
            "compression": "ZSTD_COMPRESSION"})[1]
        got = self.upload.uploads().get(path)
        raw = life.node.wipe_disk.stat().st_size
        if (got is None or hashlib.sha256(got).hexdigest() != result.uploaded_digest.hex
                or result.source_bytes != raw
                or result.source_digest.hex != hashlib.sha256(bytes(raw)).hexdigest()):
            raise life.fail(f"instance.snapshot: {result}")
        life.step("instance.snapshot", t, f"/dev/vdb ({raw // MiB} MiB, the wiped disk: its "
                                          f"zeros' digest) -> {len(got)} bytes zstd uploaded")

    def upgrade(self, new_build: Path, new_version: str) -> None:
        from agent.proto import agent_pb2, common_pb2
        from agent.security.trust import SigningKey

        life, t = self.life, time.monotonic()
        lab, name = life.lab, life.node.name
        os.link(new_build, lab.www / f"{name}-agent.pyz")
        route = life.site("site.httpProxy", {
            "node_id": name, "upstream_url": lab.upstream_url(f"{name}-agent.pyz"),
            "ttl_seconds": 600})
        data = new_build.read_bytes()
        sha = hashlib.sha256(data)
        key = SigningKey.load(lab.pki.signing_key)
        before = lab.gateway.nodes[name]
        old_version, sessions = before.hello.agent_version, before.sessions
        cid = lab.gateway.send(name, "daemon.upgrade", agent_pb2.DaemonSection(
            version=new_version, url=route.proxy_url,
            digest=common_pb2.Digest(algorithm="sha256", hex=sha.hexdigest()),
            signature=key.sign_artifact(sha.digest()), key_id=key.key_id,
            rejoin_timeout_seconds=300))
        try:
            rec = lab.gateway.wait(cid, COMMAND_TIMEOUT)
        except TimeoutError:
            raise life.fail("daemon.upgrade did not complete") from None
        after = lab.gateway.nodes[name]
        if (rec.state is not State.COMPLETED or after.hello.agent_version != new_version
                or after.sessions <= sessions or after.hello.role != "node"):
            raise life.fail(f"daemon.upgrade: {rec.state} {lab.gateway.events_for(cid)}; "
                            f"rejoined as {after.hello.role} {after.hello.agent_version}")
        life.step("daemon.upgrade", t, f"{old_version} -> {new_version} through a site route, "
                                       f"signed build verified; rejoined in role node")


def guest_shell(node: SiteNode, command: str, timeout: float = 60.0) -> tuple[int, str]:
    """A command on the test ramdisk's debug shell (its second serial port, a unix socket in
    the node directory: qemu/harness.py's Machine.shell)."""
    spec = node.power.spec()
    shell = Machine(MachineSpec(workdir=node.power.dir, kernel=Path(spec.kernel),
                                initrd=Path(spec.initrd), name=spec.name, arch=spec.arch))
    try:
        return shell.shell(command, timeout)
    finally:
        shell.stop()


def timeline_lines(result: Any, joined: Mapping[str, float] | None = None) -> list[str]:
    """What the demo prints of the site's view of each node's boot: the site's inventory.refresh
    result's ``node_boots`` (agent/site/observe/), a line per node and one per step under it.
    ``joined``: when the gateway saw each node join (unix seconds). The control plane merges its
    own join with the site's timeline (docs/site.md): an attempt the site still calls booting,
    whose node the gateway joined after it began, is said joined, by the gateway."""
    lines = []
    for boot, head in zip(getattr(result, "node_boots", ()), _heads(result), strict=False):
        at = (joined or {}).get(boot.node_id)
        began = boot.started_unix_ms / 1000
        if boot.outcome == "booting" and at is not None and at >= began:
            head = head.replace(": booting", f": joined (the gateway's join, +{at - began:.1f}s; "
                                             "the site's console has not shown it)", 1)
        lines.append(head)
        lines.extend(f"    {step}" for step in boot.steps)
    return lines


def gateway_joins(lab: SiteLab) -> dict[str, float]:
    """When the lab's gateway last saw each connected node join (unix seconds)."""
    joins: dict[str, float] = {}
    for event in list(lab.gateway.events):
        if event.what == "connected" and event.node_id:
            joins[event.node_id] = event.time
    return {n: t for n, t in joins.items() if (rec := lab.gateway.nodes.get(n)) is not None and rec.connected}


def _site_lags(result: Any, joined: Mapping[str, float]) -> bool:
    """Whether the site still calls booting an attempt whose node the gateway joined."""
    return any(b.outcome == "booting" and joined.get(b.node_id, 0.0) >= b.started_unix_ms / 1000 > 0
               for b in getattr(result, "node_boots", ()))


def _heads(result: Any) -> list[str]:
    from agent.gateway.cli import boots_summary

    return [line for line in boots_summary(result) if not line.startswith("    |")]


def say_timelines(lab: SiteLab, say: Callable[[str], None], settle: float = 3.0,
                  catch_up: float = 15.0) -> None:
    """Ask the site for each node's last boot attempt and print its timeline; never fails the
    demo (a site that cannot answer is said). ``settle``: seconds waited first, as the demo asks
    right after the last join and the console's line of it comes after the gateway's (asked 0.4
    s after, a joined node showed ``booting``; 3 s after, still, in issue 56): asked again each
    2 s while the site calls a node booting that the gateway joined, ``catch_up`` seconds at
    most, and then the gateway's join is merged in (``timeline_lines``), said as the gateway's."""
    time.sleep(settle)
    deadline = time.monotonic() + catch_up
    while True:
        try:
            cid = lab.gateway.send(SITE_NODE_ID, "inventory.refresh", {"skip_gpus": True})
            body, result = lab.gateway.wait_result(cid, 120)
        except Exception as exc:  # the demo's work is done; this is its report
            say(f"TIMELINES: the site did not answer ({exc})")
            return
        joined = gateway_joins(lab)
        if body.status != session_pb2.SUCCEEDED or not _site_lags(result, joined) \
                or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    if body.status != session_pb2.SUCCEEDED:
        say(f"TIMELINES: inventory.refresh {body.reason}: {body.message}")
        return
    say("TIMELINES (the site's view of each node's last boot attempt; docs/site.md):")
    for line in timeline_lines(result, joined):
        say(line)
