"""The project's own Redfish emulator: recorded trees of real BMCs (../shared/vendor-trees) served
on 127.0.0.1 with the write behaviour each vendor documents (server.py, profiles.py)."""

from tests.site.bmc.redfish_emulator.profiles import PROFILES, Profile, Quirk
from tests.site.bmc.redfish_emulator.server import (
           PASSWORD,
           USER,
           RedfishEmulator,
           emulated,
           tree_names,
           unpack,
)

__all__ = ["PASSWORD", "PROFILES", "USER", "Profile", "Quirk", "RedfishEmulator", "emulated", "tree_names",
           "unpack"]
