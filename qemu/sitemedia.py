"""A node's life over Redfish virtual media, with no DHCP server on the network at all: what
tests/e2e/test_virtual_media.py runs and checks, and what ``./dev demo --virtual-media`` shows.

    bmc.query -> boot.prepareRamdisk (virtual_media: static address) -> bmc.storage
    insert_media (the ramdisk ISO, CD) and insert_media (the node's config medium, USBStick)
    -> bmc.boot cdrom (once) -> bmc.power on -> (the firmware boots the ISO, GRUB the ramdisk,
    which reads its config medium, brings its NIC up statically and joins) -> site.httpProxy
    -> deploy.image through the route -> disk.wipe -> boot.cleanUp -> bmc.storage eject_media
    -> bmc.boot disk -> bmc.power cycle -> (the node boots its disk, whose own static network
    file brings it up, and joins in role node)

The lab (qemu/sitelab.py) runs without its plain DHCP server and the site daemon without
dnsmasq (no proxy DHCP, no TFTP): the only way in is the BMC. The BMC is sushy-tools'
emulator (tests/site/bmc/sushy.py), whose VirtualMedia downloads each image from the site's HTTP
service and whose hook puts it in the QEMU node's drives (qemu/powered.py). Each step as in
qemu/sitelife.py: checked where it happens and from outside, a ``Step`` with its evidence.
"""

from __future__ import annotations

import hashlib
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.proto import site_pb2
from agent.site.boot.vmedia import MediaRequest, StaticNetwork, iso9660
from initramfs import build as ramdisk
from initramfs import iso, signing
from initramfs.signing import DbKey
from qemu.harness import GUEST_HOST, PLATFORMS
from qemu.lab import GATEWAY_PORT, GUEST_TRUST, Lab
from qemu.sitelab import GATEWAY_ADDRESS, SITE_ADDRESS, SiteLab
from qemu.sitelife import Bmc, Lifecycle, SiteNode, guest_shell, make_node

NODE_ADDRESS = "10.0.2.50"       # outside the lab's DHCP range: nothing hands it out
PREFIX = 24
ISO_NAME = "ramdisk.iso"
SIGNED_ISO_NAME = "ramdisk-signed.iso"   # the same for Secure Boot: the signed UKI its EFI boot
# efivarfs: the SecureBoot variable (4 bytes of attributes, then its one byte).
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
MEDIA_TIMEOUT = 120.0


def static_network(mac: str) -> StaticNetwork:
    return StaticNetwork(mac, NODE_ADDRESS, PREFIX, SITE_ADDRESS, (SITE_ADDRESS,))


def build_lab_iso(lab: Lab) -> Path:
    """The lab's shared ramdisk ISO in its upstream's directory: the test ramdisk (debug
    shell, the lab's CA and trust key) on the ISO initramfs/iso.py makes, as ``--iso`` does."""
    target = lab.www / ISO_NAME
    if not target.is_file():
        initrd = lab.initrd("iso", lab.overlay(test=True))
        arch = ramdisk.ARCHES[lab.ramdisk.arch]
        iso.build_iso(lab.ramdisk.kernel, initrd, target, arch=arch.name, out=ramdisk.out_dir(arch))
    return target


def build_signed_lab_iso(lab: Lab, db_key: DbKey) -> Path:
    """The lab's ramdisk ISO as ``--iso --iso-uki --db-key`` makes it: its EFI boot the test
    ramdisk as a UKI signed with ``db_key`` (the firmware verifies and starts it: initramfs/iso.py,
    "Secure Boot"), the kernel and initramfs beside it for BIOS."""
    target = lab.www / SIGNED_ISO_NAME
    if not target.is_file():
        esp, _ = lab.uki("iso-signed", settings={"media": "cdrom"},
                         sign=lambda image: signing.sign(image, db_key))
        arch = ramdisk.ARCHES[lab.ramdisk.arch]
        name = "BOOTX64.EFI" if arch.name == "amd64" else "BOOTAA64.EFI"
        iso.build_iso(lab.ramdisk.kernel, lab.workdir / "iso-signed-initrd.img", target, arch=arch.name,
                      out=ramdisk.out_dir(arch), uki=esp / "EFI" / "BOOT" / name, db_key=db_key)
    return target


def user_net_media(lab: Lab, node: str, workdir: Path, *,
                   network: StaticNetwork | None = None) -> tuple[str, str]:
    """(the lab's ramdisk ISO, ``node``'s config medium) for a node on QEMU's user network
    (qemu/lab.py's ``Lab.boot(media=...)``): by default the harness NIC's static address
    10.0.2.15/24, the gateway reached at GUEST_HOST as ever."""
    return str(build_lab_iso(lab)), str(user_net_config(lab, node, workdir, network=network))


