"""The site-driven lifecycle in QEMU, over IPMI: nothing reaches the node but its BMC
(OpenIPMI's ipmi_sim driving a qemu/powered.py node), the site daemon's boot service on the
provisioning network, and its gateway session. qemu/sitelab.py builds the network (namespaces,
a bridge, a plain DHCP server, the site daemon, the node on a tap device); qemu/sitelife.py
runs and checks each step:

    bmc.query -> boot.prepareRamdisk -> bmc.boot pxe -> bmc.power on -> PXE boot through the
    proxy DHCP (iPXE) into the ramdisk, which joins -> site.httpProxy -> deploy.image through
    the route -> disk.wipe of the second disk -> boot.cleanUp -> bmc.boot disk -> bmc.power
    cycle -> the node boots its deployed disk and joins in role node

Every step is a command through the reference gateway, to the site daemon or to the node;
bmc.boot, deploy.image and disk.wipe are destructive and go signed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from agent.site.bmc import Credentials
from agent.site.secrets import SecretStore
from qemu.ipmisim import IpmiSim, start_ipmi_sim
from qemu.lab import Ramdisk
from qemu.sitelab import SiteLab, missing_network_prerequisites
from qemu.sitelife import Bmc, Lifecycle, SiteNode, Step, make_node
from tests.site.conftest import PASSWORD, REF, USERNAME

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "site-n1"


@pytest.fixture(scope="module")
def site_lab(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteLab]:
    reason = missing_network_prerequisites()
    if reason:
        pytest.skip(reason)
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openipmi ipmitool)")
    with SiteLab(tmp_path_factory.mktemp("sitelab"), ramdisk_parts) as lab:
        lab.start_site()
        yield lab


@pytest.fixture(scope="module")
def node(site_lab: SiteLab) -> SiteNode:
    return make_node(site_lab, NODE)


@pytest.fixture(scope="module")
def ipmi(site_lab: SiteLab, node: SiteNode) -> Iterator[IpmiSim]:
    """The node's BMC: ipmi_sim in the lab's namespace (the site daemon reaches it on the
    namespace's loopback), its credentials in the site daemon's secret store."""
    SecretStore(site_lab.secrets_dir).put(REF, Credentials(USERNAME, PASSWORD))
    sim = site_lab.in_lan(start_ipmi_sim, site_lab.workdir / "ipmi", node.power, USERNAME, PASSWORD)
    yield sim
    sim.stop()


def test_site_driven_lifecycle_over_ipmi(site_lab: SiteLab, node: SiteNode, ipmi: IpmiSim) -> None:
    shown: list[Step] = []
    life = Lifecycle(site_lab, node, Bmc("ipmi", ipmi.address, REF), on_step=shown.append)
    try:
        life.run_all()
    finally:
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
    names = [s.name for s in shown]
    assert names == ["bmc.query", "boot.prepareRamdisk", "bmc.boot pxe", "bmc.power on",
                     "PXE boot + join", "site.httpProxy", "deploy.image", "disk.wipe",
                     "boot.cleanUp", "bmc.boot disk", "bmc.power cycle", "disk boot + join"]
    # The destructive kinds went signed, and none was refused for it.
    gw = site_lab.gateway
    for kind in ("bmc.boot", "deploy.image", "disk.wipe"):
        recs = [r for r in gw.commands.values() if r.kind == kind]
        assert recs and all(r.signed.signature for r in recs), kind
    # The image came from the upstream once, to the site daemon (the route relays it).
    assert [line for line in site_lab.upstream.served if line.startswith("GET /site-n1.img.zst")]
