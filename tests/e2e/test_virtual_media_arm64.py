"""The life over Redfish virtual media without DHCP (test_virtual_media.py) on an arm64 node:
``-M virt`` under TCG, UEFI (edk2) booting the arm64 ramdisk ISO's EFI image (GRUB), the
node's config medium on the second CD drive; then the deployed disk, as test_arm64.py boots it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qemu.lab import ensure_ramdisk
from qemu.sitelab import SiteLab
from tests.e2e.conftest import skip_reason
from tests.e2e.test_virtual_media import lab_without_dhcp, run_life, skip_without_tools

pytestmark = [pytest.mark.qemu, pytest.mark.slow]


@pytest.fixture(scope="module")
def arm_media_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteLab]:
    reason = skip_reason("arm64")
    if reason:
        pytest.skip(reason)
    skip_without_tools()
    with lab_without_dhcp(tmp_path_factory.mktemp("medialab-arm64"), ensure_ramdisk(arch="arm64")) as lab:
        yield lab


def test_virtual_media_life_arm64(arm_media_lab: SiteLab, tmp_path: Path) -> None:
    run_life(arm_media_lab, "vm-arm64", "52:54:00:5e:00:13", False, tmp_path)
