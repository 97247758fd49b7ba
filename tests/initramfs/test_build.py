"""The ramdisk builder's own checks, on small trees built here."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

from initramfs.build import (
    ARCHES,
    MEDIA_MODULES,
    MODULES,
    OUT,
    TPM_MODULES,
    Kernel,
    checked_bytecode,
    find_kernel,
    install_modules,
    module_files,
    out_dir,
    unpacked,
)
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


def installed(kernel: Kernel, root: Path, arch: str) -> tuple[dict[str, list[str]], list[str]]:
    """install_modules into ``root``: the lists it wrote, by name, and the .ko files it copied."""
    install_modules(kernel, root, ARCHES[arch])
    lists = {p.name: p.read_text().split() for p in (root / "usr/share/bettercompute").iterdir()}
    files = sorted(str(p.relative_to(root / "lib/modules")) for p in (root / "lib/modules").rglob("*.ko"))
    return lists, files


def test_the_x86_ramdisk_gets_no_tpm_modules(tmp_path: Path) -> None:
    """x86's cloud kernel has the TPM's driver built in: its ramdisk's modules and their lists
    are what they were before the TPM list existed, and there is no modules.tpm."""
    if not list(Path("/boot").glob(ARCHES["amd64"].kernel_glob)):
        pytest.skip("no /boot/vmlinuz-*-cloud-amd64 (apt-get install linux-image-cloud-amd64)")
    kernel = find_kernel(arch=ARCHES["amd64"])
    assert module_files(kernel, TPM_MODULES) == []  # built in
    lists, files = installed(kernel, tmp_path, "amd64")
    mods = module_files(kernel, MODULES)
    media = [m for m in module_files(kernel, MEDIA_MODULES) if m not in mods]
    assert lists == {"modules": mods, "modules.media": media}
    assert files == sorted(mods + media)
    assert not any("/tpm/" in f for f in files)


def test_the_arm64_ramdisk_loads_the_tpm_driver(tmp_path: Path) -> None:
    """arm64's cloud kernel has tpm_tis and tpm_tis_core as modules: the ramdisk carries both,
    listed in load order in modules.tpm (which /init loads before the agent), apart from the
    background list."""
    boots = sorted((out_dir(ARCHES["arm64"]) / "kernel/boot").glob(ARCHES["arm64"].kernel_glob))
    if not boots:
        pytest.skip("no arm64 kernel unpacked (python -m initramfs.build --arch arm64)")
    kernel = find_kernel(boots[-1], ARCHES["arm64"])
    lists, files = installed(kernel, tmp_path, "arm64")
    tpm = "kernel/drivers/char/tpm"
    assert lists["modules.tpm"] == [f"{tpm}/tpm_tis_core.ko", f"{tpm}/tpm_tis.ko"]
    assert not any("/tpm/" in m for m in lists["modules"] + lists["modules.media"])
    assert set(lists["modules.tpm"]) <= set(files)
    assert lists["modules"] == module_files(kernel, MODULES)


def test_init_loads_the_tpm_list_before_the_agent_starts() -> None:
    text = (Path(__file__).resolve().parents[2] / "initramfs" / "init.sh").read_text()
    load, mount = text.index("</usr/share/bettercompute/modules.tpm"), text.index("mount -t securityfs")
    background, agent = text.index("</usr/share/bettercompute/modules\n"), text.index('say "starting agent')
    assert load < mount < background < agent


# -- one builder at a time in a tree -----------------------------------------------------------

WAITER = """
import sys
from pathlib import Path
from initramfs.build import build_lock
with build_lock(Path(sys.argv[1])):
    print("building", flush=True)
"""


def held(lock: Path) -> bool:
    """Whether some open file holds ``lock``'s flock now (asked without waiting)."""
    import fcntl

    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_a_second_build_waits_for_the_first_to_finish(tmp_path: Path) -> None:
    """Two builders in one tree (a developer's ./dev demo beside a test run): the second, another
    process, says it waits and starts only once the first lets go, never beside it."""
    import sys

    from initramfs.build import HERE, build_lock

    lock = tmp_path / "out" / ".build.lock"
    child = None
    try:
        with build_lock(lock):
            assert held(lock)
            child = subprocess.Popen([sys.executable, "-c", WAITER, str(lock)], cwd=HERE.parent,
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            assert child.stdout is not None
            assert child.stdout.readline() == f"initramfs: another build holds {lock}: waiting for it\n"
            assert child.poll() is None
        assert child.stdout.readline() == "building\n"    # only now: the first let go
        assert child.wait(60) == 0
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    assert not held(lock)


def test_the_build_command_holds_the_lock_for_the_whole_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """python -m initramfs.build: the agent and the ramdisk made under the lock (the builders
    replaced by ones that write small files and say whether the lock was held)."""
    from initramfs import build as ramdisk

    lock = tmp_path / ".build.lock"
    monkeypatch.setattr(ramdisk, "LOCK", lock)
    seen: list[tuple[str, bool]] = []

    def build_agent(out: Path, version: str | None = None) -> Path:
        seen.append(("agent", held(lock)))
        out.write_bytes(b"zipapp")
        return out

    def build(agent: Path | None, out: Path | None = None, kernel_path: Path | None = None,
              extra: dict[str, bytes] | None = None, arch: ramdisk.Arch = ramdisk.AMD64) -> ramdisk.Built:
        seen.append(("ramdisk", held(lock)))
        assert out is not None
        for name in ("vmlinuz", "base.img", "initramfs.img"):
            (out / name).write_bytes(name.encode())
        return ramdisk.Built(out / "vmlinuz", out / "initramfs.img", agent, out / "base.img", out)

    monkeypatch.setattr(ramdisk, "build_agent", build_agent)
    monkeypatch.setattr(ramdisk, "build", build)
    assert ramdisk.main(["--out", str(tmp_path)]) == 0
    assert seen == [("agent", True), ("ramdisk", True)]
    assert not held(lock)
