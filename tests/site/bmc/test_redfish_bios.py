"""BIOS settings through bmc.firmware set_bios and bmc.query bios, checked against the BMC's own
AttributeRegistry, on recorded trees served by the project's emulator (its settings objects
apply at the next reset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import parse_kind, run_kind

DELL_BIOS = "/redfish/v1/Systems/System.Embedded.1/Bios"


def test_dell_bios_set_through_its_settings_object_applied_at_the_next_reset(trees: Path,
                                                                             emulator_config: Config) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        done = run_kind("bmc.firmware", emulator_config, bmc, "set_bios",
                        attributes='{"LogicalProc": "Disabled", "AcPwrRcvryUserDelay": "180"}')
        assert done.state == "pending: applied at the next reset"
        assert dict(done.values) == {"LogicalProc": "Disabled", "AcPwrRcvryUserDelay": "180"}
        [(_, path, body)] = bmc.writes("PATCH")
        assert path == f"{DELL_BIOS}/Settings"
        assert body == {"Attributes": {"LogicalProc": "Disabled", "AcPwrRcvryUserDelay": 180},
                        "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}
        before = run_kind("bmc.query", emulator_config, bmc, "bios", names="LogicalProc,AcPwrRcvryUserDelay")
        assert dict(before.values) == {"LogicalProc": "Enabled", "AcPwrRcvryUserDelay": "120",
                                       "pending.LogicalProc": "Disabled",
                                       "pending.AcPwrRcvryUserDelay": "180"}
        run_kind("bmc.power", emulator_config, bmc, "reset")
        after = run_kind("bmc.query", emulator_config, bmc, "bios", names="LogicalProc,AcPwrRcvryUserDelay")
        assert after.values["LogicalProc"] == "Disabled" and after.values["AcPwrRcvryUserDelay"] == "180"


def test_attributes_outside_the_registry_are_refused_before_any_write(trees: Path,
                                                                       emulator_config: Config) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        with pytest.raises(InvalidParameters) as err:
            run_kind("bmc.firmware", emulator_config, bmc, "set_bios", attributes=(
                '{"NoSuchThing": "1", "SystemModelName": "x", "AcPwrRcvryUserDelay": 30,'
                ' "LogicalProc": "Maybe", "SriovGlobalEnable": "Disabled"}'))
        said = err.value.message
        for words in ("NoSuchThing: not in the BMC's AttributeRegistry", "SystemModelName: read-only",
                      "AcPwrRcvryUserDelay: 30 is outside 120..600", "LogicalProc: 'Maybe' is not one of"):
            assert words in said
        assert "SriovGlobalEnable" not in said
        assert not bmc.writes("PATCH")


def test_gh200_booleans_and_integers_by_its_registry(trees: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        done = run_kind("bmc.firmware", emulator_config, bmc, "set_bios",
                        attributes='{"EGM": "true", "EGMHypervisorReservedMemory": 1024}')
        assert dict(done.values) == {"EGM": "True", "EGMHypervisorReservedMemory": "1024"}
        assert bmc.writes("PATCH")[0][2]["Attributes"] == {"EGM": True, "EGMHypervisorReservedMemory": 1024}
        with pytest.raises(InvalidParameters, match="EGM: 'yes' is not true or false"):
            run_kind("bmc.firmware", emulator_config, bmc, "set_bios", attributes='{"EGM": "yes"}')


def test_lenovo_registry_is_found_through_its_location(trees: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("lenovo_sr670", trees) as bmc:
        done = run_kind("bmc.firmware", emulator_config, bmc, "set_bios",
                        attributes='{"SystemRecovery_POSTWatchdogTimer": "Enabled"}')
        assert done.state.startswith("pending")
        assert [p for _, p, _ in bmc.writes("PATCH")] == ["/redfish/v1/Systems/1/Bios/Pending"]


@pytest.mark.parametrize("tree", ["supermicro_sys821", "nvidia_dgxh100"])
def test_no_registry_no_write(trees: Path, emulator_config: Config, tree: str) -> None:
    """Their recordings publish no BIOS AttributeRegistry: nothing can be checked."""
    with RedfishEmulator.of(tree, trees) as bmc:
        with pytest.raises(Unsupported, match="no BIOS AttributeRegistry"):
            run_kind("bmc.firmware", emulator_config, bmc, "set_bios", attributes='{"Anything": "1"}')
        assert not bmc.writes("PATCH")


@pytest.mark.parametrize("attributes", ["", "[]", "{}", "not json", '{"a b": 1}', '{"x": [1]}',
                                        '{"x": "' + "y" * 300 + '"}'])
def test_the_attributes_parameter_is_checked_in_parse(attributes: str) -> None:
    with pytest.raises(InvalidParameters, match="attributes"):
        parse_kind("bmc.firmware", "set_bios", attributes=attributes)
