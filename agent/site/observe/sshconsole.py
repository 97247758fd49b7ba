"""A node's serial console over SSH to its BMC: the transport for a BMC whose IPMI is off, or
that publishes an SSH console. The session's lines go through the same ring, milestones and
boot detection as a SOL console's (console.py ``SolSession``, which this subclasses).

    plan = choose(system_doc, vendor, protocols_doc)      # None: no SSH console offered
    Bmc(address, "redfish", ref, console=plan.encode())   # console.py Consoles.attach keeps it

Where the console is (``choose``): the System's ``SerialConsole.SSH`` where the BMC publishes
it (its Port, ConsoleEntryCommand, HotKeySequenceDisplay and the System's
MaxConcurrentSessions: OpenBMC's GH200, GB200 and BlueField-3 on 2200, Supermicro's
SMASH-CLP on 22), else the vendor row's ``ssh_console_entry`` (agent/site/bmc/redfish/vendors.py:
iDRAC's ``console com2``, iLO's ``vsp``, XCC's ``console 1``) on the manager's SSH port
(ManagerNetworkProtocol.SSH); IPMI is never needed. A BMC with neither: SOL where IPMI is on
(console.py), else no console, said.

The client is OpenSSH's ssh, started through agent/proc.py: no new runtime dependency (a
Python SSH library would be one, with its own crypto to keep patched), the host's own audited
client, its keepalives (``ServerAliveInterval``: a BMC that stops answering ends the session
in 45 s, without a second session asking, as SOL's liveness check must).

- The password: ssh asks it of ``SSH_ASKPASS`` (``SSH_ASKPASS_REQUIRE=force``, ssh(1)), a
  constant script in a private 0700 folder of its own that prints the ``password`` file beside
  it (0600), removed once ssh has authenticated, and the folder at the session's end. The
  password is never in argv nor in any environment; ssh's own closefrom() at start rules out
  an inherited pipe. One prompt only (``NumberOfPasswordPrompts=1``): a wrong password is said
  ``auth failed`` and not retried (a BMC locks accounts).
- The host key: pinned at first contact (``StrictHostKeyChecking=accept-new``) in a
  known_hosts of the site's own per BMC, in the secret store (``SecretStore.known_hosts``); a
  changed key is refused by ssh and said ``host_key_changed``, not retried: an operator who
  replaced the BMC removes the pinned file.
- Another session holds the console (the BMC says so in words of its own, the vendor row's
  ``ssh_console_busy``): said ``busy``, tried again every BUSY_RETRY seconds, never taken over.
- The BMC drops the connection or closes an idle session (BMCs time out SSH sessions with no
  input; a console's output is not input, and the site never types into a node's console):
  said ``dropped`` and reconnected, at once after a session that was up STEADY seconds,
  else backing off from 1 s to 30 s (it cannot connect, or the BMC lets it in and puts it out
  at once: a refusal whose words no row knows). What the BMC sent is kept; what the node
  wrote while no session was up the BMC never sent (except a BMC that buffers it, as
  obmc-console does).
- Leaving: the console's exit keys (from HotKeySequenceDisplay or the row), then ssh stopped;
  a BMC ends the console session when the connection closes in any case.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import proc
from agent.errors import AgentError, InvalidParameters
from agent.site.bmc.client import Credentials, shown_address
from agent.site.bmc.ipmi import split_address
from agent.site.bmc.redfish.vendors import Vendor
from agent.site.observe.console import BUSY_RETRY, Ended, SolSession, _tail

if TYPE_CHECKING:
    from agent.site.bmc.redfish.session import RedfishSession

log = logging.getLogger(__name__)

Doc = dict[str, Any]
KEEPALIVE_SECONDS, KEEPALIVE_COUNT = 15, 3
CONNECT_TIMEOUT = 15
ENTRY_QUIET = 0.3         # the CLI's output quiet this long after login: its prompt is shown
ENTRY_LATEST = 5.0        # a CLI that shows nothing: its command typed this long after login
STEADY = 30.0             # a session up this long is reconnected at once; a shorter one backs off
BUSY_WINDOW = 8192        # how much of a session's first output is searched for a busy message

# What the BMC shows (HotKeySequenceDisplay) -> the keys that leave its console. Recorded:
# OpenBMC's "Press ~. to exit console" (obmc-console-client's escape, after a newline);
# Supermicro's "press <Enter>, <Esc>, and then <T> to terminate session".
EXIT_KEYS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"~\."), "\r~."),
    (re.compile(r"<Enter>,\s*<Esc>,?\s*and then\s*<T>", re.I), "\r\x1bT"),
    (re.compile(r"ESC\s*\(", re.I), "\x1b("),
    (re.compile(r"Ctrl\s*\+?\s*\\", re.I), "\x1c"),
)

HOST_KEY_CHANGED = ("remote host identification has changed", "host key verification failed",
                    "has changed and you have requested strict checking")
SSH_AUTH_FAILED = ("permission denied (",)


def _typable(text: object) -> bool:
    """A command the site may type at a BMC's CLI: printable, one line, at most 200 characters."""
    return isinstance(text, str) and len(text) <= 200 and text.isprintable()


