"""RedfishClient against sushy-tools' emulator (fake driver, basic auth) on 127.0.0.1: query,
boot override read back, power changes that settle, storage, virtual media, the BMC's own
refusal text, wrong credentials, TLS. No QEMU here (test_redfish_qemu.py drives a node)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import AuthFailed, BmcRefused, BmcUnreachable, Unsupported
from agent.site.bmc.client import (
    BootDevice,
    BootMode,
    BootSetting,
    Credentials,
    PowerAction,
    PowerState,
    Target,
)
from agent.site.bmc.redfish.client import RedfishClient
from tests.loopback_http import LoopbackServer, self_signed_cert
from tests.site.bmc.sushy import NODE_MAC, USER, SushyEmulator, fast_call, free_port

PASSWORD = "emu-Secret-4417"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SushyEmulator]:
    with SushyEmulator(tmp_path_factory.mktemp("sushy"), password=PASSWORD) as emu:
        yield emu


@pytest.fixture
def client(emulator: SushyEmulator) -> Iterator[RedfishClient]:
    c = RedfishClient(emulator.target(), fast_call())
    yield c
    c.close()


def test_query_reads_the_system_manager_nics_and_sensors(client: RedfishClient) -> None:
    result = client.query()
    assert result.system.manufacturer == "Sushy Emulator"
    assert result.system.health == "OK"
    assert result.system.bmc_firmware_version == "1.00"
    assert result.system.uuid
    assert result.power_state in ("on", "off")
    assert [n.mac_address for n in result.nics] == [NODE_MAC]
    temps = [s for s in result.sensors if s.kind == "temperature"]
    assert temps and all(s.units == "Cel" and s.has_reading for s in temps)
    assert {s.reading for s in temps} >= {41.0, 25.0}
    assert any(s.kind == "fan" for s in result.sensors)
    assert client._auth is not None and "Authorization" in client._auth  # no SessionService: basic


def test_boot_override_set_and_read_back(client: RedfishClient) -> None:
    client.set_boot_device(BootSetting(BootDevice.PXE, persistent=True, mode=BootMode.UEFI))
    assert client.boot_device() == BootSetting(BootDevice.PXE, True, BootMode.UEFI)
    client.set_boot_device(BootSetting(BootDevice.DISK, persistent=True, mode=BootMode.LEGACY))
    assert client.boot_device() == BootSetting(BootDevice.DISK, True, BootMode.LEGACY)
    client.set_boot_device(BootSetting(BootDevice.CDROM, persistent=True))
    assert client.boot_device().device is BootDevice.CDROM


def test_boot_once_reads_back_continuous_on_the_emulator(
    client: RedfishClient, caplog: pytest.LogCaptureFixture
) -> None:
    # The emulator keeps every override Continuous: the device is set, the read-back says so
    # (the bmc.boot handler reports it in not_kept).
    client.set_boot_device(BootSetting(BootDevice.PXE, persistent=False))
    back = client.boot_device()
    assert (back.device, back.persistent) == (BootDevice.PXE, True)
    assert "reads back persistent=True" in caplog.text


def test_boot_device_it_does_not_offer_is_unsupported(client: RedfishClient) -> None:
    with pytest.raises(Unsupported, match="BiosSetup"):
        client.set_boot_device(BootSetting(BootDevice.BIOS, persistent=True))


def wait_power(client: RedfishClient, want: PowerState, seconds: float = 30.0) -> float:
    start = time.monotonic()
    while client.power_state() is not want:
        assert time.monotonic() - start < seconds, f"power not {want} after {seconds} s"
        time.sleep(0.5)
    return time.monotonic() - start


@pytest.mark.slow
def test_power_on_cycle_off_settle(client: RedfishClient) -> None:
    client.set_power(PowerAction.ON, graceful_timeout=10)
    wait_power(client, PowerState.ON)
    client.set_power(PowerAction.ON, graceful_timeout=10)     # already on: nothing to do
    assert client.power_state() is PowerState.ON
    client.set_power(PowerAction.CYCLE, graceful_timeout=10)  # no PowerCycle: ForceOff, off, On
    wait_power(client, PowerState.ON)
    client.set_power(PowerAction.OFF, graceful_timeout=20)    # GracefulShutdown, waited for
    wait_power(client, PowerState.OFF, 5)


def test_storage_lists_the_controller_and_drive(client: RedfishClient) -> None:
    (ctl,) = client.storage()
    assert ctl.id == "1" and ctl.name == "Local Storage Controller"
    (drive,) = ctl.drives
    assert drive.id == "32ADF365C6C1B7BD" and drive.capacity_bytes == 899527000000
    assert drive.protocol == "SAS"
    assert list(ctl.volumes) == []


def test_virtual_media_insert_and_eject(client: RedfishClient) -> None:
    with LoopbackServer() as srv:
        url = srv.add("/boot.iso", b"\0" * 4096)
        client.insert_media(url)
        cd = next(m for m in client.virtual_media() if "CD" in m.media_types)
        assert cd.inserted and cd.image.endswith("boot.iso")
        client.eject_media()
    assert not any(m.inserted for m in client.virtual_media())


def test_simple_update_refused_with_the_bmcs_own_words(client: RedfishClient) -> None:
    # The emulator wants Targets, which the schema makes optional: its refusal reaches the caller.
    with pytest.raises(BmcRefused, match="Missing ImageURI and/or Targets") as err:
        client.firmware_update(image_uri="http://127.0.0.1:1/fw.bin")
    assert err.value.details["status"] == "400"
    assert "Missing ImageURI" in err.value.details["bmc_message"]


def test_no_account_service_is_unsupported(client: RedfishClient) -> None:
    with pytest.raises(Unsupported, match="AccountService"):
        client.set_password(USER, "n3w-Password")


def test_check_login(client: RedfishClient) -> None:
    assert client.check_login(Credentials(USER, PASSWORD)) is True
    assert client.check_login(Credentials(USER, "wrong")) is False


def test_wrong_password_is_auth_failed_at_once(emulator: SushyEmulator) -> None:
    client = RedfishClient(emulator.target(password="not-the-password"), fast_call())
    start = time.monotonic()
    with pytest.raises(AuthFailed, match="refused the credentials of user 'admin'") as err:
        client.power_state()
    assert "not-the-password" not in str(err.value)
    assert client.attempts <= 2 and time.monotonic() - start < 5  # the root, one refused GET


def test_unreachable_bmc_bounded_then_clear() -> None:
    target = Target(f"http://127.0.0.1:{free_port()}", Credentials(USER, PASSWORD))
    client = RedfishClient(target, fast_call(seconds=20))
    start = time.monotonic()
    with pytest.raises(BmcUnreachable, match="giving up after 5 attempts"):
        client.power_state()
    assert time.monotonic() - start < 10


def test_tls_verified_unless_told_not_to(tmp_path: Path) -> None:
    cert, key = self_signed_cert(str(tmp_path))
    with SushyEmulator(tmp_path / "emu", password=PASSWORD, tls=(cert, key)) as emu:
        untrusted = RedfishClient(emu.target(), fast_call())
        with pytest.raises(BmcUnreachable, match="TLS certificate is not trusted") as err:
            untrusted.power_state()
        assert err.value.details["tls"] == "untrusted"
        assert untrusted.attempts <= 1
        with_ca = RedfishClient(emu.target(ca_file=cert), fast_call())
        assert with_ca.power_state() in (PowerState.ON, PowerState.OFF)
        unverified = RedfishClient(emu.target(verify_tls=False), fast_call())
        assert unverified.query().system.manufacturer == "Sushy Emulator"
