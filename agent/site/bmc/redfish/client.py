"""A DMTF Redfish client for one BMC, over the project's HTTP client (agent/net/http.py).

    client = RedfishClient(Target("10.0.0.5", Credentials("admin", pw)), CallContext(cancel, deadline))
    try:
        client.set_power(PowerAction.ON, graceful_timeout=60)
        client.power_state()                      # the caller polls until it has settled
    finally:
        client.close()                            # DELETEs the session

Auth: a session (POST to the service root's ``Links.Sessions``, then ``X-Auth-Token``; the
session is DELETEd on close and opened again once if the BMC drops it), or HTTP basic auth
when the BMC offers no session service. A 401 raises AuthFailed at once: wrong credentials
are never retried (BMCs lock accounts out). TLS is verified unless ``verify_tls`` is False; an
address may carry ``http://`` for a lab BMC (the emulator), ``https://`` is the default.

Every request goes through ``http.request``, GETs (and the session's DELETE) over one kept-alive
connection per client (one TLS handshake per command, not per request): connection errors,
5xx, "busy" answers and (for
GETs) bodies that are not JSON are retried with backoff from ``Pacing`` (a POST or PATCH only
when the BMC provably did not take it: agent/net/http.py; a 5xx to one is reported once,
never resent) (never faster than
``min_interval``), bounded by the command's cancel event and deadline, which cut a request
short even while the BMC is sending (a BMC that drips a byte a second; each answer in full
within ANSWER_TIMEOUT). The BMC's own error
text (``error.message`` and ``@Message.ExtendedInfo``) is kept in BmcRefused's message. Every
``@odata.id`` or Location the BMC gives is checked to stay on the BMC's own host before it is
followed. The password is never logged, returned or kept in an error message: if a BMC echoes
it back, it is replaced by ``<hidden>``.

The System, Manager and Chassis are discovered from the service root: the first System, the
Manager that lists it (else the first), the System's first Chassis (else the first). The
UpdateService and its task monitor are in ``agent/site/bmc/redfish/firmware.py``.
"""

from __future__ import annotations

import base64
import contextlib
import http.client as http_client
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from agent.errors import (
    AuthFailed,
    BmcRefused,
    BmcUnreachable,
    Cancelled,
    CommandTimeout,
    InvalidParameters,
    Unsupported,
)
from agent.net import http
from agent.proto import site_pb2
from agent.site.bmc import events
from agent.site.bmc.client import (
    BootDevice,
    BootMode,
    BootSetting,
    CallContext,
    Credentials,
    PowerAction,
    PowerState,
    Target,
    shown_address,
)
from agent.site.bmc.redfish import firmware as redfish_firmware

log = logging.getLogger(__name__)

Doc = dict[str, Any]

ROOT = "/redfish/v1/"
MAX_RETRIES = 4
MAX_BODY = http.MAX_BODY  # a BMC's JSON answer, at most (a service root is a few KiB)
REQUEST_TIMEOUT = 30.0       # per connect, per read
ANSWER_TIMEOUT = 60.0        # one whole answer, however its bytes come (a BMC that drips)
MAX_RAW_MESSAGE = 64 * 1024   # of a non-JSON error body, what is redacted before its start is kept
_BUSY_WORDS = (b"busy", b"temporarilyunavailable", b"initialization in progress", b"initializing",
               b"resourceinuse")

_BOOT_TO_REDFISH = {
    BootDevice.PXE: "Pxe",
    BootDevice.HTTP: "UefiHttp",
    BootDevice.DISK: "Hdd",
    BootDevice.CDROM: "Cd",
    BootDevice.BIOS: "BiosSetup",
    BootDevice.NONE: "None",
}
_BOOT_FROM_REDFISH = {v: k for k, v in _BOOT_TO_REDFISH.items()}
_MODE_TO_REDFISH = {BootMode.UEFI: "UEFI", BootMode.LEGACY: "Legacy"}
_MODE_FROM_REDFISH = {v: k for k, v in _MODE_TO_REDFISH.items()}
# PoweringOn is not on yet, PoweringOff not off yet: the caller keeps polling.
_POWER_FROM_REDFISH = {"On": PowerState.ON, "PoweringOff": PowerState.ON, "Paused": PowerState.ON,
                       "Off": PowerState.OFF, "PoweringOn": PowerState.OFF}


@dataclass
class Discovered:
    """What a command learnt of one BMC that the next command on it may use (kept in the
    runtime's ``Kept``, agent/commands/base.py, under the BMC's key "bmc:<address>"): the
    service root, the System, Manager and Chassis paths, and the idle kept-alive connection.
    Used only by a client of the same base URL and TLS settings; a path that answers 404 later
    is discovered again (``RedfishClient._resource``)."""

    base: str
    verify_tls: bool
    ca_file: str
    root: Doc | None
    paths: dict[str, str]
    connection: http_client.HTTPConnection | None = None

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    doc: Doc


