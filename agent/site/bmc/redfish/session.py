"""The Redfish session: one BMC's transport, login, the kept connection and paths, pacing.

    s = RedfishSession(Target("10.0.0.5", Credentials("admin", pw)), CallContext(cancel, deadline))
    try:
        s.get(s.system_ref())
    finally:
        s.close()                                 # DELETEs the session

Every other module of this package (system, storage, media, firmware, events, tasks) is a
set of functions over a ``RedfishSession``; ``client.RedfishClient`` is the session with the
``BmcClient`` methods that call them.

Auth: a session (POST to the service root's ``Links.Sessions`` with our ``Context``, then
``X-Auth-Token``; the session is DELETEd on close and opened again once if the BMC drops it;
at the first contact since the daemon started, the sessions a crash left are closed:
``_close_stale``), or HTTP basic auth when the BMC offers no session service. A 401 raises
AuthFailed at once: wrong credentials are never retried (BMCs lock accounts out). TLS is
verified unless ``verify_tls`` is False; an address may carry ``http://`` for a lab BMC (the
emulator), ``https://`` is the default.

Every request goes through ``http.request``, GETs (and the session's DELETE) over one kept-alive
connection per client (one TLS handshake per command, not per request): connection errors,
5xx, "busy" answers and (for GETs) bodies that are not JSON are retried with backoff from
``Pacing`` (never faster than ``min_interval``), bounded by the command's cancel event and
deadline, which cut a request short even while the BMC is sending (a BMC that drips a byte a
second; each answer in full within ANSWER_TIMEOUT). A POST or PATCH is sent again only where
the BMC did not take it (429, 503, busy, never connected); an ambiguous answer raises
``Unconfirmed`` and ``write`` reads back instead. An answer that was cut, timed out or did not
parse leaves nothing to the next command (``leave``). The vendor's row
(agent/site/bmc/redfish/vendors.py) is ``vendor()``. The BMC's own error
text (``error.message`` and ``@Message.ExtendedInfo``) is kept in BmcRefused's message. Every
``@odata.id`` or Location the BMC gives is checked to stay on the BMC's own host before it is
followed. The password is never logged, returned or kept in an error message: if a BMC echoes
it back, it is replaced by ``<hidden>``.
"""

from __future__ import annotations

import base64
import http.client as http_client
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import limits
from agent.errors import (
    AgentError,
    AuthFailed,
    BmcRefused,
    BmcUnreachable,
    Cancelled,
    InvalidParameters,
    Unsupported,
)
from agent.net import http
from agent.site.bmc.client import CallContext, Credentials, Target, Unconfirmed, shown_address
from agent.site.bmc.redfish import vendors

log = logging.getLogger(__name__)

Doc = dict[str, Any]

ROOT = "/redfish/v1/"
SESSION_CONTEXT = "bettercompute-agent site"   # a session's Context: how the daemon finds its own
MAX_STALE_SESSIONS = 32      # a crash's sessions closed at first contact, at most
MAX_RETRIES = 4
MAX_BODY = http.MAX_BODY  # a BMC's JSON answer, at most (a service root is a few KiB)
REQUEST_TIMEOUT = 30.0       # per connect, per read
ANSWER_TIMEOUT = 60.0        # one whole answer, however its bytes come (a BMC that drips)
REDFISH_DEPTH = 64            # objects and arrays inside each other in an answer ($expand, Oem)
MAX_RAW_MESSAGE = 64 * 1024   # of a non-JSON error body, what is redacted before its start is kept
_BUSY_WORDS = (b"busy", b"temporarilyunavailable", b"initialization in progress", b"initializing",
               b"resourceinuse")


@dataclass
class Discovered:
    """What a command learnt of one BMC that the next command on it may use (kept in the
    runtime's ``Kept``, agent/commands/base.py, under the BMC's key "bmc:<address>"): the
    service root, the System, Manager and Chassis paths, and the idle kept-alive connection.
    Used only by a client of the same base URL and TLS settings; a path that answers 404 later
    is discovered again (``RedfishSession._resource``)."""

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


