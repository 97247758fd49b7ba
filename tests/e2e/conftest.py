"""End-to-end fixtures: the ramdisk (built once, cached under initramfs/out/), labs (the
reference gateway on 127.0.0.1 plus QEMU guests that reach only it), the fake NVML library.

Every test here boots a real kernel in QEMU (TCG unless BC_QEMU_KVM=1) and is marked ``qemu``
and ``slow``: ``pytest -m 'not qemu'`` runs the fast tests alone. They skip (not fail) where
QEMU, the Debian kernel, apt or root is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.proto import session_pb2
from qemu.harness import Machine
from qemu.lab import Lab, Ramdisk, ensure_ramdisk, missing_prerequisites
from qemu.sitelab import SiteLab, missing_network_prerequisites

# Generous bounds for a loaded 2-core CI machine under TCG (a boot takes ~40-90 s there).
JOIN_TIMEOUT = 420.0
COMMAND_TIMEOUT = 900.0

FAKES = Path(__file__).resolve().parent.parent / "fakes"


def run_command(lab: Lab, machine: Machine, node_id: str, kind: str, payload: dict,  # type: ignore[type-arg]  # a JSON payload
                timeout: float = COMMAND_TIMEOUT) -> tuple[str, session_pb2.ResultBody, Any]:
    """Send a command through the lab's gateway and wait for its success: (id, body, result)."""
    cid = lab.gateway.send(node_id, kind, payload)
    try:
        body, result = lab.gateway.wait_result(cid, timeout)
    except TimeoutError:
        raise machine.fail(f"{kind} did not finish within {timeout:g}s") from None
    assert body.status == session_pb2.SUCCEEDED, \
        f"{kind}: {body.reason}: {body.message}\n{machine.console_tail()}"
    return cid, body, result


def skip_reason(arch: str = "amd64", *, uefi: bool = False) -> str | None:
    if os.geteuid() != 0:
        return "needs root (the ramdisk builder chroots into its root)"
    return missing_prerequisites(arch, uefi=uefi)


@pytest.fixture(scope="session")
def ramdisk_parts() -> Ramdisk:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return ensure_ramdisk()


@pytest.fixture(scope="module")
def lab(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with Lab(tmp_path_factory.mktemp("lab"), ramdisk_parts) as lab:
        yield lab


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1 (tests/fakes/nvml), compiled for the guest (same glibc)."""
    spec = importlib.util.spec_from_file_location("fakenvml_e2e", FAKES / "nvml" / "fakenvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return Path(module.build_library(tmp_path_factory.mktemp("nvml")))
    except module.NoCompiler as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def site_lab(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteLab]:
    """The provisioning network with the site daemon joined (qemu/sitelab.py), one per module."""
    reason = missing_network_prerequisites()
    if reason:
        pytest.skip(reason)
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openipmi ipmitool)")
    with SiteLab(tmp_path_factory.mktemp("sitelab"), ramdisk_parts) as lab:
        lab.start_site()
        yield lab
