"""The release gate's golden state: what is expected (from the wire) and what was observed.

The gate itself (agent/policy/release/__init__.py says how it works) is gate.py over one module
per area.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent.errors import InvalidParameters
from agent.hw import efivars
from agent.hw import tpm as tpmwire
from agent.hw.gpu import GpuState
from agent.policy.release.golden import Golden
from agent.proto import agent_pb2

_SHA256 = re.compile(r"[0-9a-f]{64}|absent")
_PCI_IDS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{4}")
_PARAMETER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}(\[\d{1,3}\])?")
_DISK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_VALUE = re.compile(r"[A-Za-z0-9_]{1,64}(\(\d{1,10}\))?")
_BIOS_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_BIOS_ATTRIBUTES = 256
MAX_ACCOUNTS = 64
SITE_AREAS = ("bios", "bmc_accounts")     # the BMC's half of the state, checked at the site
MELLANOX = "15b3"
SECURE_BOOT_DATABASES = ("pk", "kek", "db", "dbx")


# --------------------------------------------------------------------------- expected


@dataclass(frozen=True)
class Uefi:
    boot_entries: dict[int, str] = field(default_factory=dict)     # number -> sha256
    descriptions: dict[int, str] = field(default_factory=dict)
    boot_order: tuple[int, ...] = ()
    secure_boot: bool | None = None
    setup_mode: bool | None = None
    digests: dict[str, str] = field(default_factory=dict)          # "pk" -> sha256 | "absent"
    memory_overwrite: int | None = None


@dataclass(frozen=True)
class NicProfile:
    match: str                                                      # "vvvv:dddd", "" every Mellanox
    config: dict[str, str]
    firmware_version: str = ""

    def matches(self, ids: str) -> bool:
        return ids == self.match if self.match else ids.startswith(MELLANOX + ":")


@dataclass(frozen=True)
class NvmeLayout:
    namespaces: int = 0
    full_capacity: bool = False
    lba_data_size: int = 0


@dataclass(frozen=True)
class TpmBaseline:
    persistent_handles: frozenset[int] = frozenset()    # kept besides the EK at 0x81010001
    nv_indices: frozenset[int] = frozenset()            # owner-defined indices kept


@dataclass(frozen=True)
class ExpectedAccount:
    user_name: str
    role: str = ""                                # Redfish RoleId; "" not checked
    enabled: bool = True


@dataclass(frozen=True)
class ExpectedState:
    uefi: Uefi | None = None
    gpus_at_defaults: bool = False
    gpu_persistence_mode: bool | None = None
    nics: tuple[NicProfile, ...] = ()
    nvme: NvmeLayout | None = None
    tpm: TpmBaseline | None = None
    bios: dict[str, str] | None = None                        # the site's: name -> value as given
    bmc_accounts: tuple[ExpectedAccount, ...] | None = None   # the site's
    wipes: tuple[str, ...] | None = None          # disks by serial, WWN or name: a certificate each
    golden: Golden | None = None                  # round 2: the node's sources diffed against it

    @property
    def areas(self) -> list[str]:
        """The areas the ramdisk checks (those set)."""
        wants_gpus = self.gpus_at_defaults or self.gpu_persistence_mode is not None
        return [name for name, on in (("uefi", self.uefi is not None), ("gpus", wants_gpus),
                                      ("nics", bool(self.nics)), ("nvme", self.nvme is not None),
                                      ("tpm", self.tpm is not None),
                                      ("wipes", self.wipes is not None),
                                      ("golden", bool(self.golden and self.golden.node_sources))) if on]

    @property
    def site_areas(self) -> list[str]:
        """The areas the site checks (those set): the BMC's half."""
        return [name for name, on in (("bios", self.bios is not None),
                                      ("bmc_accounts", self.bmc_accounts is not None)) if on]

    @classmethod
    def from_proto(cls, msg: agent_pb2.ExpectedState) -> ExpectedState:
        bios = _bios(msg.bios) if msg.HasField("bios") else None
        accounts = _accounts(msg.bmc_accounts) if msg.HasField("bmc_accounts") else None
        uefi = _uefi(msg.uefi) if msg.HasField("uefi") else None
        if len(msg.nics) > 16:
            raise InvalidParameters("expect.state.nics: at most 16 profiles")
        nics = tuple(_profile(p) for p in msg.nics)
        nvme = None
        if msg.HasField("nvme"):
            n = msg.nvme
            if n.namespaces > 1024 or n.lba_data_size not in (0, 512, 4096):
                raise InvalidParameters("expect.state.nvme: at most 1024 namespaces; "
                                        "an LBA size of 512 or 4096")
            nvme = NvmeLayout(n.namespaces, n.full_capacity, n.lba_data_size)
        return cls(uefi=uefi, gpus_at_defaults=msg.gpus.at_defaults,
                   gpu_persistence_mode=(msg.gpus.persistence_mode
                                         if msg.gpus.HasField("persistence_mode") else None),
                   nics=nics, nvme=nvme, tpm=_tpm(msg.tpm) if msg.HasField("tpm") else None,
                   bios=bios, bmc_accounts=accounts,
                   wipes=_wipes(msg.wipes) if msg.HasField("wipes") else None,
                   golden=Golden.from_proto(msg.golden)
                   if msg.HasField("golden") else None)


