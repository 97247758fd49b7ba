"""The ramdisk builder's own checks, on small trees built here."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

from initramfs.build import ARCHES, OUT, checked_bytecode, find_kernel, out_dir, unpacked
from initramfs.build import _qualified as qualified


def test_only_unchecked_hash_bytecode_passes(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/python3.11"
    (lib / "json").mkdir(parents=True)
    for name in ("stamped.py", "checked.py", "kept.py", "json/decoder.py"):
        (lib / name).write_text("X = 1\n")
    mode = py_compile.PycInvalidationMode
    py_compile.compile(str(lib / "stamped.py"), invalidation_mode=mode.TIMESTAMP)
    py_compile.compile(str(lib / "checked.py"), invalidation_mode=mode.CHECKED_HASH)
    py_compile.compile(str(lib / "kept.py"), invalidation_mode=mode.UNCHECKED_HASH)
    py_compile.compile(str(lib / "json/decoder.py"), invalidation_mode=mode.TIMESTAMP)
    stale = checked_bytecode(tmp_path)
    assert [Path(p).name.split(".")[0] for p in stale] == ["checked", "stamped", "decoder"]
    assert all(p.startswith("usr/lib/python3.11/") for p in stale)


def test_a_kernel_unpacked_from_its_deb_brings_its_own_modules(tmp_path: Path) -> None:
    release = "6.1.0-99-cloud-arm64"
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / f"vmlinuz-{release}").write_bytes(b"MZ")
    (tmp_path / "lib/modules" / release).mkdir(parents=True)
    kernel = find_kernel(tmp_path / "boot" / f"vmlinuz-{release}", ARCHES["arm64"], tmp_path)
    assert kernel.release == release
    assert kernel.modules == tmp_path / "lib/modules" / release


def deb(tmp_path: Path, version: str) -> Path:
    """A .deb of one file, built with dpkg-deb."""
    tree = tmp_path / f"pkg-{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(f"Package: bc-test\nVersion: {version}\nArchitecture: all\n"
                                         "Maintainer: t <t@example.org>\nDescription: test\n")
    (tree / "usr/share/bc").mkdir(parents=True)
    (tree / "usr/share/bc/version").write_text(version)
    out = tmp_path / f"bc-test_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(out)],
                   check=True, capture_output=True)
    return out


def test_a_deb_is_unpacked_once_and_again_when_it_changes(tmp_path: Path) -> None:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("no dpkg-deb")
    finished: list[Path] = []
    dest = tmp_path / "out" / "tree"
    first = deb(tmp_path, "1")
    assert unpacked(first, dest, then=finished.append) == dest
    assert (dest / "usr/share/bc/version").read_text() == "1" and finished == [tmp_path / "out" / "tree.tmp"]
    assert unpacked(first, dest, then=finished.append) == dest and len(finished) == 1  # once
    (dest / ".deb").unlink()  # as an unpack cut before its stamp
    (dest / "stray").write_text("x")
    unpacked(deb(tmp_path, "2"), dest)
    assert (dest / "usr/share/bc/version").read_text() == "2" and not (dest / "stray").exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tree"]


def test_each_architecture_builds_into_its_own_directory() -> None:
    assert out_dir(ARCHES["amd64"]) == OUT
    assert out_dir(ARCHES["arm64"]) == OUT / "arm64"
    assert {a.machine for a in ARCHES.values()} == {"x86_64", "aarch64"}


def test_foreign_packages_are_asked_for_by_architecture_but_arch_all_ones_are_not() -> None:
    if shutil.which("apt-cache") is None:
        pytest.skip("no apt-cache")
    known = subprocess.run(["apt-cache", "show", "--no-all-versions", "busybox:arm64"],
                           capture_output=True, check=False)
    if known.returncode != 0:
        pytest.skip("apt does not know arm64 packages here (dpkg --add-architecture arm64; apt-get update)")
    assert qualified(["busybox", "lsb-base"], ARCHES["arm64"]) == ["busybox:arm64", "lsb-base"]
