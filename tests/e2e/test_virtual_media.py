"""A node's life over Redfish virtual media with no DHCP server on the network at all
(issue #29), in QEMU: sushy-tools' emulator is the BMC (its VirtualMedia downloads the media
from the site, its hook puts them in the QEMU node's CD drives: tests/site/bmc/sushy.py,
qemu/powered.py), the site daemon runs its HTTP service alone (no dnsmasq), and the lab has
no plain DHCP server either. qemu/sitemedia.py runs and checks each step:

    bmc.query -> boot.prepareRamdisk (virtual media, static address) -> bmc.storage
    insert_media (ISO, config medium) -> bmc.boot cdrom -> bmc.power on -> the ramdisk joins
    over its static address -> site.httpProxy -> deploy.image -> disk.wipe -> boot.cleanUp
    -> eject_media -> bmc.boot disk -> bmc.power cycle -> rejoined as a node

x86 under SeaBIOS (El Torito) and under OVMF's Secure Boot build with the fleet's keys (the
signed ISO's EFI boot image, the signed UKI: issue 52); arm64 under UEFI in
test_virtual_media_arm64.py. The step times are printed; docs/performance.md has the
power-on-to-joined figure against PXE's.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.boot.vmedia import StaticNetwork
from initramfs import iso
from qemu import secureboot
from qemu.lab import Lab, Ramdisk
from qemu.sitelab import SiteLab, missing_network_prerequisites
from qemu.sitelife import Bmc, Step
from qemu.sitemedia import (
    MediaLifecycle,
    build_lab_iso,
    build_signed_lab_iso,
    make_media_node,
    user_net_media,
)
from tests.loopback_http import self_signed_cert
from tests.site.bmc.sushy import USER, NodeHook, SushyEmulator

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

PASSWORD = "Redfish-Emu-Pass-8842"
REF = "rack1-vm01"
STEPS = ["bmc.query", "boot.prepareRamdisk", "bmc.storage insert_media", "bmc.boot cdrom",
         "bmc.power on", "CD boot + join", "site.httpProxy", "deploy.image", "disk.wipe",
         "boot.cleanUp", "bmc.storage eject_media", "bmc.boot disk", "bmc.power cycle",
         "disk boot + join"]


def skip_without_tools() -> None:
    reason = missing_network_prerequisites() or iso.missing_tools()
    if reason:
        pytest.skip(reason)
    if shutil.which("sushy-emulator", path=str(Path(sys.executable).parent)) is None \
            and shutil.which("sushy-emulator") is None:
        pytest.skip("sushy-emulator is not installed (pip install sushy-tools: the dev extra)")


@contextlib.contextmanager
def lab_without_dhcp(workdir: Path, parts: Ramdisk) -> Iterator[SiteLab]:
    """The site lab with no DHCP server and the site daemon without dnsmasq; the ISO built."""
    with SiteLab(workdir, parts, dhcp=False) as lab:
        lab.start_site(proxy_dhcp=False)
        SecretStore(lab.secrets_dir).put(REF, Credentials(USER, PASSWORD))
        build_lab_iso(lab)
        yield lab


@pytest.fixture(scope="module")
def media_lab(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteLab]:
    skip_without_tools()
    with lab_without_dhcp(tmp_path_factory.mktemp("medialab"), ramdisk_parts) as lab:
        yield lab


def run_life(lab: SiteLab, name: str, mac: str, uefi: bool, tmp_path: Path, *,
             iso_image: Path | None = None, secure_boot_vars: Path | None = None) -> list[Step]:
    """The node's life over virtual media; ``iso_image``: another ISO in the lab's upstream than
    its plain one; ``secure_boot_vars``: the node under Secure Boot with these keys."""
    node = make_media_node(lab, name, mac=mac, uefi=uefi, secure_boot_vars=secure_boot_vars)
    cert, key = self_signed_cert(str(tmp_path))
    hook = lab.in_lan(lambda: NodeHook(node.power).__enter__())
    shown: list[Step] = []
    try:
        emu = lab.in_lan(lambda: SushyEmulator(tmp_path / "emu", password=PASSWORD, tls=(cert, key),
                                               notify_url=hook.url, mac=mac).__enter__())
        try:
            life = MediaLifecycle(lab, node, Bmc("redfish", f"127.0.0.1:{emu.port}", REF,
                                                 verify_tls=False), iso_image)
            life.on_step = shown.append
            life.run_all()
        finally:
            for s in shown:
                print(f"{s.seconds:7.1f}s  {s.name:26} {s.evidence}")
            emu.__exit__()
            node.power.stop(force=True)   # one QEMU at a time on a shared machine
    finally:
        hook.__exit__()
    assert not hook.errors, hook.errors
    assert [s.name for s in shown] == STEPS
    assert "insert cd" in hook.events and "eject cd" in hook.events
    # The destructive kinds went signed.
    for kind in ("bmc.boot", "deploy.image", "disk.wipe"):
        recs = [r for r in lab.gateway.commands.values() if r.kind == kind]
        assert recs and all(r.signed.signature for r in recs), kind
    print(f"power on -> joined over virtual media: {life.join_seconds:.1f} s")
    return shown


def test_virtual_media_life_bios(media_lab: SiteLab, tmp_path: Path) -> None:
    run_life(media_lab, "vm-bios", "52:54:00:5e:00:11", False, tmp_path)


def test_virtual_media_life_uefi_with_secure_boot_on(media_lab: SiteLab, tmp_path: Path) -> None:
    """The UEFI node under OVMF's Secure Boot build with the fleet's keys (made now, enrolled by
    virt-fw-vars: qemu/secureboot.py); the site serves the ISO the build signs (its EFI boot the
    signed UKI: initramfs/iso.py, "Secure Boot"), which the BMC mounts and the firmware verifies
    and starts; the ramdisk reads SecureBoot = 1 (MediaLifecycle.media_join). The disk boot after
    it is QEMU's -kernel, which proves nothing of Secure Boot (docs/site.md, "Secure Boot")."""
    reason = secureboot.missing()
    if reason:
        pytest.skip(reason)
    keys = secureboot.FleetKeys.generate(tmp_path / "keys")
    image = build_signed_lab_iso(media_lab, keys.db_key())
    shown = run_life(media_lab, "vm-uefi", "52:54:00:5e:00:12", True, tmp_path, iso_image=image,
                     secure_boot_vars=keys.enrolled_vars(tmp_path / "vars.fd"))
    joined = next(s for s in shown if s.name == "CD boot + join")
    assert "UEFI Secure Boot" in joined.evidence and "SecureBoot = 1" in joined.evidence, joined


