"""The site's UKI boot entry on real firmware: an OVMF node with a TPM 2.0 (swtpm) PXE-boots the
ramdisk as a UKI through the site's boot entry, and its join is attested.

The site's HTTP service (agent/site/, its boot entries) runs on loopback, reached by the guest
on QEMU's user network; the NIC's option ROM (QEMU's EFI iPXE) fetches boot.ipxe from the user
network's TFTP, which chains the site's /boot.ipxe, then the node's /pxe/<mac>.ipxe, which
chains the UKI from the site's store by digest, named U+0001 so that systemd-stub keeps the
UKI's embedded command line. That command line is the site's, one build for its nodes: it
names the site (bc.site=) and nothing of the node; the ramdisk's init fetches the node's id,
gateway and token from /pxe/<mac>.cmdline. The policy holds the UKI's reference values
(initramfs/uki.py); PCR 12 must be empty (no command line from iPXE). Marked qemu and slow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.policy import Build
from agent.proto import site_pb2
from agent.site.boot.pxe import EntryRequest
from agent.site.services import ServiceSettings, SiteServices
from qemu import tpm as qemu_tpm
from qemu.harness import GUEST_HOST
from qemu.lab import GATEWAY_PORT, GUEST_CA, GUEST_TRUST, Lab
from tests.e2e.conftest import JOIN_TIMEOUT, skip_reason
from tests.e2e.test_attest_uefi import attest, verdict

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "attest-site"
MAC = "52:54:00:12:34:56"  # the lab's NIC


@pytest.fixture
def site(lab: Lab, tmp_path: Path) -> Iterator[SiteServices]:
    reason = skip_reason(uefi=True) or qemu_tpm.missing()
    if reason:
        pytest.skip(reason)
    # Bound on loopback; its address is the one the guest dials (forwarded to loopback).
    with SiteServices(ServiceSettings(address=GUEST_HOST, bind="127.0.0.1", port=0,
                                      root=tmp_path / "site", upstreams=("127.0.0.1",))) as running:
        yield running


def test_a_node_pxe_booting_the_sites_uki_attests(lab: Lab, site: SiteServices, tmp_path: Path) -> None:
    port = site.http.port
    # The site's build: console and the lab's CA and signing key (the same for every node);
    # bc.site names where the node's own settings come from.
    esp, values = lab.uki("site-build", settings={
        "site": site.base_url, "ca": GUEST_CA, "trust": GUEST_TRUST,
        "reconnect_min": "0.5", "reconnect_max": "3"})
    image = esp / "EFI" / "BOOT" / "BOOTX64.EFI"
    lab.www.joinpath("ramdisk.efi").write_bytes(image.read_bytes())
    settings = f"bc.node={NODE} bc.token={lab.token_for(NODE)} bc.gateway={GUEST_HOST}:{GATEWAY_PORT}"
    site.entries.register(EntryRequest.from_proto(site_pb2.ProxyDhcpEntry(
        node_id=NODE, mac_address=MAC, boot_file="ipxe.efi", ttl_seconds=900,
        uki_url=f"http://127.0.0.1:{lab.files.port}/ramdisk.efi",
        uki_digest={"algorithm": "sha256", "hex": hashlib.sha256(image.read_bytes()).hexdigest()},
        kernel_cmdline=settings)))
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    joins = attest(lab, tmp_path / "ca", [Build.from_values(values)])
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
        machine = lab.boot(NODE, uefi=True, tpm=swtpm.socket, pxe=True,
                           pxe_chain=f"{site.base_url}/boot.ipxe", forwards={port: port})
        try:
            lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
            found = verdict(joins, NODE)
            assert found.status is Status.ATTESTED, f"{found}\n{machine.console_tail()}"
            assert found.matched["pcr4"] == values["pcr4"][0], found  # the site's UKI
            code, cmdline = machine.shell("cat /proc/cmdline")
            assert code == 0 and f"bc.site={site.base_url}" in cmdline, cmdline
            assert "bc.node" not in cmdline and "bc.token" not in cmdline, cmdline  # none measured
            code, pcr12 = machine.shell("cat /sys/class/tpm/tpm0/pcr-sha256/12")
            assert code == 0 and pcr12.split()[-1] == "0" * 64, pcr12  # no loader's command line
        finally:
            machine.stop()
            lab.gateway.attestation = None
