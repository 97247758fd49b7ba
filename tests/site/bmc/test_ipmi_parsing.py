"""agent/site/bmc/ipmi.py's readers of ipmitool output, on text in ipmitool's formats (the
boot parameter, LAN and user list texts are ipmi_sim's own answers)."""

from __future__ import annotations

import pytest

from agent.errors import BmcRefused, InvalidParameters
from agent.site.bmc.client import BootDevice, BootMode, PowerState
from agent.site.bmc.ipmi import (
    check_ipmi_password,
    parse_bootparam5,
    parse_fru,
    parse_getaccess,
    parse_lan_mac,
    parse_power,
    parse_sdr,
    parse_user_id,
    split_address,
)

BOOTPARAM_UEFI_PERSISTENT = """\
Boot parameter version: 1
Boot parameter 5 is valid/unlocked
Boot parameter data: e004000000
 Boot Flags :
   - Boot Flag Valid
   - Options apply to all future boots
   - BIOS EFI boot
   - Boot Device Selector : Force PXE
"""

BOOTPARAM_SIM_DEFAULT = """\
Boot parameter version: 1
Boot parameter 5 is valid/unlocked
Boot parameter data: 0008000000
 Boot Flags :
   - Boot Flag Invalid
   - Options apply to only next boot
   - BIOS PC Compatible (legacy) boot
   - Boot Device Selector : Force Boot from default Hard-Drive
"""

SDR = """\
CPU Temp         | 30h | ok  |  3.1 | 45 degrees C
Inlet Temp       | 31h | nc  | 64.1 | 41.50 degrees C
FAN1             | 41h | ok  | 29.1 | 5400 RPM
FAN2             | 42h | ns  | 29.2 | No Reading
12V              | 50h | cr  |  7.1 | 10.20 Volts
PS1 Status       | 60h | ok  | 10.1 | Presence detected
Pwr Consumption  | 70h | ok  |  7.1 | 320 Watts
Watchdog         | 80h | ok  |  7.1 |
"""

FRU = """\
FRU Device Description : Builtin FRU Device (ID 0)
 Chassis Type          : Rack Mount Chassis
 Chassis Serial        : CH123
 Board Mfg             : Board Maker
 Board Product         : X12DPG
 Board Serial          : BS999
 Product Manufacturer  : Supermicro
 Product Name          : SYS-421GE
 Product Serial        : S4242
"""

LAN = """\
IP Address Source       : Static Address
IP Address              : 10.1.2.3
MAC Address             : 3C:EC:EF:01:02:AB
"""

USERS = """\
ID  Name\t     Callin  Link Auth\tIPMI Msg   Channel Priv Limit
1                    true    false      true       USER
2   bcadmin          true    false      true       ADMINISTRATOR
3                    true    false      false      Unknown (0x00)
"""


def test_boot_parameter_five() -> None:
    s = parse_bootparam5(BOOTPARAM_UEFI_PERSISTENT)
    assert (s.device, s.persistent, s.mode) == (BootDevice.PXE, True, BootMode.UEFI)
    s = parse_bootparam5(BOOTPARAM_SIM_DEFAULT)
    assert (s.device, s.persistent, s.mode) == (BootDevice.DISK, False, BootMode.LEGACY)
    assert parse_bootparam5(BOOTPARAM_SIM_DEFAULT.replace("default Hard-Drive", "CD/DVD")).device \
        is BootDevice.CDROM
    bios = BOOTPARAM_SIM_DEFAULT.replace("Force Boot from default Hard-Drive", "Force Boot into BIOS Setup")
    assert parse_bootparam5(bios).device is BootDevice.BIOS


def test_sensors_are_typed_with_units_and_health() -> None:
    sensors = {s.name: s for s in parse_sdr(SDR)}
    assert set(sensors) == {"CPU Temp", "Inlet Temp", "FAN1", "12V", "PS1 Status", "Pwr Consumption"}
    cpu = sensors["CPU Temp"]
    assert (cpu.kind, cpu.reading, cpu.units, cpu.health) == ("temperature", 45, "Cel", "OK")
    assert cpu.has_reading
    assert (sensors["Inlet Temp"].reading, sensors["Inlet Temp"].health) == (41.5, "Warning")
    assert (sensors["FAN1"].kind, sensors["FAN1"].units) == ("fan", "RPM")
    assert (sensors["12V"].kind, sensors["12V"].health) == ("voltage", "Critical")
    assert sensors["PS1 Status"].kind == "power_supply" and not sensors["PS1 Status"].has_reading
    assert (sensors["Pwr Consumption"].kind, sensors["Pwr Consumption"].reading) == ("power", 320)