def bmc_message(body: bytes, hide: Callable[[str], str] = str) -> str:
    """The BMC's own words from a Redfish error body: error.message and every
    @Message.ExtendedInfo Message (or MessageId), joined; the raw start when it is not JSON.
    ``hide`` redacts each piece before anything is cut, so no part of a secret survives."""
    try:
        doc = json.loads(body)
    except ValueError:
        return hide(body[:MAX_RAW_MESSAGE].decode("utf-8", "replace")).strip()[:200]
    if not isinstance(doc, dict):
        return ""
    err = doc.get("error", doc)
    words: list[str] = []
    if isinstance(err, dict):
        if isinstance(err.get("message"), str):
            words.append(hide(err["message"]))
        infos = err.get("@Message.ExtendedInfo") or doc.get("@Message.ExtendedInfo") or []
        for info in infos if isinstance(infos, list) else []:
            if isinstance(info, dict):
                text = info.get("Message") or info.get("MessageId") or ""
                if isinstance(text, str) and text and hide(text) not in words:
                    words.append(hide(text))
    return "; ".join(words)[:1000]


def _busy(resp: http.Response) -> bool:
    if resp.status in (400, 409):
        lowered = resp.body.lower()
        return any(word in lowered for word in _BUSY_WORDS)
    return False


def _not_json(resp: http.Response) -> bool:
    if resp.status != 200 or not resp.body:
        return False
    try:
        return not isinstance(json.loads(resp.body), dict)
    except ValueError:
        return True


