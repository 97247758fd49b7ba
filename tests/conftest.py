"""Shared test set-up. Area-specific fixtures live in the conftest.py of their folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from agent.gateway.certs import DevPki
    from qemu.powered import PoweredNode
    from tests.runtime.core_harness import World

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# Under pytest-xdist (./dev test runs two workers, --dist loadgroup) the tests that boot QEMU or
# write the ramdisk under initramfs/out/ run on one worker, one after another: one TCG guest at a
# time on a 2-core machine, one writer of the shared build; every other test goes to either.
SERIAL_GROUP = "qemu-and-ramdisk"
_RAMDISK_WRITERS = ROOT / "tests" / "initramfs"


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("qemu") or item.path.is_relative_to(_RAMDISK_WRITERS):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


def free_port() -> int:
    """A TCP port free on loopback now (for a server started in a child process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    """One dev PKI for the session: a CA, the gateway's certificate (localhost, 127.0.0.1, ::1),
    the control plane's signing key, and client certificates for the nodes the tests name."""
    from agent.gateway.certs import make_dev_pki

    return make_dev_pki(tmp_path_factory.mktemp("pki"), nodes=("node-1", "node-2", "node-7"))


@pytest.fixture(scope="session")
def zipapp_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The zipapp of this tree (build/zipapp.py, both architectures' wheels) with ``--version``
    the one asked for, built once a session per version: the modules that install, run or
    upgrade an agent from it only read it (a test that changes one copies it first)."""
    built: dict[str, Path] = {}

    def zipapp(version: str) -> Path:
        if version not in built:
            out = tmp_path_factory.mktemp("zipapp") / "agent.pyz"
            subprocess.run([sys.executable, str(ROOT / "build" / "zipapp.py"), "--out", str(out),
                            "--version", version, "--arch", "x86_64,aarch64"],
                           check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            built[version] = out
        return built[version]

    return zipapp


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fake libnvidia-ml.so.1 of tests/fakes/nvml, compiled once per test session."""
    from tests.fakes.nvml.fakenvml import NoCompiler, build_library

    try:
        return str(build_library(tmp_path_factory.mktemp("nvml")))
    except NoCompiler as exc:
        pytest.skip(str(exc))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """In-process Agents on one state dir (tests/runtime/core_harness.py), stopped afterwards:
    used by the core tests (tests/runtime) and the lifecycle handlers' rejoin tests (tests/commands)."""
    from tests.runtime.core_harness import world_in

    yield from world_in(tmp_path)


@pytest.fixture
def powered_node(tmp_path: Path) -> Iterator[PoweredNode]:
    """A QEMU node driven from outside (qemu/powered.py), off, booting the built ramdisk (or the
    host's kernel); stopped at the end. Skips where QEMU or a kernel to boot is missing."""
    from qemu.harness import qemu_available
    from qemu.powered import NodeSpec, PoweredNode, default_boot_files

    reason = qemu_available()
    files = default_boot_files()
    if reason or files is None:
        pytest.skip(reason or "no kernel and initrd to boot (initramfs/out/ or /boot)")
    kernel, initrd = files
    node = PoweredNode(tmp_path / "node").configure(
        NodeSpec(kernel=str(kernel), initrd=str(initrd), append="console=ttyS0 panic=-1",
                 owner_pid=os.getpid()))
    try:
        yield node
    finally:
        node.stop(force=True)