def test_bad_config_medium_is_said_and_dhcp_takes_over(lab: Lab, tmp_path: Path) -> None:
    """Booted from the ISO with a config medium that names a NIC this machine lacks: the
    ramdisk says so on the console and in the kernel log, does not reboot, brings its network
    up by DHCP instead (QEMU's user network has a DHCP server) and joins with the medium's
    settings. On QEMU's user network, without the site lab."""
    reason = iso.missing_tools()
    if reason:
        pytest.skip(reason)
    node = "vm-bad-medium"
    wrong = StaticNetwork("02:00:00:00:00:99", "10.0.2.15", 24, "10.0.2.2", ())
    machine = lab.boot(node, media=user_net_media(lab, node, tmp_path, network=wrong))
    try:
        lab.wait_joined(machine, node, 420)
        console = machine.console()
        said = "config medium: network: no NIC has MAC 02:00:00:00:00:99"
        assert said in console and "falling back to DHCP" in console
        assert "network: eth0 10.0.2.15/24" in console  # the DHCP lease (udhcpc's script)
        status, out = machine.shell('echo "kmsg=$(dmesg | grep -c \'no NIC has MAC 02:00:00:00:00:99\')"')
        assert status == 0 and "kmsg=1" in out, out  # in the kernel log once
        assert lab.gateway.nodes[node].sessions == 1  # one boot: no reboot loop
    finally:
        machine.stop()
