"""IPMI 2.0 (lanplus) through ``ipmitool``: the BmcClient of old and simple BMCs.

Every call is one ``ipmitool -I lanplus -H HOST -p PORT -U USER -E ...`` run with the
project's subprocess helper (agent/proc.py): the password travels in the child's environment
(``IPMI_PASSWORD``, read by ``-E``), never on its command line; a new password for
``user set password`` travels on the child's stdin (``ipmitool exec /dev/stdin``), never in a
file that could outlive a killed child or daemon.

Failures are told apart from ipmitool's verbose (``-v``) messages:

- wrong user or password (RAKP 2 "HMAC is invalid", "unauthorized name"): AuthFailed at
  once, never retried (a BMC locks an account after a few bad logins);
- no answer ("Get Auth Capabilities error", "No response", name lookup failures): retried a
  few times, paced, then BmcUnreachable;
- busy ("Node busy", "Insufficient resources for session", initialization in progress):
  retried with backoff within the command's deadline;
- anything else the BMC answers: BmcRefused with the BMC's own words.

Between retries and polls the client waits at least ``Pacing.min_interval`` (frequent
polling hangs real BMCs), backing off by ``Pacing.factor`` up to ``max_interval``. Each
ipmitool run takes one of the site's IPMI session slots (``CallContext.ipmi_sessions``, the
``ipmi_max_sessions`` setting) for as long as it runs, waited for within the deadline.

Boot devices: ``chassis bootdev DEV options=persistent,efiboot`` then, as Ironic does,
``raw 0x00 0x08 0x03 0x08`` (System Boot Options parameter 3, "boot flag valid bit
clearing": don't clear) so the flag survives the 60 s timeout the IPMI spec gives it; read
back with ``chassis bootparam get 5``. Firmware, storage and virtual media are not IPMI
things: Unsupported, use Redfish.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import io
import ipaddress
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from agent import limits, proc
from agent.errors import (
    AuthFailed,
    BmcRefused,
    BmcUnreachable,
    Cancelled,
    CommandTimeout,
    InvalidParameters,
    Unsupported,
)
from agent.policy.release.state import Account
from agent.proto import site_pb2
from agent.retry import Backoff
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
    Unconfirmed,
    shown_address,
)

log = logging.getLogger(__name__)

IPMITOOL = "ipmitool"
SITE_CHANNEL = 1             # the LAN channel the site talks over (its users' access is written there)
CALL_TIMEOUT = 30.0          # one ipmitool run, at most
SLOT_POLL = 0.5              # how often a wait for an IPMI session slot looks at cancel
UNREACHABLE_ATTEMPTS = 3     # an unreachable BMC is tried this many times, paced
BUSY_ATTEMPTS = 8            # a busy one this many, within the deadline
MAX_PASSWORD_BYTES = 20      # IPMI 2.0
# RAKP-HMAC-SHA1 / HMAC-SHA1-96 / AES-CBC-128: what IPMI 2.0 BMCs offer (Ironic's usual
# choice too). Naming it skips ipmitool's cipher-suite discovery, a second round trip that
# BMCs like ipmi_sim do not answer (a 2 s wait per call).
CIPHER_SUITE = "3"

AUTH_PATTERNS = ("rakp 2 hmac is invalid", "unauthorized name", "invalid user name",
                 "rakp 4 message has invalid integrity check", "password invalid",
                 "invalid password", "unauthorized role or privilege level")
# "request match not found": lanplus got only late answers (to requests it had already sent
# again) and gave up; seen from ipmi_sim on a loaded machine, and UDP loses answers on a busy
# management network too. The same as no answer: retried, paced.
UNREACHABLE_PATTERNS = ("get auth capabilities error", "no response from remote controller",
                        "address lookup for", "could not open socket", "unable to send",
                        "connection refused", "network is unreachable", "no route to host",
                        "request match not found")
# What ipmitool says when the session never opened: the command was not sent, so trying again
# cannot do it twice. Any other silence (no response, late answers, our own timeout) may come
# after the BMC took the command: a write (``once``) is then never sent again (``write``).
SESSION_NOT_OPENED = ("unable to establish ipmi v2", "get auth capabilities error", "address lookup for",
                      "could not open socket", "connection refused", "network is unreachable",
                      "no route to host")
BUSY_PATTERNS = ("node busy", "insufficient resources for session", "initialization in progress",
                 "temporarily unavailable", "out of space", "command not supported in present state")
NOT_IPMI = "not over IPMI; use redfish"

# ipmitool's "Boot Device Selector" wording -> ours.
_BOOT_SELECTOR = (
    ("pxe", BootDevice.PXE),
    ("hard-drive", BootDevice.DISK),
    ("hard drive", BootDevice.DISK),
    ("cd/dvd", BootDevice.CDROM),
    ("bios setup", BootDevice.BIOS),
    ("no override", BootDevice.NONE),
)
_BOOTDEV = {BootDevice.PXE: "pxe", BootDevice.DISK: "disk", BootDevice.CDROM: "cdrom",
            BootDevice.BIOS: "bios", BootDevice.NONE: "none"}


def split_address(address: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host, port); port 623 default.
    An error quotes the address without any user part (``shown_address``)."""
    if "@" in address:
        raise InvalidParameters(
            f"bmc_address {shown_address(address)!r}: no user or password in the address; "
            "they come from credentials_ref"
        )
    host, port = address, 623
    shown = shown_address(address)
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise InvalidParameters(f"bmc_address {shown!r}: unbalanced '['")
        host, rest = address[1:end], address[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise InvalidParameters(f"bmc_address {shown!r}: expected [host]:port")
            port = _port(rest[1:], shown)
    elif address.count(":") == 1:
        host, text = address.split(":")
        port = _port(text, shown)
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InvalidParameters(f"bmc_address {shown!r}: not an IPv6 address") from None
    elif not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", host):
        raise InvalidParameters(f"bmc_address {shown!r}: not a host name or IP address")
    return host, port


def _port(text: str, shown: str) -> int:
    if not limits.is_digits(text) or not 0 < int(text) < 65536:
        raise InvalidParameters(f"bmc_address {shown!r}: port must be 1-65535")
    return int(text)


def check_ipmi_password(password: str) -> None:
    """What an IPMI BMC can take and ``ipmitool exec`` can carry (no quoting there)."""
    if not password or len(password.encode()) > MAX_PASSWORD_BYTES:
        raise InvalidParameters(f"an IPMI password is 1 to {MAX_PASSWORD_BYTES} bytes")
    if any(c.isspace() or c in "\"'\\#" or not c.isprintable() for c in password):
        raise InvalidParameters("an IPMI password here cannot hold spaces, quotes, '\\' or '#'")


# -- parsing ipmitool's output (pure functions, tested on recorded output) ----------------


def _fields(text: str) -> dict[str, str]:
    """``Key   : value`` lines -> {key: value} (first occurrence wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def parse_power(text: str) -> PowerState:
    m = re.search(r"Chassis Power is (on|off)", text)
    if not m:
        raise BmcRefused(f"unexpected answer to 'chassis power status': {text.strip()[:200]!r}")
    return PowerState(m.group(1))


def parse_bootparam5(text: str) -> BootSetting:
    """``chassis bootparam get 5`` -> the boot setting. Like Ironic, the selector is read
    whatever the valid bit says (ipmi_sim, and some BMCs once the flag was consumed, leave
    it clear while keeping the selector)."""
    lower = text.lower()
    device = BootDevice.NONE
    m = re.search(r"boot device selector\s*:\s*(.+)", lower)
    if m:
        for word, dev in _BOOT_SELECTOR:
            if word in m.group(1):
                device = dev
                break
    persistent = "all future boots" in lower
    mode = BootMode.UEFI if "efi boot" in lower else BootMode.LEGACY if "legacy" in lower else None
    return BootSetting(device, persistent, mode)


def parse_mc_info(text: str) -> dict[str, str]:
    f = _fields(text)
    return {"firmware": f.get("Firmware Revision", ""), "manufacturer": f.get("Manufacturer Name", ""),
            "product": f.get("Product Name", ""), "ipmi_version": f.get("IPMI Version", "")}


def parse_fru(text: str) -> dict[str, str]:
    f = _fields(text)
    return {
        "manufacturer": f.get("Product Manufacturer") or f.get("Board Mfg", ""),
        "model": f.get("Product Name") or f.get("Board Product", ""),
        "serial": f.get("Product Serial") or f.get("Chassis Serial") or f.get("Board Serial", ""),
    }


_UNITS = {  # ipmitool unit words -> (kind, our unit)
    "degrees c": ("temperature", "Cel"),
    "rpm": ("fan", "RPM"),
    "volts": ("voltage", "V"),
    "watts": ("power", "W"),
    "amps": ("current", "A"),
    "percent": ("percent", "%"),
}
_HEALTH = {"ok": "OK", "nc": "Warning", "cr": "Critical", "nr": "Critical"}


def parse_sdr(text: str) -> list[site_pb2.BmcSensor]:
    """``sdr elist full`` lines: ``name | id | status | entity | reading``."""
    sensors = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not cells[0]:
            continue
        name, status, reading = cells[0], cells[2].lower(), cells[4]
        sensor = site_pb2.BmcSensor(name=name, health=_HEALTH.get(status, ""))
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s+(.+)", reading)
        if m and m.group(2).lower() in _UNITS:
            sensor.kind, sensor.units = _UNITS[m.group(2).lower()]
            sensor.reading = float(m.group(1))
            sensor.has_reading = True
        elif "power supply" in name.lower() or name.lower().startswith("ps"):
            sensor.kind = "power_supply"
        else:
            continue
        sensors.append(sensor)
    return sensors


def parse_sel(text: str) -> list[site_pb2.BmcLogEntry]:
    """``ipmitool -c sel elist`` (CSV: id, date, time, sensor, event, direction) -> entries.

    The date and time are the BMC's clock, taken as UTC; a record stamped before the clock was
    set reads "Pre-Init" and a count of seconds, and has no absolute time (created_unix 0)."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 5 or not row[0].strip():
            continue
        record, date, clock = row[0].strip(), row[1].strip(), row[2].strip()
        unix = 0
        created = f"{date} {clock}".strip()
        with contextlib.suppress(ValueError):
            stamp = datetime.datetime.strptime(created, "%m/%d/%Y %H:%M:%S")
            unix = int(stamp.replace(tzinfo=datetime.UTC).timestamp())
        event = " ".join(part.strip() for part in row[4:] if part.strip())
        out.append(site_pb2.BmcLogEntry(id=record, created=created, created_unix=unix, message=event,
                                        sensor=row[3].strip(), log="sel"))
    return out


def parse_lan_mac(text: str) -> str:
    m = re.search(r"MAC Address\s*:\s*([0-9a-fA-F:]{17})", text)
    return m.group(1).lower() if m else ""


def parse_user_id(text: str, username: str) -> int | None:
    """``user list CHANNEL`` -> the id of ``username``."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1] == username:
            return int(parts[0])
    return None


_PRIVILEGE_ROLE = {"administrator": "Administrator", "operator": "Operator", "user": "ReadOnly",
                   "callback": "Callback", "no access": "NoAccess"}


def parse_getaccess(text: str) -> list[Account]:
    """``channel getaccess CHANNEL [ID]`` -> the users that have a name, and those without one
    that are enabled (user 1, the anonymous login, turned on). A user is enabled unless its
    Enable Status reads disabled or its IPMI Messaging is off (no LAN login either way; ipmi_sim
    leaves the status "unknown" and turns messaging off for ``user disable``). The privilege is
    read as a Redfish RoleId (USER as ReadOnly); one without a name here is kept as ipmitool says."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        f = _fields(block)
        uid, name = f.get("User ID", ""), f.get("User Name", "")
        privilege = f.get("Privilege Level", "")
        status, messaging = f.get("Enable Status", "").lower(), f.get("IPMI Messaging", "")
        enabled = status != "disabled" and messaging == "enabled"
        if uid.isdigit() and (name or enabled):
            out.append(Account(uid, name, _PRIVILEGE_ROLE.get(privilege.lower(), privilege), enabled))
    return out


# IPMI 2.0 table 6-? (privilege levels): 0 is reserved and grants nothing, as NO ACCESS (0x0F)
# does; a BMC refuses to set 0 (ipmi_sim: "invalid data field"), so both read as NO ACCESS.
_PRIVILEGE_CODE = {"callback": 1, "user": 2, "operator": 3, "administrator": 4, "oem": 5,
                   "no access": 15}


def privilege_code(text: str) -> int:
    """A privilege as ``channel getaccess`` prints it ("ADMINISTRATOR", "Unknown (0x00)") -> its
    code, 0 (reserved) read as NO ACCESS's 15; 15 for what has no code."""
    code = _PRIVILEGE_CODE.get(text.strip().lower())
    if code is None:
        m = re.search(r"\(0x([0-9a-fA-F]{1,2})\)", text)
        code = int(m.group(1), 16) if m else 15
    return 15 if code == 0 else code


class IpmiClient:
    """One BMC over IPMI 2.0 lanplus. ``attempts`` counts the ipmitool runs made."""

    def __init__(self, target: Target, call: CallContext, *, channel: int = SITE_CHANNEL,
                 ipmitool: str = IPMITOOL) -> None:
        self.ipmitool = ipmitool
        self.target = target
        self.call = call
        self.host, self.port = split_address(target.address)
        self.channel = channel
        self.attempts = 0

    # -- running ipmitool -----------------------------------------------------------------

    def _remaining(self) -> float:
        left = self.call.deadline - time.monotonic()
        if left <= 0:
            raise CommandTimeout(f"BMC {self.target.address}: deadline reached")
        return left

    def _wait(self, seconds: float) -> None:
        """Sleep, woken by cancel; never past the deadline."""
        if self.call.cancel.wait(min(seconds, self._remaining())):
            raise Cancelled(f"BMC {self.target.address}: cancelled")
        self._remaining()

    @property
    def _pacing(self) -> Backoff:
        """The waits between retries and between polls (``CallContext.pacing``)."""
        pacing = self.call.pacing
        return Backoff(first=pacing.min_interval, cap=pacing.max_interval, factor=pacing.factor)

    def _redact(self, text: str, *secrets: str) -> str:
        for s in (self.target.credentials.password, *secrets):
            if s:
                text = text.replace(s, "<hidden>")
        return text

    def _once(self, args: list[str], creds: Credentials, verbose: bool,
              stdin: bytes | None = None) -> proc.Completed:
        argv = [self.ipmitool, *(["-v"] if verbose else []), "-I", "lanplus",
                "-H", self.host, "-p", str(self.port), "-U", creds.username, "-E",
                "-C", CIPHER_SUITE, "-N", "2", "-R", "1", *args]
        env = proc.clean_env({"IPMI_PASSWORD": creds.password})
        with self._session():
            self.attempts += 1
            return proc.run(argv, input=stdin, check=False, env=env, cancel=self.call.cancel,
                            timeout=min(CALL_TIMEOUT, self._remaining()))

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """One of the site's IPMI session slots for one ipmitool run, waited for within the
        deadline and woken by cancel (at most SLOT_POLL seconds late)."""
        slots = self.call.ipmi_sessions
        if slots is None:
            yield
            return
        while not slots.acquire(timeout=min(SLOT_POLL, self._remaining())):
            if self.call.cancel.is_set():
                raise Cancelled(f"BMC {self.target.address}: cancelled while waiting for an IPMI session")
        try:
            yield
        finally:
            slots.release()

    def run(self, *args: str, creds: Credentials | None = None, secrets: tuple[str, ...] = (),
            verbose: bool = True, stdin: bytes | None = None, once: bool = False) -> str:
        """One ipmitool command against the BMC, with the retries its failure allows.
        Returns stdout. ``secrets`` are also redacted from any message. ``verbose`` (-v) is
        what tells a refused login from no answer; off only for commands whose output it
        changes (sdr), run after a login has been proven. ``stdin`` is given to each run.
        ``once``: a write, tried again only where it cannot have been sent (the session never
        opened, or the BMC answered busy); no answer after that raises Unconfirmed."""
        creds = creds or self.target.credentials
        what = " ".join(args[:3])
        unreachable = busy = 0
        # Bounded by the counts below and the deadline; cancel wakes the wait.
        tries = self._pacing.start(cancel=self.call.cancel, deadline=self.call.deadline)
        while True:
            try:
                done = self._once(list(args), creds, verbose, stdin)
            except CommandTimeout:
                if time.monotonic() >= self.call.deadline:
                    raise CommandTimeout(f"BMC {self.target.address}: no answer to {what!r} "
                                         "before the deadline") from None
                done = None
            if done is not None and done.returncode == 0:
                return done.text
            err = "" if done is None else done.stderr.decode("utf-8", "replace")
            out = "" if done is None else done.text
            lower = (err + "\n" + out).lower()
            if any(p in lower for p in AUTH_PATTERNS):
                raise AuthFailed(
                    f"BMC {self.target.address}: user {creds.username!r} was refused "
                    "(wrong username or password); not retried",
                    bmc_address=self.target.address,
                )
            if done is None or any(p in lower for p in UNREACHABLE_PATTERNS):
                if once and (done is None or not any(p in lower for p in SESSION_NOT_OPENED)):
                    raise Unconfirmed(
                        f"BMC {self.target.address}: no answer to {what!r} once it could have been "
                        "sent: the BMC may have acted; not sent again",
                        bmc_message=self._redact(_tail(err) or "no answer", *secrets),
                        bmc_address=self.target.address)
                unreachable += 1
                if unreachable >= UNREACHABLE_ATTEMPTS:
                    raise BmcUnreachable(
                        f"BMC {self.target.address}: no answer over IPMI lanplus after "
                        f"{unreachable} attempts ({what})", bmc_address=self.target.address,
                        attempts=self.attempts)
            elif any(p in lower for p in BUSY_PATTERNS):
                busy += 1
                if busy >= BUSY_ATTEMPTS:
                    raise BmcRefused(f"BMC {self.target.address}: still busy after {busy} attempts",
                                     bmc_message=self._redact(_tail(err), *secrets))
            else:
                message = self._redact(_tail(err) or _tail(out), *secrets)
                raise BmcRefused(f"BMC {self.target.address} refused {what!r}: {message}",
                                 bmc_message=message, bmc_address=self.target.address)
            delay = tries.next()
            if delay is None:   # the wait would reach the deadline: no try could follow it
                raise CommandTimeout(f"BMC {self.target.address}: deadline reached")
            log.info("BMC %s: %s failed (%s), retrying in %.1fs", self.target.address, what,
                     "no answer" if unreachable and not busy else "busy", delay)
            if not tries.sleep(delay):
                raise Cancelled(f"BMC {self.target.address}: cancelled")

    def write(self, *args: str, taken: Callable[[], bool] | None = None) -> None:
        """A command that changes the BMC, sent once: on an ambiguous answer (Unconfirmed) it is
        never sent again; ``taken()`` reads back whether the BMC did it, and it stands done when
        it did (as RedfishSession.write). ``taken`` None: the caller reads back next itself."""
        try:
            self.run(*args, once=True)
        except Unconfirmed:
            if self.call.cancel.is_set() or (taken is not None and not taken()):
                raise
            log.warning("BMC %s: %s answered nothing but reads back as asked", self.target.address,
                        " ".join(args[:3]))

    # -- BmcClient ------------------------------------------------------------------------

    def power_state(self) -> PowerState:
        return parse_power(self.run("chassis", "power", "status"))

    def set_power(self, action: PowerAction, *, graceful_timeout: float) -> None:
        if action is PowerAction.STATUS:
            return
        state = self.power_state()
        if action is PowerAction.ON:
            if state is not PowerState.ON:
                self.write("chassis", "power", "on", taken=lambda: self.power_state() is PowerState.ON)
            return
        if action is PowerAction.OFF:
            if state is PowerState.OFF:
                return
            if graceful_timeout > 0:
                # an ambiguous answer is read back by the wait below, then forced off
                with contextlib.suppress(Unconfirmed):
                    self.run("chassis", "power", "soft", once=True)
                end = time.monotonic() + graceful_timeout
                polls = 0
                while time.monotonic() < end:
                    polls += 1
                    self._wait(min(self._pacing.delay(polls), max(0.0, end - time.monotonic())))
                    if self.power_state() is PowerState.OFF:
                        return
                log.info("BMC %s: no graceful shutdown within %.0fs; forcing power off",
                         self.target.address, graceful_timeout)
            self.write("chassis", "power", "off", taken=lambda: self.power_state() is PowerState.OFF)
            return
        # cycle and reset of a node that is off: power it on (what an operator means).
        if state is PowerState.OFF:
            self.write("chassis", "power", "on", taken=lambda: self.power_state() is PowerState.ON)
        else:   # no read back tells a reset done from one not: Unconfirmed, never sent twice
            self.run("chassis", "power", "cycle" if action is PowerAction.CYCLE else "reset", once=True)

    def boot_device(self) -> BootSetting:
        return parse_bootparam5(self.run("chassis", "bootparam", "get", "5"))

    def set_boot_device(self, setting: BootSetting) -> BootSetting:
        if setting.device is BootDevice.HTTP:
            raise Unsupported(f"HTTP boot is {NOT_IPMI}")
        options = []
        if setting.persistent:
            options.append("persistent")
        if setting.mode is BootMode.UEFI:
            options.append("efiboot")
        args = ["chassis", "bootdev", _BOOTDEV[setting.device]]
        if options:
            args.append("options=" + ",".join(options))
        self.write(*args, taken=lambda: self.boot_device().device is setting.device)
        # Keep the boot flag valid past the 60 s the spec gives it (as Ironic does).
        self.run("raw", "0x00", "0x08", "0x03", "0x08")
        return self.boot_device()

    def query(self) -> site_pb2.BmcOperationResult:
        result = site_pb2.BmcOperationResult()
        result.power_state = str(self.power_state())
        mc = parse_mc_info(self.run("mc", "info"))
        fru: dict[str, str] = {}
        with contextlib.suppress(BmcRefused):   # many BMCs (and ipmi_sim) have no FRU 0
            fru = parse_fru(self.run("fru", "print", "0"))
        result.system.CopyFrom(site_pb2.BmcSystem(
            manufacturer=fru.get("manufacturer") or mc["manufacturer"],
            model=fru.get("model") or mc["product"],
            serial=fru.get("serial", ""),
            bmc_firmware_version=mc["firmware"],
        ))
        with contextlib.suppress(BmcRefused):   # an empty SDR repository is an error to ipmitool
            result.sensors.extend(parse_sdr(self.run("sdr", "elist", "full", verbose=False)))
        mac = parse_lan_mac(self.run("lan", "print", str(self.channel)))
        if mac and mac != "00:00:00:00:00:00":
            # The BMC's own LAN port: IPMI has no portable way to list the host's NICs.
            result.nics.append(site_pb2.BmcNic(id=f"bmc-lan{self.channel}", mac_address=mac))
        result.values["ipmi_version"] = mc["ipmi_version"]
        return result

    def event_log(self, since: int) -> list[site_pb2.BmcLogEntry]:
        # -c: ipmitool's CSV output, not its table; an empty SEL prints "SEL has no entries".
        return events.keep(parse_sel(self.run("-c", "sel", "elist", verbose=False)), since)

    def user_id(self, username: str) -> int:
        uid = parse_user_id(self.run("user", "list", str(self.channel)), username)
        if uid is None:
            raise BmcRefused(f"BMC {self.target.address}: no user {username!r} on channel {self.channel}",
                             bmc_message="user not found")
        return uid

    def set_password(self, username: str, new_password: str) -> None:
        check_ipmi_password(new_password)
        uid = self.user_id(username)
        size = 20 if len(new_password.encode()) > 16 else 16
        # The command reaches ``ipmitool exec`` on its stdin: no file holds it, so a kill at
        # any moment (of ipmitool or of the daemon) leaves nothing behind.
        script = f"user set password {uid} {new_password} {size}\n".encode()
        out = self.run("exec", "/dev/stdin", secrets=(new_password,), stdin=script)
        if "successful" not in out.lower():
            raise BmcRefused(f"BMC {self.target.address}: password change not confirmed",
                             bmc_message=self._redact(_tail(out), new_password))

    def accounts(self) -> list[Account]:
        return parse_getaccess(self.run("channel", "getaccess", str(self.channel)))

    def disable_account(self, username: str) -> list[Account]:
        """``user disable`` each enabled user named ``username`` once, each read back after."""
        named = [a for a in self.accounts() if a.user_name == username]
        if not named:
            raise BmcRefused(f"BMC {self.target.address}: no user {username!r} on channel {self.channel}",
                             bmc_message="user not found")
        back = []
        for account in named:
            if account.enabled:
                self.write("user", "disable", account.id)      # read back below
                log.info("BMC %s: user %r (id %s) disabled", self.target.address, username, account.id)
            now = parse_getaccess(self.run("channel", "getaccess", str(self.channel), account.id))
            if not now or now[0].enabled:
                raise BmcRefused(f"BMC {self.target.address} accepted disabling user {username!r} "
                                 "but reads it back enabled", bmc_message="read back enabled")
            back.append(now[0])
        return back

    def reset_account(self, slot: str, user_name: str, role: str, enabled: bool | None,
                      site_user: str) -> Account:
        """User ``slot`` put back: its name (Set User Name, 16 bytes: an empty name included,
        which ``user set name`` cannot write), its access on the client's channel (Set User
        Access: IPMI messaging on where ``enabled``, the privilege ``role`` as ``channel
        getaccess`` prints it, the link authentication as it is) and ``user enable`` or
        ``disable``; each command once, then read back. A slot holding the site's own name is
        reset only while another enabled slot holds it (a tenant's namesake beside the site's)."""
        where = f"BMC {self.target.address}"
        if not slot.isdigit() or not 1 < int(slot) <= 63:
            raise InvalidParameters(f"{where}: user slot {slot!r}: 2 to 63 (1 is the anonymous user)")
        name = user_name.encode("ascii", "replace")
        if len(name) > 16:
            raise InvalidParameters(f"{where}: an IPMI user name is 16 characters at most")
        level = privilege_code(role) if role else None
        before = self._access(slot)
        others = [a for a in self.accounts() if a.user_name == site_user and a.enabled and a.id != slot]
        if before.get("User Name", "") == site_user and (user_name != site_user or enabled is False) \
                and not others:
            raise InvalidParameters(f"{where}: user {slot} is the site's own account {site_user!r}; "
                                    "it is not reset")
        if before.get("User Name", "") != user_name:
            padded = name.ljust(16, b"\0")
            self.write("raw", "0x06", "0x45", f"{int(slot):#04x}", *(f"{b:#04x}" for b in padded))
        messaging = enabled if enabled is not None else before.get("IPMI Messaging") == "enabled"
        if level is not None or enabled is not None:
            now = privilege_code(before.get("Privilege Level", ""))
            bits = 0x80 | (0x10 if messaging else 0) \
                | (0x20 if before.get("Link Authentication") == "enabled" else 0) | (self.channel & 0x0F)
            self.write("raw", "0x06", "0x43", f"{bits:#04x}", f"{int(slot):#04x}",
                       f"{(level if level is not None else now):#04x}")
        if enabled is not None:
            self.write("user", "enable" if enabled else "disable", slot)
        after = self._access(slot)
        got = (after.get("User Name", ""), after.get("IPMI Messaging") == "enabled",
               privilege_code(after.get("Privilege Level", "")))
        want = (user_name, messaging, level if level is not None else got[2])
        if got != want:
            raise BmcRefused(f"{where} accepted resetting user {slot} but reads back {got}, not {want}",
                             bmc_message="read back differs")
        log.info("%s: user slot %s reset", where, slot)
        return Account(slot, got[0], after.get("Privilege Level", ""), got[1])

    def _access(self, slot: str) -> dict[str, str]:
        text = self.run("channel", "getaccess", str(self.channel), slot)
        for block in re.split(r"\n\s*\n", text):
            f = _fields(block)
            if f.get("User ID") == slot:
                return f
        raise BmcRefused(f"BMC {self.target.address}: channel getaccess lists no user {slot}",
                         bmc_message="no such user")

    def check_login(self, credentials: Credentials) -> bool:
        try:
            self.run("chassis", "power", "status", creds=credentials, secrets=(credentials.password,))
        except AuthFailed:
            return False
        return True

    # -- not IPMI -------------------------------------------------------------------------

    def firmware_update(
        self,
        *,
        image_uri: str = "",
        file: Path | None = None,
        sha256: str = "",
        transfer_protocol: str = "",
        method: str = "",
        progress: Callable[[int, str], None] | None = None,
    ) -> site_pb2.BmcFirmwareTask:
        raise Unsupported(f"firmware update is {NOT_IPMI}")

    def firmware_status(self, task_uri: str = "") -> site_pb2.BmcOperationResult:
        raise Unsupported(f"firmware inventory is {NOT_IPMI}")

    def storage(self) -> list[site_pb2.BmcStorageController]:
        raise Unsupported(f"storage inventory is {NOT_IPMI}")

    def virtual_media(self) -> list[site_pb2.BmcVirtualMedia]:
        raise Unsupported(f"virtual media is {NOT_IPMI}")

    def insert_media(self, image_url: str, *, media_type: str = "CD",
                     alternates: tuple[str, ...] = ()) -> site_pb2.BmcVirtualMedia:
        raise Unsupported(f"virtual media is {NOT_IPMI}")

    def eject_media(self) -> None:
        raise Unsupported(f"virtual media is {NOT_IPMI}")

    def create_volume(
        self, controller_id: str, *, name: str, raid_type: str, drives: list[str], capacity_bytes: int
    ) -> site_pb2.BmcVolume:
        raise Unsupported(f"volume management is {NOT_IPMI}")

    def delete_volume(self, volume_id: str) -> None:
        raise Unsupported(f"volume management is {NOT_IPMI}")

    def close(self) -> None:
        pass


def _tail(text: str, lines: int = 3) -> str:
    """The last meaningful lines of ipmitool's output, without its noise."""
    noise = ("loading iana pen registry", "unable to get channel cipher suites", "running get ")
    kept = [ln.strip() for ln in text.splitlines()
            if ln.strip() and not ln.strip().lower().startswith(noise)]
    return " / ".join(kept[-lines:])