def user_net_config(lab: Lab, node: str, workdir: Path, *, network: StaticNetwork | None = None) -> Path:
    """``node``'s config medium for a node on QEMU's user network (``user_net_media``)."""
    mac = "52:54:00:12:34:56"  # the harness's NIC
    s = lab.settings(node)
    req = MediaRequest(node, mac, "", "", network or StaticNetwork(mac, "10.0.2.15", 24, "10.0.2.2", ()),
                       f"{GUEST_HOST}:{GATEWAY_PORT}", lab.pki.ca.read_bytes(),
                       f"bc.token={s['token']} bc.trust={GUEST_TRUST} bc.reconnect_min=0.5 "
                       "bc.reconnect_max=3", 60)
    config = workdir / f"{node}-config.iso"
    config.write_bytes(iso9660(req.medium_files()))
    return config


def make_media_node(lab: SiteLab, name: str, *, mac: str, uefi: bool = False,
                    secure_boot_vars: Path | None = None) -> SiteNode:
    """qemu/sitelife.py's node, its image carrying its own static network; ``secure_boot_vars``:
    under Secure Boot with these keys (qemu/secureboot.py)."""
    return make_node(lab, name, mac=mac, uefi=uefi, network=static_network(mac).file(),
                     secure_boot_vars=secure_boot_vars)


