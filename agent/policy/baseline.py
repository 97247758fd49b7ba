"""The release gate: what a tenant could change, against the baseline the node must be back to.

``ExpectedState.from_proto`` checks the request's ``ExpectedState`` once, at the edge;
``check(expected, observed)`` returns every ``Mismatch``, each with the ``remedy`` (a
driver.invoke request, destructive and so signed by the control plane) that puts it back, or
none where the agent cannot: such a finding keeps the node out of the pool until a person acts.
The observed state is read by agent/commands/inventory/release.py. An unset or empty field is not
checked. Checks and their stable names (``where``: the entry, PCI address or controller):

  uefi.unreadable        no efivarfs (not a UEFI boot)                    -
  uefi.boot_entry        a Boot#### not in the baseline                   efivars.delete_boot_entry
                         one missing, or changed (its sha256)             -
  uefi.boot_order        BootOrder differs                                efivars.set_boot_order
  uefi.secure_boot       SecureBoot differs                               -  (firmware setup)
  uefi.setup_mode        SetupMode differs                                -
  uefi.pk uefi.kek uefi.db uefi.dbx
                         the sha256 of the database differs               -  (needs the owner's keys)
  uefi.memory_overwrite  MemoryOverwriteRequestControl differs            efivars.set_memory_overwrite
  gpu.unreadable         NVML cannot be read, or a GPU is lost            -
  gpu.mig_mode           MIG on, or pending on                            nvidia-smi.set_mig_mode, then .reset
  gpu.persistence_mode   differs from the baseline                        nvidia-smi.set_persistence_mode
  gpu.power_limit        the set limit is not the GPU's default           nvidia-smi.set_power_limit
  gpu.app_clocks         application clocks are not the defaults          nvidia-smi.reset_application_clocks
  gpu.retired_pending    a page retirement waits for a reset              nvidia-smi.reset
  gpu.remap_pending      a row remap waits for a reset                    nvidia-smi.reset
  gpu.remap_failure      a row remap failed (the GPU needs service)       -
  gpu.ecc_volatile       volatile ECC errors since the last reset         nvidia-smi.reset
  nic.unreadable         the configuration tool is missing or failed      -
  nic.config             a parameter's current or next-boot value         mlxconfig|mstconfig.set (next boot)
  nic.firmware_version   not the profile's firmware                       -  (a firmware flash)
  nvme.unreadable        nvme-cli is missing or failed                    -
  nvme.namespaces        the namespaces are not the factory's, or one     nvme.factory_layout (with the
                         is detached from this controller                  baseline's namespaces and LBA
  nvme.capacity          capacity left unallocated                        size both set, on a drive with
  nvme.lba_size          a namespace's LBA size differs                   namespace management; before
                                                                          disk.wipe)
  tpm.unreadable         the TPM answered with an error                   -
  tpm.nv_index           an NV index the owner defined, not the baseline's  tpm-ppi.clear (next boot)
  tpm.persistent_handle  a persistent object not the EK (0x81010001) nor  tpm-ppi.clear (next boot)
                         one the baseline names
  tpm.owner_auth tpm.endorsement_auth tpm.lockout_auth
                         that hierarchy's authorization is set            tpm-ppi.clear (next boot)
  tpm.lockout_counter    authorization failures counted (above zero)      tpm.reset_lockout (with the
                                                                          empty lockout auth; none
                                                                          while it is set: Clear first)
  wipe.certificate       a disk the baseline names without a verified     -  (disk.wipe, then check
                         erasure certificate of this boot                    again)

The BMC's half is checked at the site (``check_bmc``, bmc.query baseline, agent/commands/bmc.py);
its remedies are site commands (``Mismatch.bmc_remedy``), sent with the same BMC and credentials:

  bmc.unreadable         the accounts could not be read                   -
  bmc.account_extra      an enabled account not in the expected set       bmc.rotate disable_account
                         an enabled one without a name (IPMI anonymous)   -
  bmc.account_enabled    an expected-disabled account is enabled          bmc.rotate disable_account
                         an expected account is disabled                  -
  bmc.account_missing    an expected account is not on the BMC            -  (its password is not ours)
  bmc.account_role       an expected account has another role             -
  bios.unreadable        no BIOS attributes (IPMI, no registry, an error) -
  bios.unknown_attribute the BMC's AttributeRegistry has no such name     -  (a baseline for another BIOS)
  bios.invalid_value     the baseline's value is not of its registry type -
  bios.attribute         the current or pending value differs             bmc.firmware set_bios (next reset)

The TPM's findings are put back by one thing: a Clear the firmware carries out at the next boot,
asked for through its Physical Presence Interface (agent/drivers/tpm_ppi.py). Where the firmware
offers no PPI, or refuses Clear from the OS, they have no remedy and say why. NV indices the
platform defined (TPMA_NV_PLATFORMCREATE: the firmware's, which a Clear keeps) and those in the
TCG's EK range (0x01C00000-0x01C07FFF: the EK certificates) are never findings. No TPM is stated
in the report (``tpm_absent``, "tpm" not checked), not a finding.

A NIC parameter set back, or the TPM's Clear, takes effect at the next firmware boot (a reboot):
the finding stays until then, with the same remedy, which is harmless to send again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agent.errors import InvalidParameters
from agent.hw import efivars
from agent.hw import tpm as tpmwire
from agent.hw.gpu import GpuState, pci_address
from agent.proto import agent_pb2

_SHA256 = re.compile(r"[0-9a-f]{64}|absent")
_PCI_IDS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{4}")
_PARAMETER = re.compile(r"[A-Z][A-Z0-9_]{0,63}(\[\d{1,3}\])?")
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

    @property
    def areas(self) -> list[str]:
        """The areas the ramdisk checks (those set)."""
        wants_gpus = self.gpus_at_defaults or self.gpu_persistence_mode is not None
        return [name for name, on in (("uefi", self.uefi is not None), ("gpus", wants_gpus),
                                      ("nics", bool(self.nics)), ("nvme", self.nvme is not None),
                                      ("tpm", self.tpm is not None),
                                      ("wipes", self.wipes is not None)) if on]

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
                   wipes=_wipes(msg.wipes) if msg.HasField("wipes") else None)


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


# --------------------------------------------------------------------------- the checks


def invoke(driver: str, operation: str, **arguments: str | int | bool) -> agent_pb2.DriverInvokeRequest:
    """A driver.invoke request; a bool is a bool_value, an int an int_value, else a string."""
    request = agent_pb2.DriverInvokeRequest(driver=driver, operation=operation)
    for name, value in arguments.items():
        if isinstance(value, bool):
            request.arguments[name].bool_value = value
        elif isinstance(value, int):
            request.arguments[name].int_value = value
        else:
            request.arguments[name].string_value = value
    return request


def bmc_remedy(kind: str, operation: str, **parameters: str) -> agent_pb2.BmcRemedy:
    """A site command that puts a BMC finding back (sent with the check's BMC and credentials)."""
    return agent_pb2.BmcRemedy(kind=kind, operation=operation, parameters=parameters)


def restorable(m: agent_pb2.Mismatch) -> bool:
    """Whether the finding has a remedy: a driver.invoke (node) or a site command (BMC)."""
    return m.HasField("remedy") or m.HasField("bmc_remedy")


class _Found:
    def __init__(self) -> None:
        self.mismatches: list[agent_pb2.Mismatch] = []

    def add(self, check: str, expected: object, found: object, where: str, message: str,
            remedy: agent_pb2.DriverInvokeRequest | agent_pb2.BmcRemedy | None = None) -> None:
        m = agent_pb2.Mismatch(check=check, expected=str(expected), found=str(found), where=where,
                               message=message)
        if isinstance(remedy, agent_pb2.BmcRemedy):
            m.bmc_remedy.CopyFrom(remedy)
        elif remedy is not None:
            m.remedy.CopyFrom(remedy)
        self.mismatches.append(m)


def check(e: ExpectedState, seen: Observed) -> list[agent_pb2.Mismatch]:
    """Every way ``seen`` differs from ``e``, each with its remedy where there is one."""
    out = _Found()
    if e.uefi is not None:
        _uefi_check(e.uefi, seen, out)
    if "gpus" in e.areas:
        _gpu_check(e, seen, out)
    if e.nics:
        _nic_check(e.nics, seen, out)
    if e.nvme is not None:
        _nvme_check(e.nvme, seen, out)
    if e.tpm is not None:
        _tpm_check(e.tpm, seen, out)
    if e.wipes is not None:
        _wipe_check(e.wipes, seen, out)
    return out.mismatches


def disk_names(cert: agent_pb2.ErasureCertificate) -> set[str]:
    """What names the certificate's disk: serial, WWN, kernel name (the non-empty ones)."""
    d = cert.disk
    return {n for n in (d.serial, d.wwn, d.name) if n}


def certificates_of(disks: tuple[str, ...], certificates: list[agent_pb2.ErasureCertificate]) -> list[int]:
    """The index of the first (newest) certificate of each named disk that has one."""
    chosen: list[int] = []
    for disk in disks:
        i = next((i for i, c in enumerate(certificates) if disk in disk_names(c)), None)
        if i is not None and i not in chosen:
            chosen.append(i)
    return chosen


def _wipe_check(disks: tuple[str, ...], seen: Observed, out: _Found) -> None:
    refused = (f" (kept results that do not count: {'; '.join(seen.wipes_refused)})"
               if seen.wipes_refused else "")
    for disk in disks:
        if not any(disk in disk_names(c) for c in seen.wipes):
            out.add("wipe.certificate", "verified in this boot", "none", disk,
                    f"disk {disk} has no verified erasure certificate of this boot: run disk.wipe on it, "
                    f"then check again{refused}")


def _hex(numbers: tuple[int, ...] | list[int] | None) -> str:
    return ",".join(f"{n:04X}" for n in numbers or ())


def _uefi_check(e: Uefi, seen: Observed, out: _Found) -> None:
    u = seen.uefi
    if u is None:
        out.add("uefi.unreadable", "UEFI variables", seen.unread.get("uefi", "none"), "",
                f"UEFI variables cannot be read: {seen.unread.get('uefi', 'no efivarfs')}")
        return
    if e.boot_entries:
        for number, entry in sorted(u.boot_entries.items()):
            name = efivars.boot_name(number)
            if number not in e.boot_entries:
                out.add("uefi.boot_entry", "absent", entry.sha256, name,
                        f"{name} ({entry.description or 'no description'}) is not in the baseline",
                        invoke("efivars", "delete_boot_entry", entry=f"{number:04X}"))
            elif entry.sha256 != e.boot_entries[number]:
                out.add("uefi.boot_entry", e.boot_entries[number], entry.sha256, name,
                        f"{name} was changed: now {entry.description or 'no description'!r}")
        for number in sorted(set(e.boot_entries) - set(u.boot_entries)):
            name = efivars.boot_name(number)
            out.add("uefi.boot_entry", e.boot_entries[number], "absent", name,
                    f"{name} ({e.descriptions.get(number) or 'baseline entry'}) is missing")
    if e.boot_order and tuple(u.boot_order or ()) != e.boot_order:
        out.add("uefi.boot_order", _hex(e.boot_order), _hex(u.boot_order), "BootOrder",
                f"BootOrder is {_hex(u.boot_order) or '(none)'}, the baseline's {_hex(e.boot_order)}",
                invoke("efivars", "set_boot_order", order=_hex(e.boot_order)))
    for check, want, have in (("uefi.secure_boot", e.secure_boot, u.secure_boot),
                              ("uefi.setup_mode", e.setup_mode, u.setup_mode)):
        if want is not None and bool(have) != want:
            out.add(check, int(want), "absent" if have is None else have, check.split(".")[1],
                    f"{check.split('.')[1]} is {have}, the baseline's {int(want)}")
    for name, want_digest in sorted(e.digests.items()):
        have_digest = u.digests.get(name, efivars.ABSENT)
        if have_digest != want_digest:
            out.add(f"uefi.{name}", want_digest, have_digest, name,
                    f"the Secure Boot variable {name} differs from the baseline's "
                    f"(sha256 {have_digest[:16]})")
    if e.memory_overwrite is not None and u.memory_overwrite != e.memory_overwrite:
        out.add("uefi.memory_overwrite", e.memory_overwrite,
                "absent" if u.memory_overwrite is None else u.memory_overwrite,
                "MemoryOverwriteRequestControl",
                f"MemoryOverwriteRequestControl is {u.memory_overwrite}, the baseline's {e.memory_overwrite}",
                invoke("efivars", "set_memory_overwrite", value=e.memory_overwrite))


def _gpu_check(e: ExpectedState, seen: Observed, out: _Found) -> None:
    if seen.gpus is None:
        out.add("gpu.unreadable", "NVML", "unreadable", "",
                f"the GPUs' state cannot be read: {seen.unread.get('gpus', 'no NVML')}")
        return
    for g in seen.gpus:
        where = pci_address(g.pci_bus_id) if g.pci_bus_id else str(g.index)
        if g.lost or g.errors:
            out.add("gpu.unreadable", "readable", "lost" if g.lost else "errors", where,
                    f"GPU {where} cannot be read: {'lost' if g.lost else '; '.join(g.errors.values())}")
            continue
        reset = invoke("nvidia-smi", "reset", gpu=g.index)
        if e.gpu_persistence_mode is not None and g.persistence_mode not in (None, e.gpu_persistence_mode):
            out.add("gpu.persistence_mode", e.gpu_persistence_mode, g.persistence_mode, where,
                    f"GPU {where}: persistence mode {'on' if g.persistence_mode else 'off'}",
                    invoke("nvidia-smi", "set_persistence_mode", gpu=g.index, enabled=e.gpu_persistence_mode))
        if not e.gpus_at_defaults:
            continue
        if g.mig_mode or g.mig_mode_pending:
            # Set off first; once only the current mode is on, a reset takes the pending "off" up.
            out.add("gpu.mig_mode", "off", f"current {'on' if g.mig_mode else 'off'}, pending "
                    f"{'on' if g.mig_mode_pending else 'off'}", where, f"GPU {where} is in MIG mode",
                    reset if not g.mig_mode_pending else
                    invoke("nvidia-smi", "set_mig_mode", gpu=g.index, enabled=False))
        default = g.power_limit_default_mw
        if default and g.power_limit_set_mw is not None and g.power_limit_set_mw != default:
            watts = default // 1000         # nvidia-smi -pl takes whole watts, 50-2000 (the driver's Arg)
            out.add("gpu.power_limit", f"{watts} W", f"{g.power_limit_set_mw // 1000} W", where,
                    f"GPU {where}: power limit {g.power_limit_set_mw // 1000} W, its default {watts} W",
                    invoke("nvidia-smi", "set_power_limit", gpu=g.index, watts=watts)
                    if 50 <= watts <= 2000 else None)
        clocks = (g.app_clock_graphics_mhz, g.app_clock_memory_mhz)
        defaults = (g.app_clock_graphics_default_mhz, g.app_clock_memory_default_mhz)
        if None not in clocks and None not in defaults and clocks != defaults:
            want, have = "{}/{} MHz".format(*defaults), "{}/{} MHz".format(*clocks)
            out.add("gpu.app_clocks", want, have, where,
                    f"GPU {where}: application clocks (graphics/memory) {have}, defaults {want}",
                    invoke("nvidia-smi", "reset_application_clocks", gpu=g.index))
        if g.retired_pages_pending:
            out.add("gpu.retired_pending", False, True, where,
                    f"GPU {where}: a page retirement waits for a reset", reset)
        if g.remapped_rows_pending:
            out.add("gpu.remap_pending", False, True, where,
                    f"GPU {where}: a row remap waits for a reset", reset)
        if g.remapped_rows_failure:
            out.add("gpu.remap_failure", False, True, where,
                    f"GPU {where}: a row remap failed; the GPU needs service")
        volatile = (g.ecc_corrected_volatile or 0) + (g.ecc_uncorrected_volatile or 0)
        if volatile:
            out.add("gpu.ecc_volatile", 0, volatile, where,
                    f"GPU {where}: {volatile} volatile ECC error(s) since its last reset", reset)


def same_value(a: str, b: str) -> bool:
    """mlxconfig's "True(1)" is "1" is "True"; "ETH(2)" is "2": by the number in brackets."""
    def key(value: str) -> str:
        bracket = re.fullmatch(r"[^()]*\((\d+)\)", value.strip())
        text = bracket.group(1) if bracket else value.strip().lower()
        return {"true": "1", "false": "0"}.get(text, text)
    return key(a) == key(b)


def _set_value(value: str) -> str:
    bracket = re.fullmatch(r"[^()]*\((\d+)\)", value)
    return bracket.group(1) if bracket else value


def _nic_check(profiles: tuple[NicProfile, ...], seen: Observed, out: _Found) -> None:
    for nic in seen.nics:
        profile = next((p for p in profiles if p.matches(nic.ids)), None)
        if profile is None:
            continue
        if profile.firmware_version and nic.firmware_version != profile.firmware_version:
            out.add("nic.firmware_version", profile.firmware_version, nic.firmware_version or "(unknown)",
                    nic.address, f"NIC {nic.address} runs firmware {nic.firmware_version or '(unknown)'}, "
                    f"the profile's is {profile.firmware_version}")
        if not profile.config:
            continue
        if nic.error:
            out.add("nic.unreadable", "configuration", "unreadable", nic.address,
                    f"NIC {nic.address}: its firmware configuration cannot be read: {nic.error}")
            continue
        for name, want in sorted(profile.config.items()):
            current, next_boot = nic.settings.get(name, ("absent", "absent"))
            if same_value(current, want) and same_value(next_boot, want):
                continue
            remedy = None
            if nic.tool and name in nic.settings and "[" not in name:
                remedy = invoke(nic.tool, "set", device=nic.address, parameter=name, value=_set_value(want))
            out.add("nic.config", want, f"current {current}, next boot {next_boot}", f"{nic.address} {name}",
                    f"NIC {nic.address}: {name} is {current} (next boot {next_boot}), the profile's {want}",
                    remedy)


def _nvme_check(e: NvmeLayout, seen: Observed, out: _Found) -> None:
    if not seen.nvme and "nvme" in seen.unread:
        out.add("nvme.unreadable", "nvme-cli", "unreadable", "", f"NVMe layout: {seen.unread['nvme']}")
    for c in seen.nvme:
        if c.error:
            out.add("nvme.unreadable", "readable", "unreadable", c.name, f"{c.name}: {c.error}")
            continue
        remedy = (invoke("nvme", "factory_layout", device=f"/dev/{c.name}", namespaces=e.namespaces,
                         lba_data_size=e.lba_data_size)
                  if c.managed and e.namespaces and e.lba_data_size else None)
        seen_before = len(out.mismatches)
        detached = sorted(set(c.namespaces) - set(c.attached))
        if e.namespaces and (len(c.namespaces) != e.namespaces or detached):
            also = f", {len(detached)} detached ({','.join(map(str, detached))})" if detached else ""
            out.add("nvme.namespaces", e.namespaces, f"{len(c.namespaces)}{also}", c.name,
                    f"{c.name} has {len(c.namespaces)} namespace(s) "
                    f"({','.join(map(str, c.namespaces)) or 'none'}){also}, "
                    f"the factory layout {e.namespaces}")
        if e.full_capacity and c.unallocated_bytes:
            out.add("nvme.capacity", 0, c.unallocated_bytes, c.name,
                    f"{c.name} leaves {c.unallocated_bytes} bytes unallocated to any namespace")
        for nsid, size in sorted(c.lba_sizes.items()):
            if e.lba_data_size and size != e.lba_data_size:
                out.add("nvme.lba_size", e.lba_data_size, size, f"{c.name}n{nsid}",
                        f"{c.name}n{nsid} is formatted with {size}-byte blocks, "
                        f"the baseline {e.lba_data_size}")
        for m in out.mismatches[seen_before:]:     # the whole layout, put back at once, before disk.wipe
            if remedy is not None:
                m.remedy.CopyFrom(remedy)
            else:
                m.message += ("; the drive has no namespace management: its layout cannot be changed "
                              "from the OS" if not c.managed else
                              "; the baseline names no namespace count and LBA size to put it back to")


_AUTH_SET = (("tpm.owner_auth", tpmwire.Permanent.OWNER_AUTH_SET, "owner"),
             ("tpm.endorsement_auth", tpmwire.Permanent.ENDORSEMENT_AUTH_SET, "endorsement"),
             ("tpm.lockout_auth", tpmwire.Permanent.LOCKOUT_AUTH_SET, "lockout"))


def _tpm_check(e: TpmBaseline, seen: Observed, out: _Found) -> None:
    t = seen.tpm
    if t is None:
        if "tpm" in seen.unread:
            out.add("tpm.unreadable", "readable", "unreadable", "",
                    f"the TPM cannot be read: {seen.unread['tpm']}")
        return                                    # no TPM: stated in the report, not a finding
    remedy = None if t.clear_refused else invoke("tpm-ppi", "clear")
    after = f"; it cannot be cleared from here: {t.clear_refused}" if t.clear_refused else \
        "; the firmware clears the TPM at the next boot once asked"
    for index, by_platform in sorted(t.nv_indices.items()):
        if by_platform or index in tpmwire.EK_NV_RANGE or index in e.nv_indices:
            continue
        out.add("tpm.nv_index", "absent", "defined", f"{index:#010x}",
                f"the TPM holds NV index {index:#010x}, defined by its owner{after}", remedy)
    for handle in t.persistent:
        if handle == tpmwire.EK_HANDLE or handle in e.persistent_handles:
            continue
        out.add("tpm.persistent_handle", "absent", "present", f"{handle:#010x}",
                f"the TPM holds a persistent object at {handle:#010x}{after}", remedy)
    for check, bit, hierarchy in _AUTH_SET:
        if t.permanent & bit:
            out.add(check, "empty", "set", hierarchy,
                    f"the TPM's {hierarchy} authorization is set{after}", remedy)
    if t.lockout_counter:                         # not every TPM's Clear zeroes failedTries: reset it
        if t.permanent & tpmwire.Permanent.LOCKOUT_AUTH_SET:
            how, reset = ("the reset needs the lockout authorization its owner set: once the firmware's "
                          "Clear has emptied it, check again"), None
        else:
            how, reset = "TPM2_DictionaryAttackLockReset with the empty lockout authorization resets "\
                "them", invoke("tpm", "reset_lockout")
        out.add("tpm.lockout_counter", 0, t.lockout_counter, "",
                f"the TPM counts {t.lockout_counter} authorization failure(s) (a power cycle without "
                f"TPM2_Shutdown counts one); they fall by one every {t.lockout_interval} s "
                f"(TPM_PT_LOCKOUT_INTERVAL); {how}", reset)

# --------------------------------------------------------------------------- the BMC's half


def check_bmc(e: ExpectedState, seen: BmcObserved) -> list[agent_pb2.Mismatch]:
    """Every way the BMC differs from ``e``'s bios and bmc_accounts, each with its site remedy
    where there is one."""
    out = _Found()
    if e.bmc_accounts is not None:
        _accounts_check(e.bmc_accounts, seen, out)
    if e.bios is not None:
        _bios_check(seen, out)
    return out.mismatches


def _accounts_check(expected: tuple[ExpectedAccount, ...], seen: BmcObserved, out: _Found) -> None:
    if seen.accounts is None:
        why = seen.unread.get("bmc_accounts", "not read")
        out.add("bmc.unreadable", "accounts", "unreadable", "accounts",
                f"the BMC's accounts cannot be read: {why}")
        return
    wanted = {a.user_name: a for a in expected}
    if seen.management_user not in wanted:            # the site's own: always there, enabled
        wanted[seen.management_user] = ExpectedAccount(seen.management_user)
    for a in seen.accounts:
        if not a.user_name:                           # IPMI's anonymous user, turned on
            out.add("bmc.account_extra", "absent", f"{a.role or 'no role'}, enabled", f"id {a.id}",
                    f"the BMC's user {a.id} has no name and is enabled: an anonymous login "
                    f"({a.role or 'no role'}); disable it by its id (ipmitool user disable {a.id})")
            continue
        want = wanted.get(a.user_name)
        disable = bmc_remedy("bmc.rotate", "disable_account", username=a.user_name)
        if want is None:
            if a.enabled:
                out.add("bmc.account_extra", "absent", f"{a.role or 'no role'}, enabled", a.user_name,
                        f"the BMC has an enabled account {a.user_name!r} ({a.role or 'no role'}, id {a.id}) "
                        "not in the baseline", disable)
            continue
        if want.role and a.role != want.role:
            out.add("bmc.account_role", want.role, a.role or "none", a.user_name,
                    f"the BMC's account {a.user_name!r} has role {a.role or 'none'}, "
                    f"the baseline's {want.role}")
        if a.enabled != want.enabled:
            state = "enabled" if a.enabled else "disabled"
            out.add("bmc.account_enabled", "enabled" if want.enabled else "disabled", state, a.user_name,
                    f"the BMC's account {a.user_name!r} is {state}, the baseline's is not",
                    None if want.enabled else disable)
    listed = {a.user_name for a in seen.accounts}
    for name in sorted(set(wanted) - listed):
        out.add("bmc.account_missing", "present", "absent", name,
                f"the BMC has no account {name!r}; the baseline keeps one")


def _bios_check(seen: BmcObserved, out: _Found) -> None:
    if seen.bios is None:
        why = seen.unread.get("bios", "not read")
        out.add("bios.unreadable", "BIOS attributes", "unreadable", "bios",
                f"the BIOS attributes cannot be read: {why}")
        return
    for v in seen.bios:
        if not v.registered:
            out.add("bios.unknown_attribute", "in the AttributeRegistry", "unknown", v.name,
                    f"BIOS attribute {v.name} is not in the BMC's AttributeRegistry: the baseline is "
                    "not this BIOS's")
            continue
        if v.invalid:
            out.add("bios.invalid_value", "a value of its type", v.invalid, v.name,
                    f"BIOS attribute {v.name}: the baseline's value does not fit the registry: {v.invalid}")
            continue
        pending_differs = v.pending is not None and v.pending != v.expected
        if v.current == v.expected and not pending_differs:
            continue
        found = f"current {_shown(v.current)}"
        if v.pending is not None:
            found += f", pending {_shown(v.pending)}"
        out.add("bios.attribute", _shown(v.expected), found, v.name,
                f"BIOS attribute {v.name} is {found}, the baseline's {_shown(v.expected)}"
                + ("; set back, it takes effect at the next reset" if v.pending == v.expected else ""),
                bmc_remedy("bmc.firmware", "set_bios", attributes=json.dumps({v.name: v.expected})))


def _shown(value: Any) -> str:
    if value is None:
        return "(absent)"
    return str(value).lower() if isinstance(value, bool) else str(value)
