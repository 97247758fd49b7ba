"""How each vendor's BMC answers WRITES, as its vendor documents it or public trackers report it:
the recordings (../shared/vendor-trees) show only what a BMC answers to GETs.

One ``Profile`` per recorded tree; each ``Quirk`` below names one documented misbehaviour, with
where it is documented. The emulator (tests/site/bmc/redfish_emulator/server.py) consults the
profile; nothing in it says ``if vendor ==``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Quirk(enum.StrEnum):
    # iDRAC: past its session limit a session POST answers 503 with IDRAC.2.x.RAC0218 "The
    # maximum number of user sessions is reached" (stmcginnis/gofish#75, bb-Ricardo/check_redfish#89,
    # quadsproject/badfish#447: sessions left open lock the BMC out for ~20 minutes).
    SESSION_LIMIT = "session-limit"
    # iDRAC: while the Lifecycle Controller runs a job, writes answer 503 "Lifecycle controller
    # is currently not ready" / SYS518 job queue busy (dell/iDRAC-Redfish-Scripting#116,
    # quadsproject/badfish#45): refused before processing, to be retried later.
    BUSY_JOB_QUEUE = "busy-job-queue"
    # iDRAC: a Boot PATCH that names BootSourceOverrideMode, even unchanged, queues a BIOS
    # configuration job and an extra reboot (ironcore-dev/metal-operator#81).
    MODE_QUEUES_BIOS_JOB = "mode-queues-bios-job"
    # AMI MegaRAC (DGX H100): boot properties are written to the settings object the System
    # names in @Redfish.Settings (/Systems/Self/SD), with that object's ETag in If-Match; the
    # System itself answers 400 Ami.1.0.OperationSupportedInFutureStateURI
    # (DMTF/Redfish-Tacklebox#144 and #111). Applied at the next reset.
    BOOT_IN_SETTINGS_OBJECT = "boot-in-settings-object"
    # AMI MegaRAC: a PATCH of a resource with an ETag and no If-Match answers 428
    # (DMTF/Redfish-Tacklebox#111; Redfish spec DSP0266 "ETags": a service may require it).
    IF_MATCH_REQUIRED = "if-match-required"
    # Supermicro: a Boot PATCH without BootSourceOverrideMode resets the mode to Legacy
    # (DMTF/Redfishtool#106: "they revert to default value if it is not explicitly passed").
    MODE_RESET_WITHOUT_MODE = "mode-reset-without-mode"
    # Supermicro (AMI based): an override answered 200 reads back reverted a moment later,
    # Enabled Disabled and the mode Legacy (bmc-toolbox/bmclib#459).
    OVERRIDE_REVERTED = "override-reverted"
    # Supermicro: after EjectMedia the slot keeps its Image (Inserted false), and a second
    # EjectMedia of that slot is refused (ansible-collections/community.general#12537).
    EJECT_KEEPS_IMAGE = "eject-keeps-image"
    # HPE (DL160 Gen10): a Boot PATCH with any property but BootSourceOverrideEnabled and
    # BootSourceOverrideTarget is refused whole (bmc-toolbox/bmclib#318).
    EXTRA_BOOT_FIELDS_REFUSED = "extra-boot-fields-refused"
    # HPE iLO: ETags are weak (W/"8BFACCBF", bb-Ricardo/check_redfish#178) but If-Match must
    # carry the strong form: the weak one answers 412 (openstack/sushy's weak-ETag handling).
    WEAK_ETAG = "weak-etag"
    # HPE iLO 5 (firmware 2.30 and later) compresses parts of its resource tree: a GET there from
    # a client that does not accept gzip answers 406 (DMTF/Redfish-Mockup-Creator#56), and one
    # with no Accept-Encoding at all gets gzip anyway (#58; the tool's fix, #62, accepts any
    # coding). Python's http.client sends "Accept-Encoding: identity" unless told otherwise. The
    # emulator compresses every resource but the service root (which names the vendor).
    GZIP_OR_406 = "gzip-or-406"
    # HPE iLO firmware that matches If-Match against the ETag exactly as it gave it, W/ included:
    # the strong form answers 412 (issue 53; RFC 9110 13.1.1 leaves a weak tag unmatched by a
    # strong comparison, and iLO firmware differs on which form it takes: WEAK_ETAG above). The
    # client's row sends the strong form first, so this is the other half of its one retry.
    WEAK_ETAG_AS_GIVEN = "weak-etag-as-given"
    # HPE iLO 4: InsertMedia takes Image alone; Inserted or WriteProtected answers 400
    # Base.0.10.PropertyUnknown (ansible-collections/community.general#4595, #4596).
    INSERT_TAKES_IMAGE_ONLY = "insert-takes-image-only"
    # bmcweb (GH200, GB200): the Boot resource has no BootSourceOverrideMode; a PATCH naming it
    # applies the target and then answers 500 (the recordings: no such property; issue 40).
    MODE_PATCH_500 = "mode-patch-500"
    # bmcweb: virtual media takes https:// and smb:// images only (openbmc/bmcweb
    # redfish-core/lib/virtual_media.hpp, TransferProtocolType: HTTPS, CIFS).
    MEDIA_HTTPS_ONLY = "media-https-only"
    # Lenovo XCC: network images mount only in the EXT slots, by PATCH (no InsertMedia action);
    # RDOC and Remote slots are for uploaded files (lenovo/python-redfish-lenovo#21).
    EXT_SLOTS_ONLY = "ext-slots-only"
    # bmcweb and others: a ComputerSystem.Reset answered 5xx after the BMC acted on it (issue 40:
    # a resent reset would reset the node twice).
    RESET_500_AFTER_ACTING = "reset-500-after-acting"
    # A LogService listed in its collection that answers 404 (issue 40, BlueField-3: its recording
    # lists the Manager's Journal, whose Entries answer 404; the emulator also takes ``gone`` paths).
    LOG_SERVICE_404 = "log-service-404"
    # BlueField-3's BMC: a Boot PATCH at the System answers 204 and applies nothing; the override
    # is taken by the settings object the System names (/redfish/v1/Systems/Bluefield/Settings)
    # and applied at the next reset (NVIDIA BlueField BMC Software documentation, "Boot
    # Configuration": "applying patches to the setting attribute is required", PATCH
    # .../Systems/Bluefield/Settings; NVIDIA/libredfish PATCHes the same object).
    BOOT_AT_SYSTEM_IGNORED = "boot-at-system-ignored"
    # bmcweb: a ManagerNetworkProtocol PATCH takes HostName, NTP and IPMI's and SSH's
    # ProtocolEnabled; one naming any other property is refused whole, 400 PropertyUnknown
    # (openbmc/bmcweb redfish-core/lib/network_protocol.hpp: readJsonPatch of those keys alone).
    PROTOCOL_PATCH_IPMI_SSH_ONLY = "protocol-patch-ipmi-ssh-only"
    # NVIDIA BlueField BMC: a Secure Boot key write (ResetKeys, a certificate POST) becomes a task
    # that UEFI runs at the next boot ("BIOS Secure Boot Configuration", BlueField BMC software
    # 23.09 to 25.10); answered 202 (tests/site/bmc/redfish_emulator/secureboot.py).
    SECURE_BOOT_AT_REBOOT = "secure-boot-at-reboot"


@dataclass(frozen=True)
class Profile:
    """One vendor's write behaviour: ``max_sessions`` (0: no limit), ``etag`` ("strong",
    "weak" or "" for none), the image transports virtual media takes, the quirks."""

    name: str
    max_sessions: int = 0
    etag: str = "strong"
    media_schemes: tuple[str, ...] = ("http", "https", "nfs", "smb", "cifs")
    quirks: frozenset[Quirk] = field(default_factory=frozenset)
    apply_delay: float = 0.0      # seconds before an OVERRIDE_REVERTED override reverts
    task_polls: int = 2           # task monitor GETs before a task is Completed


def _p(name: str, *quirks: Quirk, **kw: object) -> Profile:
    return Profile(name, quirks=frozenset(quirks), **kw)  # type: ignore[arg-type]


# tree directory (../shared/vendor-trees/<dir>) -> its vendor's profile
PROFILES: dict[str, Profile] = {
    # iDRAC9 allows 8 Redfish sessions (Dell iDRAC9 User's Guide, "Session limits"; RAC0218 above).
    "dell_r750": _p("dell", Quirk.SESSION_LIMIT, Quirk.BUSY_JOB_QUEUE, Quirk.MODE_QUEUES_BIOS_JOB,
                    max_sessions=8),
    "hpe_dl385": _p("hpe", Quirk.WEAK_ETAG, Quirk.EXTRA_BOOT_FIELDS_REFUSED,
                    Quirk.INSERT_TAKES_IMAGE_ONLY, Quirk.GZIP_OR_406, etag="weak"),
    "lenovo_sr670": _p("lenovo", Quirk.EXT_SLOTS_ONLY),
    # OVERRIDE_REVERTED is a board's BIOS setting (CSM off), not every Supermicro's: a test adds it.
    "supermicro_sys821": _p("supermicro", Quirk.MODE_RESET_WITHOUT_MODE, Quirk.EJECT_KEEPS_IMAGE),
    "nvidia_dgxh100": _p("ami", Quirk.BOOT_IN_SETTINGS_OBJECT, Quirk.IF_MATCH_REQUIRED),
    "nvidia_gh200": _p("bmcweb", Quirk.MODE_PATCH_500, Quirk.MEDIA_HTTPS_ONLY, Quirk.RESET_500_AFTER_ACTING,
                       Quirk.PROTOCOL_PATCH_IPMI_SSH_ONLY, media_schemes=("https", "smb")),
    "nvidia_gb200": _p("bmcweb", Quirk.MODE_PATCH_500, Quirk.MEDIA_HTTPS_ONLY, Quirk.RESET_500_AFTER_ACTING,
                       Quirk.PROTOCOL_PATCH_IPMI_SSH_ONLY, media_schemes=("https", "smb")),
    "nvidia_bluefield3": _p("bmcweb", Quirk.LOG_SERVICE_404, Quirk.BOOT_AT_SYSTEM_IGNORED,
                            Quirk.PROTOCOL_PATCH_IPMI_SSH_ONLY, Quirk.SECURE_BOOT_AT_REBOOT),
    "dmtf_public_rackmount1": _p("dmtf"),
}