def exit_keys(display: str) -> str:
    """The keys that leave a console whose BMC shows ``display``; "" when not known (closing
    the connection ends the BMC's console session anyway)."""
    for pattern, keys in EXIT_KEYS:
        if pattern.search(display):
            return keys
    return ""


@dataclass(frozen=True)
class SshConsole:
    """Where a BMC keeps a node's console over SSH and how to enter and leave it."""

    port: int = 22
    entry: str = ""                  # typed once logged in ("": the port is the console itself)
    exit: str = ""                   # the keys that leave it
    sessions: int = 0                # the BMC's MaxConcurrentSessions for it (0: not said)
    busy: tuple[str, ...] = ()       # what the BMC says when another session holds it (lower case)
    source: str = ""                 # where this came from: SerialConsole.SSH, or the vendor row

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> SshConsole:
        try:
            data = json.loads(text)
            plan = cls(**{**data, "busy": tuple(data.get("busy", ()))})
        except (ValueError, TypeError) as exc:
            raise InvalidParameters(f"an SSH console's plan is unreadable: {exc}") from None
        if not 0 < plan.port < 65536 or not _typable(plan.entry):
            raise InvalidParameters(f"an SSH console's plan is not one: port {plan.port}")
        return plan


def choose(system: Doc, vendor: Vendor, protocols: Doc | None = None) -> SshConsole | None:
    """The SSH console a BMC offers for ``system`` (its ComputerSystem), by what it publishes
    first, else by its vendor row; None when it offers none (SOL where IPMI is on)."""
    serial = system.get("SerialConsole")
    ssh = serial.get("SSH") if isinstance(serial, dict) else None
    if isinstance(ssh, dict) and ssh.get("ServiceEnabled") is True and isinstance(ssh.get("Port"), int):
        entry = ssh.get("ConsoleEntryCommand")
        if entry is not None and not _typable(entry):
            log.warning("a BMC's ConsoleEntryCommand is no command to type (%r); no SSH console",
                        str(entry)[:60])
            return None
        display = str(ssh.get("HotKeySequenceDisplay") or "")
        sessions = serial.get("MaxConcurrentSessions") if isinstance(serial, dict) else 0
        return SshConsole(port=ssh["Port"], entry=entry if isinstance(entry, str) else "",
                          exit=exit_keys(display) or vendor.ssh_console_exit,
                          sessions=sessions if isinstance(sessions, int) else 0,
                          busy=vendor.ssh_console_busy, source="SerialConsole.SSH")
    if not vendor.ssh_console_entry:
        return None
    manager_ssh = (protocols or {}).get("SSH")
    port = 22
    if isinstance(manager_ssh, dict):
        if manager_ssh.get("ProtocolEnabled") is False:
            return None
        if isinstance(manager_ssh.get("Port"), int):
            port = manager_ssh["Port"]
    return SshConsole(port=port, entry=vendor.ssh_console_entry, exit=vendor.ssh_console_exit,
                      sessions=vendor.ssh_console_sessions, busy=vendor.ssh_console_busy,
                      source=f"vendor row {vendor.name}")


