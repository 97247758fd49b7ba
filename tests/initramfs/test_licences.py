"""The ramdisk's copyright archive and SBOM helpers (initramfs/licences.py), on small inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from initramfs import licences

DEP5 = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: util-linux
License: GPL-2+

Files: *
Copyright: 1992 A. Person
License: GPL-2+

Files: lib/md5.c
Copyright: none
License: public-domain

Files: libblkid/*
Copyright: 2008 Someone
License: LGPL-2.1+
 The text of a licence, indented,
 License: not-a-field

License: GPL-2+
 The text of GPL-2+ (a stand-alone paragraph: no new name).

License: BSD-4-clause-unused
 Defined, never used by a Files paragraph.
"""


def test_licences_of_a_machine_readable_copyright_file() -> None:
    assert licences.licences(DEP5, "util-linux") == ["GPL-2+", "public-domain", "LGPL-2.1+"]


def test_licences_of_a_free_form_copyright_file() -> None:
    busybox = "This package was debianized...\nsee `/usr/share/common-licenses/GPL-2'.\n"
    assert licences.licences(busybox, "busybox") == ["GPL-2"]  # the table's entry
    other = "Licensed under /usr/share/common-licenses/LGPL-2.1 and /usr/share/common-licenses/GPL-3.\n"
    assert licences.licences(other, "unknown") == ["LGPL-2.1", "GPL-3"]
    assert licences.licences("All rights reserved.\n", "unknown") == ["NOASSERTION"]


def test_source_package_and_version_from_the_source_field() -> None:
    assert licences.source_of("libgcc-s1", "12.2.0-14", "gcc-12") == ("gcc-12", "12.2.0-14")
    assert licences.source_of("libcap2", "1:2.66-4+b1", "libcap2 (1:2.66-4)") == ("libcap2", "1:2.66-4")
    assert licences.source_of("zstd", "1.5.4", "") == ("zstd", "1.5.4")


def test_copyright_archive_is_deterministic_and_reads_back() -> None:
    files = {"zstd": b"zstd's terms\n", "busybox": b"GPL-2\n" * 100}
    data = licences.copyright_archive(files)
    assert data == licences.copyright_archive(dict(reversed(files.items())))
    assert licences.read_copyright_archive(data) == files


def _deb(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    tree = tmp / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: 1:2.0-1+b1\nArchitecture: amd64\nSource: {name}-src (1:2.0-1)\n"
        "Maintainer: nobody <nobody@example.org>\nDescription: test\n")
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    deb = tmp / f"{name}_2.0-1_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(deb)], check=True,
                   capture_output=True)
    return deb


def test_copyright_files_follow_a_doc_link_to_a_package_not_unpacked(tmp_path: Path) -> None:
    """libgcc-s1's doc directory links to gcc-12-base's, a package the ramdisk does not unpack:
    its copyright file comes from that package's .deb."""
    root = tmp_path / "root"
    doc = root / "usr/share/doc"
    (doc / "libpython3.11-minimal").mkdir(parents=True)
    (doc / "libpython3.11-minimal/copyright").write_bytes(b"PSF\n")
    (doc / "libpython3.11-stdlib").symlink_to("libpython3.11-minimal")
    (doc / "libgcc-s1").symlink_to("gcc-12-base")
    base = _deb(tmp_path, "gcc-12-base", {"usr/share/doc/gcc-12-base/copyright": b"GCC RLE\n"})
    fetched: list[str] = []

    def fetch(name: str) -> Path:
        fetched.append(name)
        return base

    files = licences.copyright_files(root, ["libpython3.11-minimal", "libpython3.11-stdlib", "libgcc-s1"],
                                     fetch)
    assert files == {"libpython3.11-minimal": b"PSF\n", "libpython3.11-stdlib": b"PSF\n",
                     "libgcc-s1": b"GCC RLE\n"}
    assert fetched == ["gcc-12-base"]
    with pytest.raises(FileNotFoundError):
        licences.copyright_files(root, ["not-unpacked"], fetch)


def test_sbom_lists_each_package_with_version_source_and_licences(tmp_path: Path) -> None:
    deb = _deb(tmp_path, "libfoo1", {"usr/lib/libfoo.so.1": b"\x7fELF"})
    pkg = licences.deb_package(deb)
    assert (pkg.name, pkg.version, pkg.source, pkg.source_version) == ("libfoo1", "1:2.0-1+b1", "libfoo1-src",
                                                                       "1:2.0-1")
    agent = tmp_path / "agent.pyz"
    with zipfile.ZipFile(agent, "w") as z:
        z.writestr("_legal/sbom.cdx.json", json.dumps({
            "metadata": {"component": {"name": "bettercompute-agent", "version": "0.1.0"}},
            "components": [{"name": "protobuf", "version": "7.36.2"}]}))
    data = agent.read_bytes()
    bom = licences.sbom([pkg], None, data, {"libfoo1": DEP5.encode()}, "k1")
    assert bom == licences.sbom([pkg], None, data, {"libfoo1": DEP5.encode()}, "k1")  # deterministic
    doc = json.loads(bom)
    (foo, agent_c) = doc["components"]
    assert foo["name"] == "libfoo1" and foo["version"] == "1:2.0-1+b1"
    assert foo["purl"] == "pkg:deb/debian/libfoo1@1%3A2.0-1%2Bb1?arch=amd64&distro=debian-12"
    assert [entry["license"]["name"] for entry in foo["licenses"]] == ["GPL-2+", "public-domain", "LGPL-2.1+"]
    props = {p["name"]: p["value"] for p in foo["properties"]}
    assert props["debian:source"] == "libfoo1-src" and props["debian:source-version"] == "1:2.0-1"
    assert agent_c["name"] == "bettercompute-agent" and agent_c["components"][0]["name"] == "protobuf"
