"""The Redfish UpdateService: bmc.firmware's update and status, and the FirmwareInventory.

Three ways in, as the schema (UpdateService v1.6+) documents them, picked by ``choose`` from
what the BMC's UpdateService offers (``offer``), or named by the operator (``Method``):

- SimpleUpdate: POST ``{"ImageURI": ..., "TransferProtocol": ...}`` to the action's target; the
  BMC fetches the image itself. Chosen for an image URL whose scheme is among its
  TransferProtocol allowable values (on the action or in its ActionInfo).
- A multipart push: POST multipart/form-data to ``MultipartHttpPushUri`` with the parts
  ``UpdateParameters`` (JSON) and ``UpdateFile`` (the image, streamed from disk after its
  sha256 has been checked against the one the request gave). Chosen for a file.
- A push to ``HttpPushUri`` (deprecated by the schema for the multipart one): the image as the
  whole body. Chosen for a file where no multipart push is offered.

``status`` reads the FirmwareInventory's versions and, given its URI, a task's state now.

Either answers 202 with a Location (a task monitor, or the Task itself), or with the Task in
its body; ``tasks.follow`` (agent/site/bmc/redfish/tasks.py) follows it to its end. Then the
BMC's own reboot after its update is waited out (``wait_settled``: 3 good answers in a row,
30 s apart by default, as Ironic waits) and the FirmwareInventory read again: the task's
messages say which component went from which version to which.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import (
    BmcRefused,
    BmcUnreachable,
    Cancelled,
    ChecksumMismatch,
    CommandTimeout,
    InvalidParameters,
    Unsupported,
)
from agent.net import http
from agent.proto import site_pb2
from agent.site.bmc.redfish import tasks
from agent.site.bmc.redfish.session import ROOT, Doc, RedfishSession, link

log = logging.getLogger(__name__)

class Method(enum.StrEnum):
    """How an image reaches the BMC: it fetches a URL (SimpleUpdate), or the site pushes a file
    (MultipartHttpPushUri; HttpPushUri, the older raw-body push)."""

    SIMPLE_UPDATE = "simple_update"
    MULTIPART = "multipart"
    HTTP_PUSH = "http_push"


# An image URL's scheme -> the UpdateService's TransferProtocol (TransferProtocolType) value.
_PROTOCOLS = {"http": "HTTP", "https": "HTTPS", "ftp": "FTP", "sftp": "SFTP", "scp": "SCP", "tftp": "TFTP",
              "nfs": "NFS", "cifs": "CIFS", "smb": "CIFS"}


@dataclass(frozen=True)
class Offer:
    """What an UpdateService offers: the SimpleUpdate action's target ("" for none) and its
    TransferProtocol allowable values (None where it lists none), the push URIs ("" for none)."""

    simple_update: str
    protocols: tuple[str, ...] | None
    protocol_required: bool
    multipart: str
    http_push: str

    def methods(self) -> list[str]:
        said = [f"SimpleUpdate ({', '.join(self.protocols)})" if self.protocols is not None
                else "SimpleUpdate"] if self.simple_update else []
        return said + [name for name, uri in (("MultipartHttpPushUri", self.multipart),
                                              ("HttpPushUri", self.http_push)) if uri]


def offer(client: RedfishSession, service: Doc) -> Offer:
    """The UpdateService's ways in, its SimpleUpdate's protocols read from the action or, where
    it names one, its ActionInfo."""
    action = service.get("Actions", {}).get("#UpdateService.SimpleUpdate", {})
    target, listed, required = "", None, False
    if isinstance(action, dict) and isinstance(action.get("target"), str):
        target = action["target"]
        listed = action.get("TransferProtocol@Redfish.AllowableValues")
        info = action.get("@Redfish.ActionInfo")
        if isinstance(info, str) and info:
            for param in client.get(info).get("Parameters", []):
                if isinstance(param, dict) and param.get("Name") == "TransferProtocol":
                    listed = param.get("AllowableValues", listed)
                    required = param.get("Required") is True
    protocols = tuple(_flat(listed)) if isinstance(listed, list) else None
    multipart, push = (v if isinstance(v := service.get(k), str) else ""
                       for k in ("MultipartHttpPushUri", "HttpPushUri"))
    return Offer(target, protocols, required, multipart, push)


def _flat(values: list[Any]) -> list[str]:
    """Allowable values as strings, a nested list flattened (BlueField-3 lists [["SCP"]])."""
    out: list[str] = []
    for value in values:
        out.extend(_flat(value) if isinstance(value, list) else [value] if isinstance(value, str) else [])
    return out


def choose(offered: Offer, *, image_uri: str = "", file: Path | None = None, method: str = "",
           transfer_protocol: str = "", where: str = "the BMC") -> tuple[Method, str]:
    """(the method, the TransferProtocol to send: "" for none) for an image given as a URL the
    BMC fetches or a file the site pushes: ``method`` where the operator names one (it must be
    offered), else SimpleUpdate for a URL whose scheme its TransferProtocol values take, the
    multipart push for a file, else HttpPushUri; Unsupported naming what is offered where
    nothing fits, before anything is sent."""
    if bool(image_uri) == (file is not None):
        raise InvalidParameters("firmware: give image_uri or file, one of them")
    offers = ", ".join(offered.methods()) or "no way in"
    if image_uri:
        if method not in ("", Method.SIMPLE_UPDATE):
            raise InvalidParameters(f"firmware: method {method} pushes a file: give file and sha256")
        if not offered.simple_update:
            raise Unsupported(f"{where}: its UpdateService has no SimpleUpdate to fetch {image_uri.split(':')[0]}://"
                              f" images (it offers {offers}): give file and sha256 to push it")
        scheme = image_uri.split(":", 1)[0].lower()
        protocol = transfer_protocol or _PROTOCOLS.get(scheme, "")
        if offered.protocols is not None and protocol not in offered.protocols:
            raise Unsupported(f"{where}: SimpleUpdate takes TransferProtocol {', '.join(offered.protocols)},"
                              f" not {protocol or scheme} (it offers {offers})"
                              + ("; give file and sha256 to push it" if offered.multipart or offered.http_push
                                 else ""))
        # Named where the BMC lists its values (DGX H100's ActionInfo requires it), or the operator did.
        sent = protocol if transfer_protocol or offered.protocols is not None or offered.protocol_required \
            else ""
        return Method.SIMPLE_UPDATE, sent
    if method == Method.SIMPLE_UPDATE:
        raise InvalidParameters("firmware: SimpleUpdate fetches an image: give image_uri")
    for candidate, uri in ((Method.MULTIPART, offered.multipart), (Method.HTTP_PUSH, offered.http_push)):
        if uri and method in ("", candidate):
            return candidate, ""
    wanted = {"": "a push", Method.MULTIPART: "MultipartHttpPushUri", Method.HTTP_PUSH: "HttpPushUri"}[method]
    raise Unsupported(f"{where}: its UpdateService offers no {wanted} (it offers {offers})"
                      + ("; give image_uri for its SimpleUpdate" if offered.simple_update else ""))


def update(
    client: RedfishSession,
    *,
    image_uri: str = "",
    file: Path | None = None,
    sha256: str = "",
    transfer_protocol: str = "",
    method: str = "",
    progress: Callable[[int, str], None] | None = None,
    targets: tuple[str, ...] = (),
    apply_time: str = "Immediate",
) -> site_pb2.BmcFirmwareTask:
    """Update through the way ``choose`` picks from what the UpdateService offers (``method``
    names one), follow its task, wait out the BMC's reboot, and name what changed. A multipart
    push names ``targets`` (the components' URIs; none: the BMC picks) and ``apply_time``."""
    if method and method not in tuple(Method):
        raise InvalidParameters(f"firmware: method {method!r}: one of {', '.join(Method)}")
    where = f"Redfish BMC {client.target.address}"
    ref = link(client.root(), "UpdateService")
    if not ref:
        raise Unsupported(f"{where} has no UpdateService")
    service = client.get(ref)
    offered = offer(client, service)
    chosen, protocol = choose(offered, image_uri=image_uri, file=file, method=method,
                              transfer_protocol=transfer_protocol, where=where)
    if image_uri:
        http.check_url(image_uri)
    before = {c.id: c.version for c in inventory(client)}
    if chosen is Method.SIMPLE_UPDATE:
        body: dict[str, Any] = {"ImageURI": image_uri}
        if protocol:
            body["TransferProtocol"] = protocol
        log.info("%s: SimpleUpdate from %s", where, http.redact(image_uri))
        answer = client.send("POST", offered.simple_update, json_body=body)
        status, headers, doc = answer.status, answer.headers, answer.doc
    else:
        assert file is not None
        uri = offered.multipart if chosen is Method.MULTIPART else offered.http_push
        status, headers, doc = _push(client, uri, chosen, file, sha256, targets, apply_time)
    location = headers.get("location", "") or str(doc.get("@odata.id", "") if "TaskState" in doc else "")
    if not location:
        if status not in (200, 204):
            raise BmcRefused(f"{where}: the update was accepted (HTTP {status}) without a task to follow")
        task = site_pb2.BmcFirmwareTask(state="Completed", percent=100)   # applied synchronously
    else:
        task = tasks.follow(client, location, progress)
    if progress is not None:
        progress(100, "waiting for the BMC to answer steadily after its update")
    wait_settled(client)
    after = {c.id: c.version for c in inventory(client)}
    changed = [f"updated {cid}: {before.get(cid, '')} -> {version}"
               for cid, version in sorted(after.items()) if before.get(cid) != version]
    task.messages.insert(0, f"method {chosen}")
    task.messages.extend(changed or ["no component's version changed yet (one may wait for a reset)"])
    return task


STABLE_ANSWERS = 3           # good answers in a row before a BMC that updated itself is trusted again


def wait_settled(client: RedfishSession) -> None:
    """After an update a BMC often reboots itself: wait until it answers its service root
    STABLE_ANSWERS times in a row, spaced twice the pacing's max_interval (30 s by default, as
    Ironic waits), within the command's deadline (CommandTimeout) and cancel."""
    where = f"Redfish BMC {client.target.address}"
    interval = min(30.0, 2 * client.call.pacing.max_interval)
    good = 0
    while good < STABLE_ANSWERS:
        if time.monotonic() + interval >= client.call.deadline:
            raise CommandTimeout(f"{where}: not answering steadily after its update before the deadline"
                                 f" ({good} good answers in a row of {STABLE_ANSWERS})")
        if client.call.cancel.wait(interval):
            raise Cancelled("cancelled")
        try:
            client.send("GET", ROOT, auth=False)
            good += 1
        except (BmcUnreachable, BmcRefused) as exc:
            log.info("%s: not settled after its update (%s)", where, exc.message)
            good = 0


def _push(
    client: RedfishSession, uri: str, method: Method, file: Path, sha256: str,
    targets: tuple[str, ...] = (), apply_time: str = "Immediate",
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Push ``file`` (its sha256 checked first) to ``uri``: multipart (UpdateParameters and
    UpdateFile) or, for HttpPushUri, the image as the whole body. Sent once."""
    where = f"Redfish BMC {client.target.address}"
    want = sha256.strip().lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        raise InvalidParameters("firmware push: sha256 must be 64 hex digits")
    digest = hashlib.sha256()
    try:
        with file.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise InvalidParameters(f"firmware push: cannot read {file}: {exc.strerror}") from exc
    if digest.hexdigest() != want:
        raise ChecksumMismatch(f"firmware push: {file.name} has sha256 {digest.hexdigest()}, expected {want}")
    headers = dict(client._login())
    opts = http.HttpOptions(timeout=300.0, verify=client.opts.verify, ca_file=client.opts.ca_file,
                            cancel=client.call.cancel, headers=headers)
    log.info("%s: pushing %s (%d bytes, %s)", where, file.name, file.stat().st_size, method)
    try:
        if method is Method.MULTIPART:
            params = json.dumps({"Targets": list(targets),
                             "@Redfish.OperationApplyTime": apply_time}).encode()
            resp = http.post_multipart(client.url(uri), [
                http.Part("UpdateParameters", params, "application/json"),
                http.Part("UpdateFile", path=file),
            ], opts)
        else:
            resp = http.post_file(client.url(uri), file, opts)
    except http.BodyTooLarge as exc:
        raise BmcRefused(f"{where}: firmware push: {exc.message}", status=exc.status) from exc
    except http.HttpError as exc:
        raise BmcUnreachable(f"{where}: firmware push failed: {exc.message}",
                             tls=exc.details.get("tls", "")) from exc
    client.attempts += 1
    answer = client._answer("POST", client.url(uri), resp, ())
    return answer.status, answer.headers, answer.doc


def status(client: RedfishSession, task_uri: str = "") -> site_pb2.BmcOperationResult:
    """bmc.firmware status: the UpdateService's FirmwareInventory (``inventory``), and with
    ``task_uri`` that task's state as the BMC reports it now (read once, not followed)."""
    where = f"Redfish BMC {client.target.address}"
    if not link(client.root(), "UpdateService"):
        raise Unsupported(f"{where} has no UpdateService")
    result = site_pb2.BmcOperationResult(operation="status")
    result.firmware_inventory.extend(inventory(client))
    if task_uri:
        answer = client.send("GET", task_uri, ok=(404,))
        if answer.status == 404:
            raise BmcRefused(f"{where}: no task {task_uri} (HTTP 404)", status=404)
        task = site_pb2.BmcFirmwareTask(task_uri=task_uri)
        tasks.read(client, answer, task)
        result.firmware.CopyFrom(task)
        result.state = task.state
    else:
        result.state = "listed"
    return result


MAX_COMPONENTS = 128


def inventory(client: RedfishSession) -> list[site_pb2.BmcFirmwareComponent]:
    """Every component of the UpdateService's FirmwareInventory (name, version, updateable,
    health, the resources it is the firmware of: RelatedItem);
    empty where the BMC has no UpdateService or no FirmwareInventory."""
    service_ref = link(client.root(), "UpdateService")
    if not service_ref:
        return []
    ref = link(client.get(service_ref), "FirmwareInventory")
    if not ref:
        return []
    answer = client.send("GET", ref, ok=(404,))   # an emulator may link one it does not serve
    if answer.status == 404:
        return []
    out = []
    for member in answer.doc.get("Members", [])[:MAX_COMPONENTS]:
        if not isinstance(member, dict):
            continue
        if "Version" in member:
            doc = member
        elif isinstance(member.get("@odata.id"), str) and member["@odata.id"]:
            doc = client.get(member["@odata.id"])
        else:
            continue
        out.append(site_pb2.BmcFirmwareComponent(
            id=str(doc.get("Id") or ""), name=str(doc.get("Name") or ""),
            version=str(doc.get("Version") or ""), updateable=doc.get("Updateable") is True,
            health=_text(st.get("Health")) if isinstance(st := doc.get("Status"), dict) else "",
            software_id=_text(doc.get("SoftwareId")), manufacturer=_text(doc.get("Manufacturer")),
            uri=_text(doc.get("@odata.id")),
            related=_refs(doc.get("RelatedItem")),
        ))  # fmt: skip
    return out


def _refs(value: object) -> list[str]:
    """The @odata.id of each link in a list of links (RelatedItem), at most 16."""
    if not isinstance(value, list):
        return []
    refs = (item.get("@odata.id") for item in value if isinstance(item, dict))
    return [ref.rstrip("/") for ref in refs if isinstance(ref, str) and ref][:16]


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""
