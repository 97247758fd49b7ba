"""The project's own Redfish emulator: a recorded tree served on 127.0.0.1, with the write
behaviour of its vendor's profile (tests/site/bmc/redfish_emulator/profiles.py).

    with RedfishEmulator.of("dell_r750", tmp_path) as bmc:
        bmc.address                 # "127.0.0.1:PORT" (https, a throw-away certificate)
        bmc.target()                # a Target for RedfishSession (verify_tls False)
        bmc.writes("PATCH")         # the writes it received, in order: (method, path, body)

The tree is a DMTF Mockup Creator recording in ../shared/vendor-trees/<dir>/*.tar.gz, read in
memory once per process (``recorded``: each emulator changes a copy of its own; ``unpack``
writes it out for a test that reads the files); a test skips where it is absent. GETs answer
from the recording (404 with a Redfish error where it has nothing). Writes do what the schema
says, bent by the profile:

- sessions: POST to the Sessions collection (UserName, Password, Context kept), a token and a
  Location; DELETE ends one; past ``max_sessions`` a POST is refused (RAC0218). Basic auth works
  too. A session's Context is shown in the collection, so a client can find its own.
- ETags on every resource (strong, weak or none); If-Match checked (412), required (428) where
  the profile says.
- GZIP_OR_406 (iLO 5): every resource but the service root gzip-compressed, 406 to a GET that
  does not accept gzip.
- ComputerSystem.Reset: ResetType checked against the recording's allowable values (or its
  ActionInfo); PowerState follows, and LastResetTime where the System has one; settings
  pending in a settings object are applied.
- Boot PATCH: values checked against the recording's allowable values; a settings object
  (@Redfish.Settings) takes what the client sends there, applied at the next reset; where the
  profile says so (BlueField-3) the System answers a Boot PATCH and applies nothing.
- EventService subscriptions: a POST to the Subscriptions collection makes one (Destination
  required), a DELETE of a member removes it.
- BIOS attributes PATCHed to a settings object: applied to the Bios at the next reset, and the
  settings object no longer holds them (DSP0266 "Settings").
- ManagerNetworkProtocol PATCH: each protocol's ProtocolEnabled or Port, within the protocol's
  object; one the resource does not list refused (and on bmcweb any but IPMI and SSH).
- VirtualMedia: InsertMedia / EjectMedia actions or PATCH, with the profile's transports; an
  https image fetched as it is mounted (its certificate verified) where ``state.media_ca`` is set.
- UpdateService.SimpleUpdate (its TransferProtocol checked against the action's or ActionInfo's
  allowable values, and required where that says so), a multipart push to
  MultipartHttpPushUri or a raw one to HttpPushUri: 202 and a task monitor that completes after
  ``task_polls`` GETs. Where the test names an image in ``state.images`` (the sha256 of a pushed
  file, a SimpleUpdate's ImageURI), its task's completion sets those components' versions; one
  named in ``state.failing`` ends its task in Exception with that message, nothing changed;
  ``state.on_update`` is told of each update that took (a lab's hook: the node's next power-on
  starts the build the BMC took).
- ``$expand`` of a collection: its members inline (the recording's own documents).
- UEFI Secure Boot: SecureBoot.ResetKeys, SecureBootDatabase.ResetKeys and certificate POSTs to
  the live databases (tests/site/bmc/redfish_emulator/secureboot.py), applied at once or, where the
  profile says, at the next reset; a reset sets SecureBootCurrentBoot.
- Actions a test installs (``state.actions``): ComponentIntegrity's SPDMGetSignedMeasurements,
  answered by responders of the test's own making (tests/site/bmc/redfish_emulator/spdm.py).
- A host behind a System (``attach``: a ``Machine``, e.g. machine.py's QEMU node): each Reset
  the System takes and each Boot override applied to it drive the machine, in the request,
  before the answer; the System's PowerState is the machine's at every read. Where the machine
  has ``variables`` (a QEMU node under Secure Boot with its own variable store file), the
  System's SecureBoot resource is that store: read from it (again whenever it changed under the
  BMC), each write (SecureBootEnable PATCH, ResetKeys, a certificate POST) staged into it for
  the firmware's next boot (machine.py ``NodeVariables``).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import email
import email.message
import email.policy
import gzip
import hashlib
import json
import pickle
import secrets
import socket
import ssl
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, Self

import pytest

from agent.site.bmc.client import Credentials, Target
from tests.loopback_http import self_signed_cert
from tests.site.bmc.redfish_emulator import secureboot
from tests.site.bmc.redfish_emulator.profiles import PROFILES, Profile, Quirk

Doc = dict[str, Any]
USER, PASSWORD = "bcadmin", "Emu-Pass-7Kq2Lw"
ROOT = "/redfish/v1"


def trees_dir() -> Path:
    """../shared/vendor-trees beside the checkout (or a worktree's checkout)."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "vendor-trees"
        if candidate.is_dir():
            return candidate
    pytest.skip("the recorded Redfish trees (../shared/vendor-trees) are absent")


def tree_names() -> list[str]:
    try:
        return sorted(p.name for p in trees_dir().iterdir() if p.is_dir() and any(p.glob("*.tar.gz")))
    except pytest.skip.Exception:
        return sorted(PROFILES)


def _archive(name: str) -> Path:
    source = trees_dir() / name
    archives = sorted(source.glob("*.tar.gz"))
    if not archives:
        pytest.skip(f"no recording in {source}")
    return archives[0]


def unpack(name: str, into: Path) -> Path:
    """The recording's /redfish/v1 directory, unpacked under ``into`` (once per directory)."""
    archive = _archive(name)
    dest = into / name
    if not dest.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    for index in sorted(dest.rglob("index.json"), key=lambda p: len(p.parts)):
        doc = json.loads(index.read_text())
        if isinstance(doc, dict) and doc.get("@odata.id", "").rstrip("/") == ROOT:
            return index.parent
    raise AssertionError(f"{name}: no service root in the recording")


def _error(message_id: str, message: str) -> Doc:
    return {"error": {"code": "Base.1.8.GeneralError", "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}]}}


def _takes_gzip(accept: str | None) -> bool:
    """Whether a request's Accept-Encoding takes gzip: no header at all counts as yes, as iLO
    answers it (DMTF/Redfish-Mockup-Creator#58); ``gzip`` or ``*`` with a q above 0."""
    if accept is None:
        return True
    for item in accept.split(","):
        coding, _, params = item.strip().partition(";")
        q = params.strip().removeprefix("q=") if params.strip().startswith("q=") else "1"
        if coding.strip().lower() in ("gzip", "*") and q.strip() not in ("0", "0.0", "0.00", "0.000"):
            return True
    return False


class Machine(Protocol):
    """A host behind an emulated System (``RedfishEmulator.attach``)."""

    def power_state(self) -> str:
        """The System's PowerState as the host is now: "On" or "Off"."""
        ...

    def boot(self, boot: Doc) -> None:
        """The System's Boot object, an override just applied to it."""
        ...

    def reset(self, reset_type: str) -> None:
        """A ComputerSystem.Reset the System took (its ResetType already checked)."""
        ...


@dataclass
class Session:
    id: str
    token: str
    user: str
    context: str


@dataclass
class State:
    """What the emulated BMC holds: the resources by path, sessions, the writes received."""

    docs: dict[str, Doc]
    profile: Profile
    sessions: dict[str, Session] = field(default_factory=dict)
    log: list[tuple[str, str, Doc]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    pending: dict[str, Doc] = field(default_factory=dict)     # system path -> settings to apply
    pending_attributes: dict[str, Doc] = field(default_factory=dict)   # Bios path -> attributes
    bios_jobs: int = 0
    busy_left: int = 0             # writes still refused busy (BUSY_JOB_QUEUE)
    fail_next: dict[str, int] = field(default_factory=dict)   # path -> status of its next write
    drip: dict[str, float] = field(default_factory=dict)      # path -> seconds per byte
    gone: set[str] = field(default_factory=set)               # paths answering 404
    cut: set[str] = field(default_factory=set)     # paths whose next write is done, then unanswered
    update_to: tuple[str, str] | None = None       # a firmware update sets (component path, version)
    # an image (sha256 of a pushed file, or a SimpleUpdate's ImageURI) -> the (component path,
    # version) its task's completion sets; one in ``failing`` -> its task ends in Exception so
    images: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    failing: dict[str, str] = field(default_factory=dict)
    monitors: dict[str, str] = field(default_factory=dict)     # task monitor -> its image
    # Told of each update that took, as its task completes (the image, the (component path,
    # version) pairs it set): a lab's hook that swaps what the node starts with at its next
    # power-on (tests/e2e/test_attest_uefi.py: the OVMF build of a QEMU node).
    on_update: Callable[[str, list[tuple[str, str]]], None] | None = None
    pushed: list[Doc] = field(default_factory=list)           # each multipart UpdateParameters
    reboot_seconds: float = 0.0                    # after which the BMC answers nothing this long
    down_until: float = 0.0
    polls: dict[str, int] = field(default_factory=dict)
    if_match: list[str] = field(default_factory=list)          # each write's If-Match, in order
    # Paths another writer changes between every read and write: If-Match never matches (412).
    contended: set[str] = field(default_factory=set)
    ignored: set[str] = field(default_factory=set)   # paths whose PATCH answers 204, applies nothing
    resets: list[str] = field(default_factory=list)
    # Where set, an https image is fetched when it is mounted (its first bytes, the server's
    # certificate verified against this CA, as a BMC that mounts it would), else refused 400.
    media_ca: Path | None = None
    fetched: list[tuple[str, bytes]] = field(default_factory=list)   # (image, its first bytes)
    # Actions a test's extension answers (path -> body -> (status, answer)): the SPDM responders
    # of tests/site/bmc/redfish_emulator/spdm.py.
    actions: dict[str, Callable[[Doc], tuple[int, Doc]]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    secure_boot: dict[str, Any] = field(default_factory=dict)   # SecureBoot path -> its SecureBootKeys
    machines: dict[str, Machine] = field(default_factory=dict)  # System path -> the host it drives

    def etag(self, path: str) -> str:
        digest = hashlib.sha256(f"{path}:{self.versions.get(path, 0)}".encode()).hexdigest()[:8]
        return {"strong": f'"{digest}"', "weak": f'W/"{digest}"'}.get(self.profile.etag, "")

    def changed(self, path: str) -> None:
        self.versions[path] = self.versions.get(path, 0) + 1


_RECORDED: dict[str, bytes] = {}      # tree -> its documents by path, pickled (read once a process)


def recorded(name: str) -> dict[str, Doc]:
    """The recording's documents by path (the index.json of each folder at or under the one
    that holds the service root), a copy of its own for one emulator to change: the archive is
    read in memory, not unpacked, once per process; each copy is unpickled from that reading."""
    if name not in _RECORDED:
        _RECORDED[name] = pickle.dumps(_read(name), pickle.HIGHEST_PROTOCOL)
    docs: dict[str, Doc] = pickle.loads(_RECORDED[name])
    return docs


def _read(name: str) -> dict[str, Doc]:
    found: dict[PurePosixPath, Doc] = {}
    with tarfile.open(_archive(name)) as tar:
        for member in tar:
            where = PurePosixPath(member.name)
            if not member.isfile() or where.name != "index.json":
                continue
            file = tar.extractfile(member)
            assert file is not None
            with contextlib.suppress(ValueError):
                doc = json.loads(file.read().decode())
                if isinstance(doc, dict):
                    found[where.parent] = doc
    roots = sorted((p for p, d in found.items() if str(d.get("@odata.id", "")).rstrip("/") == ROOT),
                   key=lambda p: len(p.parts))
    if not roots:
        raise AssertionError(f"{name}: no service root in the recording")
    root = roots[0]
    return {ROOT if p == root else f"{ROOT}/{p.relative_to(root).as_posix()}": doc
            for p, doc in found.items() if p == root or root in p.parents}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True    # headers and body are two writes: no 40 ms delayed-ACK wait
    server: _Server
    image = ""                    # the sha256 of the image the request pushed, if any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ----------------------------------------------------------------------------

    def _send(self, status: int, doc: Doc | None = None, headers: dict[str, str] | None = None,
              path: str = "", gzipped: bool = False) -> None:
        body = json.dumps(doc).encode() if doc is not None else b""
        if gzipped:
            body = gzip.compress(body)
            headers = {**(headers or {}), "Content-Encoding": "gzip"}
        st = self.server.state
        if self.command in ("POST", "PATCH") and self._path() in st.cut:
            st.cut.discard(self._path())       # acted on, and the connection lost before the answer
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("OData-Version", "4.0")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        drip = self.server.state.drip.get(path, 0.0)
        if drip:
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(drip)
        else:
            self.wfile.write(body)

    def _down(self) -> bool:
        """A BMC rebooting after its update: the connection closed, no answer."""
        if time.monotonic() >= self.server.state.down_until:
            return False
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        return True

    def _body(self) -> Doc:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        self.image = ""
        if self.headers.get("Content-Type", "").startswith("multipart/"):
            self._parts(raw)
            return {"multipart": len(raw)}
        if self.headers.get("Content-Type", "").startswith("application/octet-stream"):
            self.image = hashlib.sha256(raw).hexdigest()
            return {"octets": len(raw)}       # an HttpPushUri push: the image as the body
        doc = json.loads(raw)
        return doc if isinstance(doc, dict) else {}

    def _parts(self, raw: bytes) -> None:
        """A multipart push's parts: UpdateFile's sha256 kept, UpdateParameters recorded."""
        head = f"Content-Type: {self.headers.get('Content-Type')}\r\n\r\n".encode()
        message = email.message_from_bytes(head + raw, policy=email.policy.HTTP)
        for part in message.iter_parts() if isinstance(message, email.message.EmailMessage) else ():
            data = part.get_payload(decode=True)
            name = part.get_param("name", header="content-disposition")
            if name == "UpdateFile" and isinstance(data, bytes):
                self.image = hashlib.sha256(data).hexdigest()
            elif name == "UpdateParameters" and isinstance(data, bytes):
                self.server.state.pushed.append(json.loads(data))

    def _path(self) -> str:
        return urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"

    def _authorised(self) -> bool:
        st = self.server.state
        token = self.headers.get("X-Auth-Token", "")
        if token and any(s.token == token for s in st.sessions.values()):
            return True
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return (user, password) == (self.server.user, self.server.password)
        return False

    def _serve(self, method: str, answer: Callable[[str, Doc], None], *, reads_body: bool) -> None:
        """Every request's start: no answer while the BMC reboots; the path and the body read;
        the request logged, then ``answer(path, body)`` under the state's lock."""
        if self._down():
            return
        path = self._path()
        body = self._body() if reads_body else {}
        st = self.server.state
        with st.lock:
            st.log.append((method, path, body))
            answer(path, body)

    # -- GET ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._serve("GET", self._get, reads_body=False)

    def _get(self, path: str, _: Doc) -> None:
        st = self.server.state
        if path not in (ROOT, "/redfish") and not self._authorised():
            return self._send(401, _error("Base.1.8.NoValidSession", "no valid session"))
        if path.endswith("/Sessions") and path == self.server.sessions_path:
            members = [{"@odata.id": f"{path}/{s.id}"} for s in st.sessions.values()]
            return self._send(200, {"@odata.id": path, "Members": members,
                                    "Members@odata.count": len(members)})
        if path.startswith(self.server.sessions_path + "/"):
            sid = path.rsplit("/", 1)[-1]
            if sid in st.sessions:
                s = st.sessions[sid]
                return self._send(200, {"@odata.id": path, "Id": sid, "UserName": s.user,
                                        "Context": s.context})
        if path.startswith(f"{ROOT}/TaskService/TaskMonitors/"):
            return self._task(path)
        for keys in st.secure_boot.values():     # the node's own store, changed under the BMC
            if path == keys.ref or path.startswith(keys.ref + "/"):
                keys.refresh()
        query = urllib.parse.urlsplit(self.path).query
        doc = st.docs.get(path)
        if doc is None or path in st.gone:
            missing = _error("Base.1.8.ResourceMissingAtURI", f"{path} not found")
            return self._send(404, missing, path=path)
        if query and "skip" in query:     # a page past what was recorded
            doc = {"@odata.id": path, "Members": []}
        elif "$expand" in urllib.parse.unquote(query) and isinstance(doc.get("Members"), list):
            # a collection's members inline where recorded (DSP0266 $expand, levels 1)
            doc = {**doc, "Members": [st.docs.get(str(m.get("@odata.id", "")).rstrip("/"), m)
                                      for m in doc["Members"] if isinstance(m, dict)]}
        machine = st.machines.get(path)
        if machine is not None and doc.get("PowerState") != (power := machine.power_state()):
            doc["PowerState"] = power         # the host's own state (it may have powered off itself)
            st.changed(path)
        headers = {"ETag": st.etag(path)} if st.profile.etag else {}
        gzipped = Quirk.GZIP_OR_406 in st.profile.quirks and path not in (ROOT, "/redfish")
        if gzipped and not _takes_gzip(self.headers.get("Accept-Encoding")):
            return self._send(406, _error("Base.1.8.GeneralError", "Not Acceptable"), path=path)
        self._send(200, doc, headers, path, gzipped)

    def _task(self, path: str) -> None:
        st = self.server.state
        st.polls[path] = st.polls.get(path, 0) + 1
        done = st.polls[path] > st.profile.task_polls
        image = st.monitors.get(path, "")
        state = "Completed" if done else "Running"
        message = f"update {state.lower()}"
        if done and image in st.failing:
            state, message = "Exception", st.failing[image]
        elif done and st.polls[path] == st.profile.task_polls + 1:
            updates = st.images.get(image, []) or ([st.update_to] if st.update_to else [])
            for component, version in updates:      # the update took: the BMC reboots into it
                st.docs[component]["Version"] = version
                st.changed(component)
            if updates:
                st.down_until = time.monotonic() + st.reboot_seconds
                if st.on_update is not None:
                    st.on_update(image, list(updates))
        doc = {"@odata.id": path, "TaskState": state, "PercentComplete": 100 if done else 50,
               "Messages": [{"Message": message}]}
        self._send(200, doc, {} if done else {"Location": path})

    # -- writes ------------------------------------------------------------------------------

    def do_DELETE(self) -> None:
        self._serve("DELETE", self._delete, reads_body=False)

    def _delete(self, path: str, _: Doc) -> None:
        st = self.server.state
        if path.startswith(self.server.sessions_path + "/"):
            if not self._authorised():
                return self._send(401, _error("Base.1.8.NoValidSession", "no valid session"))
            sid = path.rsplit("/", 1)[-1]
            if st.sessions.pop(sid, None) is None:
                return self._send(404, _error("Base.1.8.ResourceMissingAtURI", path))
            return self._send(204)
        if path.rsplit("/", 1)[0] == self._subscriptions():
            if not self._authorised():
                return self._send(401, _error("Base.1.8.NoValidSession", "no valid session"))
            if st.docs.pop(path, None) is None:
                return self._send(404, _error("Base.1.8.ResourceMissingAtURI", path))
            collection = st.docs[self._subscriptions()]
            collection["Members"] = [m for m in collection.get("Members", [])
                                     if str(m.get("@odata.id", "")).rstrip("/") != path]
            collection["Members@odata.count"] = len(collection["Members"])
            st.changed(self._subscriptions())
            return self._send(204)
        self._send(405, _error("Base.1.8.OperationNotAllowed", "DELETE not allowed"))

    def do_POST(self) -> None:
        self._serve("POST", self._post, reads_body=True)

    def _post(self, path: str, body: Doc) -> None:
        st = self.server.state
        if path == self.server.sessions_path:
            return self._login(body)
        if not self._authorised():
            return self._send(401, _error("Base.1.8.NoValidSession", "no valid session"))
        if self._refused_early(path):
            return
        if path in st.actions:
            status, answer = st.actions[path](body)
            return self._send(status, answer)
        if path.endswith("/Actions/ComputerSystem.Reset"):
            return self._reset(path.rsplit("/Actions/", 1)[0], body)
        if path.endswith("/Actions/VirtualMedia.InsertMedia"):
            return self._insert(path.rsplit("/Actions/", 1)[0], body)
        if path.endswith("/Actions/VirtualMedia.EjectMedia"):
            return self._eject(path.rsplit("/Actions/", 1)[0])
        if path == self._subscriptions():
            return self._subscribe(path, body)
        service = st.docs.get(f"{ROOT}/UpdateService", {})
        pushes = {str(service.get(k) or "").rstrip("/") for k in ("MultipartHttpPushUri", "HttpPushUri")}
        simple = service.get("Actions", {}).get("#UpdateService.SimpleUpdate", {})
        if path in pushes - {""} or path == str(simple.get("target", "")).rstrip("/"):
            if "ImageURI" in body and not self._transfer_protocol_taken(simple, body):
                return
            monitor = f"{ROOT}/TaskService/TaskMonitors/{secrets.token_hex(4)}"
            st.monitors[monitor] = self.image or str(body.get("ImageURI", ""))
            return self._send(202, {"@odata.id": monitor, "TaskState": "New"}, {"Location": monitor})
        self._send(404, _error("Base.1.8.ActionNotSupported", f"{path} is no action here"))

    def _subscriptions(self) -> str:
        """The EventService's Subscriptions collection, "" where the recording has none."""
        docs = self.server.state.docs
        service = str(docs.get(ROOT, {}).get("EventService", {}).get("@odata.id", "")).rstrip("/")
        ref = str(docs.get(service, {}).get("Subscriptions", {}).get("@odata.id", "")).rstrip("/")
        return ref if ref in docs else ""

    def _subscribe(self, path: str, body: Doc) -> None:
        """An EventDestination made of the POST's body (Destination required), as a member of
        the collection, answered 201 with its Location."""
        st = self.server.state
        if not isinstance(body.get("Destination"), str) or not body["Destination"]:
            return self._send(400, _error("Base.1.8.PropertyMissing", "Destination is required"))
        sid = secrets.token_hex(8)
        ref = f"{path}/{sid}"
        st.docs[ref] = {"@odata.id": ref, "@odata.type": "#EventDestination.v1_10_1.EventDestination",
                        "Id": sid, "Name": f"EventSubscription {sid}", "Protocol": "Redfish",
                        "EventFormatType": "Event", "SubscriptionType": "RedfishEvent", "Context": "",
                        "EventTypes": ["Alert"],
                        **{k: v for k, v in body.items() if not k.startswith("@")}}
        collection = st.docs[path]
        collection.setdefault("Members", []).append({"@odata.id": ref})
        collection["Members@odata.count"] = len(collection["Members"])
        st.changed(path)
        self._send(201, st.docs[ref], {"Location": ref})

    def _transfer_protocol_taken(self, action: Doc, body: Doc) -> bool:
        """SimpleUpdate's TransferProtocol against the allowable values of the action or its
        ActionInfo, and present where the ActionInfo requires it (DGX H100's does); else 400."""
        allowed, required = action.get("TransferProtocol@Redfish.AllowableValues"), False
        info = self.server.state.docs.get(str(action.get("@Redfish.ActionInfo", "")).rstrip("/"), {})
        for param in info.get("Parameters", []):
            if isinstance(param, dict) and param.get("Name") == "TransferProtocol":
                allowed, required = param.get("AllowableValues", allowed), param.get("Required") is True
        given = body.get("TransferProtocol")
        listed = allowed if isinstance(allowed, list) else []
        flat = [v for a in listed for v in (a if isinstance(a, list) else [a])]
        if (given is None and required) or (given is not None and flat and given not in flat):
            self._send(400, _error("Base.1.8.ActionParameterValueNotInList" if given else
                                   "Base.1.8.ActionParameterMissing", f"TransferProtocol {given} not taken"))
            return False
        return True

    def do_PATCH(self) -> None:
        self._serve("PATCH", self._patch, reads_body=True)

    def _patch(self, path: str, body: Doc) -> None:
        st = self.server.state
        if not self._authorised():
            return self._send(401, _error("Base.1.8.NoValidSession", "no valid session"))
        doc = st.docs.get(path)
        if doc is None:
            return self._send(404, _error("Base.1.8.ResourceMissingAtURI", path))
        if self._refused_early(path) or not self._if_match(path):
            return
        if "Boot" in body and isinstance(body["Boot"], dict):
            return self._boot(path, body["Boot"])
        if "Image" in body or "Inserted" in body:
            return self._patch_media(path, body)
        if isinstance(body.get("Attributes"), dict):
            return self._attributes(path, body["Attributes"])
        if path in st.ignored:
            return self._send(204)
        if "ManagerNetworkProtocol" in str(doc.get("@odata.type", "")):
            return self._network_protocol(path, body)
        doc.update({k: v for k, v in body.items() if not k.startswith("@")})
        st.changed(path)
        if path in st.secure_boot:       # SecureBootEnable: into the node's own store, where attached
            st.secure_boot[path].stage()
        self._send(204)

    def _network_protocol(self, path: str, body: Doc) -> None:
        """ManagerNetworkProtocol: each protocol's ProtocolEnabled (or Port) set, the rest of
        its object kept; a protocol the resource does not list is refused, and, where the profile
        says so, any but IPMI and SSH (the whole PATCH: nothing applied)."""
        st = self.server.state
        doc = st.docs[path]
        limited = Quirk.PROTOCOL_PATCH_IPMI_SSH_ONLY in st.profile.quirks
        for name, value in body.items():
            if (limited and name not in ("HostName", "NTP", "IPMI", "SSH")) or not isinstance(value, dict) \
                    or not isinstance(doc.get(name), dict) or set(value) - {"ProtocolEnabled", "Port"}:
                return self._send(400, _error("Base.1.8.PropertyUnknown", f"The property {name} is not in "
                                              "the list of valid properties for the resource."))
        for name, value in body.items():
            doc[name].update(value)
        st.changed(path)
        self._send(204)

    def _attributes(self, path: str, attributes: Doc) -> None:
        """BIOS attributes: merged into a settings object and applied to the resource that names
        it at the next reset, or into the resource itself."""
        st = self.server.state
        st.docs[path].setdefault("Attributes", {}).update(attributes)
        owner = next((p for p, d in st.docs.items() if isinstance(d.get("@Redfish.Settings"), dict)
                      and d["@Redfish.Settings"].get("SettingsObject", {}).get("@odata.id", "").rstrip("/")
                      == path), "")
        if owner:
            st.pending_attributes.setdefault(owner, {}).update(attributes)
        st.changed(path)
        self._send(204)

    def _refused_early(self, path: str) -> bool:
        """A busy answer or a scripted failure, before anything is done."""
        st = self.server.state
        if st.busy_left > 0 and Quirk.BUSY_JOB_QUEUE in st.profile.quirks:
            st.busy_left -= 1
            self._send(503, _error("IDRAC.2.8.SYS518", "Lifecycle Controller in use: the job queue is busy"))
            return True
        status = st.fail_next.pop(path, 0)
        if status:
            self._send(status, _error("Base.1.8.InternalError", "scripted failure, nothing done"))
            return True
        return False

    def _if_match(self, path: str) -> bool:
        st = self.server.state
        given = self.headers.get("If-Match", "")
        st.if_match.append(given)
        if given and path in st.contended:
            self._send(412, _error("Base.1.8.PreconditionFailed", "ETag does not match"))
            return False
        if not given:
            if Quirk.IF_MATCH_REQUIRED in st.profile.quirks and st.profile.etag:
                self._send(428, _error("Base.1.8.PreconditionRequired", "If-Match is required"))
                return False
            return True
        want = st.etag(path)
        strong = want.removeprefix("W/")
        if Quirk.WEAK_ETAG in st.profile.quirks:
            ok = given in (strong, "*")
        elif Quirk.WEAK_ETAG_AS_GIVEN in st.profile.quirks:
            ok = given in (f"W/{strong}", "*")
        else:
            ok = given in (want, "*")
        if not ok:
            self._send(412, _error("Base.1.8.PreconditionFailed", "ETag does not match"))
        return ok

    # -- sessions ----------------------------------------------------------------------------

    def _login(self, body: Doc) -> None:
        st = self.server.state
        if (body.get("UserName"), body.get("Password")) != (self.server.user, self.server.password):
            return self._send(401, _error("Base.1.8.NoValidSession", "invalid credentials"))
        if Quirk.SESSION_LIMIT in st.profile.quirks and len(st.sessions) >= st.profile.max_sessions:
            full = "The maximum number of user sessions is reached."
            return self._send(503, _error("IDRAC.2.4.RAC0218", full))
        sid = secrets.token_hex(4)
        session = Session(sid, secrets.token_hex(16), str(body["UserName"]), str(body.get("Context") or ""))
        st.sessions[sid] = session
        where = f"{self.server.sessions_path}/{sid}"
        self._send(201, {"@odata.id": where, "Id": sid, "UserName": session.user},
                   {"X-Auth-Token": session.token, "Location": where})

    # -- power and boot ----------------------------------------------------------------------

    def _allowed_resets(self, system: Doc) -> list[str]:
        action = system.get("Actions", {}).get("#ComputerSystem.Reset", {})
        allowed = action.get("ResetType@Redfish.AllowableValues")
        info = self.server.state.docs.get(str(action.get("@Redfish.ActionInfo", "")).rstrip("/"), {})
        for param in info.get("Parameters", []):
            if isinstance(param, dict) and param.get("Name") == "ResetType":
                allowed = param.get("AllowableValues")
        return list(allowed or [])

    def _reset(self, system_path: str, body: Doc) -> None:
        st = self.server.state
        system = st.docs.get(system_path)
        if system is None:
            return self._send(404, _error("Base.1.8.ResourceMissingAtURI", system_path))
        kind = str(body.get("ResetType", ""))
        allowed = self._allowed_resets(system)
        if allowed and kind not in allowed:
            return self._send(400, _error("Base.1.8.ActionParameterValueNotInList",
                                          f"ResetType {kind} is not one of {allowed}"))
        st.resets.append(kind)
        if "LastResetTime" in system:       # the System's own record of its resets (ComputerSystem 1.12)
            system["LastResetTime"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()) \
                + f"#{len(st.resets)}"
        if kind in ("On", "ForceOn"):
            system["PowerState"] = "On"
        elif kind in ("ForceOff", "GracefulShutdown"):
            system["PowerState"] = "Off"
        else:
            system["PowerState"] = "On"
        machine = st.machines.get(system_path)
        if kind not in ("ForceOff", "GracefulShutdown") and system_path in st.pending:
            boot = st.pending.pop(system_path)
            system.setdefault("Boot", {}).update(boot)
            if machine is not None:
                machine.boot(system["Boot"])
        if machine is not None:
            try:
                machine.reset(kind)
            except Exception as exc:  # the host's failure, the BMC's 500: the test reads why
                return self._send(500, _error("Base.1.8.InternalError",
                                              f"the host did not take {kind}: {exc}"))
            system["PowerState"] = machine.power_state()
        if kind not in ("ForceOff", "GracefulShutdown"):
            for keys in st.secure_boot.values():
                if keys.ref.startswith(system_path + "/"):
                    keys.boot()
            for owner, attributes in list(st.pending_attributes.items()):
                if owner.startswith(system_path + "/"):
                    st.docs[owner].setdefault("Attributes", {}).update(attributes)
                    del st.pending_attributes[owner]
                    st.changed(owner)
                    # applied: the settings object holds nothing pending any more (DSP0266 "Settings")
                    settings = st.docs[owner]["@Redfish.Settings"]["SettingsObject"]["@odata.id"].rstrip("/")
                    waiting = st.docs[settings].get("Attributes", {})
                    for name in attributes:
                        waiting.pop(name, None)
                    st.changed(settings)
        st.changed(system_path)
        if Quirk.RESET_500_AFTER_ACTING in st.profile.quirks and st.resets.count(kind) == 1:
            return self._send(500, _error("Base.1.8.InternalError", "internal error"))
        self._send(204)

    def _boot(self, path: str, patch: Doc) -> None:
        st = self.server.state
        quirks = st.profile.quirks
        doc = st.docs[path]
        settings = doc.get("@Redfish.Settings", {}).get("SettingsObject", {}).get("@odata.id", "")
        if Quirk.BOOT_IN_SETTINGS_OBJECT in quirks and settings and path != settings.rstrip("/"):
            return self._send(400, _error("Ami.1.0.OperationSupportedInFutureStateURI",
                                          f"Support of this Operation for Boot Properties is moved to "
                                          f"FutureState URI({settings})"))
        system_path = next((p for p, d in st.docs.items() if d.get("@Redfish.Settings", {}).get(
            "SettingsObject", {}).get("@odata.id", "").rstrip("/") == path), path)
        system = st.docs[system_path]
        boot = system.get("Boot", {})
        if Quirk.EXTRA_BOOT_FIELDS_REFUSED in quirks:
            extra = sorted(set(patch) - {"BootSourceOverrideEnabled", "BootSourceOverrideTarget"})
            if extra:
                return self._send(400, _error("Base.1.8.PropertyUnknown", f"property {extra[0]} unknown"))
        for name, value in patch.items():
            allowed = boot.get(f"{name}@Redfish.AllowableValues")
            if name == "BootSourceOverrideEnabled" and allowed is None:
                allowed = ["Once", "Continuous", "Disabled"]
            if isinstance(allowed, list) and value not in allowed:
                return self._send(400, _error("Base.1.8.PropertyValueNotInList",
                                              f"{value} is not allowed for {name}"))
            if name not in boot and not name.endswith("Target") and name != "BootSourceOverrideEnabled" \
                    and Quirk.MODE_PATCH_500 not in quirks:
                return self._send(400, _error("Base.1.8.PropertyUnknown", f"property {name} unknown"))
        new = dict(patch)
        if Quirk.MODE_RESET_WITHOUT_MODE in quirks and "BootSourceOverrideMode" not in patch:
            new["BootSourceOverrideMode"] = "Legacy"
        if Quirk.MODE_QUEUES_BIOS_JOB in quirks and "BootSourceOverrideMode" in patch:
            st.bios_jobs += 1
        if path == system_path and settings and Quirk.BOOT_AT_SYSTEM_IGNORED in quirks:
            return self._send(204)        # accepted, and nothing applied
        if path != system_path:           # the settings object: applied at the next reset
            st.pending.setdefault(system_path, {}).update(new)
            st.docs[path].setdefault("Boot", {}).update(new)
            st.changed(path)
            return self._send(204)
        mode_500 = Quirk.MODE_PATCH_500 in quirks and "BootSourceOverrideMode" in new \
            and "BootSourceOverrideMode" not in boot
        new.pop("BootSourceOverrideMode", None) if mode_500 else None
        boot.update(new)
        st.changed(path)
        if (machine := st.machines.get(path)) is not None:
            machine.boot(boot)
        if mode_500:
            return self._send(500, _error("Base.1.8.InternalError", "internal error"))
        if Quirk.OVERRIDE_REVERTED in quirks:
            def revert() -> None:
                with st.lock:
                    boot.update({"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideMode": "Legacy"})
                    st.changed(path)
            threading.Timer(st.profile.apply_delay, revert).start()
        self._send(200 if Quirk.OVERRIDE_REVERTED in quirks else 204)

    # -- virtual media -----------------------------------------------------------------------

    def _media_refused(self, path: str, image: str) -> bool:
        st = self.server.state
        scheme = urllib.parse.urlsplit(image).scheme.lower()
        if Quirk.MEDIA_HTTPS_ONLY in st.profile.quirks and scheme not in st.profile.media_schemes:
            self._send(400, _error("Base.1.8.ActionParameterValueFormatError",
                                   f"transfer protocol {scheme} not supported"))
            return True
        if Quirk.EXT_SLOTS_ONLY in st.profile.quirks and not path.rsplit("/", 1)[-1].startswith("EXT"):
            self._send(400, _error("Base.1.8.ActionNotSupported", "network images mount in EXT slots only"))
            return True
        if st.media_ca is not None and scheme == "https":
            try:
                context = ssl.create_default_context(cafile=str(st.media_ca))
                with urllib.request.urlopen(image, timeout=10, context=context) as resp:
                    st.fetched.append((image, resp.read(2048)))
            except (OSError, ValueError) as exc:
                self._send(400, _error("Base.1.8.ResourceAtUriUnauthorized", f"image not reachable: {exc}"))
                return True
        return False

    def _insert(self, path: str, body: Doc) -> None:
        st = self.server.state
        doc = st.docs.get(path)
        if doc is None:
            return self._send(404, _error("Base.1.8.ResourceMissingAtURI", path))
        if Quirk.INSERT_TAKES_IMAGE_ONLY in st.profile.quirks:
            extra = sorted(set(body) - {"Image"})
            if extra:
                return self._send(400, _error("Base.0.10.PropertyUnknown", f"property {extra[0]} unknown"))
        image = str(body.get("Image", ""))
        if self._media_refused(path, image):
            return
        if doc.get("Inserted") is True:
            return self._send(409, _error("Base.1.8.ResourceInUse", "media already inserted"))
        doc.update({"Image": image, "Inserted": True, "ConnectedVia": "URI"})
        st.changed(path)
        self._send(204)

    def _eject(self, path: str) -> None:
        st = self.server.state
        doc = st.docs.get(path)
        if doc is None:
            return self._send(404, _error("Base.1.8.ResourceMissingAtURI", path))
        if Quirk.EJECT_KEEPS_IMAGE in st.profile.quirks and doc.get("Inserted") is not True:
            return self._send(400, _error("Base.1.8.ActionNotSupported", "no media to eject"))
        doc["Inserted"] = False
        doc["ConnectedVia"] = "NotConnected"
        if Quirk.EJECT_KEEPS_IMAGE not in st.profile.quirks:
            doc["Image"] = None
        st.changed(path)
        self._send(204)

    def _patch_media(self, path: str, body: Doc) -> None:
        st = self.server.state
        doc = st.docs[path]
        image = body.get("Image")
        if image and self._media_refused(path, str(image)):
            return
        if not image and Quirk.EJECT_KEEPS_IMAGE in st.profile.quirks:
            if doc.get("Inserted") is not True:
                return self._send(400, _error("Base.1.8.ActionNotSupported", "no media to eject"))
            doc["Inserted"] = False
        else:
            doc.update({"Image": image, "Inserted": bool(image) and body.get("Inserted", True) is not False})
        st.changed(path)
        self._send(204)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: State, user: str, password: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.user, self.password = user, password
        root = state.docs.get(ROOT, {})
        sessions = root.get("Links", {}).get("Sessions", {}).get("@odata.id", "")
        self.sessions_path = (sessions or f"{ROOT}/SessionService/Sessions").rstrip("/")


class RedfishEmulator:
    """One emulated BMC; see the module docstring."""

    def __init__(self, docs: dict[str, Doc], profile: Profile, workdir: Path, *, tls: bool = True,
                 user: str = USER, password: str = PASSWORD) -> None:
        self.state = State(docs, profile)
        self.state.secure_boot = secureboot.install(self.state)
        self.workdir = workdir
        self.tls = tls
        self.user, self.password = user, password
        self._server = _Server(self.state, user, password)
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, tree: str, workdir: Path, *, quirks: frozenset[Quirk] = frozenset(), **kw: Any) -> Self:
        """The emulator of a recorded tree with its vendor's profile (plus ``quirks``)."""
        profile = PROFILES[tree]
        if quirks:
            profile = replace(profile, quirks=profile.quirks | quirks)
        for name in ("max_sessions", "apply_delay", "task_polls"):
            if name in kw:
                profile = replace(profile, **{name: kw.pop(name)})
        return cls(recorded(tree), profile, workdir, **kw)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def target(self, password: str = "", verify_tls: bool = False) -> Target:
        scheme = "https" if self.tls else "http"
        return Target(f"{scheme}://{self.address}", Credentials(self.user, password or self.password),
                      verify_tls=verify_tls)

    def attach(self, machine: Machine, system: str = "") -> str:
        """Put ``machine`` behind the System at ``system`` (default: the Systems collection's
        first member); its path."""
        with self.state.lock:
            if not system:
                systems = str(self.state.docs[ROOT]["Systems"]["@odata.id"]).rstrip("/")
                system = str(self.state.docs[systems]["Members"][0]["@odata.id"])
            system = system.rstrip("/")
            self.state.machines[system] = machine
            variables = getattr(machine, "variables", None)   # PoweredMachine's NodeVariables
            if variables is not None:
                for keys in self.state.secure_boot.values():
                    if keys.ref.startswith(system + "/"):
                        keys.attach_store(variables)
            self.state.docs[system]["PowerState"] = machine.power_state()
            self.state.changed(system)
            return system

    def writes(self, method: str = "", path_end: str = "") -> list[tuple[str, str, Doc]]:
        with self.state.lock:
            return [w for w in self.state.log if (not method or w[0] == method) and w[1].endswith(path_end)]

    def doc(self, path: str) -> Doc:
        with self.state.lock:
            return copy.deepcopy(self.state.docs[path.rstrip("/")])

    def __enter__(self) -> Self:
        if self.tls:
            self.workdir.mkdir(parents=True, exist_ok=True)
            cert, key = self_signed_cert(str(self.workdir))
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cert, key)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def emulated(tree: str, workdir: Path, **kw: Any) -> Iterator[RedfishEmulator]:
    with RedfishEmulator.of(tree, workdir, **kw) as bmc:
        yield bmc
