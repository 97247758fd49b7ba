"""The firmware's TCG event log: parsed, and replayed to the PCR values it claims.

The format is the TCG PC Client Platform Firmware Profile's "crypto agile" log, little-endian
(unlike the TPM's own structures): a first event in the old SHA-1 layout whose data is the
"Spec ID Event03" header (the digest algorithms and their sizes), then TCG_PCR_EVENT2 records
(PCR, event type, one digest per algorithm, the event's data). Linux exposes it, the final
events table included, at /sys/kernel/security/tpm0/binary_bios_measurements.

Replaying extends each event's SHA-256 digest into its PCR, from zero (PCR 0 from the
locality the StartupLocality event names); EV_NO_ACTION events are not extended. A log that
replays to other values than the quoted ones was edited, or is not this boot's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from agent.errors import InvalidParameters
from agent.hw import tpm as tpmwire

SHA1, SHA256 = 0x0004, 0x000B
SPEC_ID = b"Spec ID Event03\0"
STARTUP_LOCALITY = b"StartupLocality\0"
MAX_EVENTS = 20000
MAX_EVENT_DATA = 1 << 20


class Ev:
    """Event types (TCG PC Client PFP, 10.4.1) that the policy and the reports name."""

    POST_CODE = 0x1
    NO_ACTION = 0x3
    SEPARATOR = 0x4
    ACTION = 0x5
    EVENT_TAG = 0x6
    S_CRTM_CONTENTS = 0x7
    S_CRTM_VERSION = 0x8
    CPU_MICROCODE = 0x9
    COMPACT_HASH = 0xC
    IPL = 0xD
    NONHOST_CODE = 0xF
    NONHOST_CONFIG = 0x10
    NONHOST_INFO = 0x11
    OMIT_BOOT_DEVICE_EVENTS = 0x12
    POST_CODE2 = 0x13
    EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
    EFI_VARIABLE_BOOT = 0x80000002
    EFI_BOOT_SERVICES_APPLICATION = 0x80000003
    EFI_BOOT_SERVICES_DRIVER = 0x80000004
    EFI_RUNTIME_SERVICES_DRIVER = 0x80000005
    EFI_GPT_EVENT = 0x80000006
    EFI_ACTION = 0x80000007
    EFI_PLATFORM_FIRMWARE_BLOB = 0x80000008
    EFI_HANDOFF_TABLES = 0x80000009
    EFI_PLATFORM_FIRMWARE_BLOB2 = 0x8000000A
    EFI_HANDOFF_TABLES2 = 0x8000000B
    EFI_VARIABLE_BOOT2 = 0x8000000C
    EFI_HCRTM_EVENT = 0x80000010
    EFI_VARIABLE_AUTHORITY = 0x800000E0
    EFI_SPDM_FIRMWARE_BLOB = 0x800000E1
    EFI_SPDM_FIRMWARE_CONFIG = 0x800000E2
    EFI_SPDM_DEVICE_POLICY = 0x800000E3
    EFI_SPDM_DEVICE_AUTHORITY = 0x800000E4


def type_name(event_type: int) -> str:
    """``EV_EFI_ACTION`` for 0x80000007; the number where the type is not one of Ev's."""
    name = next((k for k, v in vars(Ev).items() if k.isupper() and v == event_type), None)
    return f"EV_{name}" if name else f"event type {event_type:#x}"


# What the PC Client PFP lets firmware measure into the PCRs the policy judges (its PCR usage,
# 3.3.4, and its event types with the PCRs each is for, 10.4.1), EV_NO_ACTION aside (never
# extended). PCRs 8-15 are the OS's: for 9, 11 and 12 the events the kernel's EFI stub,
# systemd-stub and GRUB log there (EV_IPL, EV_EVENT_TAG) and EV_COMPACT_HASH, which the PFP
# allows in any PCR above 3.
PCR_EVENT_TYPES: dict[int, frozenset[int]] = {
    0: frozenset({Ev.POST_CODE, Ev.POST_CODE2, Ev.SEPARATOR, Ev.S_CRTM_CONTENTS, Ev.S_CRTM_VERSION,
                  Ev.NONHOST_CODE, Ev.NONHOST_INFO, Ev.EFI_PLATFORM_FIRMWARE_BLOB,
                  Ev.EFI_PLATFORM_FIRMWARE_BLOB2, Ev.EFI_HANDOFF_TABLES, Ev.EFI_HANDOFF_TABLES2,
                  Ev.EFI_HCRTM_EVENT, Ev.EFI_SPDM_FIRMWARE_BLOB}),
    2: frozenset({Ev.SEPARATOR, Ev.ACTION, Ev.NONHOST_CODE, Ev.EFI_BOOT_SERVICES_DRIVER,
                  Ev.EFI_RUNTIME_SERVICES_DRIVER, Ev.EFI_PLATFORM_FIRMWARE_BLOB,
                  Ev.EFI_PLATFORM_FIRMWARE_BLOB2, Ev.EFI_SPDM_FIRMWARE_BLOB}),
    4: frozenset({Ev.SEPARATOR, Ev.ACTION, Ev.EFI_ACTION, Ev.EFI_BOOT_SERVICES_APPLICATION, Ev.IPL,
                  Ev.COMPACT_HASH, Ev.OMIT_BOOT_DEVICE_EVENTS}),
    7: frozenset({Ev.SEPARATOR, Ev.EFI_ACTION, Ev.EFI_VARIABLE_DRIVER_CONFIG, Ev.EFI_VARIABLE_AUTHORITY,
                  Ev.EFI_SPDM_DEVICE_POLICY, Ev.EFI_SPDM_DEVICE_AUTHORITY}),
    9: frozenset({Ev.IPL, Ev.EVENT_TAG, Ev.COMPACT_HASH}),
    11: frozenset({Ev.IPL, Ev.EVENT_TAG, Ev.COMPACT_HASH}),
    12: frozenset({Ev.IPL, Ev.EVENT_TAG, Ev.COMPACT_HASH}),
}
# The strings an EV_EFI_ACTION event may hold in those PCRs (PFP 10.4.4), its digest their SHA-256:
# PCR 4's boot attempts, PCR 7's firmware debug mode and disabled DMA protection.
EFI_ACTIONS: dict[int, frozenset[bytes]] = {
    4: frozenset({b"Calling EFI Application from Boot Option",
                  b"Returning from EFI Application from Boot Option"}),
    7: frozenset({b"UEFI Debug Mode", b"DMA Protection Disabled"}),
}
# EV_SEPARATOR's data (PFP 10.4.1): 0 where the firmware ends its pre-boot measurements, 1 where
# it met an error measuring.
SEPARATOR = bytes(4)
SEPARATOR_ERROR = b"\x01\0\0\0"


