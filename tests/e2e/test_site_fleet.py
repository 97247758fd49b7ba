"""Three QEMU nodes at once through one site daemon (issue 26.4): IPMI BMCs (one ipmi_sim
each), the site's proxy DHCP, each node its own NIC (a tap device) on the bridge. Each node's
life runs as qemu/sitelife.py checks it, in a thread of its own (qemu/sitefleet.py): PXE boot
into the ramdisk, a route that serves the raw image from the site's chunk store, deploy.image
started on the three at the same moment, boot.cleanUp, then a boot from the deployed disk and
a rejoin in role node. Counted: the site fetched each distinct data chunk of the three images
from the upstream exactly once (the chunks they share once for all three), and every node's
disk holds its image byte for byte (sitelife's deploy step reads it back)."""

from __future__ import annotations

import pytest

from qemu.sitefleet import fleet_lives, run_fleet
from qemu.sitelab import SiteLab
from tests.site.conftest import PASSWORD, REF, USERNAME

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODES = ("fleet-n1", "fleet-n2", "fleet-n3")
MACS = ("52:54:00:5e:00:11", "52:54:00:5e:00:12", "52:54:00:5e:00:13")


def test_three_nodes_deploy_one_download(site_lab: SiteLab) -> None:
    lives = fleet_lives(site_lab, list(NODES), list(MACS), USERNAME, PASSWORD, REF)
    try:
        report = run_fleet(site_lab, lives, print)
    finally:
        for life in lives:
            life.node.power.stop(force=True)
    assert not report.errors, "\n\n".join(report.errors)
    for life in lives:
        assert [s.name for s in life.node.steps] == [
            "bmc.query", "boot.prepareRamdisk", "bmc.boot pxe", "bmc.power on", "PXE boot + join",
            "site.httpProxy", "deploy.image", "boot.cleanUp", "bmc.boot disk", "bmc.power cycle",
            "disk boot + join"]
    assert report.shared_data_chunks > 0
    assert report.chunks_verified == report.distinct_data_chunks
    assert report.upstream_bytes == report.distinct_data_bytes
    # The kernel and initrd the three entries boot: one file each in the store, by digest.
    kernel_fetches = [line for line in site_lab.upstream.served if line.startswith("GET /vmlinuz")]
    assert len(kernel_fetches) == 1, kernel_fetches
