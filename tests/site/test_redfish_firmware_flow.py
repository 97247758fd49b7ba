"""A firmware update as fleets do it, on recorded trees served by the project's emulator: the
update's task followed to its end, the BMC's own reboot after it waited out (3 good answers in a
row), and the new version read back from the FirmwareInventory."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from agent.errors import CommandTimeout
from agent.site.bmc.client import CallContext, Pacing
from agent.site.bmc.redfish.client import RedfishClient
from tests.site.redfish_emulator import RedfishEmulator


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trees")


def quick(seconds: float) -> CallContext:
    return CallContext(threading.Event(), time.monotonic() + seconds, Pacing(0.1, 0.3, 1.5))


def first_component(bmc: RedfishEmulator) -> tuple[str, str]:
    members = bmc.doc("/redfish/v1/UpdateService/FirmwareInventory")["Members"]
    path = str(members[0]["@odata.id"]).rstrip("/")
    return path, str(bmc.doc(path).get("Version"))


def test_simple_update_waits_out_the_bmcs_reboot_and_reads_the_new_version(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        path, old = first_component(bmc)
        bmc.state.update_to, bmc.state.reboot_seconds = (path, "9.9.9"), 1.5
        client = RedfishClient(bmc.target(), quick(60))
        start = time.monotonic()
        try:
            task = client.firmware_update(image_uri="https://127.0.0.1:9/fw.exe")
        finally:
            client.close()
        assert task.state == "Completed"
        assert f"updated {path.rsplit('/', 1)[-1]}: {old} -> 9.9.9" in task.messages
        assert time.monotonic() - start >= 1.5             # not before the BMC was back


def test_a_multipart_push_where_that_is_what_the_bmc_offers(trees: Path, tmp_path: Path) -> None:
    image = tmp_path / "fw.tar"
    image.write_bytes(b"firmware" * 1000)
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        path, _ = first_component(bmc)
        bmc.state.update_to, bmc.state.reboot_seconds = (path, "GH200-99"), 0.5
        client = RedfishClient(bmc.target(), quick(60))
        try:
            task = client.firmware_update(file=image, sha256=hashlib.sha256(image.read_bytes()).hexdigest())
        finally:
            client.close()
        assert task.state == "Completed" and any(m.endswith("-> GH200-99") for m in task.messages)
        assert len(bmc.writes("POST", "/update-multipart")) == 1      # pushed once


def test_a_bmc_that_does_not_come_back_times_out_at_the_deadline(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        path, _ = first_component(bmc)
        bmc.state.update_to, bmc.state.reboot_seconds = (path, "9.9.9"), 600
        client = RedfishClient(bmc.target(), quick(6))
        try:
            with pytest.raises(CommandTimeout, match="not answering steadily"):
                client.firmware_update(image_uri="https://127.0.0.1:9/fw.exe")
        finally:
            client.close()