class BadEventLog(InvalidParameters):
    """The log does not parse: truncated, no Spec ID header, sizes out of bounds."""


@dataclass(frozen=True)
class Event:
    pcr: int
    type: int
    digests: dict[int, bytes]  # algorithm -> digest
    data: bytes

    @property
    def sha256(self) -> bytes:
        return self.digests.get(SHA256, b"")


@dataclass(frozen=True)
class EventLog:
    algorithms: dict[int, int]  # algorithm -> digest size, from the Spec ID header
    locality: int
    events: list[Event]

    def replay(self, pcrs: Iterable[int] = range(24)) -> dict[int, bytes]:
        """The SHA-256 PCR values this log leads to, for ``pcrs``."""
        values = {p: bytes(32) for p in pcrs}
        if 0 in values:
            values[0] = bytes(31) + bytes([self.locality])
        for ev in self.events:
            if ev.type != Ev.NO_ACTION and ev.pcr in values:
                values[ev.pcr] = hashlib.sha256(values[ev.pcr] + ev.sha256).digest()
        return values

    def of(self, pcr: int, event_type: int | None = None) -> list[Event]:
        return [e for e in self.events if e.pcr == pcr and (event_type is None or e.type == event_type)]


def _reader(data: bytes, what: str = "the event log") -> tpmwire.Reader:
    """The TPM's reader, little-endian, whose running short is a BadEventLog."""
    return tpmwire.Reader(data, what, little=True, error=BadEventLog)


def parse(data: bytes) -> EventLog:
    """Parse a crypto-agile log; a SHA-1-only (TPM 1.2 layout) log is a BadEventLog."""
    r = _reader(data)
    pcr, kind = r.u32(), r.u32()
    r.take(20)
    header = _reader(r.take(_size(r.u32())), "the Spec ID header")
    if pcr != 0 or kind != Ev.NO_ACTION or header.take(16) != SPEC_ID:
        raise BadEventLog("the event log has no Spec ID Event03 header: not a TPM 2.0 crypto-agile log")
    header.take(4 + 4)  # platform class, version minor/major, errata, uintn size
    algorithms = {}
    for _ in range(header.u32()):
        alg, size = header.u16(), header.u16()
        if not 0 < size <= 64:
            raise BadEventLog(f"algorithm {alg:#x} with a digest of {size} bytes")
        algorithms[alg] = size
    if SHA256 not in algorithms:
        raise BadEventLog("the event log carries no SHA-256 digests")
    locality = 0
    events: list[Event] = []
    while r.left:
        if len(events) >= MAX_EVENTS:
            raise BadEventLog(f"more than {MAX_EVENTS} events")
        pcr, kind = r.u32(), r.u32()
        digests = {}
        for _ in range(r.u32()):
            alg = r.u16()
            if alg not in algorithms:
                raise BadEventLog(f"event {len(events) + 1}: digest algorithm {alg:#x} not in the header")
            digests[alg] = r.take(algorithms[alg])
        event_data = r.take(_size(r.u32()))
        if pcr > 23:
            raise BadEventLog(f"event {len(events) + 1}: PCR {pcr}")
        if kind != Ev.NO_ACTION and SHA256 not in digests:
            raise BadEventLog(f"event {len(events) + 1} has no SHA-256 digest")
        if kind == Ev.NO_ACTION and pcr == 0 and event_data.startswith(STARTUP_LOCALITY):
            locality = event_data[len(STARTUP_LOCALITY)] if len(event_data) > 16 else 0
        events.append(Event(pcr, kind, digests, event_data))
    return EventLog(algorithms, locality, events)


def _size(n: int) -> int:
    if n > MAX_EVENT_DATA:
        raise BadEventLog(f"an event of {n} bytes")
    return n

