"""The built ramdisk's SBOM against what the image holds (builds it, cached, as root)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from initramfs import build as ramdisk
from initramfs import licences

pytestmark = [pytest.mark.slow, pytest.mark.root]

# Files the builder writes itself (no package ships them).
BUILDER_FILES = re.compile(r"^(init|etc/(passwd|group|nsswitch\.conf|hosts|os-release)"
                           r"|usr/share/bettercompute/.*|usr/share/licenses/.*"
                           r"|usr/lib/bettercompute/agent\.pyz|usr/lib/modules/.*|.*/__pycache__/.*\.pyc)$")


def read_cpio(data: bytes) -> dict[str, tuple[int, bytes]]:
    """path -> (mode, data) of concatenated newc archives, later entries replacing earlier."""
    out: dict[str, tuple[int, bytes]] = {}
    pos = 0
    while pos + 110 <= len(data):
        if data[pos:pos + 6] != b"070701":
            pos += 4  # padding between archives
            continue
        fields = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_at = pos + 110
        name = data[name_at: name_at + namesize - 1].decode()
        body_at = name_at + namesize + (-(name_at + namesize) % 4)
        body = data[body_at: body_at + size]
        pos = body_at + size + (-(body_at + size) % 4)
        if name != "TRAILER!!!":
            out[name] = (mode, body)
    return out


def merged(path: str) -> str:
    """A path in a .deb as the merged-/usr root has it."""
    path = path.removeprefix("./")
    for top in ("bin/", "sbin/", "lib/", "lib64/"):
        if path.startswith(top):
            return "usr/" + path
    return path


@pytest.fixture(scope="module")
def built() -> ramdisk.Built:
    if os.geteuid() != 0:
        pytest.skip("building the ramdisk needs root (chroot)")
    for tool in ("apt-get", "dpkg-deb", "zstd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not list(Path("/boot").glob("vmlinuz-*-cloud-amd64")):
        pytest.skip("no /boot/vmlinuz-*-cloud-amd64")
    with ramdisk.build_lock():
        return ramdisk.build(ramdisk.build_agent(ramdisk.OUT / "agent.pyz"), ramdisk.OUT)


@pytest.fixture(scope="module")
def image(built: ramdisk.Built) -> dict[str, tuple[int, bytes]]:
    raw = subprocess.run(["zstd", "-dc"], input=built.initramfs.read_bytes(), capture_output=True,
                         check=True).stdout
    return read_cpio(raw)


@pytest.fixture(scope="module")
def bom(built: ramdisk.Built, image: dict[str, tuple[int, bytes]]) -> dict[str, Any]:
    inside = image[licences.SBOM][1]
    assert built.initramfs.with_name("initramfs.img.cdx.json").read_bytes() == inside  # beside, the same
    doc: dict[str, Any] = json.loads(inside)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    return doc


def debian(bom: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in bom["components"] if str(c.get("purl", "")).startswith("pkg:deb/")}


def prop(component: dict[str, Any], name: str) -> str:
    return next(str(p["value"]) for p in component["properties"] if p["name"] == name)


def test_every_file_in_the_image_comes_from_a_listed_package_of_that_version(
        built: ramdisk.Built, image: dict[str, tuple[int, bytes]], bom: dict[str, Any]) -> None:
    listed = debian(bom)
    by_hash = {hashlib.sha256(d.read_bytes()).hexdigest(): d for d in (ramdisk.OUT / "debs").glob("*.deb")}
    owner: dict[str, str] = {}
    for name, c in listed.items():
        if prop(c, "bettercompute:location") != "root":
            continue  # the kernel: its hash is the vmlinuz beside the image
        deb = by_hash.get(c["hashes"][0]["content"])
        assert deb is not None, f"{name}: no .deb in {ramdisk.OUT / 'debs'} with the listed sha256"
        fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Version"], capture_output=True,
                                text=True, check=True).stdout
        assert f"Package: {name}\nVersion: {c['version']}\n" == fields
        fs = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(fs)) as tar:
            for member in tar.getmembers():
                owner.setdefault(merged(member.name), name)
    unowned = [path for path, (mode, _) in image.items()
               if stat.S_ISREG(mode) and path not in owner and not BUILDER_FILES.match(path)]
    assert unowned == []  # else a package is in the image that the SBOM does not list
    used = {owner[path] for path, (mode, _) in image.items() if stat.S_ISREG(mode) and path in owner}
    assert used <= set(listed)
    # And it lists exactly what the builder resolved and unpacked.
    assert {n for n, c in listed.items() if prop(c, "bettercompute:location") == "root"} == \
        set(ramdisk.resolve(ramdisk.PACKAGES))


def test_every_listed_package_has_its_copyright_file_and_licences(
        built: ramdisk.Built, image: dict[str, tuple[int, bytes]], bom: dict[str, Any]) -> None:
    copyrights = licences.read_copyright_archive(image[licences.COPYRIGHTS][1])
    listed = debian(bom)
    assert set(copyrights) == set(listed)
    for name, c in listed.items():
        assert len(copyrights[name]) > 100, name
        names = [entry["license"]["name"] for entry in c["licenses"]]
        assert names and "NOASSERTION" not in names, name
        assert prop(c, "debian:source") and prop(c, "debian:source-version"), name
    kernel = [c for c in listed.values() if prop(c, "bettercompute:location") != "root"]
    assert len(kernel) == 1 and kernel[0]["hashes"][0]["content"] == \
        hashlib.sha256(built.kernel.read_bytes()).hexdigest()
    assert not [p for p in image if p.startswith("usr/share/doc/")]  # one place: the archive


def test_the_agent_is_listed_with_its_wheels_and_without_the_gateway(
        image: dict[str, tuple[int, bytes]], bom: dict[str, Any]) -> None:
    agent = image[licences.AGENT][1]
    (component,) = [c for c in bom["components"] if c["name"] == "bettercompute-agent"]
    assert component["hashes"][0]["content"] == hashlib.sha256(agent).hexdigest()
    with zipfile.ZipFile(io.BytesIO(agent)) as z:
        own = json.loads(z.read("_legal/sbom.cdx.json"))
        assert not [n for n in z.namelist() if n.startswith("agent/gateway/")]
        assert [n for n in z.namelist() if n.startswith("_legal/licenses/protobuf-")]
    assert component["components"] == own["components"]
    assert {c["name"] for c in own["components"]} == {"protobuf", "pynvml", "nvidia-ml-py"}
