"""What each BMC vendor's Redfish needs, refuses or does late: one row per vendor, each field
citing where the behaviour is documented. The client consults the row of the BMC it talks to
(``detect``: the service root's Vendor and Oem, else the Manager's Model; an operator may name
the row for a BMC, the ``vendor`` parameter of a bmc.* request); nothing in the client says
``if vendor ==``.

What every BMC gets, whatever its row (the standard's rules and the client's own caution):
a write sent once unless the BMC provably did not take it, read back on an ambiguous answer
(a Reset for ``reset_readback_polls`` paced reads);
the boot mode sent only when it must change and only where the Boot resource offers it; the
boot override PATCHed at the settings object the System names in @Redfish.Settings where that
object carries it (system.py ``_boot_target``); after a 412 to one form of an ETag (weak or
strong), the other form sent once (a 412 is a write not applied); media ejected only where
Inserted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Doc = dict[str, Any]


@dataclass(frozen=True)
class Vendor:
    name: str
    # Every Boot PATCH names BootSourceOverrideMode (the current one when unchanged): without it
    # the BMC resets the mode to Legacy.
    mode_in_every_boot_patch: bool = False
    # A Boot PATCH carries BootSourceOverrideEnabled and BootSourceOverrideTarget only; the
    # mode, when it must change, goes in a PATCH of its own.
    boot_patch_minimal: bool = False
    # Seconds after a Boot PATCH before the override is read back (a BMC that accepts it and
    # reverts it a moment later); 0: read back at once.
    boot_readback_delay: float = 0.0
    # If-Match carries the strong form of the BMC's weak ETags from the first PATCH.
    strong_if_match: bool = False
    # Virtual-media slots, by Id prefix, that take a network image (others are skipped).
    media_slot_prefixes: tuple[str, ...] = ()
    # The image URL schemes virtual media takes; () for any.
    media_schemes: tuple[str, ...] = ()
    # The InsertMedia action's body: the properties it takes.
    insert_properties: tuple[str, ...] = ("Image", "Inserted", "WriteProtected")
    # The Accept-Encoding of every request once the row is known ("": the HTTP client's
    # ``identity``). A gzip answer is decoded whatever the row (agent/net/exchange.py).
    accept_encoding: str = ""
    # After a ComputerSystem.Reset answered ambiguously (5xx, a cut answer, a timeout): how many
    # paced reads of the System (PowerState, LastResetTime) look for it before the client says
    # applied, not applied or unknown (system.py ``_reset``). 3 at the default pacing: about 10 s.
    reset_readback_polls: int = 3
    # The node's serial console over SSH to the manager's CLI, where the System publishes no
    # SerialConsole.SSH (agent/site/observe/sshconsole.py): the command typed once logged in,
    # the keys that leave it, how many sessions may hold it (0: not documented), and what the
    # BMC says when another holds it (lower case).
    ssh_console_entry: str = ""
    ssh_console_exit: str = ""
    ssh_console_sessions: int = 0
    ssh_console_busy: tuple[str, ...] = ()
    # ManagerNetworkProtocol protocols whose ProtocolEnabled the BMC does not take by PATCH (the
    # posture gate sends none, and says why: ``posture_fixed_why``).
    posture_fixed: tuple[str, ...] = ()
    posture_fixed_why: str = ""


GENERIC = Vendor("generic")

VENDORS: dict[str, Vendor] = {v.name: v for v in (
    GENERIC,
    # iDRAC9: naming the boot mode, even unchanged, queues a BIOS job and an extra reboot
    # (ironcore-dev/metal-operator#81): the generic "mode only when it must change" covers it.
    # 8 sessions at most, then 503 RAC0218 (stmcginnis/gofish#75, quadsproject/badfish#447): no
    # row field, as every BMC gets the same rule (one session per command, two while a rotation
    # proves a password, every one DELETEd, a crash's swept at first contact: session.py).
    # The host's serial console from the SSH CLI: ``console com2``, left with Ctrl+\ . Sources
    # (searched 2026-12): Dell's DRAC 4 and DRAC 5 user guides document its forerunner
    # ``connect com2`` ("Configuring the DRAC 5 to Use a Serial or Telnet Console",
    # support.dell.com/support/edocs/software/smdrac3/drac5/OM53/en/ug/racugc3.htm); a public
    # iDRAC6 session transcript shows ``console com2`` answering "Connected to Serial Device 2.
    # To end type: ^\". UNSOURCED: the iDRAC9 command itself (no iDRAC9 guide found), the one
    # session at a time, and a refusal's wording (none found: no busy words in this row).
    Vendor("dell", ssh_console_entry="console com2", ssh_console_exit="\x1c", ssh_console_sessions=1),
    # iLO: weak ETags (W/"...": iLO 6's service root answers ETag: W/"8BFACCBF" in
    # bb-Ricardo/check_redfish#178's log) matched only in their strong form: UNSOURCED, no
    # public source found (searched 2026-12: issues, docs); the generic "after a 412, the other
    # form once" rule stands whatever the row says. A Boot PATCH with more than Enabled and
    # Target refused (bmc-toolbox/bmclib#318, DL160 Gen10); iLO 4's InsertMedia takes Image
    # alone (ansible-collections/community.general#4595).
    # iLO 5 from firmware 2.30 compresses parts of its tree and answers 406 there to a client
    # that does not take gzip (DMTF/Redfish-Mockup-Creator#56; #58 and its fix #62): gzip asked.
    # Its SSH CLI's ``vsp`` starts the Virtual Serial Port, left with ESC ( : HPE's ProLiant
    # Gen10 UEFI guide, "Accessing the UEFI Shell from a serial console connection"
    # (support.hpe.com/techlib/docs/iss/proliant-gen10-uefi/s_accessing_from_console.html, an
    # iLO 5 1.30 transcript: "hpiLO-> vsp ... Press 'ESC (' to return to the CLI Session.").
    # A second session refused with "Virtual Serial Port is currently in use by another
    # session.": seen in a public iLO 3 session transcript only; UNSOURCED for iLO 5 and 6 (no
    # HPE document found), as is the one session at a time.
    Vendor("hpe", strong_if_match=True, boot_patch_minimal=True, insert_properties=("Image",),
           accept_encoding="gzip", ssh_console_entry="vsp", ssh_console_exit="\x1b(",
           ssh_console_sessions=1,
           ssh_console_busy=("virtual serial port is currently in use by another session",)),
    # XCC mounts network images in its EXT slots only (lenovo/python-redfish-lenovo#21).
    # XCC's SSH CLI: ``console 1`` starts the serial redirection of SOL instance 1, left with
    # ESC ( . UNSOURCED: written from memory of Lenovo's XCC User Guide ("console command"),
    # not found in public sources (searched 2026-12); nor its session count or refusal's words.
    Vendor("lenovo", media_slot_prefixes=("EXT",), ssh_console_entry="console 1",
           ssh_console_exit="\x1b(", ssh_console_sessions=1),
    # Supermicro resets the mode to Legacy when a Boot PATCH does not name it
    # (DMTF/Redfishtool#106), and may revert an accepted override a moment later
    # (bmc-toolbox/bmclib#459): read back after 2 s.
    # Its console over SSH: published in SerialConsole.SSH (port 22 shared with the SMASH-CLP
    # CLI, ConsoleEntryCommand "cd system1/sol1; start", MaxConcurrentSessions 1: the
    # sys821 recording); the exit keys there too.
    Vendor("supermicro", mode_in_every_boot_patch=True, boot_readback_delay=2.0),
    # AMI MegaRAC (DGX H100): boot properties in the @Redfish.Settings object (/Systems/Self/SD)
    # with its ETag (DMTF/Redfish-Tacklebox#144, #111): the generic "settings object" rule
    # covers it, as it does BlueField-3's.
    Vendor("ami"),
    # bmcweb (OpenBMC: GH200, GB200, BlueField-3): virtual media takes https and smb images
    # only (openbmc/bmcweb redfish-core/lib/virtual_media.hpp); its Boot has no mode property,
    # and a PATCH naming it answers 500 (issue 40): the generic "where offered" covers it.
    # Its Reset answers once the host state manager has been asked for the transition
    # (openbmc/phosphor-state-manager: RequestedHostTransition); PowerState follows when the
    # transition is done, seconds later: 5 paced reads (about 26 s) before "unknown".
    # Its ManagerNetworkProtocol PATCH takes HostName, NTP and IPMI's and SSH's ProtocolEnabled
    # only (openbmc/bmcweb redfish-core/lib/network_protocol.hpp, the PATCH handler's
    # readJsonPatch; openbmc-test-automation's protocol tests turn IPMI and SSH on and off): a
    # PATCH naming another protocol is refused whole.
    Vendor("bmcweb", media_schemes=("https", "smb"), reset_readback_polls=5,
           posture_fixed=("HTTP", "HTTPS", "KVMIP", "SSDP", "VirtualMedia"),
           posture_fixed_why="bmcweb takes only IPMI's and SSH's ProtocolEnabled by PATCH"),
)}

# (where, word, vendor): the first row whose word is in the service root's Vendor ("vendor"),
# among its Oem keys ("oem"), or in the Manager's Model ("manager") names the vendor.
DETECT: tuple[tuple[str, str, str], ...] = (
    ("vendor", "dell", "dell"), ("oem", "dell", "dell"),
    ("vendor", "hpe", "hpe"), ("oem", "hpe", "hpe"), ("oem", "hp", "hpe"),
    ("vendor", "lenovo", "lenovo"), ("oem", "lenovo", "lenovo"),
    ("vendor", "supermicro", "supermicro"), ("oem", "supermicro", "supermicro"),
    ("vendor", "ami", "ami"), ("oem", "ami", "ami"),
    ("manager", "openbmc", "bmcweb"),
)


def detect(root: Doc, manager: Doc | None) -> Vendor:
    """The row for a BMC from its service root and (where the root does not say) its Manager."""
    vendor = str(root.get("Vendor") or "").lower()
    oem = {str(k).lower() for k in root.get("Oem", {})} if isinstance(root.get("Oem"), dict) else set()
    model = str((manager or {}).get("Model") or "").lower()
    for where, word, name in DETECT:
        if (where == "vendor" and word == vendor) or (where == "oem" and word in oem) \
                or (where == "manager" and word in model):
            return VENDORS[name]
    return GENERIC


def needs_manager(root: Doc) -> bool:
    """Whether ``detect`` would read the Manager: the root alone names no vendor."""
    return detect(root, None) is GENERIC
