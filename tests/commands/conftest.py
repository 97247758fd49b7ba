"""Fixtures shared by the command tests: a loop-mounted ext4 filesystem."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.errors import AgentError


@pytest.fixture
def ext4_mount(tmp_path: Path) -> Iterator[Path]:
    """A fresh ext4 filesystem loop-mounted under tmp_path; skipped where that cannot be done."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 for a loop-mounted filesystem")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with image.open("wb") as f:
        f.truncate(32 << 20)
    try:
        proc.run(["mkfs.ext4", "-q", "-F", str(image)], timeout=60)
        proc.run(["mount", "-o", "loop", str(image), str(mnt)], timeout=60)
    except AgentError as exc:
        pytest.skip(f"cannot loop-mount an ext4 image here: {exc}")
    try:
        yield mnt
    finally:
        proc.run(["fsfreeze", "-u", str(mnt)], check=False, timeout=30)
        proc.run(["umount", str(mnt)], check=False, timeout=60)
