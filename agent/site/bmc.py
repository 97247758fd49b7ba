"""What every BMC client offers, whatever its protocol, and what it is given.

``agent/site/redfish.py`` (DMTF Redfish over HTTPS) and ``agent/site/ipmi.py`` (IPMI 2.0
lanplus through ``ipmitool``) implement ``BmcClient``; ``agent/commands/bmc.py`` picks one by
the request's protocol, holds the BMC's resource lock and turns the typed answers into
``BmcOperationResult``. A client raises the errors of agent/errors.py: ``AuthFailed`` for
wrong credentials (never retried), ``BmcUnreachable`` when the BMC cannot be reached within
the retries, ``BmcRefused`` with the BMC's own message when it answers but refuses,
``Unsupported`` for what the protocol or this BMC does not offer.

Secrets: a client receives ``Credentials`` and never logs, returns or puts on an argv the
password (``Credentials.__repr__`` hides it).
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Protocol

from agent.proto import site_pb2


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


@dataclass(frozen=True)
class Target:
    """Where a BMC is and how to talk to it."""

    address: str             # host or host:port
    credentials: Credentials
    verify_tls: bool = True
    ca_file: str = ""        # extra CA bundle for the BMC's certificate (Redfish)


@dataclass(frozen=True)
class BootSetting:
    device: BootDevice
    persistent: bool = False
    mode: BootMode | None = None


@dataclass(frozen=True)
class Pacing:
    """How a client waits on a BMC: never more often than ``min_interval`` between polls
    (frequent polling hangs real BMCs), backing off by ``factor`` up to ``max_interval``."""

    min_interval: float = 2.0
    max_interval: float = 15.0
    factor: float = 1.5


class BmcClient(Protocol):
    """One BMC, one protocol. Every call is bounded by ``cancel`` and the caller's deadline
    (``deadline`` is a time.monotonic() value)."""

    def power_state(self) -> PowerState: ...

    def set_power(self, action: PowerAction, *, graceful_timeout: float) -> None:
        """Ask for the change; the caller polls ``power_state`` until it has settled."""
        ...

    def boot_device(self) -> BootSetting: ...

    def set_boot_device(self, setting: BootSetting) -> None: ...

    def query(self) -> site_pb2.BmcOperationResult:
        """system, nics, sensors and power_state filled in."""
        ...

    def set_password(self, username: str, new_password: str) -> None: ...

    def check_login(self, credentials: Credentials) -> bool:
        """True when ``credentials`` are accepted; False when refused (AuthFailed is not
        raised here); other failures raise."""
        ...

    def close(self) -> None: ...


@dataclass
class CallContext:
    """What a client needs of the command that uses it."""

    cancel: threading.Event
    deadline: float
    pacing: Pacing = field(default_factory=Pacing)