def _json(body: bytes, what: str) -> Any:
    """A BMC's JSON, read bounded (agent/limits.py): a document nested deeper than
    REDFISH_DEPTH, or not JSON, is an AgentError the callers name as the BMC's bad answer."""
    return limits.loads_json(body, what=f"the BMC's {what}", max_bytes=max(len(body), 1),
                             max_depth=REDFISH_DEPTH)


def bmc_message(body: bytes, hide: Callable[[str], str] = str) -> str:
    """The BMC's own words from a Redfish error body: error.message and every
    @Message.ExtendedInfo Message (or MessageId), joined; the raw start when it is not JSON.
    ``hide`` redacts each piece before anything is cut, so no part of a secret survives."""
    try:
        doc = _json(body, "error body")
    except AgentError:
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
    """An answer that refused the request before acting on it, for now: iDRAC's SYS518 (503,
    the Lifecycle Controller's job queue), a 400 or 409 that says busy or initializing."""
    if resp.status in (400, 409, 503):
        lowered = resp.body.lower()
        return any(word in lowered for word in _BUSY_WORDS)
    return False


def _not_json(resp: http.Response) -> bool:
    """A 200 to a GET whose body is not a JSON object (an empty one included): a BMC still
    starting, or an answer cut short; asked again, never kept."""
    if resp.status != 200:
        return False
    try:
        return not isinstance(_json(resp.body, "answer"), dict)
    except AgentError:
        return True



