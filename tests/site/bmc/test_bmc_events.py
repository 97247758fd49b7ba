"""bmc.query's firmware inventory and the BMC's event log: the SEL of ipmi_sim (records added
with the IPMI Add SEL Entry command), and Redfish FirmwareInventory and LogServices of the
documented test server (tests/site/bmc/redfish_documented.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import Config
from agent.errors import InvalidParameters
from agent.site.bmc import events
from agent.site.bmc.client import Credentials
from agent.site.bmc.ipmi import parse_sel
from agent.site.bmc.secrets import SecretStore
from tests.loopback_http import self_signed_cert
from tests.site.bmc.redfish_documented import DocumentedBmc
from tests.site.bmc.test_bmc_ipmi import request, run_kind
from tests.site.conftest import IpmiSim

# Add SEL Entry (NetFn storage 0x0a, cmd 0x44): a system event record, generator 0x20 (the BMC),
# EvM rev 4, then sensor type, sensor number, event type/direction and the three data bytes.
TEMPERATURE_HIGH = ("0x01", "0x30", "0x01", "0x59", "0x5a", "0x55")  # upper critical going high
VOLTAGE_LOW = ("0x02", "0x60", "0x01", "0x52", "0x00", "0x00")       # lower critical going low


def add_sel(sim: IpmiSim, record: tuple[str, ...]) -> None:
    header = ("0x00", "0x00", "0x02", "0x00", "0x00", "0x00", "0x00", "0x20", "0x00", "0x04")
    done = sim.ipmitool("raw", "0x0a", "0x44", *header, *record)
    assert done.returncode == 0, done.stderr


def test_sel_entries_from_ipmi_sim(sim: IpmiSim, site_config: Config) -> None:
    empty = run_kind("bmc.query", site_config, request(sim.address, "events"))
    assert empty.state == "0 entries" and not empty.events
    add_sel(sim, TEMPERATURE_HIGH)
    add_sel(sim, VOLTAGE_LOW)
    result = run_kind("bmc.query", site_config, request(sim.address, "events", since="1764619200"))
    assert result.state == "2 entries"
    first, second = result.events
    assert (first.log, first.sensor, first.message) == ("sel", "Temperature #0x30",
                                                        "Upper Critical going high Asserted")
    assert second.sensor == "Voltage #0x60" and second.message.startswith("Lower Critical going low")
    # ipmi_sim stamps its records with its own clock since start ("Pre-Init"): no absolute time,
    # so kept whatever `since` says
    assert first.created.startswith("Pre-Init") and first.created_unix == 0


def test_sel_lines_with_the_bmc_clock() -> None:
    text = ("1,11/30/2026,08:00:00,Power Supply #0x51,Presence detected,Asserted\n"
            "2,12/01/2026,20:10:21,Temperature #0x30,Upper Critical going high,Asserted\n"
            "3, Pre-Init ,0000000899,Voltage #0x60,Lower Critical going low ,Asserted\n")
    parsed = parse_sel(text)
    assert [e.created_unix for e in parsed] == [1796025600, 1796155821, 0]
    kept = events.keep(parsed, since=1796100000)
    assert [e.id for e in kept] == ["3", "2"]  # no time first, then by time
    assert parse_sel(" SEL has no entries\n") == []


@pytest.mark.parametrize(("since", "unix"), [("1764619200", 1764619200), ("2026-12-01T20:00:00Z", 1796155200),
                                             ("2026-12-01T21:00:00+01:00", 1796155200)])
def test_since(since: str, unix: int) -> None:
    assert events.parse_since(since) == unix


def test_a_bad_since_is_refused_in_parse(site_config: Config) -> None:
    from agent.commands import handler_for

    handler = handler_for("bmc.query")
    assert handler is not None
    with pytest.raises(InvalidParameters, match="since"):
        handler.parse(request("10.0.0.1", "events", since="yesterday"))
    with pytest.raises(InvalidParameters, match="unknown parameter"):
        handler.parse(request("10.0.0.1", "query", since="0"))


@pytest.fixture
def documented(site_config: Config, tmp_path: Path) -> Iterator[DocumentedBmc]:
    cert, key = self_signed_cert(str(tmp_path))
    with DocumentedBmc(username="root", password="Passw0rd-redfish-1", tls=(cert, key)) as server:
        SecretStore(site_config.secrets_dir).put("redfish-n01", Credentials("root", "Passw0rd-redfish-1"))
        yield server


def test_redfish_firmware_inventory_in_query(documented: DocumentedBmc, site_config: Config) -> None:
    payload = request(documented.server.address, "query", protocol="redfish", ref="redfish-n01")
    result = run_kind("bmc.query", site_config, payload)
    assert [(c.id, c.name, c.version, c.updateable) for c in result.firmware_inventory] == [
        ("BMC", "iDRAC", "7.00.30.00", True), ("BIOS", "BIOS", "2.19.1", True),
        ("GPU0", "GPU 0 VBIOS", "96.00.74.00.01", False)]


def test_redfish_log_services_since(documented: DocumentedBmc, site_config: Config) -> None:
    def entries(since: str) -> list[tuple[str, str, str]]:
        payload = request(documented.server.address, "events", protocol="redfish", ref="redfish-n01",
                          since=since)
        result = run_kind("bmc.query", site_config, payload)
        return [(e.log, e.id, e.severity) for e in result.events]

    # both services, both pages of the SEL, and the System's entry read by its link; oldest first
    assert entries("0") == [("SEL", "1", "OK"), ("SEL", "3", "Critical"), ("SEL", "2", "Warning"),
                            ("EventLog", "1", "Critical")]
    assert entries("2026-12-01T19:00:00Z") == [("SEL", "3", "Critical"), ("SEL", "2", "Warning"),
                                               ("EventLog", "1", "Critical")]
    assert entries("2026-12-01T20:00:00Z") == [("EventLog", "1", "Critical")]
