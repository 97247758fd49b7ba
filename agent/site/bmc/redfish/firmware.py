"""The Redfish UpdateService: bmc.firmware's update and status, and the FirmwareInventory.

Two ways in, as the schema (UpdateService v1.6+) documents them:

- SimpleUpdate: POST ``{"ImageURI": ..., "TransferProtocol": ...}`` to the action's target; the
  BMC fetches the image itself.
- A multipart push: POST multipart/form-data to ``MultipartHttpPushUri`` with the parts
  ``UpdateParameters`` (JSON) and ``UpdateFile`` (the image, streamed from disk after its
  sha256 has been checked against the one the request gave).

``status`` reads the FirmwareInventory's versions and, given its URI, a task's state now.

Either answers 202 with a Location (a task monitor, or the Task itself), or with the Task in
its body; ``tasks.follow`` (agent/site/bmc/redfish/tasks.py) follows it to its end. Then the
BMC's own reboot after its update is waited out (``wait_settled``: 3 good answers in a row,
30 s apart by default, as Ironic waits) and the FirmwareInventory read again: the task's
messages say which component went from which version to which.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
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
from agent.site.bmc.redfish.session import ROOT, RedfishSession, link

log = logging.getLogger(__name__)

def update(
    client: RedfishSession,
    *,
    image_uri: str = "",
    file: Path | None = None,
    sha256: str = "",
    transfer_protocol: str = "",
    progress: Callable[[int, str], None] | None = None,
) -> site_pb2.BmcFirmwareTask:
    if bool(image_uri) == (file is not None):
        raise InvalidParameters("firmware: give image_uri or file, one of them")
    where = f"Redfish BMC {client.target.address}"
    ref = link(client.root(), "UpdateService")
    if not ref:
        raise Unsupported(f"{where} has no UpdateService")
    service = client.get(ref)
    before = {c.id: c.version for c in inventory(client)}
    if image_uri:
        http.check_url(image_uri)
        action = service.get("Actions", {}).get("#UpdateService.SimpleUpdate", {})
        if not isinstance(action, dict) or not action.get("target"):
            raise Unsupported(f"{where}: its UpdateService has no SimpleUpdate")
        body: dict[str, Any] = {"ImageURI": image_uri}
        if transfer_protocol:
            allowed = action.get("TransferProtocol@Redfish.AllowableValues")
            if isinstance(allowed, list) and transfer_protocol not in allowed:
                raise Unsupported(f"{where}: TransferProtocol {transfer_protocol} not in {allowed}")
            body["TransferProtocol"] = transfer_protocol
        log.info("%s: SimpleUpdate from %s", where, http.redact(image_uri))
        answer = client.send("POST", action["target"], json_body=body)
        status, headers, doc = answer.status, answer.headers, answer.doc
    else:
        assert file is not None
        status, headers, doc = _push(client, service, file, sha256)
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
    client: RedfishSession, service: dict[str, Any], file: Path, sha256: str
) -> tuple[int, dict[str, str], dict[str, Any]]:
    where = f"Redfish BMC {client.target.address}"
    push = service.get("MultipartHttpPushUri")
    if not isinstance(push, str) or not push:
        raise Unsupported(f"{where}: its UpdateService offers no MultipartHttpPushUri (multipart push)")
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
    params = json.dumps({"Targets": [], "@Redfish.OperationApplyTime": "Immediate"}).encode()
    headers = dict(client._login())
    opts = http.HttpOptions(timeout=300.0, verify=client.opts.verify, ca_file=client.opts.ca_file,
                            cancel=client.call.cancel, headers=headers)
    log.info("%s: pushing %s (%d bytes)", where, file.name, file.stat().st_size)
    try:
        resp = http.post_multipart(client.url(push), [
            http.Part("UpdateParameters", params, "application/json"),
            http.Part("UpdateFile", path=file),
        ], opts)
    except http.BodyTooLarge as exc:
        raise BmcRefused(f"{where}: firmware push: {exc.message}", status=exc.status) from exc
    except http.HttpError as exc:
        raise BmcUnreachable(f"{where}: firmware push failed: {exc.message}",
                             tls=exc.details.get("tls", "")) from exc
    client.attempts += 1
    answer = client._answer("POST", client.url(push), resp, ())
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
    health);
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
        ))  # fmt: skip
    return out


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""