class RedfishClient:
    """``BmcClient`` over Redfish; see the module docstring."""

    def __init__(self, target: Target, call: CallContext, known: Discovered | None = None) -> None:
        """``known``: what an earlier command learnt of this BMC (see ``leave``), or None."""
        self.target = target
        self.call = call
        scheme, address = "https", target.address
        for prefix in ("https://", "http://"):
            if address.startswith(prefix):
                scheme, address = prefix[:-3], address[len(prefix):]
        self.base = f"{scheme}://{address.rstrip('/')}"
        parts = http.check_url(self.base + ROOT)
        if parts.path != ROOT or parts.query or "@" in parts.netloc:
            raise InvalidParameters(f"BMC address must be host or host:port, not {shown_address(address)!r}")
        self._netloc = parts.netloc.lower()
        self._root_parts = parts        # the BMC's origin, for its kept connection
        if scheme == "http":
            log.warning("Redfish %s: plain http, no TLS (a lab BMC or an emulator only)", address)
        pacing = call.pacing
        self.opts = http.HttpOptions(
            timeout=REQUEST_TIMEOUT, total_timeout=ANSWER_TIMEOUT, max_retries=MAX_RETRIES,
            backoff=pacing.min_interval,
            max_backoff=pacing.max_interval, cancel=call.cancel, verify=target.verify_tls,
            ca_file=Path(target.ca_file) if target.ca_file else None,
        )
        self.attempts = 0           # requests made, retries included (BmcOperationResult.attempts)
        self.connections = http.ConnectionPool()   # GETs reuse one; closed in close()
        self._auth: dict[str, str] | None = None
        self._session_uri = ""
        self._root: Doc | None = None
        self._paths: dict[str, str] = {}
        self._secrets: list[str] = []   # passwords being set, hidden like the login's
        self._known = False             # root and paths came from an earlier command
        self._last: tuple[str, Answer] | None = None   # the last GET's answer, until a write
        if known is not None and (known.base, known.verify_tls, known.ca_file) == \
                (self.base, target.verify_tls, target.ca_file):
            self._root, self._paths, self._known = known.root, dict(known.paths), True
            if known.connection is not None:
                self.connections.give_back(http.origin(self._root_parts), known.connection)
                known.connection = None
        if known is not None:
            known.close()

    # -- transport -----------------------------------------------------------------------

    def url(self, ref: str) -> str:
        """The URL of an ``@odata.id`` or Location from the BMC, refused unless it stays on the
        BMC's own host and is a plain absolute path."""
        try:
            parts = urllib.parse.urlsplit(ref)
        except ValueError as exc:
            raise BmcRefused(f"BMC gave an unusable link {ref[:100]!r}") from exc
        if (parts.scheme or parts.netloc) and (
            parts.netloc.lower() != self._netloc or parts.scheme not in ("http", "https")
        ):
            raise BmcRefused(f"BMC pointed outside itself: {http.redact(ref)!r}", link=http.redact(ref))
        path = parts.path
        segments = path.split("/")
        if (not path.startswith("/") or path.startswith("//") or ".." in segments
                or any(c in path for c in "\r\n\t \\")):
            raise BmcRefused(f"BMC gave an unusable link {ref[:100]!r}")
        return self.base + path + (f"?{parts.query}" if parts.query else "")

    def hide(self, text: str) -> str:
        """``text`` with the password (and one being set) replaced, should a BMC echo it,
        as typed or JSON-escaped."""
        for secret in (self.target.credentials.password, *self._secrets):
            if secret:
                for form in {secret, json.dumps(secret)[1:-1]}:
                    text = text.replace(form, "<hidden>")
        return text

    def send(
        self,
        method: str,
        ref: str,
        *,
        json_body: object = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
        ok: tuple[int, ...] = (),
    ) -> Answer:
        """One request; 2xx and the statuses in ``ok`` are answered, the rest raise: 401
        AuthFailed, others BmcRefused with the BMC's message; no answer at all BmcUnreachable."""
        url = self.url(ref)
        hdrs = {"OData-Version": "4.0"}
        if auth:
            hdrs.update(self._login())
        if headers:
            hdrs.update(headers)
        if method != "GET":
            self._last = None
        resp = self._request(method, url, json_body, hdrs)
        if resp.status == 401 and auth and self._session_uri:
            log.info("Redfish %s: session refused, logging in again", self.target.address)
            self._auth, self._session_uri = None, ""
            hdrs.update(self._login())
            resp = self._request(method, url, json_body, hdrs)
        answer = self._answer(method, url, resp, ok)
        if method == "GET":
            self._last = (url, answer)
        return answer

    def as_read(self, ref: str) -> Answer:
        """The answer to a GET of ``ref``: the one this client last had, when it asked for
        ``ref`` and has sent nothing but GETs since (a resource read a moment ago, before it is
        changed: no second GET for its state or ETag), else a GET now. Never for polling."""
        if self._last is not None and self._last[0] == self.url(ref):
            return self._last[1]
        return self.send("GET", ref)

    def _request(self, method: str, url: str, json_body: object, hdrs: dict[str, str]) -> http.Response:
        if self.call.cancel.is_set():
            raise Cancelled("cancelled")
        busy = (lambda r: _busy(r) or _not_json(r)) if method == "GET" else _busy
        try:
            resp = http.request(method, url, self.opts, json_body=json_body, headers=hdrs,
                                deadline=self.call.deadline, busy=busy, max_body=MAX_BODY,
                                connections=self.connections)
        except http.AmbiguousWrite as exc:
            if exc.response is None:    # no answer after it was sent: as any transport failure
                return self._unreachable(exc)
            resp = exc.response         # a 5xx to a write: its message read, never sent again
        except http.BodyTooLarge as exc:
            self.attempts += 1
            raise BmcRefused(f"Redfish BMC {self.target.address}: {exc.message}; a Redfish "
                             "resource is a few KiB", status=exc.status) from exc
        except http.HttpError as exc:
            return self._unreachable(exc)
        self.attempts += resp.attempts
        return resp

    def _unreachable(self, exc: http.HttpError) -> NoReturn:
        self.attempts += int(exc.details.get("attempts", "1") or 1)
        where = f"Redfish BMC {self.target.address}"
        if exc.details.get("tls") == "untrusted":
            raise BmcUnreachable(
                f"{where}: its TLS certificate is not trusted; give the BMC's CA, or set"
                f" verify_tls false for a self-signed BMC ({exc.message})", tls="untrusted"
            ) from exc
        raise BmcUnreachable(f"{where}: {exc.message}") from exc

    def _answer(self, method: str, url: str, resp: http.Response, ok: tuple[int, ...]) -> Answer:
        where = f"Redfish {method} {http.redact(url)}"
        if resp.status == 401:
            raise AuthFailed(
                f"{where}: the BMC refused the credentials of user {self.target.credentials.username!r}"
                " (HTTP 401)", status=401
            )
        if not (200 <= resp.status < 300 or resp.status in ok):
            said = bmc_message(resp.body, self.hide)
            retried = f" after {resp.attempts} attempts" if resp.attempts > 1 else ""
            raise BmcRefused(
                f"{where}: HTTP {resp.status}{retried}" + (f": {said}" if said else ""),
                status=resp.status, bmc_message=said,
            )
        doc: Doc = {}
        if resp.body.strip():
            try:
                parsed = json.loads(resp.body)
            except ValueError as exc:
                raise BmcRefused(
                    f"{where}: the BMC answered HTTP {resp.status} with invalid JSON"
                    f" (after {resp.attempts} attempts)", status=resp.status
                ) from exc
            if not isinstance(parsed, dict):
                raise BmcRefused(f"{where}: the BMC answered with JSON that is not an object")
            doc = parsed
        return Answer(resp.status, resp.headers, doc)

    def get(self, ref: str) -> Doc:
        return self.send("GET", ref).doc

    # -- auth ----------------------------------------------------------------------------

    def root(self) -> Doc:
        if self._root is None:
            self._root = self.send("GET", ROOT, auth=False).doc
        return self._root

    def _sessions_ref(self) -> str:
        root = self.root()
        ref = link(root.get("Links", {}), "Sessions")
        if not ref and "SessionService" in root:
            ref = "/redfish/v1/SessionService/Sessions"
        return ref

    def _login(self) -> dict[str, str]:
        if self._auth is not None:
            return self._auth
        creds = self.target.credentials
        sessions = self._sessions_ref()
        if sessions:
            answer = self._open_session(sessions, creds)
            if answer is not None:
                token = answer.headers.get("x-auth-token", "")
                if not token:
                    raise BmcRefused(f"Redfish BMC {self.target.address}: session opened without a token")
                location = answer.headers.get("location", "") or str(answer.doc.get("@odata.id", ""))
                self._session_uri = location
                self._auth = {"X-Auth-Token": token}
                log.debug("Redfish %s: session opened", self.target.address)
                return self._auth
        pair = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        self._auth = {"Authorization": f"Basic {pair}"}
        log.debug("Redfish %s: no session service, basic auth", self.target.address)
        return self._auth

    def _open_session(self, sessions: str, creds: Credentials) -> Answer | None:
        """The answer to POSTing a session; None when the BMC does not offer sessions."""
        body = {"UserName": creds.username, "Password": creds.password}
        answer = self.send("POST", sessions, json_body=body, auth=False, ok=(404, 405, 501))
        return None if answer.status in (404, 405, 501) else answer

    def check_login(self, credentials: Credentials) -> bool:
        """Opens (and closes) a session with ``credentials``; with basic auth, GETs the Systems."""
        probe = RedfishClient(
            Target(self.target.address, credentials, self.target.verify_tls, self.target.ca_file), self.call
        )
        probe._root = self.root()
        try:
            probe._login()
            if not probe._session_uri:
                probe.get(link(self.root(), "Systems") or "/redfish/v1/Systems")
            return True
        except AuthFailed:
            return False
        finally:
            self.attempts += probe.attempts
            probe.close()

    def close(self) -> None:
        self._end_session()
        self.connections.close()

    def leave(self) -> Discovered:
        """Close the session as ``close`` does, and hand over what the next command on this BMC
        may use: the root, the paths and the idle connection (the caller closes or keeps it)."""
        self._end_session()
        known = Discovered(self.base, self.target.verify_tls, self.target.ca_file, self._root,
                           dict(self._paths), self.connections.take(http.origin(self._root_parts)))
        self.connections.close()
        return known

    def _end_session(self) -> None:
        uri, self._session_uri = self._session_uri, ""
        if uri and self._auth is not None:
            try:
                self.send("DELETE", uri, ok=(404,))
            except (BmcRefused, BmcUnreachable, AuthFailed, Cancelled) as exc:
                log.warning("Redfish %s: could not close the session: %s", self.target.address, exc)
        self._auth = None

    # -- discovery -----------------------------------------------------------------------

    def members(self, collection_ref: str) -> list[str]:
        doc = self.get(collection_ref)
        found = [m.get("@odata.id", "") for m in doc.get("Members", []) if isinstance(m, dict)]
        return [ref for ref in found if isinstance(ref, str) and ref]

    def _first(self, key: str, collection: str) -> str:
        if key not in self._paths:
            ref = link(self.root(), collection)
            refs = self.members(ref) if ref else []
            if not refs:
                raise Unsupported(f"Redfish BMC {self.target.address} lists no {collection}")
            self._paths[key] = refs[0]
        return self._paths[key]

    def system_ref(self) -> str:
        return self._first("system", "Systems")

    def manager_ref(self) -> str:
        if "manager" not in self._paths:
            system = self.system_ref()
            for ref in self.members(link(self.root(), "Managers") or "/redfish/v1/Managers"):
                servers = self.get(ref).get("Links", {}).get("ManagerForServers", [])
                if any(isinstance(s, dict) and same_path(s.get("@odata.id", ""), system) for s in servers):
                    self._paths["manager"] = ref
                    break
            else:
                self._first("manager", "Managers")
        return self._paths["manager"]

    def chassis_ref(self) -> str:
        if "chassis" not in self._paths:
            chassis = self.system().get("Links", {}).get("Chassis", [])
            if chassis and isinstance(chassis[0], dict) and chassis[0].get("@odata.id"):
                self._paths["chassis"] = chassis[0]["@odata.id"]
            else:
                self._first("chassis", "Chassis")
        return self._paths["chassis"]

    def system(self) -> Doc:
        return self._resource(self.system_ref)

    def manager(self) -> Doc:
        return self._resource(self.manager_ref)

    def chassis(self) -> Doc:
        return self._resource(self.chassis_ref)

    def _resource(self, ref: Callable[[], str]) -> Doc:
        """GET the resource at ``ref()``; when its path came from an earlier command and the
        BMC now answers 404 (the BMC was reset or replaced, its resources renumbered), the
        root and paths are discovered again, once."""
        try:
            return self.get(ref())
        except BmcRefused as exc:
            if not self._known or exc.details.get("status") != "404":
                raise
        log.info("Redfish %s: a path kept from an earlier command is gone; discovering again",
                 self.target.address)
        self._root, self._paths, self._known = None, {}, False
        return self.get(ref())

    # -- power ---------------------------------------------------------------------------

    def power_state(self) -> PowerState:
        return self._power_of(self.system())

    def _power_of(self, system: Doc) -> PowerState:
        value = system.get("PowerState")
        state = _POWER_FROM_REDFISH.get(value) if isinstance(value, str) else None
        if state is None:
            raise BmcRefused(f"Redfish BMC {self.target.address}: unknown PowerState {value!r}")
        return state

    def _reset_types(self, system: Doc) -> tuple[str, list[str]]:
        """(the Reset action's target, its allowed ResetTypes; [] when the BMC does not say)."""
        action = system.get("Actions", {}).get("#ComputerSystem.Reset")
        if not isinstance(action, dict) or not action.get("target"):
            raise Unsupported(f"Redfish BMC {self.target.address}: the System has no Reset action")
        allowed = action.get("ResetType@Redfish.AllowableValues")
        if allowed is None and action.get("@Redfish.ActionInfo"):
            info = self.get(action["@Redfish.ActionInfo"])
            for param in info.get("Parameters", []):
                if isinstance(param, dict) and param.get("Name") == "ResetType":
                    allowed = param.get("AllowableValues")
        return str(action["target"]), [str(a) for a in allowed or []]

    def _reset(self, target: str, reset_type: str) -> None:
        log.info("Redfish %s: ResetType %s", self.target.address, reset_type)
        self.send("POST", target, json_body={"ResetType": reset_type})

    def set_power(self, action: PowerAction, *, graceful_timeout: float) -> None:
        if action is PowerAction.STATUS:
            return
        system = self.as_read(self.system_ref()).doc   # the caller has just read the state
        state = self._power_of(system)
        target, allowed = self._reset_types(system)

        def pick(*choices: str) -> str:
            for choice in choices:
                if not allowed or choice in allowed:
                    return choice
            raise Unsupported(f"Redfish BMC {self.target.address} offers none of ResetType {choices}")

        if action is PowerAction.ON:
            if state is not PowerState.ON:
                self._reset(target, pick("On", "ForceOn"))
        elif action is PowerAction.OFF:
            if state is not PowerState.OFF:
                self._power_off(target, allowed, graceful_timeout)
        elif state is PowerState.OFF:          # cycle or reset of a node that is off: start it
            self._reset(target, pick("On", "ForceOn"))
        elif action is PowerAction.CYCLE and (not allowed or "PowerCycle" in allowed):
            self._reset(target, "PowerCycle")
        elif action is PowerAction.RESET and (not allowed or "ForceRestart" in allowed):
            self._reset(target, "ForceRestart")
        else:                                  # no cycle/restart offered: off, settled, on
            self._reset(target, pick("ForceOff"))
            self._wait_power(PowerState.OFF, self.call.deadline)
            self._reset(target, pick("On", "ForceOn"))

    def _power_off(self, target: str, allowed: list[str], graceful_timeout: float) -> None:
        if not allowed or "GracefulShutdown" in allowed:
            self._reset(target, "GracefulShutdown")
            until = min(time.monotonic() + graceful_timeout, self.call.deadline)
            if self._wait_power(PowerState.OFF, until, raise_timeout=False):
                return
            log.info("Redfish %s: not off after %.0f s of GracefulShutdown, forcing",
                     self.target.address, graceful_timeout)
        if "ForceOff" not in allowed and allowed:
            raise Unsupported(f"Redfish BMC {self.target.address} offers no ResetType ForceOff")
        self._reset(target, "ForceOff")

    def _wait_power(self, want: PowerState, until: float, *, raise_timeout: bool = True) -> bool:
        for _ in self.paced(until):
            if self.power_state() is want:
                return True
        if raise_timeout:
            raise CommandTimeout(f"Redfish BMC {self.target.address}: power not {want} in time")
        return False

    def paced(self, until: float) -> Iterator[None]:
        """Yield, then wait (min_interval, growing by factor up to max_interval) until ``until``
        or the command's deadline; Cancelled when cancelled."""
        pacing = self.call.pacing
        interval = pacing.min_interval
        until = min(until, self.call.deadline)
        while True:
            yield
            left = until - time.monotonic()
            if left <= 0:
                return
            if self.call.cancel.wait(min(interval, left)):
                raise Cancelled("cancelled")
            if time.monotonic() >= until:
                return
            interval = min(pacing.max_interval, interval * pacing.factor)

    # -- boot ----------------------------------------------------------------------------

    def boot_device(self) -> BootSetting:
        return self._boot_of(self.system())

    def _boot_of(self, system: Doc) -> BootSetting:
        boot = system.get("Boot", {})
        enabled = boot.get("BootSourceOverrideEnabled", "Disabled")
        raw = boot.get("BootSourceOverrideTarget", "None")
        mode = _MODE_FROM_REDFISH.get(boot.get("BootSourceOverrideMode", ""))
        if enabled == "Disabled" or raw in (None, "None"):
            return BootSetting(BootDevice.NONE, persistent=False, mode=mode)
        device = _BOOT_FROM_REDFISH.get(raw)
        if device is None:
            raise Unsupported(f"Redfish BMC {self.target.address}: boot override {raw!r} has no name here")
        return BootSetting(device, persistent=enabled == "Continuous", mode=mode)

    def set_boot_device(self, setting: BootSetting) -> BootSetting:
        system = self.system()
        boot = system.get("Boot", {})
        wanted = _BOOT_TO_REDFISH[setting.device]
        allowed = boot.get("BootSourceOverrideTarget@Redfish.AllowableValues")
        if setting.device is not BootDevice.NONE and isinstance(allowed, list) and wanted not in allowed:
            raise Unsupported(
                f"Redfish BMC {self.target.address} cannot boot from {setting.device}"
                f" (BootSourceOverrideTarget {wanted} not in {allowed})"
            )
        patch: Doc = {"BootSourceOverrideTarget": wanted}
        if setting.device is BootDevice.NONE:
            patch["BootSourceOverrideEnabled"] = "Disabled"
        else:
            patch["BootSourceOverrideEnabled"] = "Continuous" if setting.persistent else "Once"
        if setting.mode is not None:
            patch["BootSourceOverrideMode"] = _MODE_TO_REDFISH[setting.mode]
        self.patch(self.system_ref(), {"Boot": patch})
        got = self.boot_device()
        if got.device is not setting.device:
            raise BmcRefused(
                f"Redfish BMC {self.target.address} accepted boot override {wanted} but reads back"
                f" {got.device}", bmc_message=f"read back {got.device}"
            )
        # A persistence or mode the BMC does not keep (sushy's emulator keeps every override
        # Continuous) is reported by the caller from its own read-back, as for IPMI; not hidden.
        mode_differs = setting.mode is not None and got.mode is not setting.mode
        if got.persistent != setting.persistent or mode_differs:
            log.warning("Redfish %s: boot override %s reads back persistent=%s mode=%s, asked %s/%s",
                        self.target.address, wanted, got.persistent, got.mode, setting.persistent,
                        setting.mode)
        return got

    def patch(self, ref: str, body: Doc) -> Answer:
        """PATCH with If-Match when the resource has an ETag (some BMCs require it): the ETag of
        the GET just made of it, else of a GET now."""
        etag = self.as_read(ref).headers.get("etag", "")
        return self.send("PATCH", ref, json_body=body, headers={"If-Match": etag} if etag else None)

    # -- query ---------------------------------------------------------------------------

    def query(self) -> site_pb2.BmcOperationResult:
        system = self.system()
        result = site_pb2.BmcOperationResult(operation="query")
        sys_msg = result.system
        sys_msg.manufacturer = text(system.get("Manufacturer"))
        sys_msg.model = text(system.get("Model"))
        sys_msg.serial = text(system.get("SerialNumber"))
        sys_msg.bios_version = text(system.get("BiosVersion"))
        sys_msg.uuid = text(system.get("UUID"))
        sys_msg.health = text(system.get("Status", {}).get("Health"))
        with contextlib.suppress(Unsupported):
            sys_msg.bmc_firmware_version = text(self.manager().get("FirmwareVersion"))
        result.power_state = str(self._power_of(system))
        result.state = result.power_state
        nics_ref = link(system, "EthernetInterfaces")
        for ref in self.members(nics_ref) if nics_ref else []:
            nic = self.get(ref)
            mac = normal_mac(nic.get("MACAddress") or nic.get("PermanentMACAddress"))
            if mac:
                status = text(nic.get("LinkStatus"))
                result.nics.add(id=text(nic.get("Id")), mac_address=mac, link_status=status)
        try:
            result.sensors.extend(self.sensors())
        except Unsupported as exc:
            log.info("Redfish %s: no sensors: %s", self.target.address, exc)
        result.firmware_inventory.extend(redfish_firmware.inventory(self))
        result.attempts = self.attempts
        return result

    def event_log(self, since: int) -> list[site_pb2.BmcLogEntry]:
        return events.redfish_entries(self, since)

    def sensors(self) -> list[site_pb2.BmcSensor]:
        """Thermal and Power (one GET each) where the Chassis has them, else its Sensors."""
        chassis = self.chassis()
        out: list[site_pb2.BmcSensor] = []
        thermal, power = link(chassis, "Thermal"), link(chassis, "Power")
        if thermal:
            doc = self.get(thermal)
            for t in dicts(doc.get("Temperatures")):
                out.append(sensor(t, "temperature", t.get("ReadingCelsius"), "Cel"))
            for f in dicts(doc.get("Fans")):
                units = "RPM" if f.get("ReadingUnits", "RPM") == "RPM" else "%"
                out.append(sensor(f, "fan", f.get("Reading", f.get("ReadingRPM")), units))
        if power:
            doc = self.get(power)
            for p in dicts(doc.get("PowerSupplies")):
                watts = p.get("LastPowerOutputWatts", p.get("PowerOutputWatts"))
                out.append(sensor(p, "power_supply", watts, "W"))
            for v in dicts(doc.get("Voltages")):
                out.append(sensor(v, "voltage", v.get("ReadingVolts"), "V"))
            for c in dicts(doc.get("PowerControl")):
                out.append(sensor(c, "power", c.get("PowerConsumedWatts"), "W"))
        if not thermal and not power and link(chassis, "Sensors"):
            kinds = {"Temperature": ("temperature", "Cel"), "Rotational": ("fan", "RPM"),
                     "Power": ("power", "W"), "Voltage": ("voltage", "V")}
            for ref in self.members(link(chassis, "Sensors"))[:256]:
                doc = self.get(ref)
                kind, units = kinds.get(text(doc.get("ReadingType")), ("", ""))
                if kind:
                    out.append(sensor(doc, kind, doc.get("Reading"), text(doc.get("ReadingUnits")) or units))
        elif not thermal and not power:
            raise Unsupported("the Chassis has neither Thermal/Power nor Sensors")
        return out

    # -- rotation ------------------------------------------------------------------------

    def set_password(self, username: str, new_password: str) -> None:
        service = link(self.root(), "AccountService")
        if not service:
            raise Unsupported(f"Redfish BMC {self.target.address} has no AccountService")
        accounts = link(self.get(service), "Accounts")
        for ref in self.members(accounts) if accounts else []:
            if self.get(ref).get("UserName") == username:
                self._secrets.append(new_password)
                try:
                    self.patch(ref, {"Password": new_password})
                finally:
                    self._secrets.remove(new_password)
                log.info("Redfish %s: password of %r changed", self.target.address, username)
                return
        raise BmcRefused(f"Redfish BMC {self.target.address} has no account {username!r}")


    # -- firmware (agent/site/bmc/redfish/firmware.py) ----------------------------------------

    def firmware_update(
        self,
        *,
        image_uri: str = "",
        file: Path | None = None,
        sha256: str = "",
        transfer_protocol: str = "",
        progress: Callable[[int, str], None] | None = None,
    ) -> site_pb2.BmcFirmwareTask:
        return redfish_firmware.update(self, image_uri=image_uri, file=file, sha256=sha256,
                                       transfer_protocol=transfer_protocol, progress=progress)

    def firmware_status(self, task_uri: str = "") -> site_pb2.BmcOperationResult:
        return redfish_firmware.status(self, task_uri)

    # -- storage -------------------------------------------------------------------------

    def _storage_refs(self) -> list[str]:
        system = self.system()
        ref = link(system, "Storage")
        if not ref:
            only = " (only SimpleStorage, which has no volumes)" if link(system, "SimpleStorage") else ""
            raise Unsupported(f"Redfish BMC {self.target.address}: the System has no Storage{only}")
        return self.members(ref)

    def storage(self) -> list[site_pb2.BmcStorageController]:
        """The System's Storage (controllers, drives, volumes); where it has none, its
        SimpleStorage (older BMCs, and DMTF's public-rackmount1 mockup): each controller with
        the devices present in its bays, no volumes."""
        system = self.system()
        simple = link(system, "SimpleStorage")
        if not link(system, "Storage") and simple:
            return [self._simple_storage(self.get(ref)) for ref in self.members(simple)]
        out: list[site_pb2.BmcStorageController] = []
        for ref in self._storage_refs():
            doc = self.get(ref)
            ctl = site_pb2.BmcStorageController(id=text(doc.get("Id")), name=text(doc.get("Name")))
            for drive_ref in [text(d.get("@odata.id")) for d in dicts(doc.get("Drives"))]:
                drive = self.get(drive_ref)
                ctl.drives.add(
                    id=text(drive.get("Id")), model=text(drive.get("Model")),
                    serial=text(drive.get("SerialNumber")), capacity_bytes=count(drive.get("CapacityBytes")),
                    media_type=text(drive.get("MediaType")), protocol=text(drive.get("Protocol")),
                    health=text(drive.get("Status", {}).get("Health")),
                )
            volumes = link(doc, "Volumes")
            for vol_ref in self.members(volumes) if volumes else []:
                ctl.volumes.append(self._volume(self.get(vol_ref)))
            out.append(ctl)
        return out

    @staticmethod
    def _simple_storage(doc: Doc) -> site_pb2.BmcStorageController:
        """A SimpleStorage resource: its Devices (no Id of their own: named by their bay), an
        Absent bay left out."""
        ctl = site_pb2.BmcStorageController(id=text(doc.get("Id")), name=text(doc.get("Name")))
        for number, device in enumerate(dicts(doc.get("Devices")), 1):
            status = device.get("Status")
            status = status if isinstance(status, dict) else {}
            if status.get("State") == "Absent":
                continue
            ctl.drives.add(id=text(device.get("Name")) or f"device-{number}", model=text(device.get("Model")),
                           capacity_bytes=count(device.get("CapacityBytes")),
                           health=text(status.get("Health")))
        return ctl

    @staticmethod
    def _volume(doc: Doc) -> site_pb2.BmcVolume:
        drives = [text(d.get("@odata.id")).rstrip("/").rsplit("/", 1)[-1]
                  for d in dicts(doc.get("Links", {}).get("Drives"))]
        return site_pb2.BmcVolume(
            id=text(doc.get("Id")), name=text(doc.get("Name")),
            capacity_bytes=count(doc.get("CapacityBytes")),
            raid_type=text(doc.get("RAIDType") or doc.get("VolumeType")), drives=drives,
        )

    def _controller(self, controller_id: str) -> Doc:
        for ref in self._storage_refs():
            doc = self.get(ref)
            if doc.get("Id") == controller_id:
                return doc
        raise BmcRefused(f"Redfish BMC {self.target.address} has no storage controller {controller_id!r}")

    def create_volume(
        self, controller_id: str, *, name: str, raid_type: str, drives: list[str], capacity_bytes: int
    ) -> site_pb2.BmcVolume:
        ctl = self._controller(controller_id)
        volumes = link(ctl, "Volumes")
        if not volumes:
            raise Unsupported(f"Redfish BMC {self.target.address}: controller {controller_id} has no Volumes")
        collection = self.send("GET", volumes)
        allow = collection.headers.get("allow", "")
        if allow and "POST" not in allow.upper():
            raise Unsupported(f"Redfish BMC {self.target.address} does not create volumes (Allow: {allow})")
        by_id = {text(d.get("@odata.id")).rstrip("/").rsplit("/", 1)[-1]: text(d.get("@odata.id"))
                 for d in dicts(ctl.get("Drives"))}
        missing = [d for d in drives if d not in by_id]
        if missing:
            raise BmcRefused(f"Redfish BMC {self.target.address}: no drive {missing} on {controller_id}")
        body: Doc = {"Name": name}
        if raid_type:
            body["RAIDType"] = raid_type
        if capacity_bytes:
            body["CapacityBytes"] = capacity_bytes
        if drives:
            body["Links"] = {"Drives": [{"@odata.id": by_id[d]} for d in drives]}
        answer = self.send("POST", volumes, json_body=body, ok=(405, 501))
        if answer.status in (405, 501):
            raise Unsupported(
                f"Redfish BMC {self.target.address} does not create volumes (HTTP {answer.status})"
            )
        location = answer.headers.get("location", "")
        if answer.status == 202 and location:
            task = redfish_firmware.follow_task(self, location, None)
            if task.state != "Completed":
                raise BmcRefused(f"volume creation ended {task.state}: {'; '.join(task.messages)}")
            location = ""
        if answer.doc.get("Id"):
            return self._volume(answer.doc)
        if location:
            return self._volume(self.get(location))
        for ref in self.members(volumes):
            doc = self.get(ref)
            if doc.get("Name") == name:
                return self._volume(doc)
        raise BmcRefused(f"Redfish BMC {self.target.address} accepted the volume but does not list it")

    def delete_volume(self, volume_id: str) -> None:
        for ref in self._storage_refs():
            volumes = link(self.get(ref), "Volumes")
            for vol_ref in self.members(volumes) if volumes else []:
                if vol_ref.rstrip("/").rsplit("/", 1)[-1] == volume_id:
                    answer = self.send("DELETE", vol_ref, ok=(405, 501))
                    if answer.status in (405, 501):
                        raise Unsupported(f"Redfish BMC {self.target.address} does not delete"
                                          f" volumes (HTTP {answer.status})")
                    return
        raise BmcRefused(f"Redfish BMC {self.target.address} has no volume {volume_id!r}")

    # -- virtual media -------------------------------------------------------------------

    def _media_refs(self) -> list[str]:
        """The System's VirtualMedia (newer BMCs), else the Manager's."""
        ref = link(self.system(), "VirtualMedia") or link(self.manager(), "VirtualMedia")
        if not ref:
            raise Unsupported(f"Redfish BMC {self.target.address} has no VirtualMedia")
        return self.members(ref)

    def virtual_media(self) -> list[site_pb2.BmcVirtualMedia]:
        out: list[site_pb2.BmcVirtualMedia] = []
        for ref in self._media_refs():
            out.append(_media_of(self.get(ref)))
        return out

    def insert_media(self, image_url: str, *, media_type: str = "CD") -> site_pb2.BmcVirtualMedia:
        """Insert ``image_url`` into the first drive that takes ``media_type``; the drive as
        read back afterwards (the caller checks that it holds the image)."""
        http.check_url(image_url)
        for ref in self._media_refs():
            doc = self.get(ref)
            if media_type not in doc.get("MediaTypes", []):
                continue
            if doc.get("Inserted") is True:
                self._eject(ref, doc)
            action = doc.get("Actions", {}).get("#VirtualMedia.InsertMedia", {})
            if isinstance(action, dict) and action.get("target"):
                self.send("POST", action["target"],
                          json_body={"Image": image_url, "Inserted": True, "WriteProtected": True})
            else:
                self.patch(ref, {"Image": image_url, "Inserted": True})
            # The file's name alone: a path may hold a capability (the site's /vm/<token>/).
            log.info("Redfish %s: …/%s inserted into %s", self.target.address,
                     http.redact(image_url).rsplit("/", 1)[-1], doc.get("Id"))
            return _media_of(self.get(ref))
        raise Unsupported(f"Redfish BMC {self.target.address} has no virtual {media_type} drive")

    def eject_media(self) -> None:
        for ref in self._media_refs():
            doc = self.get(ref)
            if doc.get("Inserted") is True or doc.get("Image"):
                self._eject(ref, doc)

    def _eject(self, ref: str, doc: Doc) -> None:
        action = doc.get("Actions", {}).get("#VirtualMedia.EjectMedia", {})
        if isinstance(action, dict) and action.get("target"):
            self.send("POST", action["target"], json_body={})
        else:
            self.patch(ref, {"Image": None, "Inserted": False})