class RedfishSession:
    """One BMC's Redfish service, as one command uses it; see the module docstring."""

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
        self._vendor: vendors.Vendor | None = None
        self._suspect = False           # an answer was cut, timed out or did not parse: keep nothing
        self._first_contact = known is None   # no command on this BMC since the daemon started
        self.partial: list[str] = []    # what this command could not read ("events: ...")
        self.readback: list[str] = []   # what an ambiguous write was read back as (system._reset)
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
        row = self._known_vendor()
        if row is not None and row.accept_encoding:
            hdrs["Accept-Encoding"] = row.accept_encoding
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
            if exc.response is None:    # sent, and no answer: the BMC may have acted on it
                self.attempts += int(exc.details.get("attempts", "1") or 1)
                self._suspect = True
                raise Unconfirmed(f"Redfish BMC {self.target.address}: {exc.message}; the BMC may"
                                  " have acted on it", ambiguous="true") from exc
            resp = exc.response         # a 5xx to a write: its message read (_answer), never resent
        except http.BodyTooLarge as exc:
            self.attempts += 1
            raise BmcRefused(f"Redfish BMC {self.target.address}: {exc.message}; a Redfish "
                             "resource is a few KiB", status=exc.status) from exc
        except Cancelled:
            self._suspect = True
            raise
        except http.HttpError as exc:
            self.attempts += int(exc.details.get("attempts", "1") or 1)
            self._suspect = True
            where = f"Redfish BMC {self.target.address}"
            if exc.details.get("tls") == "untrusted":
                raise BmcUnreachable(
                    f"{where}: its TLS certificate is not trusted; give the BMC's CA, or set"
                    f" verify_tls false for a self-signed BMC ({exc.message})", tls="untrusted"
                ) from exc
            raise BmcUnreachable(f"{where}: {exc.message}") from exc
        self.attempts += resp.attempts
        return resp

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
            if method in ("POST", "PATCH") and resp.status in (408, 500, 502, 504):
                raise Unconfirmed(
                    f"{where}: HTTP {resp.status}" + (f": {said}" if said else "")
                    + "; the BMC may have acted on it", status=resp.status, bmc_message=said,
                    ambiguous="true")
            raise BmcRefused(
                f"{where}: HTTP {resp.status}{retried}" + (f": {said}" if said else ""),
                status=resp.status, bmc_message=said,
            )
        doc: Doc = {}
        if resp.body.strip():
            try:
                parsed = _json(resp.body, "answer")
            except AgentError as exc:
                self._suspect = True
                raise BmcRefused(
                    f"{where}: the BMC answered HTTP {resp.status} with invalid JSON"
                    f" (after {resp.attempts} attempts)", status=resp.status
                ) from exc
            if not isinstance(parsed, dict):
                self._suspect = True
                raise BmcRefused(f"{where}: the BMC answered with JSON that is not an object")
            doc = parsed
        elif method == "GET" and resp.status == 200:
            self._suspect = True
            raise BmcRefused(f"{where}: the BMC answered HTTP 200 with no body"
                             f" (after {resp.attempts} attempts)", status=200)
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
                if self._first_contact:
                    self._first_contact = False
                    self._close_stale(sessions, self._auth)
                return self._auth
        pair = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        self._auth = {"Authorization": f"Basic {pair}"}
        log.debug("Redfish %s: no session service, basic auth", self.target.address)
        return self._auth

    def _open_session(self, sessions: str, creds: Credentials) -> Answer | None:
        """The answer to POSTing a session; None when the BMC does not offer sessions. Refused
        as full (503 after the bounded retries: iDRAC's RAC0218) at the first contact since the
        daemon started, the sessions a crash left are closed (read with basic auth: the
        credentials are the ones the POST sent, and 401 is not what it answered) and the POST
        is sent once more."""
        body = {"UserName": creds.username, "Password": creds.password, "Context": SESSION_CONTEXT}
        answer = self.send("POST", sessions, json_body=body, auth=False, ok=(404, 405, 501, 503))
        if answer.status == 503 and self._first_contact:
            self._first_contact = False
            pair = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            if self._close_stale(sessions, {"Authorization": f"Basic {pair}"}):
                answer = self.send("POST", sessions, json_body=body, auth=False, ok=(404, 405, 501, 503))
        if answer.status == 503:
            said = bmc_message(json.dumps(answer.doc).encode(), self.hide)
            raise BmcRefused(f"Redfish BMC {self.target.address}: no session to be had (HTTP 503)"
                             + (f": {said}" if said else ""), status=503, bmc_message=said)
        return None if answer.status in (404, 405, 501) else answer

    def _close_stale(self, sessions: str, auth: dict[str, str]) -> int:
        """At the first contact with a BMC since the daemon started (no command on it is kept
        in the daemon's memory): DELETE the sessions of this user that a daemon of this site
        opened (their Context says so) and a crash left open, never the one in use (a BMC
        allows few: iDRAC 8, then RAC0218). A BMC that does not list sessions or their Context
        is left as it is. How many were closed."""
        user, closed = self.target.credentials.username, 0
        mine = self._session_uri.rstrip("/").rsplit("/", 1)[-1] if self._session_uri else ""
        try:
            listed = self.send("GET", sessions, auth=False, headers=auth, ok=(401, 403, 404, 405))
            refs = [str(m.get("@odata.id")) for m in dicts(listed.doc.get("Members"))
                    if m.get("@odata.id")][:MAX_STALE_SESSIONS] if listed.status == 200 else []
            for ref in refs:
                if mine and ref.rstrip("/").rsplit("/", 1)[-1] == mine:
                    continue
                doc = self.send("GET", ref, auth=False, headers=auth, ok=(401, 403, 404)).doc
                if doc.get("Context") == SESSION_CONTEXT and doc.get("UserName") == user:
                    self.send("DELETE", ref, auth=False, headers=auth, ok=(401, 403, 404, 405))
                    closed += 1
                    log.info("Redfish %s: closed a session a crash left open (%s)", self.target.address,
                             ref.rsplit("/", 1)[-1])
        except (BmcRefused, BmcUnreachable) as exc:
            log.info("Redfish %s: stale sessions not checked: %s", self.target.address, exc)
        return closed

    def check_login(self, credentials: Credentials) -> bool:
        """Opens (and closes) a session with ``credentials``; with basic auth, GETs the Systems."""
        probe = RedfishSession(
            Target(self.target.address, credentials, self.target.verify_tls, self.target.ca_file), self.call
        )
        probe._root, probe._first_contact = self.root(), False
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
        if self._suspect:      # an answer was cut, timed out or did not parse: keep nothing of it
            self.connections.close()
            return Discovered(self.base, self.target.verify_tls, self.target.ca_file, None, {})
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
            if not refs and self._known:     # never "unsupported" from what an earlier command saw
                self._root, self._paths, self._known = None, {}, False
                return self._first(key, collection)
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

    def patch(self, ref: str, body: Doc) -> Answer:
        """PATCH with If-Match when the resource has an ETag (some BMCs require it): the ETag of
        the GET just made of it, else of a GET now; a weak one in its strong form where the
        vendor's row says so. A 412 to one form (weak or strong) is a PATCH not applied: the
        other form is sent once (iLO firmware differs on which it matches), never a third."""
        etag = self.as_read(ref).headers.get("etag", "")
        if not etag:
            return self.send("PATCH", ref, json_body=body)
        strong = etag.removeprefix("W/")
        first = strong if self.vendor().strong_if_match else etag
        other = f"W/{strong}" if first == strong else strong
        answer = self.send("PATCH", ref, json_body=body, headers={"If-Match": first}, ok=(412,))
        if answer.status == 412:
            log.info("Redfish %s: If-Match %s refused (412, not applied); its other form once",
                     self.target.address, "weak" if first.startswith("W/") else "strong")
            answer = self.send("PATCH", ref, json_body=body, headers={"If-Match": other})
        return answer

    def write(self, method: str, ref: str, body: Doc, *, taken: Callable[[], bool],
              etag: bool = False) -> Answer | None:
        """POST or PATCH ``body`` once (a PATCH with If-Match when ``etag``); on an ambiguous
        answer (``Unconfirmed``) it is never sent again: ``taken()`` reads back whether the BMC
        did what was asked, and None is returned when it did; Unconfirmed is raised when not."""
        try:
            if method == "PATCH" and etag:
                return self.patch(ref, body)
            return self.send(method, ref, json_body=body)
        except Unconfirmed as exc:
            if self.call.cancel.is_set():
                raise
            if taken():
                log.warning("Redfish %s: %s answered ambiguously (%s) but reads back as asked",
                            self.target.address, method, exc.details.get("status", "no answer"))
                return None
            raise

    def _known_vendor(self) -> vendors.Vendor | None:
        """The vendor's row where it is known without asking the BMC anything more: named by
        the operator, detected, or named by the service root already read; else None."""
        if self._vendor is not None:
            return self._vendor
        if self.target.vendor:
            return vendors.VENDORS[self.target.vendor]
        if self._root is not None and not vendors.needs_manager(self._root):
            return vendors.detect(self._root, None)
        return None

    def vendor(self) -> vendors.Vendor:
        """The row of agent/site/bmc/redfish/vendors.py for this BMC: the operator's (the
        Target's ``vendor``), else detected from the service root (and the Manager)."""
        if self._vendor is None:
            named = self.target.vendor
            if named:
                self._vendor = vendors.VENDORS[named]
            else:
                root = self.root()
                manager: Doc | None = None
                if vendors.needs_manager(root) and link(root, "Managers"):
                    try:
                        manager = self.manager()
                    except (BmcRefused, Unsupported) as exc:    # no Manager to read: generic
                        log.debug("Redfish %s: no Manager for the vendor: %s", self.target.address, exc)
                self._vendor = vendors.detect(root, manager)
            log.debug("Redfish %s: vendor profile %s", self.target.address, self._vendor.name)
        return self._vendor


# -- small readers of Redfish JSON ---------------------------------------------------------


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