def bmc_host(address: str) -> str:
    """The host of a bmc_address (``host``, ``host:port``, ``[v6]:port`` or a Redfish URL):
    the SSH console's port is its own, not Redfish's or IPMI's."""
    if "://" in address:
        host = urllib.parse.urlsplit(address).hostname
        if not host:
            raise InvalidParameters(f"bmc_address {shown_address(address)!r}: no host")
        return host
    return split_address(address)[0]


def offered(session: RedfishSession) -> tuple[SshConsole | None, bool | None]:
    """What a Redfish BMC offers for the node's console, read from it: the SSH console
    (``choose`` on its System, its vendor row and its Manager's NetworkProtocol) and whether
    its IPMI is on (None: it does not say). A NetworkProtocol that cannot be read counts as
    not saying."""
    system = session.system()
    protocols: Doc | None = None
    try:
        ref = session.manager().get("NetworkProtocol")
        if isinstance(ref, dict) and isinstance(ref.get("@odata.id"), str):
            protocols = session.get(ref["@odata.id"])
    except AgentError as exc:
        log.info("Redfish %s: NetworkProtocol unread (%s)", session.target.address, exc.message[:120])
    ipmi = (protocols or {}).get("IPMI")
    ipmi_on = ipmi.get("ProtocolEnabled") if isinstance(ipmi, dict) else None
    return choose(system, session.vendor(), protocols), ipmi_on if isinstance(ipmi_on, bool) else None


ASKPASS = b'#!/bin/sh\nexec /bin/cat -- "${0%/*}/password"\n'


