"""The cpio writer: what it writes is what cpio(1) (and so the kernel's newc reader) reads."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from initramfs import cpio


def extract(archive: bytes, dest: Path) -> subprocess.CompletedProcess[bytes]:
    if shutil.which("cpio") is None:
        pytest.skip("cpio is not installed")
    dest.mkdir()
    return subprocess.run(["cpio", "-idm", "--quiet", "--no-absolute-filenames"], input=archive, cwd=dest,
                          capture_output=True, check=True)


def test_files_dirs_and_links_round_trip_through_cpio(tmp_path: Path) -> None:
    entries = [
        cpio.directory("etc"),
        cpio.file("etc/hello.txt", b"hello\n"),
        cpio.file("init", b"#!/bin/sh\necho hi\n", 0o755),
        cpio.symlink("bin", "usr/bin"),
        cpio.file("odd/size/three.bin", b"abc"),
    ]
    extract(cpio.archive(entries), tmp_path / "x")
    root = tmp_path / "x"
    assert (root / "etc/hello.txt").read_bytes() == b"hello\n"
    assert (root / "odd/size/three.bin").read_bytes() == b"abc"
    assert stat.S_IMODE((root / "init").stat().st_mode) == 0o755
    assert os.readlink(root / "bin") == "usr/bin"


def test_archive_is_deterministic_and_sorted(tmp_path: Path) -> None:
    a = [cpio.file("b", b"2"), cpio.file("a", b"1"), cpio.directory("c")]
    assert cpio.archive(a) == cpio.archive(list(reversed(a)))
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=cpio.archive(a), capture_output=True,
                             check=True).stdout.decode().split() if shutil.which("cpio") else ["a", "b", "c"]
    assert listing == ["a", "b", "c"]
    assert len(cpio.archive(a)) % 4 == 0


def test_tree_reads_a_directory_with_symlinks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "usr/bin").mkdir(parents=True)
    (src / "usr/bin/tool").write_bytes(b"\x7fELF")
    (src / "usr/bin/tool").chmod(0o755)
    (src / "bin").symlink_to("usr/bin")
    entries = {e.path: e for e in cpio.tree(src)}
    assert set(entries) == {"bin", "usr", "usr/bin", "usr/bin/tool"}
    assert stat.S_ISLNK(entries["bin"].mode) and entries["bin"].data == b"usr/bin"
    assert entries["usr/bin/tool"].data == b"\x7fELF"
    assert stat.S_IMODE(entries["usr/bin/tool"].mode) == 0o755


def test_device_nodes_are_written_without_mknod(tmp_path: Path) -> None:
    archive = cpio.archive([cpio.chardev("dev/console", 5, 1)])
    listing = subprocess.run(["cpio", "-tv", "--quiet"], input=archive, capture_output=True, check=True) \
        if shutil.which("cpio") else pytest.skip("cpio is not installed")
    line = listing.stdout.decode()
    assert line.startswith("crw-------") and "5," in line and "dev/console" in line
