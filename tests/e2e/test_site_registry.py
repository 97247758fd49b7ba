"""A QEMU node deploys its image from an OCI registry through a site route (issue 42): Debian's
docker-registry behind htpasswd in the lab's namespace (where only the site daemon reaches
it), the image pushed there by our own push with its chunk manifest layer, the registry's
credentials in the site daemon's secret store only. The node PXE boots into the ramdisk as in
tests/e2e/test_site_lifecycle.py; site.httpProxy is given the oci:// reference and the
credentials_ref; the ramdisk's deploy.image names the route, the disk layer's digest and the
chunk manifest the site's result gave (no credentials, no registry address): each chunk is
verified before it is written, and the registry's own access log shows each data chunk sent
once."""

from __future__ import annotations

import base64
import hashlib
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agent.images import manifest, oci
from agent.net import http
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from qemu.ipmisim import start_ipmi_sim
from qemu.sitelab import SiteLab
from qemu.sitelife import Bmc, Lifecycle, SiteNode, make_node
from tests.images.registry import PASSWORD as REGISTRY_PASSWORD
from tests.images.registry import USER as REGISTRY_USER
from tests.images.registry import Registry, need_registry
from tests.site.conftest import PASSWORD, REF, USERNAME

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "reg-n1"
REGISTRY_REF = "registry1"


class RegistryLifecycle(Lifecycle):
    """The site-driven life with the route made from an oci:// reference."""

    def __init__(self, lab: SiteLab, node: SiteNode, bmc: Bmc, reference: str) -> None:
        super().__init__(lab, node, bmc)
        self.reference = reference
        self.route: Any = None

    def http_proxy(self) -> None:
        t = time.monotonic()
        self.route = self.site("site.httpProxy", {
            "node_id": self.node.name, "ttl_seconds": 1800, "upstream_url": self.reference,
            "credentials_ref": REGISTRY_REF})
        self.proxy_url = self.route.proxy_url
        if not re.match(r"^http://10\.0\.2\.2:\d+/r/", self.proxy_url) or not self.route.chunk_manifest:
            raise self.fail(f"site.httpProxy: unexpected result {self.route}")
        self.step("site.httpProxy", t, f"{self.reference} resolved to {self.route.resolved_manifest[:19]}…; "
                                       f"disk layer sha256:{self.route.disk_digest.hex[:12]}…, its chunk "
                                       f"manifest layer ({len(self.route.chunk_manifest)} bytes)")

    def deploy(self) -> None:
        t = time.monotonic()
        digest = {"algorithm": "sha256", "hex": self.route.disk_digest.hex}
        payload = {"url": self.proxy_url, "digest": digest,
                   "manifest_inline": base64.b64encode(self.route.chunk_manifest).decode(),
                   "target": {"serial": "disk0"}, "verify_readback": True}
        result = self.command(self.node.name, "deploy.image", payload)[1]
        image = self.node.image
        if result.image_bytes != image.raw.stat().st_size or result.verification != "manifest":
            raise self.fail(f"deploy.image: {result}")
        with self.node.deploy_disk.open("rb") as f:
            if hashlib.sha256(f.read(result.image_bytes)).hexdigest() != image.raw_sha256:
                raise self.fail("deploy.image succeeded but the disk does not hold the image")
        self.step("deploy.image", t, f"{result.image_bytes >> 20} MiB, {result.chunks_verified} chunks "
                                     f"verified before writing, {result.zero_chunks} zero chunks")


def test_node_deploys_from_a_registry_through_the_site(site_lab: SiteLab, tmp_path: Path) -> None:
    need_registry()
    node = make_node(site_lab, NODE)
    store = SecretStore(site_lab.secrets_dir)
    store.put(REF, Credentials(USERNAME, PASSWORD))
    store.put(REGISTRY_REF, Credentials(REGISTRY_USER, REGISTRY_PASSWORD))
    sim = site_lab.in_lan(start_ipmi_sim, site_lab.workdir / "ipmi", node.power, USERNAME, PASSWORD)
    reg = site_lab.in_lan(Registry, tmp_path, auth="htpasswd")
    try:
        chunks = manifest.write(node.image.raw, tmp_path / "node.manifest")[0]
        client = oci.Registry(oci.parse(reg.ref("fleet/node:1")), http.HttpOptions(),
                              credentials=reg.credentials)
        pushed = site_lab.in_lan(oci.push, client, node.image.raw, chunks, arch="amd64")
        life = RegistryLifecycle(site_lab, node, Bmc("ipmi", sim.address, REF), reg.ref("fleet/node:1"))
        try:
            for step in (life.query, life.prepare_ramdisk, lambda: life.boot_device("pxe"),
                         life.power_on, life.pxe_join, life.http_proxy, life.deploy):
                step()
        finally:
            for s in node.steps:
                print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
            node.power.stop(force=True)
        plan = manifest.parse(chunks.read_bytes())
        data = [s for s in plan.segments if s.digest is not None]
        gets = reg.blob_gets(pushed.disk.digest)
        assert len(gets) == len(data) and all(status == 206 for status, _ in gets), gets
        assert sum(n for _, n in gets) == sum(s.length for s in data)
        assert life.route.resolved_manifest == pushed.manifest_digest
    finally:
        site_lab.in_lan(reg.close)
        sim.stop()