class MediaLifecycle(Lifecycle):
    def __init__(self, lab: SiteLab, node: SiteNode, bmc: Bmc, iso_image: Path | None = None) -> None:
        super().__init__(lab, node, bmc)
        self.iso = iso_image if iso_image is not None else build_lab_iso(lab)   # in lab.www
        self.media_urls: tuple[str, str] = ("", "")
        self.join_seconds = 0.0      # power on (the command sent) to joined

    def run_all(self) -> list[Any]:
        self.query()
        self.prepare_media()
        self.insert_media()
        self.boot_once("cdrom")
        self.power_on()
        self.media_join()
        self.http_proxy()
        self.deploy()
        self.wipe()
        self.clean_up()
        self.eject_media()
        self.boot_device("disk")
        self.power_cycle()
        self.disk_join()
        return self.node.steps

    def prepare_media(self) -> None:
        t = time.monotonic()
        lab, name = self.lab, self.node.name
        settings = lab.settings(name)
        extra = " ".join(f"bc.{k}={settings[k]}" for k in ("token", "reconnect_min", "reconnect_max"))
        net = static_network(self.node.mac)
        result = self.site("boot.prepareRamdisk", {
            "node_id": name, "mac_address": self.node.mac, "boot_method": "virtual_media",
            "iso_url": lab.upstream_url(self.iso.name), "ttl_seconds": 1800,
            "iso_digest": {"hex": hashlib.sha256(self.iso.read_bytes()).hexdigest()},
            "static_network": {"address": net.address, "prefix_length": net.prefix,
                               "default_route": net.default_route, "dns": list(net.dns)},
            "agent_gateway": f"{GATEWAY_ADDRESS}:{GATEWAY_PORT}", "ca_pem": lab.pki.ca.read_text(),
            "kernel_cmdline": f"{extra} bc.trust={GUEST_TRUST}"})
        if not isinstance(result, site_pb2.ProxyDhcpResult) or not result.config_media_url:
            raise self.fail(f"boot.prepareRamdisk (virtual media): {result}")
        self.media_urls = (result.ramdisk_media_url, result.config_media_url)
        if not all(re.match(rf"^http://{re.escape(SITE_ADDRESS)}:\d+/vm/[\w-]{{32}}/", u)
                   for u in self.media_urls):
            raise self.fail(f"boot.prepareRamdisk: unexpected media URLs {self.media_urls}")
        self.step("boot.prepareRamdisk", t, f"config medium for {self.node.mac} ({NODE_ADDRESS}/"
                                            f"{PREFIX}) and the shared ISO at /vm/…/, no PXE entry")

    def insert_media(self) -> None:
        t = time.monotonic()
        seen = []
        for url, media_type, slot in ((self.media_urls[0], "CD", "cd"),
                                      (self.media_urls[1], "USBStick", "usb")):
            result = self.bmc_op("bmc.storage", "insert_media", image_url=url, media_type=media_type)
            back = list(result.virtual_media)
            if len(back) != 1 or not back[0].inserted:
                raise self.fail(f"bmc.storage insert_media {media_type}: read back {back}")
            seen.append(f"{media_type} in {back[0].id}")
            self.wait(lambda s=slot: s in self.node.power.media(), f"the node's {slot} drive filled")
        sizes = {s: Path(p).stat().st_size for s, p in self.node.power.media().items()}
        self.step("bmc.storage insert_media", t, f"{', '.join(seen)} read back inserted; the node's "
                                                 f"drives hold {sizes['cd']} + {sizes['usb']} bytes")

    def boot_once(self, device: str) -> None:
        t = time.monotonic()
        mode = {"mode": "uefi"} if self.node.uefi else {}
        result = self.bmc_op("bmc.boot", "set_boot_device", device=device, persistent="false", **mode)
        self.wait(lambda: self.node.power.boot_device() == device, f"the node set to boot {device}")
        if result.boot.device != device:
            raise self.fail(f"bmc.boot {device}: the BMC says {result.boot.device!r}")
        note = " (the emulator keeps overrides Continuous)" if result.boot.persistent else ""
        self.step(f"bmc.boot {device}", t, f"once; read back {result.boot.device}{note}")

    def power_on(self) -> None:
        self.power_on_at = time.monotonic()
        super().power_on()

    def media_join(self) -> None:
        t = time.monotonic()
        rec = self.wait_joined("ramdisk", 1)
        self.join_seconds = time.monotonic() - self.power_on_at
        console = self.lab.console(self.node.power)
        wanted = "static, from the config medium (no DHCP)"
        if wanted not in console:
            raise self.fail(f"joined, but the console does not say {wanted!r}")
        boots = self.node.power.boots()[self.boots_before:]
        if not boots or boots[0].device != "cdrom":
            raise self.fail(f"the node's boots since power on: {boots}")
        log = self.lab.site_log_text()
        for name in ("ramdisk.iso", "config.iso"):
            if f"GET /vm/…/{name} -> 200" not in log:
                raise self.fail(f"the BMC never fetched {name} from the site's HTTP service")
        token = self.media_urls[0].split("/vm/")[1].split("/")[0]
        if token in log:
            raise self.fail("the site daemon's log holds the media's token")
        if self.lab.net.plain_dhcp is not None or "agent.site.boot.dnsmasq" in log:
            raise self.fail("a DHCP server runs on the lab's network")
        status, out = guest_shell(self.node, "ip -4 addr show; ls /run/udhcpc.* 2>&1; "
                                             'echo "efi=$(test -d /sys/firmware/efi && echo yes)"; '
                                             f"echo sb=$(od -An -tu1 {SECURE_BOOT_VAR} 2>/dev/null)")
        if status != 0 or f"inet {NODE_ADDRESS}/{PREFIX}" not in out or "udhcpc.eth" in out:
            raise self.fail(f"the ramdisk's network is not the static one alone: {out!r}")
        firmware = "BIOS (SeaBIOS, El Torito)"
        if self.node.uefi:
            if "efi=yes" not in out:
                raise self.fail(f"a UEFI node's ramdisk sees no /sys/firmware/efi: {out!r}")
            firmware = "UEFI (El Torito EFI image, GRUB)"
            if self.node.power.spec().secure_boot:
                # The firmware enforced the fleet's keys: SecureBoot 1 (after its 4 attribute bytes).
                if not re.search(r"(?m)^sb=\s*6 0 0 0 1\s*$", out):
                    raise self.fail(f"a Secure Boot node's ramdisk reads no SecureBoot = 1: {out!r}")
                firmware = "UEFI Secure Boot (the El Torito EFI image: the signed UKI, SecureBoot = 1)"
        elif PLATFORMS[self.lab.ramdisk.arch].always_uefi:
            firmware = "UEFI (arm64)"
        self.step("CD boot + join", t, f"{firmware}: the BMC fetched both media; {NODE_ADDRESS}/{PREFIX} "
                                       f"static from the config medium, no DHCP on the network; "
                                       f"joined as {rec.hello.role} {self.join_seconds:.1f} s after "
                                       f"power on")

    def clean_up(self) -> None:
        t = time.monotonic()
        result = self.site("boot.cleanUp", {"node_id": self.node.name})
        removed = list(result.removed)
        if f"media {self.node.mac}" not in removed or not any(r.startswith("route ") for r in removed):
            raise self.fail(f"boot.cleanUp removed {removed}")
        if self.lab.in_lan(http_status, self.media_urls[1]) != 404:
            raise self.fail("the config medium is still served after boot.cleanUp")
        self.step("boot.cleanUp", t, "removed: " + ", ".join(r.split()[0] for r in removed)
                  + "; /vm/…/config.iso now 404")

    def eject_media(self) -> None:
        t = time.monotonic()
        self.bmc_op("bmc.storage", "eject_media")
        result = self.bmc_op("bmc.storage", "list")
        if any(m.inserted for m in result.virtual_media):
            raise self.fail(f"eject_media: still inserted {list(result.virtual_media)}")
        self.wait(lambda: not self.node.power.media(), "the node's drives emptied")
        self.step("bmc.storage eject_media", t, "both drives read back empty, the node's too")

    def disk_join(self) -> None:
        super().disk_join()
        if "static, from the node's /etc/bettercompute/network" not in self.lab.console(self.node.power):
            raise self.fail("joined as node, but not over the disk's static network")

    def wait(self, ready: Any, what: str, timeout: float = MEDIA_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise self.fail(f"{what}: not within {timeout:g}s")
            time.sleep(0.2)


def http_status(url: str) -> int:
    """The status of a GET of ``url`` (run in the lab's namespace: ``lab.in_lan``)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310  (the lab's own http URL)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
