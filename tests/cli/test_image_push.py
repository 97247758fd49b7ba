"""``agent image push``, run as a real subprocess: into a real registry (htpasswd over TLS,
the password from the environment or a file, never argv) and into an OCI image layout, then
deployed back (deploy.image from ``oci://`` and from the layout directory)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import NotFound
from agent.images import oci, ocilayout
from agent.net import http
from tests.commands.test_deploy import Target, deploy, sparse_image
from tests.commands.test_deploy_oci import oci_request
from tests.images.registry import PASSWORD, USER, Registry

ROOT = Path(__file__).resolve().parents[2]


def agent(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_push_to_a_registry_with_credentials(tmp_path: Path) -> None:
    img = tmp_path / "node.raw"
    img.write_bytes(sparse_image())
    with Registry(tmp_path, auth="htpasswd", tls=True) as reg:
        ca = tmp_path / "ca.pem"
        ca.write_text(reg.ca_pem)
        dest = reg.ref("fleet/node:2026.12")
        anonymous = agent("image", "push", str(img), dest, "--ca", str(ca), "--arch", "amd64")
        assert anonymous.returncode == 1 and "asks for credentials" in anonymous.stderr
        done = agent("image", "push", str(img), dest, "--ca", str(ca), "--arch", "amd64",
                     env={"AGENT_REGISTRY_USER": USER, "AGENT_REGISTRY_PASSWORD": PASSWORD})
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        pinned = done.stdout.strip()
        assert pinned.startswith(reg.ref("fleet/node@sha256:"))
        secret = tmp_path / "password"
        secret.write_text(PASSWORD + "\n")
        again = agent("image", "push", str(img), dest, "--ca", str(ca), "--arch", "arm64",
                      "--username", USER, "--password-file", str(secret))
        assert again.returncode == 0, again.stderr
        client = oci.Registry(oci.parse(dest), http.HttpOptions(ca_pem=reg.ca_pem),
                              credentials=reg.credentials)
        for arch in ("amd64", "arm64"):
            art = client.resolve(arch=arch)
            assert art.disk.hex == hashlib.sha256(img.read_bytes()).hexdigest()
            assert art.chunk_manifest is not None      # made by the push itself
        assert client.resolve(arch="amd64").manifest_digest == pinned.rpartition("@")[2]


def test_push_to_a_layout_then_deploy_from_it(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = sparse_image()
    (tmp_path / "node.raw").write_bytes(img)
    layout = tmp_path / "layout"
    done = agent("image", "push", str(tmp_path / "node.raw"), str(layout), "--tag", "v1", "--arch", "amd64")
    assert done.returncode == 0, done.stderr
    assert (layout / "oci-layout").is_file() and (layout / "index.json").is_file()
    req = oci_request("")
    req.ClearField("source")
    req.local_path = str(layout)
    r = deploy(req, t.disks)
    assert t.data()[: len(img)] == img
    assert r.verification == "manifest" and r.resolved_manifest.startswith("sha256:")
    assert r.chunks_verified >= 3


def test_layout_refusals(tmp_path: Path) -> None:
    img = tmp_path / "node.raw"
    img.write_bytes(sparse_image(4 << 20))
    layout = tmp_path / "layout"
    pushed = ocilayout.write(layout, img, arch="arm64", tag="v1")
    with pytest.raises(oci.RegistryError, match="no whole-disk entry for architecture amd64"):
        ocilayout.resolve(layout, arch="amd64")
    ocilayout.write(layout, img, arch="amd64", tag="v2")
    ocilayout.write(layout, img, arch="amd64", tag="v3")
    with pytest.raises(Exception, match="several tags for amd64"):
        ocilayout.resolve(layout, arch="amd64")
    disk_path = ocilayout.blob_path(layout, pushed.disk.digest)
    assert ocilayout.resolve(layout, arch="amd64", tag="v2")[1] == disk_path
    ocilayout.blob_path(layout, pushed.disk.digest).unlink()
    with pytest.raises(NotFound, match="disk blob"):
        ocilayout.resolve(layout, arch="amd64", tag="v2")
