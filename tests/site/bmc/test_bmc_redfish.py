"""The bmc.* handlers (agent/commands/bmc.py) over Redfish: the handler, the secret store and
RedfishClient together, against sushy-emulator (TLS, a self-signed certificate, so
verify_tls false as a request gives it) and, for rotation, the documented-responses test
server (tests/site/bmc/redfish_documented.py: the emulator has no AccountService)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import BmcRefused, BmcUnreachable
from agent.proto import site_pb2
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from tests.loopback_http import self_signed_cert
from tests.site.bmc.redfish_documented import DocumentedBmc
from tests.site.bmc.sushy import NODE_MAC, USER, SushyEmulator

EMU_PASSWORD = "Redfish-Emu-Pass-5520"
REF = "rack1-rf01"


def run_kind(kind: str, config: Config, address: str, operation: str, *, verify_tls: bool = False,
             **parameters: str) -> site_pb2.BmcOperationResult:
    payload = site_pb2.BmcOperationRequest(node_id="rf01", bmc_address=address, protocol="redfish",
                                           operation=operation, credentials_ref=REF,
                                           verify_tls=verify_tls, parameters=parameters)
    handler = handler_for(kind)
    assert handler is not None
    result = handler.run(Context.local(kind, config, timeout=120), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


@pytest.fixture(scope="module")
def tls_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SushyEmulator]:
    workdir = tmp_path_factory.mktemp("sushy-tls")
    cert, key = self_signed_cert(str(workdir))
    with SushyEmulator(workdir / "emu", password=EMU_PASSWORD, tls=(cert, key)) as emu:
        yield emu


def config_with(tmp_path: Path, username: str, password: str) -> Config:
    from agent.catalog import Role

    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(username, password))
    return Config(role=Role.SITE, node_id="site-1", state_dir=tmp_path / "state", secrets_dir=store.root)


def test_query_boot_and_power_status_through_the_handlers(
    tls_emulator: SushyEmulator, tmp_path: Path
) -> None:
    config = config_with(tmp_path, USER, EMU_PASSWORD)
    address = f"127.0.0.1:{tls_emulator.port}"
    query = run_kind("bmc.query", config, address, "query")
    assert query.system.manufacturer == "Sushy Emulator" and query.system.bmc_firmware_version == "1.00"
    assert [n.mac_address for n in query.nics] == [NODE_MAC] and query.sensors
    assert query.attempts > 0
    boot = run_kind("bmc.boot", config, address, "set_boot_device", device="pxe", persistent="true")
    assert (boot.boot.device, boot.boot.persistent) == ("pxe", True)
    once = run_kind("bmc.boot", config, address, "set_boot_device", device="disk", persistent="false")
    assert once.boot.device == "disk" and list(once.not_kept) == ["persistent"]
    status = run_kind("bmc.power", config, address, "status")
    assert status.power_state in ("on", "off")


def test_verify_tls_true_refuses_the_self_signed_bmc(tls_emulator: SushyEmulator, tmp_path: Path) -> None:
    config = config_with(tmp_path, USER, EMU_PASSWORD)
    with pytest.raises(BmcUnreachable, match="TLS certificate is not trusted"):
        run_kind("bmc.power", config, f"127.0.0.1:{tls_emulator.port}", "status", verify_tls=True)


def test_rotation_over_redfish_stores_the_proven_password(tmp_path: Path) -> None:
    cert, key = self_signed_cert(str(tmp_path))
    old = "Old-Rf-Passw0rd-77"
    with DocumentedBmc(username="root", password=old, tls=(cert, key)) as bmc:
        config = config_with(tmp_path, "root", old)
        result = run_kind("bmc.rotate", config, bmc.server.address, "rotate")
        assert result.values["new_login"] == "accepted" and result.values["old_login"] == "refused"
        new = SecretStore(config.secrets_dir).get(REF)
        assert new.password != old and bmc.accounts["root"] == new.password
        assert new.password not in str(result)
        assert not bmc.tokens  # every session the handler opened was closed


def test_insert_media_read_back_through_the_handler(tmp_path: Path) -> None:
    """bmc.storage insert_media reads the drive back: a BMC that accepts the medium but holds
    none fails the command, with the drive as read back in the error."""
    cert, key = self_signed_cert(str(tmp_path))
    with DocumentedBmc(username="root", password="Rf-Media-Passw0rd", tls=(cert, key)) as bmc:
        config = config_with(tmp_path, "root", "Rf-Media-Passw0rd")
        url = "http://10.0.2.2:8088/vm/abc/ramdisk.iso"
        result = run_kind("bmc.storage", config, bmc.server.address, "insert_media", image_url=url)
        assert [(m.id, m.inserted, m.image) for m in result.virtual_media] == [("CD", True, url)]
        run_kind("bmc.storage", config, bmc.server.address, "eject_media")
        bmc.media_sticks = False
        with pytest.raises(BmcRefused, match="reads back not inserted in CD") as err:
            run_kind("bmc.storage", config, bmc.server.address, "insert_media", image_url=url)
        assert err.value.details["bmc_message"] == "read back inserted=false"