@contextlib.contextmanager
def askpass(password: str) -> Any:
    """A private folder holding the askpass script and the password (0600) it prints; yields
    (script, password file); removed on leaving."""
    base = os.environ.get("XDG_RUNTIME_DIR") or None
    folder = Path(tempfile.mkdtemp(prefix="bc-askpass-", dir=base))   # 0700
    try:
        script = folder / "askpass"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(ASKPASS)
        secret = folder / "password"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(password.encode())
        yield script, secret
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class SshSession(SolSession):
    """One node's console over SSH, under the thread SolSession gives it."""

    def __init__(self, *args: Any, ssh: str = "ssh", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unreadable = ""
        try:
            self.plan: SshConsole | None = SshConsole.decode(self.bmc.console)
        except InvalidParameters as exc:    # a record damaged on disk: said, nothing tried
            self.plan, self._unreadable = None, exc.message
        self.ssh = ssh
        self.leave = (self.plan.exit if self.plan is not None else "").encode()
        self._thread.name = f"ssh-console-{self.node_id}"
        self._busy = False
        self._authenticated = False
        self._window = ""

    def ssh_argv(self, creds: Credentials, known_hosts: Path) -> list[str]:
        assert self.plan is not None
        host = bmc_host(self.bmc.address)
        alias = re.sub(r"[^A-Za-z0-9.-]", "_", f"bmc-{host}-{self.plan.port}")
        return [self.ssh, "-F", "/dev/null", "-tt", "-e", "none", "-p", str(self.plan.port),
                "-l", creds.username,
                "-o", "BatchMode=no", "-o", "PubkeyAuthentication=no", "-o", "GSSAPIAuthentication=no",
                "-o", "PreferredAuthentications=keyboard-interactive,password",
                "-o", "NumberOfPasswordPrompts=1",
                "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={alias}",
                "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no", "-o", "HashKnownHosts=no",
                "-o", f"ServerAliveInterval={KEEPALIVE_SECONDS}",
                "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", "LogLevel=VERBOSE",
                "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "ForwardAgent=no",
                "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes", "-o", "EscapeChar=none",
                "--", host]

    def _loop(self) -> None:
        if self.plan is None:
            self._say("no console", self._unreadable)
            return
        super()._loop()

    def _ended_by(self, stderr: str, up: float) -> Ended:
        """How the ssh session that ran ``up`` seconds ended, from what the BMC showed and
        what ssh said (``stderr``)."""
        lower = stderr.lower()
        if any(p in lower for p in HOST_KEY_CHANGED):
            return Ended("host_key_changed", "the BMC's SSH host key is not the one pinned at "
                         "first contact; refused, not retried (an operator removes the pin "
                         f"{self.store.known_hosts(self.bmc.address)} for a replaced BMC)", final=True)
        if not self._authenticated and any(p in lower for p in SSH_AUTH_FAILED):
            return Ended("auth failed", "the BMC refused the credentials; not retried", final=True)
        if self._busy:
            return Ended("busy", "another session holds the node's console; tried again every "
                         f"{BUSY_RETRY:.0f}s, never taken over", wait=BUSY_RETRY)
        why = _tail(_ssh_said(stderr)) or "the session ended"
        if self._authenticated and up >= STEADY:
            # a session that was up: again at once, nothing more lost
            return Ended("dropped", why, wait=0.2, steady=True)
        # it cannot connect, or the BMC lets it in and puts it out at once: backing off
        return Ended("dropped", why if self._authenticated else f"cannot connect: {why}")

    def _session(self, creds: Credentials) -> str:
        """One ssh session, its output into the ring; returns what ssh said on stderr."""
        plan = self.plan
        assert plan is not None
        known_hosts = self.store.known_hosts(self.bmc.address)
        self._window = ""
        self._busy = self._authenticated = False
        with askpass(creds.password) as (script, secret):
            env = proc.clean_env({"SSH_ASKPASS": str(script), "SSH_ASKPASS_REQUIRE": "force",
                                  "DISPLAY": ""})
            env.pop("SSH_AUTH_SOCK", None)

            def heard(line: str) -> None:
                if line.startswith("Authenticated to "):
                    secret.unlink(missing_ok=True)
                    self._authenticated = True
                    self.connects += 1
                    self._say("attached", f"over SSH, port {plan.port} ({plan.source})")

            with proc.running(self.ssh_argv(creds, known_hosts), stdin=subprocess.PIPE, env=env,
                              check=False, on_stderr_line=heard) as child:
                with self._lock:
                    self._child = child
                if self._stop.is_set():
                    child.stop()
                fd = child.popen.stdout.fileno() if child.popen.stdout is not None else -1
                # poll, not select: a site keeping hundreds of consoles holds descriptors past
                # select's 1024 (bench/console_liveness.py found it at 256 consoles)
                poller = select.poll()
                if fd >= 0:
                    poller.register(fd, select.POLLIN)
                entered = not plan.entry
                last, begun = 0.0, time.monotonic()
                while fd >= 0:
                    now = time.monotonic()
                    if not entered and self._authenticated and (
                            (last and now - last >= ENTRY_QUIET) or now - begun >= ENTRY_LATEST):
                        self._type(plan.entry + "\r")   # its CLI's prompt is shown: as typed
                        entered = True
                    # once entered, woken by its output alone (stop ends ssh: its EOF wakes it),
                    # so a quiet console costs the daemon nothing between lines
                    if not poller.poll(int(ENTRY_QUIET * 1000) if not entered else None):
                        continue
                    try:
                        data = os.read(fd, 65536)
                    except OSError:
                        break
                    if not data:
                        break
                    last = time.monotonic()
                    text = data.decode("utf-8", "replace")
                    if self._busy_said(text):
                        self._busy = True
                        child.stop(grace=1.0)
                        break
                    self._lines(text)
                self._ended()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.popen.wait(2.0)     # its own word on how the connection ended
                child.stop(grace=1.0)
            with self._lock:
                self._child = None
            return child.stderr_text()

    def _type(self, keys: str) -> None:
        with self._lock:
            child = self._child
        if child is not None and child.popen.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                child.popen.stdin.write(keys.encode())
                child.popen.stdin.flush()

    def _busy_said(self, text: str) -> bool:
        """Whether the session's first output says another session holds the console."""
        if self.plan is None or not self.plan.busy or len(self._window) >= BUSY_WINDOW:
            return False
        self._window = (self._window + text.lower())[:BUSY_WINDOW]
        return any(p in self._window for p in self.plan.busy)


def _ssh_said(stderr: str) -> str:
    """ssh's own words, without its VERBOSE chatter."""
    return "\n".join(ln for ln in stderr.splitlines()
                     if ln.strip() and not ln.startswith(("Authenticated to ", "Transferred: ",
                                                          "Warning: Permanently added", "debug")))
