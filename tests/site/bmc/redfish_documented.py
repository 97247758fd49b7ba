"""A TEST SERVER, NOT AN EMULATOR: a loopback Redfish service that answers what the DMTF
Redfish specification (DSP0266) and schema document, for the paths sushy-emulator lacks.

It is not a BMC and proves only that the client speaks the documented protocol:
- SessionService: POST /redfish/v1/SessionService/Sessions {UserName, Password} -> 201 with
  ``X-Auth-Token`` and ``Location``; DELETE of that Location ends the session (DSP0266 §13.3).
- AccountService: Accounts members with UserName; PATCH {"Password"} (AccountService schema).
- ComputerSystem.Reset with ResetType@Redfish.AllowableValues that include PowerCycle.
- UpdateService: SimpleUpdate (ImageURI, TransferProtocol) and MultipartHttpPushUri
  (UpdateParameters + UpdateFile parts); both answer 202 + Location of a task monitor, which
  answers 202 with the Task while it runs and the Task (TaskState Completed or Exception, with
  Messages) when it ends (DSP0266 §12.2, "Asynchronous operations").
- Storage Volumes: POST to the collection -> 201 + Location; DELETE a volume -> 204; or 405
  where ``volumes_offered`` is False (the collection's Allow header says GET only).
- Errors: a body ``{"error": {"message", "@Message.ExtendedInfo": [{"MessageId","Message"}]}}``.
- VirtualMedia on the Manager without actions (older BMCs): PATCH Image and Inserted (or,
  with ``media_sticks`` False, a BMC that answers the PATCH and keeps the drive empty).
- ResetType AllowableValues given through ``@Redfish.ActionInfo`` when ``action_info``.
- UpdateService FirmwareInventory: SoftwareInventory members (Name, Version, Updateable), read
  one by one; LogServices of the Manager (SEL, its entries expanded in the collection and split
  over two pages by Members@odata.nextLink) and of the System (entries only linked), LogEntry
  with Created, Severity, Message, SensorType (LogService and LogEntry schemas).
- Chassis with the newer Sensors collection (Sensor schema: ReadingType, Reading, ReadingUnits)
  instead of Thermal/Power.
Faults on request: ``fail`` maps (method, path) to a status or "badjson" answered every time.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from typing import Any

from tests.loopback_http import ScriptedServer, Seen

SYS = "/redfish/v1/Systems/1"
MGR = "/redfish/v1/Managers/bmc"
CHA = "/redfish/v1/Chassis/1"
SESSIONS = "/redfish/v1/SessionService/Sessions"
ACCOUNTS = "/redfish/v1/AccountService/Accounts"
UPDATE = "/redfish/v1/UpdateService"
STORAGE = f"{SYS}/Storage/RAID.1"
VOLUMES = f"{STORAGE}/Volumes"
JSON = {"Content-Type": "application/json"}

Reply = tuple[int, dict[str, str], bytes]

LOG_ENTRIES = [
    {"Id": "1", "Created": "2026-11-30T08:00:00+00:00", "Severity": "OK", "Message": "System boot",
     "SensorType": "OS Boot"},
    {"Id": "2", "Created": "2026-12-01T19:58:10Z", "Severity": "Warning", "SensorType": "Temperature",
     "Message": "The system inlet temperature is greater than the upper warning threshold."},
    {"Id": "3", "Created": "2026-12-01T20:02:00+01:00", "Severity": "Critical", "SensorType": "Power Supply",
     "Message": "Power supply 2 is lost."},
    {"Id": "1", "Created": "2026-12-01T20:30:00Z", "Severity": "Critical", "EntryType": "Event",
     "Message": "GPU 3 is not responding on PCIe."},
]


def error_body(message: str, message_id: str = "Base.1.8.GeneralError") -> bytes:
    return json.dumps({"error": {
        "code": message_id, "message": "A general error has occurred. See ExtendedInfo for more information.",
        "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message, "Severity": "Critical"}],
    }}).encode()


class DocumentedBmc:
    def __init__(self, *, username: str, password: str, sessions: bool = True,
                 volumes_offered: bool = True, task_polls: int = 2, task_fails: bool = False,
                 tls: tuple[str, str] | None = None) -> None:
        self.server = ScriptedServer(tls=tls)
        self.guard = threading.Lock()
        self.accounts = {username: password}
        self.sessions_offered = sessions
        self.tokens: dict[str, str] = {}           # token -> session path
        self.issued: list[str] = []                # every token ever handed out
        self.deleted_sessions: list[str] = []
        self.power = "Off"
        self.resets: list[str] = []
        self.volumes: dict[str, dict[str, Any]] = {}
        self.volumes_offered = volumes_offered
        self.task_polls = task_polls
        self.task_fails = task_fails
        self.task_seen = 0
        self.pushed: bytes = b""
        self.fail: dict[tuple[str, str], int | str] = {}
        self.media: dict[str, Any] = {"Inserted": False, "Image": None}
        self.media_sticks = True            # False: a PATCH of the CD is answered 204 and ignored
        self.action_info = False            # Reset's ResetTypes in @Redfish.ActionInfo instead
        self._routes()

    # -- plumbing ------------------------------------------------------------------------

    def __enter__(self) -> DocumentedBmc:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    @property
    def address(self) -> str:
        """The server's URL root (http, or https with ``tls``)."""
        return f"{self.server.scheme}://{self.server.address}"

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def _authorized(self, seen: Seen) -> bool:
        token = seen.headers.get("X-Auth-Token", "")
        if token:
            return token in self.tokens
        auth = seen.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return self.accounts.get(user) == password
        return False

    def route(self, method: str, path: str, fn: Any, *, public: bool = False) -> None:
        def guarded(seen: Seen) -> Reply:
            fault = self.fail.get((method, path))
            if fault == "badjson":
                return 200, JSON, b"{not json"
            if isinstance(fault, int):
                return fault, JSON, error_body(f"injected HTTP {fault}")
            if not public and not self._authorized(seen):
                return 401, JSON, error_body("Invalid credentials", "Base.1.8.NoValidSession")
            with self.guard:
                result: Reply = fn(seen)
                return result

        self.server.route(method, path, guarded)

    @staticmethod
    def ok(doc: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Reply:
        return status, {**JSON, **(headers or {})}, json.dumps(doc).encode()

    # -- resources -----------------------------------------------------------------------

    def _routes(self) -> None:
        ok = self.ok
        root: dict[str, Any] = {
            "@odata.id": "/redfish/v1/", "RedfishVersion": "1.15.0",
            "Systems": {"@odata.id": "/redfish/v1/Systems"},
            "Managers": {"@odata.id": "/redfish/v1/Managers"},
            "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
            "AccountService": {"@odata.id": "/redfish/v1/AccountService"},
            "UpdateService": {"@odata.id": UPDATE},
        }
        if self.sessions_offered:
            root["SessionService"] = {"@odata.id": "/redfish/v1/SessionService"}
            root["Links"] = {"Sessions": {"@odata.id": SESSIONS}}
        self.route("GET", "/redfish/v1/", lambda s: ok(root), public=True)
        for coll, member in (("Systems", SYS), ("Managers", MGR), ("Chassis", CHA)):
            self.route("GET", f"/redfish/v1/{coll}",
                       lambda s, m=member: ok({"Members": [{"@odata.id": m}], "Members@odata.count": 1}))
        self.route("GET", SYS, lambda s: ok(self._system()))
        self.route("POST", f"{SYS}/Actions/ComputerSystem.Reset", self._reset)
        self.route("GET", MGR, lambda s: ok({"@odata.id": MGR, "FirmwareVersion": "2.81",
                                             "VirtualMedia": {"@odata.id": f"{MGR}/VirtualMedia"},
                                             "LogServices": {"@odata.id": f"{MGR}/LogServices"},
                                             "Links": {"ManagerForServers": [{"@odata.id": SYS}]}}))
        # virtual media on the Manager, an older BMC's: no actions, PATCH Image and Inserted
        self.route("GET", f"{MGR}/VirtualMedia", lambda s: ok({"Members": [
            {"@odata.id": f"{MGR}/VirtualMedia/Floppy"}, {"@odata.id": f"{MGR}/VirtualMedia/CD"}]}))
        self.route("GET", f"{MGR}/VirtualMedia/Floppy", lambda s: ok(
            {"Id": "Floppy", "MediaTypes": ["Floppy", "USBStick"], "Inserted": False, "Image": None}))
        self.route("GET", f"{MGR}/VirtualMedia/CD", lambda s: ok(
            {"Id": "CD", "MediaTypes": ["CD", "DVD"], **self.media}))
        self.route("PATCH", f"{MGR}/VirtualMedia/CD", self._patch_media)
        self.route("GET", f"{SYS}/ResetActionInfo", lambda s: ok({"Parameters": [
            {"Name": "ResetType", "AllowableValues": ["On", "ForceOff", "ForceRestart"]}]}))
        self.route("GET", CHA, lambda s: ok({"@odata.id": CHA, "Sensors": {"@odata.id": f"{CHA}/Sensors"}}))
        sensors = {
            "CPU1Temp": {"ReadingType": "Temperature", "Reading": 48.5, "ReadingUnits": "Cel"},
            "Fan1": {"ReadingType": "Rotational", "Reading": 7200, "ReadingUnits": "RPM"},
            "PSU1Power": {"ReadingType": "Power", "Reading": None, "ReadingUnits": "W"},
        }
        self.route("GET", f"{CHA}/Sensors", lambda s: ok(
            {"Members": [{"@odata.id": f"{CHA}/Sensors/{n}"} for n in sensors]}))
        for name, doc in sensors.items():
            self.route("GET", f"{CHA}/Sensors/{name}", lambda s, n=name, d=doc: ok(
                {"Id": n, "Name": n, **d, "Status": {"Health": "OK"}}))
        self.route("GET", f"{SYS}/EthernetInterfaces", lambda s: ok(
            {"Members": [{"@odata.id": f"{SYS}/EthernetInterfaces/NIC.1"}]}))
        self.route("GET", f"{SYS}/EthernetInterfaces/NIC.1", lambda s: ok(
            {"Id": "NIC.1", "MACAddress": "B8-CE-F6-00-11-22", "LinkStatus": "LinkUp"}))
        # sessions
        self.route("POST", SESSIONS, self._login, public=True)
        # accounts
        self.route("GET", "/redfish/v1/AccountService", lambda s: ok({"Accounts": {"@odata.id": ACCOUNTS}}))
        self.route("GET", ACCOUNTS, lambda s: ok({"Members": [{"@odata.id": f"{ACCOUNTS}/2"}]}))
        self.route("GET", f"{ACCOUNTS}/2", lambda s: ok({"Id": "2", "UserName": next(iter(self.accounts))}))
        self.route("PATCH", f"{ACCOUNTS}/2", self._password)
        # update service
        firmware = {"BMC": ("iDRAC", "7.00.30.00", True), "BIOS": ("BIOS", "2.19.1", True),
                    "GPU0": ("GPU 0 VBIOS", "96.00.74.00.01", False)}
        self.route("GET", f"{UPDATE}/FirmwareInventory", lambda s: ok(
            {"Members": [{"@odata.id": f"{UPDATE}/FirmwareInventory/{n}"} for n in firmware]}))
        for fid, (name, version, updateable) in firmware.items():
            doc = {"Id": fid, "Name": name, "Version": version, "Updateable": updateable}
            self.route("GET", f"{UPDATE}/FirmwareInventory/{fid}", lambda s, d=doc: ok(d))
        self._log_routes()
        self.route("GET", UPDATE, lambda s: ok({
            "FirmwareInventory": {"@odata.id": f"{UPDATE}/FirmwareInventory"},
            "Actions": {"#UpdateService.SimpleUpdate": {
                "target": f"{UPDATE}/Actions/UpdateService.SimpleUpdate",
                "TransferProtocol@Redfish.AllowableValues": ["HTTP", "HTTPS"]}},
            "MultipartHttpPushUri": f"{UPDATE}/upload",
        }))
        self.route("POST", f"{UPDATE}/Actions/UpdateService.SimpleUpdate", self._simple_update)
        self.route("POST", f"{UPDATE}/upload", self._push)
        self.route("GET", "/redfish/v1/TaskMonitors/7", self._task)
        # storage
        self.route("GET", f"{SYS}/Storage", lambda s: ok({"Members": [{"@odata.id": STORAGE}]}))
        self.route("GET", STORAGE, lambda s: ok({
            "Id": "RAID.1", "Name": "PERC", "Drives": [{"@odata.id": f"{STORAGE}/Drives/D0"},
                                                      {"@odata.id": f"{STORAGE}/Drives/D1"}],
            "Volumes": {"@odata.id": VOLUMES}}))
        for d in ("D0", "D1"):
            self.route("GET", f"{STORAGE}/Drives/{d}", lambda s, d=d: ok(
                {"Id": d, "CapacityBytes": 960197124096, "MediaType": "SSD", "Protocol": "SATA"}))
        self.route("GET", VOLUMES, lambda s: ok(
            {"Members": [{"@odata.id": f"{VOLUMES}/{v}"} for v in self.volumes]},
            headers={"Allow": "GET, POST" if self.volumes_offered else "GET"}))
        self.route("POST", VOLUMES, self._create_volume)

    def _log_routes(self) -> None:
        ok = self.ok
        sel = f"{MGR}/LogServices/SEL"
        events = f"{SYS}/LogServices/EventLog"
        self.route("GET", f"{MGR}/LogServices", lambda s: ok({"Members": [{"@odata.id": sel}]}))
        self.route("GET", f"{SYS}/LogServices", lambda s: ok({"Members": [{"@odata.id": events}]}))
        self.route("GET", sel, lambda s: ok({"Id": "SEL", "Entries": {"@odata.id": f"{sel}/Entries"}}))
        self.route("GET", events, lambda s: ok(
            {"Id": "EventLog", "Entries": {"@odata.id": f"{events}/Entries"}}))
        entries = [LOG_ENTRIES[0], LOG_ENTRIES[1]], [LOG_ENTRIES[2]]
        self.route("GET", f"{sel}/Entries", lambda s: ok(
            {"Members": entries[0], "Members@odata.nextLink": f"{sel}/Entries/page2"}))
        self.route("GET", f"{sel}/Entries/page2", lambda s: ok({"Members": entries[1]}))
        self.route("GET", f"{events}/Entries", lambda s: ok(
            {"Members": [{"@odata.id": f"{events}/Entries/1"}]}))
        self.route("GET", f"{events}/Entries/1", lambda s: ok(LOG_ENTRIES[3]))

    def _system(self) -> dict[str, Any]:
        reset: dict[str, Any] = (
            {"@Redfish.ActionInfo": f"{SYS}/ResetActionInfo"} if self.action_info else
            {"ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown", "PowerCycle"]}
        )
        return {
            "@odata.id": SYS, "Id": "1", "Manufacturer": "Contoso", "Model": "GPU-8", "SerialNumber": "SN123",
            "BiosVersion": "1.4.2", "UUID": "00000000-0000-0000-0000-000000000001", "PowerState": self.power,
            "Status": {"Health": "Warning"},
            "EthernetInterfaces": {"@odata.id": f"{SYS}/EthernetInterfaces"},
            "Storage": {"@odata.id": f"{SYS}/Storage"},
            "LogServices": {"@odata.id": f"{SYS}/LogServices"},
            "Links": {"Chassis": [{"@odata.id": CHA}]},
            "Actions": {"#ComputerSystem.Reset": {"target": f"{SYS}/Actions/ComputerSystem.Reset", **reset}},
        }

    def _reset(self, seen: Seen) -> Reply:
        kind = json.loads(seen.body)["ResetType"]
        self.resets.append(kind)
        self.power = {"On": "On", "ForceOff": "Off", "GracefulShutdown": "Off", "PowerCycle": "On",
                      "ForceRestart": "On"}[kind]
        return 204, {}, b""

    def _patch_media(self, seen: Seen) -> Reply:
        if self.media_sticks:
            self.media.update(json.loads(seen.body))
        return 204, {}, b""

    def _login(self, seen: Seen) -> Reply:
        body = json.loads(seen.body)
        if self.accounts.get(body.get("UserName")) != body.get("Password"):
            return 401, JSON, error_body("Invalid username or password", "Base.1.8.InsufficientPrivilege")
        token = secrets.token_hex(16)
        path = f"{SESSIONS}/{len(self.tokens) + 1}"
        self.tokens[token] = path
        self.issued.append(token)
        self.server.route("DELETE", path, lambda s, t=token, p=path: self._logout(s, t, p))
        return self.ok({"@odata.id": path, "UserName": body["UserName"]}, 201,
                       {"X-Auth-Token": token, "Location": path})

    def _logout(self, seen: Seen, token: str, path: str) -> Reply:
        if seen.headers.get("X-Auth-Token") not in self.tokens:
            return 401, JSON, error_body("no session")
        self.tokens.pop(token, None)
        self.deleted_sessions.append(path)
        return 204, {}, b""

    def _password(self, seen: Seen) -> Reply:
        new = json.loads(seen.body)["Password"]
        if len(new) < 8:
            return 400, JSON, error_body(f"The value '{new}' for Password does not meet the policy",
                                         "Base.1.8.PropertyValueFormatError")
        user = next(iter(self.accounts))
        self.accounts[user] = new
        return 204, {}, b""

    def _simple_update(self, seen: Seen) -> Reply:
        body = json.loads(seen.body)
        if not body.get("ImageURI"):
            return 400, JSON, error_body("ImageURI is required", "Base.1.8.ActionParameterMissing")
        return 202, {"Location": "/redfish/v1/TaskMonitors/7"}, b""

    def _push(self, seen: Seen) -> Reply:
        self.pushed = seen.body
        return 202, {"Location": "/redfish/v1/TaskMonitors/7"}, b""

    def _task(self, seen: Seen) -> Reply:
        self.task_seen += 1
        task: dict[str, Any] = {"@odata.id": "/redfish/v1/TaskService/Tasks/7", "Id": "7"}
        if self.task_seen <= self.task_polls:
            task.update(TaskState="Running", PercentComplete=30 * self.task_seen,
                        Messages=[{"Message": "Flashing image"}])
            return self.ok(task, 202)
        if self.task_fails:
            task.update(TaskState="Exception", PercentComplete=60,
                        Messages=[{"Message": "Image signature verification failed"}])
        else:
            task.update(TaskState="Completed", PercentComplete=100, Messages=[{"Message": "Update done"}])
        return self.ok(task)

    def _create_volume(self, seen: Seen) -> Reply:
        if not self.volumes_offered:
            return 405, JSON, error_body("Volume creation is not supported", "Base.1.8.OperationNotAllowed")
        body = json.loads(seen.body)
        vid = f"V{len(self.volumes)}"
        self.volumes[vid] = {"Id": vid, "Name": body["Name"], "RAIDType": body.get("RAIDType", ""),
                             "CapacityBytes": body.get("CapacityBytes", 0),
                             "Links": {"Drives": body.get("Links", {}).get("Drives", [])}}
        path = f"{VOLUMES}/{vid}"
        self.route("GET", path, lambda s, v=vid: self.ok(self.volumes[v]))
        self.route("DELETE", path, lambda s, v=vid: (self.volumes.pop(v), (204, {}, b""))[1])
        return 201, {"Location": path}, b""