def _bios(msg: agent_pb2.ExpectedBios) -> dict[str, str]:
    if len(msg.attributes) > MAX_BIOS_ATTRIBUTES:
        raise InvalidParameters(f"expect.state.bios: at most {MAX_BIOS_ATTRIBUTES} attributes")
    for name, value in msg.attributes.items():
        if not _BIOS_NAME.fullmatch(name) or len(value) > 256 or not value.isprintable():
            raise InvalidParameters(f"expect.state.bios {name[:40]!r}: an attribute name (letters, digits, "
                                    "_ . : -) and a printable value of 256 characters at most")
    return dict(msg.attributes)


def _accounts(msg: agent_pb2.ExpectedBmcAccounts) -> tuple[ExpectedAccount, ...]:
    if len(msg.accounts) > MAX_ACCOUNTS:
        raise InvalidParameters(f"expect.state.bmc_accounts: at most {MAX_ACCOUNTS} accounts")
    names = [a.user_name for a in msg.accounts]
    for a in msg.accounts:
        if not a.user_name or len(a.user_name) > 64 or not a.user_name.isprintable() \
                or len(a.role) > 32 or not a.role.isprintable() or names.count(a.user_name) > 1:
            raise InvalidParameters(f"expect.state.bmc_accounts {a.user_name[:40]!r}: a printable user "
                                    "name (64 at most), once, and a role of 32 characters at most")
    return tuple(ExpectedAccount(a.user_name, a.role, not a.disabled) for a in msg.accounts)



def _wipes(msg: agent_pb2.ExpectedWipes) -> tuple[str, ...]:
    if len(msg.disks) > 64 or len(set(msg.disks)) != len(msg.disks):
        raise InvalidParameters("expect.state.wipes.disks: at most 64 disks, none twice")
    if not all(_DISK.fullmatch(d) for d in msg.disks):
        raise InvalidParameters("expect.state.wipes.disks: a serial, WWN or kernel name each "
                                "(letters, digits and ._:- only)")
    return tuple(msg.disks)


def _tpm(msg: agent_pb2.ExpectedTpm) -> TpmBaseline:
    if len(msg.persistent_handles) > 64 or len(msg.nv_indices) > 64:
        raise InvalidParameters("expect.state.tpm: at most 64 persistent handles and 64 NV indices")
    if any(h >> 24 != tpmwire.HR_PERSISTENT >> 24 for h in msg.persistent_handles):
        raise InvalidParameters("expect.state.tpm.persistent_handles: persistent handles, 0x81xxxxxx")
    if any(i >> 24 != tpmwire.HR_NV_INDEX >> 24 for i in msg.nv_indices):
        raise InvalidParameters("expect.state.tpm.nv_indices: NV indices, 0x01xxxxxx")
    return TpmBaseline(frozenset(msg.persistent_handles), frozenset(msg.nv_indices))


def _uefi(msg: agent_pb2.ExpectedUefi) -> Uefi:
    if len(msg.boot_entries) > 256 or len(msg.boot_order) > 256:
        raise InvalidParameters("expect.state.uefi: at most 256 boot entries")
    entries, descriptions = {}, {}
    for e in msg.boot_entries:
        if e.number > 0xFFFF or not _SHA256.fullmatch(e.sha256.lower()) or e.number in entries:
            raise InvalidParameters(f"expect.state.uefi.boot_entries: entry {e.number}: a 16-bit number, "
                                    "once, with a hex sha256")
        entries[e.number] = e.sha256.lower()
        descriptions[e.number] = e.description[:128]
    if any(n > 0xFFFF for n in msg.boot_order):
        raise InvalidParameters("expect.state.uefi.boot_order: 16-bit entry numbers")
    digests = {}
    for name in SECURE_BOOT_DATABASES:
        value = getattr(msg, f"{name}_sha256").lower()
        if value and not _SHA256.fullmatch(value):
            raise InvalidParameters(f"expect.state.uefi.{name}_sha256: 64 hex digits or \"absent\"")
        if value:
            digests[name] = value
    mor = msg.memory_overwrite_request_control if msg.HasField("memory_overwrite_request_control") else None
    if mor is not None and mor > 1:
        raise InvalidParameters("expect.state.uefi.memory_overwrite_request_control: 0 or 1")
    return Uefi(entries, descriptions, tuple(msg.boot_order),
                msg.secure_boot if msg.HasField("secure_boot") else None,
                msg.setup_mode if msg.HasField("setup_mode") else None, digests, mor)