def test_fru_lan_users_power() -> None:
    assert parse_fru(FRU) == {"manufacturer": "Supermicro", "model": "SYS-421GE", "serial": "S4242"}
    assert parse_fru(FRU.split(" Product Manufacturer")[0]) == \
        {"manufacturer": "Board Maker", "model": "X12DPG", "serial": "CH123"}
    assert parse_lan_mac(LAN) == "3c:ec:ef:01:02:ab"
    assert parse_lan_mac("nothing") == ""
    assert parse_user_id(USERS, "bcadmin") == 2
    assert parse_user_id(USERS, "root") is None
    assert parse_power("Chassis Power is on\n") is PowerState.ON
    with pytest.raises(BmcRefused, match="unexpected answer"):
        parse_power("Chassis Power is warm\n")


@pytest.mark.parametrize(("address", "expected"), [
    ("10.0.0.5", ("10.0.0.5", 623)),
    ("bmc-n01.rack1:6230", ("bmc-n01.rack1", 6230)),
    ("[fd00::5]", ("fd00::5", 623)),
    ("[fd00::5]:624", ("fd00::5", 624)),
])
def test_addresses(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["", ":623", "h:0", "h:x", "[fd00::5", "[::1]x", "-H", "a;b", "h:1:2:z"])
def test_bad_addresses(address: str) -> None:
    with pytest.raises(InvalidParameters, match="bmc_address"):
        split_address(address)


@pytest.mark.parametrize("password", ["", "x" * 21, "with space", "quo'te", "hash#", "back\\slash", "tab\t"])
def test_passwords_ipmi_cannot_take(password: str) -> None:
    with pytest.raises(InvalidParameters):
        check_ipmi_password(password)


# ipmi_sim's answer to ``channel getaccess 1`` (trimmed to four users): it leaves Enable Status
# "unknown"; user 3 was disabled with ``user disable`` (its IPMI Messaging off).
GETACCESS_SIM = """\
Maximum User IDs     : 63
Enabled User IDs     : 2

User ID              : 1
User Name            :
Fixed Name           : No
Access Available     : call-in / callback
Link Authentication  : disabled
IPMI Messaging       : disabled
Privilege Level      : Unknown (0x00)
Enable Status        : unknown

User ID              : 2
User Name            : bcadmin
Fixed Name           : No
Access Available     : call-in / callback
Link Authentication  : disabled
IPMI Messaging       : enabled
Privilege Level      : ADMINISTRATOR
Enable Status        : unknown

User ID              : 3
User Name            : tenant
Fixed Name           : No
Access Available     : call-in / callback
Link Authentication  : disabled
IPMI Messaging       : disabled
Privilege Level      : ADMINISTRATOR
Enable Status        : unknown

User ID              : 4
User Name            : ops
Fixed Name           : No
Access Available     : call-in / callback
Link Authentication  : disabled
IPMI Messaging       : enabled
Privilege Level      : USER
Enable Status        : disabled
"""


def test_getaccess_reads_named_users_their_role_and_whether_they_can_log_in() -> None:
    got = [(a.id, a.user_name, a.role, a.enabled) for a in parse_getaccess(GETACCESS_SIM)]
    assert got == [("2", "bcadmin", "Administrator", True), ("3", "tenant", "Administrator", False),
                   ("4", "ops", "ReadOnly", False)]
    assert parse_getaccess("") == []
    off, on = ("IPMI Messaging       : disabled\nPrivilege Level      : Unknown (0x00)",
               "IPMI Messaging       : enabled\nPrivilege Level      : ADMINISTRATOR")
    first = parse_getaccess(GETACCESS_SIM.replace(off, on, 1))[0]     # user 1, the anonymous one
    assert (first.id, first.user_name, first.role, first.enabled) == ("1", "", "Administrator", True)
