"""The Redfish client against DMTF's own public-rackmount1 mockup (../shared/vendor-trees/
dmtf_public_rackmount1, read in place), served by the project's Redfish emulator
(tests/site/bmc/redfish_emulator) over TLS: Redfish as DMTF publishes it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.site.bmc.client import Credentials, Target
from agent.site.bmc.redfish.client import RedfishClient
from tests.site.bmc.redfish_emulator import PASSWORD, USER, RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import parse_kind, run_kind
from tests.site.bmc.sushy import fast_call

SYSTEM = "/redfish/v1/Systems/437XR1138R2"


@pytest.fixture(scope="module")
def mockup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishEmulator]:
    with RedfishEmulator.of("dmtf_public_rackmount1", tmp_path_factory.mktemp("dmtf")) as server:
        yield server


def test_storage_list_reads_simple_storage_where_there_is_no_storage(mockup: RedfishEmulator,
                                                                     emulator_config: Config) -> None:
    """The mockup's System has SimpleStorage only (as many older BMCs): its controller and the
    devices present in its bays; the two Absent bays are not drives."""
    result = run_kind("bmc.storage", emulator_config, mockup, "list")
    assert [(c.id, c.name) for c in result.storage] == [("1", "Simple Storage Controller")]
    drives = [(d.id, d.model, d.capacity_bytes, d.health) for d in result.storage[0].drives]
    assert drives == [("SATA Bay 1", "3000GT8", 8_000_000_000_000, "OK"),
                      ("SATA Bay 2", "3000GT7", 4_000_000_000_000, "Warning")]
    assert not result.storage[0].volumes
    assert {m.id for m in result.virtual_media} == {"CD1", "Floppy1"}


def test_volumes_on_simple_storage_are_unsupported_and_say_why(mockup: RedfishEmulator) -> None:
    client = RedfishClient(Target(f"https://{mockup.address}", Credentials(USER, PASSWORD), verify_tls=False),
                           fast_call(30))
    try:
        with pytest.raises(Unsupported, match="only SimpleStorage, which has no volumes"):
            client.delete_volume("1")
        assert client.system_ref() == SYSTEM
    finally:
        client.close()


def test_firmware_status_lists_the_inventory_and_reads_a_task(mockup: RedfishEmulator,
                                                              emulator_config: Config) -> None:
    result = run_kind("bmc.firmware", emulator_config, mockup, "status")
    versions = {item.id: item.version for item in result.firmware_inventory}
    assert versions["BMC"] == "1.45.455b66-rev4" and set(versions) == {"BIOS", "BMC", "SS"}
    assert {i.id for i in result.firmware_inventory if i.updateable} >= {"BMC"}
    assert result.state == "listed" and not result.firmware.task_uri
    task = run_kind("bmc.firmware", emulator_config, mockup, "status",
                    task_uri="/redfish/v1/TaskService/Tasks/545")
    assert (task.firmware.task_uri, task.firmware.state, task.firmware.percent) == (
        "/redfish/v1/TaskService/Tasks/545", "Completed", 100)
    assert task.state == "Completed"
    assert "read only property" in task.firmware.messages[0]


@pytest.mark.parametrize("task_uri", ["https://elsewhere/x", "//elsewhere/x", "/redfish/../../etc", "tasks/1",
                                      "/a b", "/x\n"])
def test_a_task_uri_that_is_not_a_path_on_the_bmc_is_refused_in_parse(task_uri: str) -> None:
    with pytest.raises(InvalidParameters, match="task_uri"):
        parse_kind("bmc.firmware", "status", task_uri=task_uri)
