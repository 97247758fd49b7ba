"""Device attestation through the BMC, the gateway's half: fresh nonces out, verdicts back.

The site lists a node's SPDM responders (the BMC's ComponentIntegrity collection), asks the
gateway for one nonce per responder (``DeviceChallenges.issue``), has each responder sign its
measurements with its nonce (SPDMGetSignedMeasurements) and brings back, per device, the signed
exchange and the device's certificate chain as the BMC gave them (``DeviceEvidence``).
``DeviceChallenges.verify`` judges them with the verifier of agent/gateway/verifier/spdm.py: each nonce
is the one issued for that device and node (taken once, within its time to live), the
signature is the device's leaf's, the chain reaches a configured device maker's root, and each
measurement matches the maker's RIM for the firmware the device reports where one is
configured, else the fleet's recorded values. One ``DeviceResult`` per device: verified, or
the name of the check it failed; a device listed and not answered is refused (``missing``),
so a BMC cannot leave out the device that would fail.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509

from agent.gateway.verifier.refused import Refused
from agent.gateway.verifier.rim import Rim
from agent.gateway.verifier.spdm import (
    NONCE_SIZE,
    DeviceVerdict,
    GoldenTable,
    load_chain,
    parse_report,
    split_exchange,
    verify_report,
)

CHALLENGE_TTL = 120.0
MAX_PENDING = 4096  # nonces outstanding, all nodes together
MAX_DEVICES = 64  # responders per node


@dataclass(frozen=True)
class DeviceEvidence:
    """What the site brings back for one responder, as the BMC gave it."""

    device: str  # the ComponentIntegrity member's Id
    signed_measurements: str  # base64 of GET_MEASUREMENTS || MEASUREMENTS (DMTF's SignedMeasurements)
    certificate_chain: str  # PEM, as the BMC's Certificate resource holds it
    firmware: str = ""  # the BMC inventory's version (golden values by it if the report has none)
    component: str = ""  # the inventory component that version is of


@dataclass(frozen=True)
class DeviceResult:
    device: str
    verdict: DeviceVerdict | None
    check: str = ""  # the failed check's name ("" when verified)
    reason: str = ""
    bmc_firmware: str = ""  # the device's version in the BMC's inventory, verified or not ("" none)
    bmc_component: str = ""  # that inventory component's Id

    @property
    def verified(self) -> bool:
        return self.verdict is not None


@dataclass
class _Pending:
    node: str
    device: str
    expires: float


class DeviceChallenges:
    """Nonces for the devices of every node, and their verdicts; thread-safe and bounded."""

    def __init__(self, roots: Iterable[x509.Certificate], *, rims: Iterable[Rim] = (),
                 table: GoldenTable | None = None, ttl: float = CHALLENGE_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.roots = list(roots)
        self.rims = list(rims)
        self.table = table
        self.ttl = ttl
        self.clock = clock
        self._pending: dict[bytes, _Pending] = {}
        self._lock = threading.Lock()

    def issue(self, node: str, devices: Iterable[str]) -> dict[str, bytes]:
        """A fresh 32-byte nonce for each of ``node``'s devices (its earlier ones forgotten)."""
        names = list(dict.fromkeys(devices))
        if len(names) > MAX_DEVICES:
            raise ValueError(f"{len(names)} devices, more than {MAX_DEVICES} for one node")
        now = self.clock()
        with self._lock:
            for nonce, p in list(self._pending.items()):
                if p.expires <= now or p.node == node:
                    del self._pending[nonce]
            if len(self._pending) + len(names) > MAX_PENDING:
                raise ValueError(f"{len(self._pending)} device nonces outstanding: try again later")
            issued = {name: os.urandom(NONCE_SIZE) for name in names}
            for name, nonce in issued.items():
                self._pending[nonce] = _Pending(node, name, now + self.ttl)
        return issued

    def issued(self, node: str) -> list[str]:
        """The devices of ``node`` holding a nonce not yet taken nor expired: what its round must
        answer for, whatever the site brings back."""
        now = self.clock()
        with self._lock:
            return sorted({p.device for p in self._pending.values() if p.node == node and p.expires > now})

    def _take(self, node: str, device: str, nonce: bytes) -> None:
        with self._lock:
            pending = self._pending.get(nonce)
            if pending is None or (pending.node, pending.device) != (node, device):
                raise Refused("nonce", f"device {device}: the report's nonce was not issued for it")
            del self._pending[nonce]
            if pending.expires <= self.clock():
                raise Refused("nonce", f"device {device}: its nonce expired")

    def verify(self, node: str, expected: Iterable[str], evidence: Iterable[DeviceEvidence], *,
               at: datetime | None = None) -> list[DeviceResult]:
        """A result for every device in ``expected`` (the responders the site listed)."""
        given = {e.device: e for e in evidence}
        results = []
        for device in dict.fromkeys([*expected, *given]):
            item = given.get(device)
            if item is None:
                results.append(DeviceResult(device, None, "missing", "listed by the BMC and not answered"))
                continue
            bmc = {"bmc_firmware": item.firmware, "bmc_component": item.component}
            try:
                results.append(DeviceResult(device, self._one(node, item, at), **bmc))
            except Refused as refused:
                results.append(DeviceResult(device, None, refused.check, refused.reason, **bmc))
        return results

    def _one(self, node: str, item: DeviceEvidence, at: datetime | None) -> DeviceVerdict:
        try:
            exchange = base64.b64decode(item.signed_measurements, validate=True)
        except (binascii.Error, ValueError) as e:
            raise Refused("report", "SignedMeasurements is not base64") from e
        report = parse_report(*split_exchange(exchange))
        self._take(node, item.device, report.nonce)
        return verify_report(report, load_chain(item.certificate_chain.encode()), self.roots,
                             nonce=report.nonce, rims=self.rims, table=self.table,
                             firmware=item.firmware or None, at=at)
