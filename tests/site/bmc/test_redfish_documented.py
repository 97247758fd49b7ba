"""RedfishClient against DOCUMENTED RESPONSES only (tests/site/bmc/redfish_documented.py, a loopback
test server written from the DMTF specification and schema, not an emulator): the paths
sushy-emulator lacks (sessions, AccountService, PowerCycle, UpdateService with a task monitor,
multipart push, volumes, the Sensors collection) and the faults a BMC shows (500, invalid
JSON, links off its host, a session it drops)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import AuthFailed, BmcRefused, ChecksumMismatch, Unsupported
from agent.site.bmc.client import Credentials, PowerAction, PowerState, Target
from agent.site.bmc.redfish.client import RedfishClient
from tests.loopback_http import Seen
from tests.site.bmc.redfish_documented import ACCOUNTS, SESSIONS, SYS, UPDATE, VOLUMES, DocumentedBmc
from tests.site.bmc.sushy import fast_call

USER, PASSWORD = "root", "old-Passw0rd-91"


NEW_PASSWORDS = ("new-Passw0rd-22", "short")


@pytest.fixture
def bmc(caplog: pytest.LogCaptureFixture) -> Iterator[DocumentedBmc]:
    """The documented BMC; after the test, no password or session token in any log record."""
    caplog.set_level(logging.DEBUG)
    with DocumentedBmc(username=USER, password=PASSWORD) as server:
        yield server
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert records  # the client logged its requests: the check below has something to read
    logged = "".join(r.getMessage() + repr(r.args) for r in records)
    for secret in (PASSWORD, *NEW_PASSWORDS, *server.issued):
        assert secret not in logged


def client_for(bmc: DocumentedBmc, password: str = PASSWORD, seconds: float = 30.0) -> RedfishClient:
    return RedfishClient(Target(bmc.address, Credentials(USER, password)), fast_call(seconds))


def test_session_opened_used_and_deleted_on_close(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    assert client.power_state() is PowerState.OFF
    posts = [s for s in bmc.seen if s.method == "POST" and s.path == SESSIONS]
    assert len(posts) == 1
    gets = [s for s in bmc.seen if s.method == "GET" and s.path == SYS]
    assert gets and all("X-Auth-Token" in s.headers and "Authorization" not in s.headers for s in gets)
    client.close()
    assert bmc.deleted_sessions == [f"{SESSIONS}/1"] and not bmc.tokens


def test_dropped_session_is_opened_again_once(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    client.power_state()
    bmc.tokens.clear()                       # the BMC forgets the session (reboot, timeout)
    assert client.power_state() is PowerState.OFF
    assert len([s for s in bmc.seen if s.path == SESSIONS and s.method == "POST"]) == 2
    client.close()


def test_wrong_password_auth_failed_after_one_attempt(bmc: DocumentedBmc) -> None:
    client = client_for(bmc, password="wrong-one")
    with pytest.raises(AuthFailed, match="refused the credentials of user 'root'") as err:
        client.query()
    assert "wrong-one" not in str(err.value)
    assert len([s for s in bmc.seen if s.path == SESSIONS]) == 1


def test_query_with_the_sensors_collection(bmc: DocumentedBmc) -> None:
    result = client_for(bmc).query()
    system = result.system
    assert (system.manufacturer, system.model, system.serial) == ("Contoso", "GPU-8", "SN123")
    assert result.system.bios_version == "1.4.2" and result.system.bmc_firmware_version == "2.81"
    assert result.system.health == "Warning"
    nics = [(n.id, n.mac_address, n.link_status) for n in result.nics]
    assert nics == [("NIC.1", "b8:ce:f6:00:11:22", "LinkUp")]
    by_name = {s.name: s for s in result.sensors}
    assert (by_name["CPU1Temp"].kind, by_name["CPU1Temp"].reading, by_name["CPU1Temp"].units) == (
        "temperature", 48.5, "Cel")
    assert (by_name["Fan1"].kind, by_name["Fan1"].reading) == ("fan", 7200.0)
    assert by_name["PSU1Power"].kind == "power" and not by_name["PSU1Power"].has_reading
    assert result.attempts >= 8


def test_power_cycle_used_when_offered_and_off_is_graceful_first(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    client.set_power(PowerAction.ON, graceful_timeout=5)
    client.set_power(PowerAction.CYCLE, graceful_timeout=5)
    client.set_power(PowerAction.OFF, graceful_timeout=5)
    client.set_power(PowerAction.OFF, graceful_timeout=5)   # already off: nothing sent
    assert bmc.resets == ["On", "PowerCycle", "GracefulShutdown"]


def test_rotation_patches_the_account_and_check_login_proves_it(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    client.set_password(USER, "new-Passw0rd-22")
    patch = next(s for s in bmc.seen if s.method == "PATCH")
    assert patch.path == f"{ACCOUNTS}/2" and b"new-Passw0rd-22" in patch.body
    assert client.check_login(Credentials(USER, "new-Passw0rd-22")) is True
    assert client.check_login(Credentials(USER, PASSWORD)) is False
    client.close()
    assert not bmc.tokens  # the probe sessions were closed too


def test_rotation_refused_keeps_the_bmc_words_but_not_the_password(
    bmc: DocumentedBmc, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BmcRefused, match="does not meet the policy") as err:
        client_for(bmc).set_password(USER, "short")
    assert "short'" not in str(err.value) and "<hidden>" in str(err.value)
    assert "short'" not in err.value.details["bmc_message"]
    assert PASSWORD not in caplog.text and "X-Auth-Token" not in caplog.text


def test_simple_update_follows_the_task_monitor_with_progress(bmc: DocumentedBmc) -> None:
    seen: list[tuple[int, str]] = []
    client = client_for(bmc)
    start = time.monotonic()
    task = client.firmware_update(image_uri="https://files.example/fw.bin", transfer_protocol="HTTPS",
                                  progress=lambda p, m: seen.append((p, m)))
    assert task.state == "Completed" and task.percent == 100
    # The way in, the task's own words; then the BMC's own reboot is waited out and the
    # inventory read again (no version changed here).
    assert task.messages == ["method simple_update", "Update done",
                             "no component's version changed yet (one may wait for a reset)"]
    assert seen == [(30, "Running: Flashing image"), (60, "Running: Flashing image"),
                    (100, "Completed: Update done"),
                    (100, "waiting for the BMC to answer steadily after its update")]
    polls = [s for s in bmc.seen if s.path == "/redfish/v1/TaskMonitors/7"]
    assert len(polls) == 3
    assert time.monotonic() - start >= 0.3 + 0.45   # paced: min_interval, then growing


def test_task_exception_is_refused_with_its_messages(bmc: DocumentedBmc) -> None:
    bmc.task_fails = True
    with pytest.raises(BmcRefused, match="ended Exception: Image signature verification failed"):
        client_for(bmc).firmware_update(image_uri="https://files.example/fw.bin")


def test_unknown_transfer_protocol_unsupported(bmc: DocumentedBmc) -> None:
    with pytest.raises(Unsupported, match="TransferProtocol HTTP, HTTPS, not NFS"):
        client_for(bmc).firmware_update(image_uri="https://files.example/fw.bin", transfer_protocol="NFS")


def test_multipart_push_checks_the_digest_first(bmc: DocumentedBmc, tmp_path: Path) -> None:
    image = tmp_path / "bmc-fw.bin"
    data = os.urandom(2 * 1024 * 1024 + 3)
    image.write_bytes(data)
    client = client_for(bmc)
    with pytest.raises(ChecksumMismatch):
        client.firmware_update(file=image, sha256="0" * 64)
    assert not bmc.pushed
    task = client.firmware_update(file=image, sha256=hashlib.sha256(data).hexdigest())
    assert task.state == "Completed"
    assert data in bmc.pushed and b'name="UpdateParameters"' in bmc.pushed
    push = next(s for s in bmc.seen if s.path == f"{UPDATE}/upload")
    assert "X-Auth-Token" in push.headers


def test_volumes_created_listed_and_deleted(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    vol = client.create_volume("RAID.1", name="scratch", raid_type="RAID1", drives=["D0", "D1"],
                               capacity_bytes=500 * 10**9)
    assert (vol.id, vol.name, vol.raid_type, list(vol.drives)) == ("V0", "scratch", "RAID1", ["D0", "D1"])
    (ctl,) = client.storage()
    assert [v.id for v in ctl.volumes] == ["V0"] and [d.id for d in ctl.drives] == ["D0", "D1"]
    client.delete_volume("V0")
    assert not bmc.volumes
    with pytest.raises(BmcRefused, match="no drive"):
        client.create_volume("RAID.1", name="x", raid_type="RAID0", drives=["D9"], capacity_bytes=0)


def test_volumes_not_offered_is_unsupported() -> None:
    with DocumentedBmc(username=USER, password=PASSWORD, volumes_offered=False) as bmc:
        with pytest.raises(Unsupported, match="does not create volumes"):
            client_for(bmc).create_volume("RAID.1", name="x", raid_type="RAID0", drives=["D0"],
                                          capacity_bytes=0)
        assert not [s for s in bmc.seen if s.method == "POST" and s.path == VOLUMES]


def test_basic_auth_when_no_session_service() -> None:
    with DocumentedBmc(username=USER, password=PASSWORD, sessions=False) as bmc:
        client = client_for(bmc)
        assert client.power_state() is PowerState.OFF
        assert all("X-Auth-Token" not in s.headers for s in bmc.seen)
        assert client.check_login(Credentials(USER, "nope")) is False
        client.close()


def test_500_retried_a_bounded_number_of_times_then_its_message(bmc: DocumentedBmc) -> None:
    bmc.fail[("GET", SYS)] = 500
    with pytest.raises(BmcRefused, match=r"HTTP 500 after 5 attempts: A general error .*; injected HTTP 500"):
        client_for(bmc).power_state()
    assert len([s for s in bmc.seen if s.path == SYS]) == 5


def test_invalid_json_retried_then_clear_error(bmc: DocumentedBmc) -> None:
    bmc.fail[("GET", SYS)] = "badjson"
    with pytest.raises(BmcRefused, match="invalid JSON"):
        client_for(bmc).power_state()
    assert len([s for s in bmc.seen if s.path == SYS]) == 5


def test_links_off_the_bmcs_host_are_refused(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    for bad in ("http://169.254.169.254/latest/meta-data", "//evil.example/x", "/redfish/v1/../../etc",
                "https://127.0.0.1:1/redfish/v1/"):
        with pytest.raises(BmcRefused):
            client.url(bad)
    assert client.url(f"{bmc.address}/redfish/v1/Systems/1").endswith("/redfish/v1/Systems/1")
    bmc.server.route("GET", "/redfish/v1/Systems", lambda s: (
        200, {"Content-Type": "application/json"}, b'{"Members": [{"@odata.id": "http://10.9.9.9/redfish/v1/x"}]}'))
    with pytest.raises(BmcRefused, match="outside itself"):
        client.power_state()


def test_busy_answers_are_retried_with_pacing(bmc: DocumentedBmc) -> None:
    from tests.site.bmc.redfish_documented import error_body

    left = [2]
    original = bmc._reset

    def busy_twice(seen: object) -> tuple[int, dict[str, str], bytes]:
        if left[0]:
            left[0] -= 1
            return 409, {"Content-Type": "application/json"}, error_body(
                "The service is temporarily unavailable", "Base.1.8.ServiceTemporarilyUnavailable")
        return original(seen)  # type: ignore[arg-type]

    bmc.route("POST", f"{SYS}/Actions/ComputerSystem.Reset", busy_twice)
    client = client_for(bmc)
    start = time.monotonic()
    client.set_power(PowerAction.ON, graceful_timeout=5)
    assert bmc.resets == ["On"] and left == [0]
    assert time.monotonic() - start >= 0.3 + 0.6  # backoff from Pacing.min_interval, doubling


def test_reset_types_from_action_info(bmc: DocumentedBmc) -> None:
    bmc.action_info = True
    client = client_for(bmc)
    client.set_power(PowerAction.ON, graceful_timeout=5)
    client.set_power(PowerAction.CYCLE, graceful_timeout=5)   # no PowerCycle listed: off, settle, on
    client.set_power(PowerAction.RESET, graceful_timeout=5)
    assert bmc.resets == ["On", "ForceOff", "On", "ForceRestart"]


def test_virtual_media_on_the_manager_by_patch(bmc: DocumentedBmc) -> None:
    client = client_for(bmc)
    client.insert_media("http://10.0.0.1/boot.iso")
    assert bmc.media == {"Inserted": True, "Image": "http://10.0.0.1/boot.iso"}
    cd = next(m for m in client.virtual_media() if m.id == "CD")
    assert cd.inserted and cd.image == "http://10.0.0.1/boot.iso" and list(cd.media_types) == ["CD", "DVD"]
    client.eject_media()
    assert bmc.media == {"Inserted": False, "Image": None}
    with pytest.raises(Unsupported, match="no virtual Floppy2 drive"):
        client.insert_media("http://10.0.0.1/x.img", media_type="Floppy2")


def test_task_still_running_at_the_deadline_is_a_timeout(bmc: DocumentedBmc) -> None:
    from agent.errors import CommandTimeout

    bmc.task_polls = 10**6
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"still Running at \d+% at the deadline"):
        client_for(bmc, seconds=2.5).firmware_update(image_uri="https://files.example/fw.bin")
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize("offset", [180, 195, 199, 200])
def test_a_login_echoed_in_a_non_json_error_leaks_no_part_of_the_password(
    bmc: DocumentedBmc, offset: int
) -> None:
    """A BMC that echoes the session request in a plain-text 400: the message is cut at 200
    characters, and the password (wherever it falls, across the cut too) is hidden first."""
    def echo(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        start = seen.body.index(PASSWORD.encode())
        return 400, {"Content-Type": "text/plain"}, b"x" * (offset - start) + seen.body

    bmc.server.route("POST", SESSIONS, echo)
    with pytest.raises(BmcRefused, match="HTTP 400") as err:
        client_for(bmc).power_state()
    said = err.value.details["bmc_message"]
    assert said.startswith("xxx") and len(said) <= 200
    for text in (str(err.value), said):
        assert PASSWORD[:4] not in text, text


def test_a_new_password_echoed_in_an_error_is_hidden_before_the_cut(bmc: DocumentedBmc) -> None:
    def echo(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        start = seen.body.index(NEW_PASSWORDS[0].encode())
        return 400, {"Content-Type": "text/plain"}, b"y" * (195 - start) + seen.body

    bmc.server.route("PATCH", f"{ACCOUNTS}/2", echo)
    with pytest.raises(BmcRefused, match="HTTP 400") as err:
        client_for(bmc).set_password(USER, NEW_PASSWORDS[0])
    for text in (str(err.value), err.value.details["bmc_message"]):
        assert NEW_PASSWORDS[0][:4] not in text, text