def _profile(msg: agent_pb2.NicProfile) -> NicProfile:
    match = msg.match.lower()
    if match and not _PCI_IDS.fullmatch(match):
        raise InvalidParameters(f"expect.state.nics.match {msg.match!r}: \"vvvv:dddd\" PCI ids, or empty")
    if len(msg.config) > 256:
        raise InvalidParameters("expect.state.nics.config: at most 256 parameters")
    for name, value in msg.config.items():
        if not _PARAMETER.fullmatch(name) or not _VALUE.fullmatch(value):
            raise InvalidParameters(f"expect.state.nics.config {name}={value}: a parameter name "
                                    "(SRIOV_EN) and a value (1, True, True(1), ETH)")
    if len(msg.firmware_version) > 64 or not msg.firmware_version.isprintable():
        raise InvalidParameters("expect.state.nics.firmware_version: printable, at most 64 characters")
    return NicProfile(match, dict(msg.config), msg.firmware_version.strip())


# --------------------------------------------------------------------------- observed


@dataclass(frozen=True)
class UefiState:
    boot_entries: dict[int, efivars.BootEntry]
    boot_order: tuple[int, ...] | None
    secure_boot: int | None
    setup_mode: int | None
    digests: dict[str, str]
    memory_overwrite: int | None


@dataclass(frozen=True)
class NicConfig:
    address: str                                  # PCI address
    ids: str                                      # "15b3:101b"
    firmware_version: str
    tool: str = ""                                # the driver that read it: mlxconfig or mstconfig
    settings: dict[str, tuple[str, str]] = field(default_factory=dict)   # name -> (current, next boot)
    error: str = ""


@dataclass(frozen=True)
class NvmeController:
    name: str                                     # "nvme0"
    namespaces: tuple[int, ...] = ()
    unallocated_bytes: int | None = None
    lba_sizes: dict[int, int] = field(default_factory=dict)   # nsid -> bytes, of the attached ones
    attached: tuple[int, ...] = ()                # namespaces with a block device here
    error: str = ""
    managed: bool = True                          # namespace management (id-ctrl's OACS bit 3)


@dataclass(frozen=True)
class TpmState:
    nv_indices: dict[int, bool]                   # index -> defined by the platform (PLATFORMCREATE)
    persistent: tuple[int, ...]
    permanent: int                                # TPMA_PERMANENT
    lockout_counter: int
    lockout_interval: int = 0                     # seconds for the counter to fall by one
    clear_refused: str = ""                       # why the firmware cannot be asked to clear it


@dataclass(frozen=True)
class Account:
    """One BMC user account as the BMC lists it."""

    id: str                                       # Redfish Id, IPMI user id
    user_name: str
    role: str                                     # Redfish RoleId; IPMI's privilege read as one
    enabled: bool


@dataclass(frozen=True)
class BiosValue:
    """One expected BIOS attribute as the BMC sees it, every value typed by its registry entry."""

    name: str
    registered: bool                              # the AttributeRegistry has it
    expected: Any = None                          # the baseline's value, typed
    invalid: str = ""                             # why the baseline's value does not fit its type
    current: Any = None                           # None: the Bios does not list it
    pending: Any = None                           # in the settings object; None: nothing pending


@dataclass
class BmcObserved:
    """The BMC's half, read at the site (agent/site/bmc/release.py)."""

    management_user: str                          # the site's own account: always expected
    accounts: list[Account] | None = None
    bios: list[BiosValue] | None = None
    unread: dict[str, str] = field(default_factory=dict)      # "bmc_accounts"/"bios" -> why


@dataclass
class Observed:
    uefi: UefiState | None = None
    gpus: list[GpuState] | None = None
    nics: list[NicConfig] = field(default_factory=list)
    nvme: list[NvmeController] = field(default_factory=list)
    tpm: TpmState | None = None
    tpm_absent: str = ""                          # "no TPM: ..." where the machine has none
    wipes: list[agent_pb2.ErasureCertificate] = field(default_factory=list)  # verified, this boot's
    wipes_refused: list[str] = field(default_factory=list)   # kept results that do not count, and why
    wipe_results: list[bytes] = field(default_factory=list)  # the SignedResult of each of ``wipes``
    unread: dict[str, str] = field(default_factory=dict)      # area -> why it could not be read
