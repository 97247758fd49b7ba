"""A node's life over Redfish virtual media with no DHCP server on the network at all
(issue #29), in QEMU: sushy-tools' emulator is the BMC (its VirtualMedia downloads the media
from the site, its hook puts them in the QEMU node's CD drives: tests/site/bmc/sushy.py,
qemu/powered.py), the site daemon runs its HTTP service alone (no dnsmasq), and the lab has
no plain DHCP server either. qemu/sitemedia.py runs and checks each step:

    bmc.query -> boot.prepareRamdisk (virtual media, static address) -> bmc.storage
    insert_media (ISO, config medium) -> bmc.boot cdrom -> bmc.power on -> the ramdisk joins
    over its static address -> site.httpProxy -> deploy.image -> disk.wipe -> boot.cleanUp
    -> eject_media -> bmc.boot disk -> bmc.power cycle -> rejoined as a node

x86 under SeaBIOS (El Torito) and under OVMF (the ISO's EFI boot image); arm64 under UEFI in
test_virtual_media_arm64.py. The step times are printed; docs/performance.md has the
power-on-to-joined figure against PXE's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.boot.vmedia import StaticNetwork
from initramfs import iso
from qemu.lab import Lab, Ramdisk
from qemu.sitelab import OVMF, SiteLab, missing_network_prerequisites
from qemu.sitelife import Bmc, Step
from qemu.sitemedia import MediaLifecycle, build_lab_iso, make_media_node, user_net_media
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


def run_life(lab: SiteLab, name: str, mac: str, uefi: bool, tmp_path: Path) -> list[Step]:
    node = make_media_node(lab, name, mac=mac, uefi=uefi)
    cert, key = self_signed_cert(str(tmp_path))
    hook = lab.in_lan(lambda: NodeHook(node.power).__enter__())
    shown: list[Step] = []
    try:
        emu = lab.in_lan(lambda: SushyEmulator(tmp_path / "emu", password=PASSWORD, tls=(cert, key),
                                               notify_url=hook.url, mac=mac).__enter__())
        try:
            life = MediaLifecycle(lab, node, Bmc("redfish", f"127.0.0.1:{emu.port}", REF,
                                                 verify_tls=False))
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


def test_virtual_media_life_uefi(media_lab: SiteLab, tmp_path: Path) -> None:
    if not os.path.exists(OVMF):
        pytest.skip(f"no {OVMF} (apt-get install ovmf)")
    run_life(media_lab, "vm-uefi", "52:54:00:5e:00:12", True, tmp_path)


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