# -- small readers of Redfish JSON ---------------------------------------------------------


def _media_of(doc: Doc) -> site_pb2.BmcVirtualMedia:
    return site_pb2.BmcVirtualMedia(
        id=text(doc.get("Id")), image=text(doc.get("Image")), inserted=doc.get("Inserted") is True,
        media_types=[text(t) for t in doc.get("MediaTypes", []) if isinstance(t, str)],
    )


def link(doc: Doc, name: str) -> str:
    """``doc[name]["@odata.id"]``, or "" when absent."""
    value = doc.get(name)
    if isinstance(value, dict):
        ref = value.get("@odata.id", "")
        return ref if isinstance(ref, str) else ""
    return ""


def same_path(a: object, b: str) -> bool:
    return isinstance(a, str) and a.rstrip("/") == b.rstrip("/")


def text(value: object) -> str:
    return value.strip() if isinstance(value, str) else "" if value is None else str(value)


def dicts(value: object) -> list[Doc]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def normal_mac(value: object) -> str:
    if not isinstance(value, str):
        return ""
    hexdigits = value.replace(":", "").replace("-", "").replace(".", "").lower()
    if len(hexdigits) != 12 or any(c not in "0123456789abcdef" for c in hexdigits):
        return ""
    return ":".join(hexdigits[i:i + 2] for i in range(0, 12, 2))


def sensor(doc: Doc, kind: str, reading: object, units: str) -> site_pb2.BmcSensor:
    msg = site_pb2.BmcSensor(name=text(doc.get("Name") or doc.get("MemberId") or doc.get("Id")), kind=kind,
                             units=units, health=text(doc.get("Status", {}).get("Health")))
    if isinstance(reading, int | float) and not isinstance(reading, bool):
        msg.reading = float(reading)
        msg.has_reading = True
    return msg
