"""bmc.query responders and measurements: device attestation over SPDM, the site's half.

``responders`` lists the node's SPDM responders as its BMC gives them (Redfish
ComponentIntegrity, agent/site/bmc/redfish/integrity.py): the control plane asks the gateway
for one nonce per device (``Gateway.device_nonces``). ``measurements`` takes those nonces
(parameter ``nonces``: ``device=hex,...``, 32 bytes each) and asks each listed responder that
has one, once, for its measurements signed over it; the result's ``devices`` holds each
answer as the BMC gave it (the signed exchange and the device's certificate chain), or why
there is none. Nothing here judges them: the gateway does, when the result reaches it
(agent/gateway/spdm_report.py), and folds the verdicts into the node's release record.
Called by agent/commands/bmc.py's BmcQuery.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from agent.errors import BmcRefused, BmcUnreachable, InvalidParameters, Unsupported
from agent.proto import site_pb2

if TYPE_CHECKING:
    from agent.site.bmc.client import BmcClient
    from agent.site.bmc.redfish.client import RedfishClient
    from agent.site.bmc.redfish.integrity import Responder

MAX_DEVICES = 64  # as the gateway issues them (agent/gateway/verifier/spdm_verdict.py)
NONCE_BYTES = 32
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_NONCE = re.compile(f"[0-9a-f]{{{2 * NONCE_BYTES}}}")


def read_nonces(name: str, text: str) -> tuple[tuple[str, bytes], ...]:
    """``device=hex`` pairs, comma separated: each device once, a 32-byte nonce in lower-case hex."""
    entries = [e for e in text.split(",") if e]
    if not 0 < len(entries) <= MAX_DEVICES:
        raise InvalidParameters(f"parameter {name}: 1 to {MAX_DEVICES} device=nonce pairs, comma separated")
    out: dict[str, bytes] = {}
    for entry in entries:
        device, _, hexed = entry.rpartition("=")
        if not _DEVICE.fullmatch(device) or not _NONCE.fullmatch(hexed):
            raise InvalidParameters(f"parameter {name}: {entry[:80]!r} is not "
                                    f"device={2 * NONCE_BYTES} hex digits")
        if device in out:
            raise InvalidParameters(f"parameter {name}: device {device} named twice")
        out[device] = bytes.fromhex(hexed)
    return tuple(out.items())


def _redfish(client: BmcClient, operation: str) -> RedfishClient:
    from agent.site.bmc.redfish.client import RedfishClient

    if not isinstance(client, RedfishClient):
        raise Unsupported(f"bmc.query {operation}: SPDM responders are listed over Redfish only")
    return client


def responders(client: BmcClient, result: site_pb2.BmcOperationResult) -> site_pb2.BmcOperationResult:
    """Every responder the BMC lists (one that does not read, with why), each with the firmware
    version the BMC's inventory gives for its device."""
    from agent.site.bmc.redfish import integrity

    redfish = _redfish(client, "responders")
    listed = integrity.responders(redfish)
    firmware, why = _firmware(redfish, listed)
    for r in listed:
        _firmware_into(result.devices.add(device=r.id, version=r.version, error=r.unreadable), firmware, why)
    result.state = f"{len(result.devices)} responder(s)"
    result.attempts = getattr(client, "attempts", 0)
    return result


def measurements(client: BmcClient, nonces: tuple[tuple[str, bytes], ...],
                 result: site_pb2.BmcOperationResult) -> site_pb2.BmcOperationResult:
    """Each listed responder with a nonce asked once; every listed one in ``devices``, with the
    firmware version the BMC's inventory gives for its device (what the gateway's verdict names
    beside the device's own word, and looks golden values up by where the report says none)."""
    from agent.site.bmc.redfish import integrity

    redfish = _redfish(client, "measurements")
    listed = integrity.responders(redfish)
    answered, failed = integrity.collect(redfish, dict(nonces), listed)
    firmware, why = _firmware(redfish, listed)
    for a in answered:
        _firmware_into(result.devices.add(device=a.device, signed_measurements=a.signed_measurements,
                                          certificate_chain=a.certificate_chain, version=a.version),
                       firmware, why)
    for device, error in failed.items():
        _firmware_into(result.devices.add(device=device, error=error), firmware, why)
    result.state = f"{len(answered)} of {len(answered) + len(failed)} responder(s) answered"
    result.attempts = getattr(client, "attempts", 0)
    return result


def _firmware(client: RedfishClient, listed: list[Responder]
              ) -> tuple[dict[str, site_pb2.BmcFirmwareComponent], str]:
    """Each responder's inventory component (integrity.firmware_of), and why there is none for
    any ("" where the inventory was read): a BMC whose inventory does not read still has its
    devices asked; their verdicts then name no BMC version."""
    from agent.site.bmc.redfish import firmware, integrity

    try:
        inventory = firmware.inventory(client)
    except (BmcRefused, BmcUnreachable, Unsupported) as e:
        return {}, f"the BMC's FirmwareInventory could not be read: {e.message}"[:300]
    return {r.id: c for r in listed if (c := integrity.firmware_of(r, inventory)) is not None}, ""


def _firmware_into(device: site_pb2.BmcDeviceEvidence, firmware: dict[str, site_pb2.BmcFirmwareComponent],
                   why: str) -> None:
    component = firmware.get(device.device)
    if component is not None:
        device.firmware, device.firmware_component = component.version, component.id
    else:
        device.firmware_error = why
