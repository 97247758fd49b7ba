"""What every BMC client offers, whatever its protocol, and what it is given.

``agent/site/bmc/redfish/`` (DMTF Redfish over HTTPS) and ``agent/site/bmc/ipmi.py`` (IPMI 2.0
lanplus through ``ipmitool``) implement ``BmcClient``; ``agent/commands/bmc.py`` picks one by
the request's protocol, holds the BMC's resource lock and turns the typed answers into
``BmcOperationResult``. A client raises the errors of agent/errors.py: ``AuthFailed`` for
wrong credentials (never retried), ``BmcUnreachable`` when the BMC cannot be reached within
the retries, ``BmcRefused`` with the BMC's own message when it answers but refuses,
``Unsupported`` for what the protocol or this BMC does not offer, and ``Unconfirmed`` (below)
for a write the BMC may or may not have taken: never sent again, read back by the caller.

Secrets: a client receives ``Credentials`` and never logs, returns or puts on an argv the
password (``Credentials.__repr__`` hides it).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.config import Config
from agent.errors import BmcRefused
from agent.policy.release.state import Account
from agent.proto import site_pb2


class Unconfirmed(BmcRefused):
    """A write the BMC may or may not have taken: Redfish answered 500/502/504 or the connection
    failed after it was sent; IPMI gave no answer once the command could have gone out. Never
    sent again; the caller reads back what it asked for (``RedfishSession.write``,
    ``IpmiClient.write``)."""


class BmcProtocol(enum.StrEnum):
    REDFISH = "redfish"
    IPMI = "ipmi"


class PowerAction(enum.StrEnum):
    ON = "on"
    OFF = "off"              # graceful first, forced at the deadline
    CYCLE = "cycle"
    RESET = "reset"
    STATUS = "status"


class PowerState(enum.StrEnum):
    ON = "on"
    OFF = "off"


class BootDevice(enum.StrEnum):
    PXE = "pxe"
    HTTP = "http"
    DISK = "disk"
    CDROM = "cdrom"          # virtual media
    BIOS = "bios"            # firmware setup
    NONE = "none"            # no override


class BootMode(enum.StrEnum):
    UEFI = "uefi"
    LEGACY = "legacy"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<hidden>)"


def shown_address(address: str) -> str:
    """A ``bmc_address`` as a message may quote it: never a user part (``user:password@``,
    which credentials_ref carries instead), at most 100 characters."""
    _, at, rest = address.rpartition("@")
    return ("<user>@" + rest if at else address)[:100]


@dataclass(frozen=True)
class Target:
    """Where a BMC is and how to talk to it."""

    address: str             # host or host:port
    credentials: Credentials
    verify_tls: bool = True
    ca_file: str = ""        # extra CA bundle for the BMC's certificate (Redfish)
    vendor: str = ""         # Redfish: the operator's vendor profile (redfish/vendors.py); "" detects it


@dataclass(frozen=True)
class BootSetting:
    device: BootDevice
    persistent: bool = False
    mode: BootMode | None = None


@dataclass(frozen=True)
class Pacing:
    """How a client waits on a BMC: never more often than ``min_interval`` between polls
    (frequent polling hangs real BMCs), backing off by ``factor`` up to ``max_interval``."""

    min_interval: float = Config.bmc_poll_seconds      # the settings rows' defaults, written there
    max_interval: float = Config.bmc_poll_max_seconds
    factor: float = 1.5


class BmcClient(Protocol):
    """One BMC, one protocol. Every call is bounded by ``cancel`` and the caller's deadline
    (``deadline`` is a time.monotonic() value)."""

    def power_state(self) -> PowerState: ...

    def set_power(self, action: PowerAction, *, graceful_timeout: float) -> None:
        """Ask for the change; the caller polls ``power_state`` until it has settled."""
        ...

    def boot_device(self) -> BootSetting: ...

    def set_boot_device(self, setting: BootSetting) -> BootSetting:
        """Set it; the setting as the BMC reads it back afterwards."""
        ...

    def query(self) -> site_pb2.BmcOperationResult:
        """system, nics, sensors and power_state filled in (and the firmware inventory where
        the BMC has one)."""
        ...

    def event_log(self, since: int) -> list[site_pb2.BmcLogEntry]:
        """The BMC's event log entries since ``since`` (seconds since 1970; 0: all)."""
        ...

    def set_password(self, username: str, new_password: str) -> None: ...

    def accounts(self) -> list[Account]:
        """The BMC's user accounts that have a name (Redfish Accounts; IPMI's LAN channel)."""
        ...

    def disable_account(self, username: str) -> list[Account]:
        """Disable each account named ``username`` (one write each), read back after: those
        accounts as the BMC now lists them; BmcRefused when there is none or one stays enabled."""
        ...

    def reset_account(self, slot: str, user_name: str, role: str, enabled: bool | None,
                      site_user: str) -> Account:
        """Put the account in ``slot`` back to ``user_name`` (and ``role``, ``enabled`` where
        given; a Redfish RoleId, or IPMI's privilege as ``channel getaccess`` prints it), each
        write once, read back: the slot as read back; BmcRefused where it differs. The site's
        own account (``site_user``) is never renamed nor disabled (InvalidParameters)."""
        ...

    def check_login(self, credentials: Credentials) -> bool:
        """True when ``credentials`` are accepted; False when refused (AuthFailed is not
        raised here); other failures raise."""
        ...

    # -- firmware, storage, virtual media: Redfish; IPMI raises Unsupported ----------------

    def firmware_update(
        self,
        *,
        image_uri: str = "",
        file: Path | None = None,
        sha256: str = "",
        transfer_protocol: str = "",
        method: str = "",
        progress: Callable[[int, str], None] | None = None,
    ) -> site_pb2.BmcFirmwareTask:
        """SimpleUpdate from ``image_uri``, or a push of ``file`` (its ``sha256`` checked first),
        as ``method`` says ("": what the BMC offers that fits; simple_update, multipart,
        http_push); follows the task monitor to its end, ``progress(percent, message)``."""
        ...

    def firmware_status(self, task_uri: str = "") -> site_pb2.BmcOperationResult:
        """The FirmwareInventory's versions (``firmware_inventory``) and, with ``task_uri``, that
        task's state now (``firmware``), read once."""
        ...

    def storage(self) -> list[site_pb2.BmcStorageController]: ...

    def virtual_media(self) -> list[site_pb2.BmcVirtualMedia]: ...

    def insert_media(self, image_url: str, *, media_type: str = "CD",
                     alternates: tuple[str, ...] = ()) -> site_pb2.BmcVirtualMedia:
        """Insert ``image_url``, or the first of ``alternates`` (the same image at other URLs:
        the site's media over https) whose scheme the BMC mounts; the slot as read back."""
        ...

    def eject_media(self) -> None: ...

    def create_volume(
        self, controller_id: str, *, name: str, raid_type: str, drives: list[str], capacity_bytes: int
    ) -> site_pb2.BmcVolume: ...

    def delete_volume(self, volume_id: str) -> None: ...

    def close(self) -> None: ...


@dataclass
class CallContext:
    """What a client needs of the command that uses it."""

    cancel: threading.Event
    deadline: float
    pacing: Pacing = field(default_factory=Pacing)
    # The site-wide slots for IPMI sessions (one per ipmitool run); None: unbounded.
    ipmi_sessions: threading.BoundedSemaphore | None = None
