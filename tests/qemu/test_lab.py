"""qemu/lab.py without QEMU: ensure_ramdisk builds once per process and again only when a
piece it gave is gone (the builder replaced by one that writes small files and counts), each
time under the tree's build lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from initramfs import build as ramdisk
from qemu import lab


def test_ensure_ramdisk_builds_once_per_process_and_again_when_a_piece_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.initramfs.test_build import held

    calls: list[str] = []
    lock = tmp_path / ".build.lock"
    monkeypatch.setattr(ramdisk, "LOCK", lock)

    def build_agent(out: Path, version: str | None = None) -> Path:
        assert held(lock), "the agent built outside the build lock"
        calls.append("agent")
        out.write_bytes(b"zipapp")
        return out

    def build(agent: Path | None, out: Path | None = None, kernel_path: Path | None = None,
              extra: dict[str, bytes] | None = None, arch: ramdisk.Arch = ramdisk.AMD64) -> ramdisk.Built:
        assert held(lock), "the ramdisk built outside the build lock"
        calls.append(f"build {arch.name}")
        assert out is not None
        for name in ("vmlinuz", "base.img", "agent-1.pyz", "initramfs.img"):
            (out / name).write_bytes(name.encode())
        return ramdisk.Built(out / "vmlinuz", out / "initramfs.img", out / "agent-1.pyz",
                             out / "base.img", out)

    monkeypatch.setattr(ramdisk, "build_agent", build_agent)
    monkeypatch.setattr(ramdisk, "build", build)
    first = lab.ensure_ramdisk(tmp_path)
    assert lab.ensure_ramdisk(tmp_path) is first
    assert calls == ["agent", "build amd64"]
    arm = lab.ensure_ramdisk(tmp_path, arch="arm64")         # another key: built
    assert arm.arch == "arm64" and calls[-1] == "build arm64"
    first.base.unlink()                                      # a piece gone: built again
    again = lab.ensure_ramdisk(tmp_path)
    assert again == first and again.base.is_file() and calls[-2:] == ["agent", "build amd64"]
    assert not held(lock)
