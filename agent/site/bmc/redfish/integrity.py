"""The BMC's SPDM responders (Redfish ComponentIntegrity): listed, and asked to sign their
measurements with the gateway's nonces.

Where the service root links ``ComponentIntegrity`` (GB200, GH200 and DGX H100 do: the ERoTs and
IRoTs of GPUs, CPUs, FPGAs, the BMC and ConnectX NICs), each member of type SPDM with an
``#ComponentIntegrity.SPDMGetSignedMeasurements`` action is a responder. ``responders`` lists
them (a member that does not read is listed as unreadable, not dropped); ``signed_measurements``
POSTs the action with ``Nonce`` (32 bytes, hex) and ``SlotId``, reads ``SignedMeasurements``
(base64 of the GET_MEASUREMENTS request and MEASUREMENTS response, DMTF's ComponentIntegrity
1.0) and the device's certificate chain (the answer's ``Certificate`` link, else the member's
ComponentCertificate). Nothing here judges them: the gateway does (agent/gateway/verifier/spdm_verdict.py).

The action changes nothing on the BMC; still, an ambiguous answer is not resent (the site's
rule for every BMC POST): that device's evidence is missing, and the gateway refuses it so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.errors import BmcRefused, BmcUnreachable, Unsupported
from agent.proto import site_pb2
from agent.site.bmc.redfish.session import Doc, RedfishSession, link, text

log = logging.getLogger(__name__)

MAX_RESPONDERS = 64
NONCE_SIZE = 32
ACTION = "#ComponentIntegrity.SPDMGetSignedMeasurements"


@dataclass(frozen=True)
class Responder:
    id: str
    ref: str
    version: str  # ComponentIntegrityTypeVersion, e.g. 1.1.0
    action: str  # the action's target ("" when the member offers none)
    certificate: str  # the ComponentCertificate's ref
    component: str  # TargetComponentURI
    unreadable: str = ""  # why the member could not be read
    protects: tuple[str, ...] = ()  # Links.ComponentsProtected (@odata.id each)


@dataclass(frozen=True)
class SignedMeasurements:
    device: str
    signed_measurements: str  # base64, as the BMC gave it
    certificate_chain: str  # PEM
    version: str
    signing_algorithm: str


def responders(s: RedfishSession) -> list[Responder]:
    """The BMC's SPDM responders; Unsupported where it lists no ComponentIntegrity."""
    collection = link(s.root(), "ComponentIntegrity")
    if not collection:
        raise Unsupported(f"Redfish BMC {s.target.address} lists no ComponentIntegrity: no SPDM responder")
    refs = s.members(collection)
    if len(refs) > MAX_RESPONDERS:
        raise BmcRefused(f"Redfish BMC {s.target.address}: {len(refs)} ComponentIntegrity members, "
                         f"more than {MAX_RESPONDERS}")
    found: list[Responder] = []
    for ref in refs:
        name = ref.rstrip("/").rsplit("/", 1)[-1]
        try:
            doc = s.get(ref)
        except BmcRefused as e:
            found.append(Responder(name, ref, "", "", "", "", unreadable=e.message))
            continue
        if text(doc.get("ComponentIntegrityType")) != "SPDM" or doc.get("ComponentIntegrityEnabled") is False:
            continue
        found.append(_responder(ref, doc))
    return found


def _responder(ref: str, doc: Doc) -> Responder:
    action = doc.get("Actions", {}).get(ACTION, {})
    auth = doc.get("SPDM", {}).get("IdentityAuthentication", {}).get("ResponderAuthentication", {})
    return Responder(
        id=text(doc.get("Id")) or ref.rstrip("/").rsplit("/", 1)[-1], ref=ref,
        version=text(doc.get("ComponentIntegrityTypeVersion")),
        action=text(action.get("target")) if isinstance(action, dict) else "",
        certificate=link(auth, "ComponentCertificate") if isinstance(auth, dict) else "",
        component=text(doc.get("TargetComponentURI")).rstrip("/"),
        protects=tuple(text(d.get("@odata.id")).rstrip("/") for d in _links(doc, "ComponentsProtected")
                       if text(d.get("@odata.id"))))


def _links(doc: Doc, name: str) -> list[Doc]:
    links = doc.get("Links")
    found = links.get(name) if isinstance(links, dict) else None
    return [d for d in found if isinstance(d, dict)][:16] if isinstance(found, list) else []


def firmware_of(responder: Responder, inventory: list[site_pb2.BmcFirmwareComponent]
                ) -> site_pb2.BmcFirmwareComponent | None:
    """The component of the BMC's FirmwareInventory that is the responder's device's firmware: the
    one whose RelatedItem names the responder's TargetComponentURI, else a component it protects
    (ComponentsProtected). None where none does, or where two that do give two versions: then the
    BMC's inventory names no one version for the device."""
    for wanted in (responder.component, *responder.protects):
        if not wanted:
            continue
        found = [c for c in inventory if wanted in c.related]
        if found:
            return found[0] if len({c.version for c in found}) == 1 else None
    return None


def signed_measurements(s: RedfishSession, responder: Responder, nonce: bytes, *,
                        slot: int = 0) -> SignedMeasurements:
    """One responder's measurements signed over ``nonce`` (all indices), with its chain."""
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"an SPDM nonce is {NONCE_SIZE} bytes, not {len(nonce)}")
    if not responder.action:
        raise Unsupported(f"Redfish BMC {s.target.address}: {responder.id} offers no "
                          "SPDMGetSignedMeasurements")
    answer = s.send("POST", responder.action, json_body={"Nonce": nonce.hex(), "SlotId": slot})
    if answer.status != 200 or not isinstance(answer.doc.get("SignedMeasurements"), str):
        raise BmcRefused(f"Redfish BMC {s.target.address}: {responder.id}: SPDMGetSignedMeasurements "
                         f"answered HTTP {answer.status} without SignedMeasurements", status=answer.status)
    cert_ref = link(answer.doc, "Certificate") or responder.certificate
    if not cert_ref:
        raise BmcRefused(f"Redfish BMC {s.target.address}: {responder.id} names no certificate chain")
    chain = s.get(cert_ref).get("CertificateString")
    if not isinstance(chain, str) or "BEGIN CERTIFICATE" not in chain:
        raise BmcRefused(f"Redfish BMC {s.target.address}: {responder.id}: {cert_ref} holds no PEM chain")
    return SignedMeasurements(device=responder.id, signed_measurements=answer.doc["SignedMeasurements"],
                              certificate_chain=chain, version=text(answer.doc.get("Version")),
                              signing_algorithm=text(answer.doc.get("SigningAlgorithm")))


def collect(s: RedfishSession, nonces: dict[str, bytes], listed: list[Responder] | None = None
            ) -> tuple[list[SignedMeasurements], dict[str, str]]:
    """Every listed responder (``listed``, else the BMC's list read now) that has a nonce asked
    once: (the answers, device -> why not)."""
    answered: list[SignedMeasurements] = []
    failed: dict[str, str] = {}
    for responder in responders(s) if listed is None else listed:
        nonce = nonces.get(responder.id)
        if responder.unreadable or nonce is None:
            failed[responder.id] = responder.unreadable or "no nonce from the gateway"
            continue
        try:
            answered.append(signed_measurements(s, responder, nonce))
        except (BmcRefused, BmcUnreachable, Unsupported) as e:
            log.warning("Redfish %s: %s: %s", s.target.address, responder.id, e.message)
            failed[responder.id] = e.message
    return answered, failed
