"""Each registered node's serial console, kept by the site: IPMI Serial-over-LAN through
``ipmitool sol activate``, one session per node, into a ring of bounded size on the site's disk.

    consoles = Consoles(root, secrets_dir, report=timelines.console, ...)
    consoles.keep(node_id, Bmc(address, "ipmi", credentials_ref))    # the first bmc.* command on
    consoles.attach(node_id, bmc)         # boot.prepareRamdisk, bmc.power on: an ended one again
    consoles.detach(node_id)              # an operator's word, or another BMC for the node
    consoles.read(node_id, since=t0, until=t1)                       # [(time, line)], oldest first

A node's console is kept from the site's first contact with its BMC and stays attached across
its boots, power cycles and clean-ups (observer.py); at most ``capacity`` at once, a console
past it said ``not kept`` with the cap named.

- The password travels as for every ipmitool call (agent/site/bmc/ipmi.py): in the child's
  environment (``-E``), never in argv or a file; it is read from the secret store at each
  (re)connect, so a rotation is followed.
- A session takes no BMC lock and no IPMI session slot (those are for short commands, and a
  console is held for the whole boot): bmc.* commands on the node run beside it.
- Plain ``sol activate``: ipmitool's own keepalive (Get Device ID every 15 s) keeps the IPMI
  session open and ends ipmitool when the BMC stops answering. Not ``usesolkeepalive``: its
  keepalive is an empty SOL packet, and ipmi_sim (lanserv) renews a session's 30 s inactivity
  timer only on IPMI messages, never on SOL ones, so it closes the session ~30 s after the
  activation and what the node writes until ipmitool gives up (~45 s) is lost.
- A SOL session the BMC ended while the IPMI session lives on (another client's ``sol
  deactivate``) sends nothing and ipmitool's keepalive does not notice it: after
  ``LIVENESS_SILENCE`` seconds without a byte the site asks the BMC which session holds the
  node's SOL (Get Payload Instance Info, ``raw 0x06 0x4b 0x01 0x01``, an ipmitool run of its
  own through agent/site/bmc/ipmi.py, the password in its environment, no lock or session slot
  of the site's taken). The site's own session is the one the BMC names right after each
  activation (asked at once: a healthy boot is never silent long enough to learn it later, and
  a client that took the console meanwhile would be taken for it). Nobody: the session is over,
  its ipmitool stopped and said ``dropped``. Another session: said ``busy`` at once (the
  other client has the node's lines now), its ipmitool stopped without ``~.`` (whose
  deactivate would end the other holder's session). No answer: nothing concluded.
- Dropped by the BMC (ipmitool exits) or found ended: reconnected, backing off from 1 s to
  30 s. Another session holds SOL ("SOL payload already active on another session"): said as
  ``busy`` and tried again every 30 s, never taken over. A BMC whose SOL is disabled or absent, or a node
  driven over Redfish: said as ``no SOL`` once, no retries. Wrong credentials: said, no
  retries (a BMC locks accounts).
- Leaving: ``~.`` on ipmitool's stdin ends the session at the BMC (a killed ipmitool leaves
  it held until the BMC times it out), then its process group is stopped.
- The ring: ``<root>/<node>/console.log`` and ``console.log.1``, lines ``<unix ms> <text>``;
  past half the ring's size the newer file becomes the older one, so a node holds at most
  ``ring_bytes`` and a restart of the daemon appends where it was. The site's budget
  (``budget_bytes``) caps the rings together: a new console past it first removes the rings
  of the nodes not attached, oldest first, and is refused (said) when that is not enough.
- Beside the ring, every line also goes to the site's console store (consolestore.py: a
  node's history, compressed, kept for days): ``read`` takes from it what is older than the
  ring holds, ``oldest`` is the store's oldest moment.
- The attached nodes are recorded (``sessions.json``): a daemon that restarts resumes them.
- Milestones (MILESTONES: firmware, boot loader, a kexec, kernel started, init, the agent's
  first line, the join, a panic, no network, the gateway unreachable, no boot device) go to
  ``on_milestone``, each once per boot. A new boot (``starts_boot``): a firmware's banner
  (SeaBIOS's "SeaBIOS (version", AAVMF's "UEFI firmware (version") after any milestone, or any
  firmware line or iPXE's banner after the kernel's stage (init, the agent, a panic...; x86
  OVMF's first serial line is BdsDxe's, and a ramdisk booted ``quiet`` never shows "Linux
  version"). A kexec is a new boot with no firmware (``kexecs``): the line that announces it
  (the agent's ``reboot(LINUX_REBOOT_CMD_KEXEC)``, the kernel's "kexec_core: Starting new
  kernel", systemd's "Rebooting with kexec"), else a new kernel's first line (its "Linux
  version", bc-init's "up, kernel") after the init stage of the boot before; it is reported as
  the milestone ``kexec``, then the new kernel's own. A resumed console (a daemon restart)
  counts the firmware as seen, so a line of a boot under way is not taken for a new one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agent import proc, redact
from agent.atomicfile import write_atomic
from agent.config import Config
from agent.errors import AgentError
from agent.retry import Backoff
from agent.site.bmc.client import CallContext, Credentials, Pacing, Target
from agent.site.bmc.ipmi import CIPHER_SUITE, IpmiClient, split_address
from agent.site.bmc.secrets import SecretStore
from agent.site.observe.consolestore import ConsoleStore
from agent.site.observe.timeline import Step

log = logging.getLogger(__name__)

MAX_LINE = 2048
MAX_REFUSED = 4096    # nodes whose console's refusal is remembered (as the observer's BMCs)
RECONNECT_MIN, RECONNECT_MAX = 1.0, 30.0
BUSY_RETRY = 30.0
LIVENESS_SILENCE = 15.0     # no byte for this long: does the BMC still hold our SOL session?
LIVENESS_TIMEOUT = 20.0     # one such question, at most

SECURE_BOOT_DENIED = re.compile(r"BdsDxe: failed to load .*: Access Denied|Security Violation|"
                                r"Could not boot(?: image)?: Exec format error")
# (milestone, what on the console shows it), tried in order on each line.
MILESTONES: tuple[tuple[Step, re.Pattern[str]], ...] = (
    (Step.PANIC, re.compile(r"Kernel panic - not syncing")),
    # UEFI Secure Boot refusing an image no db entry verifies: the firmware's LoadImage answers
    # EFI_SECURITY_VIOLATION, which edk2's BDS prints as "Access Denied" for a boot option's
    # image (OVMF's ``BdsDxe: failed to load Boot0001 "UEFI PXEv4 ..." ...: Access Denied``:
    # an unsigned ipxe.efi), its shell as "Security Violation"; Debian's iPXE (1.0.0+git-2019),
    # whose image probe takes any LoadImage failure for "not an EFI image", as ``Could not boot:
    # Exec format error`` for a UKI the site served whole and verified by digest (an unsigned
    # one, one signed by a key not in db). Each seen under OVMF's Secure Boot build with a
    # fleet's keys enrolled: tests/e2e/test_secure_boot.py.
    (Step.SECURE_BOOT_DENIED, SECURE_BOOT_DENIED),
    # the agent's boot.kexec (agent/hw/kexec.py), the kernel's own word (a notice: not shown
    # under ``quiet``), systemd's ``systemctl kexec``
    (Step.KEXEC, re.compile(r"\breboot\(LINUX_REBOOT_CMD_KEXEC\)|kexec_core: Starting new kernel|"
                            r"systemd-shutdown\[1\]: Rebooting with kexec")),
    (Step.JOINED, re.compile(r"\bconnected to gateway\b")),
    # the gateway answered: a TLS handshake that failed (its certificate not trusted, or for
    # another name; a TLS version or client certificate it refused), or a session it refused
    (Step.GATEWAY_REFUSED, re.compile(
        r"agent\.link\.session: gateway \S+: (?!.*network is not up).*(\[SSL|certificate|\bTLS|"
        r"gateway refused the session)")),
    (Step.GATEWAY_UNREACHABLE, re.compile(
        r"agent\.link\.session: gateway \S+: (?!.*network is not up).*(refused|timed out|unreachable|"
        r"No route|certificate|Errno)")),
    (Step.NO_NETWORK, re.compile(r"the network is not up yet|no DHCP lease|Network is unreachable")),
    (Step.AGENT_STARTED, re.compile(r"bc-init \[[\d.]+\]: starting agent\b")),
    (Step.INIT, re.compile(r"bc-init \[[\d.]+\]: up, kernel|Run /init as init process|systemd\[1\]: ")),
    (Step.KERNEL_STARTED, re.compile(r"\bLinux version \d|Booting Linux on physical CPU|EFI stub: ")),
    # SeaBIOS's words; OVMF's for a boot option with nothing to start (an empty disk: ``BdsDxe:
    # failed to load Boot0001 "UEFI Misc Device" from PciRoot(0x0)/Pci(0x3,0x0): Not Found``,
    # then its shell; seen in tests/e2e/test_site_ipmi_off.py), and when no option is left.
    (Step.NO_BOOT_DEVICE, re.compile(r"No bootable device|Boot failed: not a bootable disk|"
                                     r"No boot device|BdsDxe: No bootable option|Boot failed|"
                                     r"BdsDxe: failed to load .*: Not Found")),
    (Step.BOOT_LOADER, re.compile(r"iPXE initialising|iPXE \d|GNU GRUB|Booting from (?:Hard Disk|DVD|ROM)|"
                                  r"Loading Linux|systemd-boot|Booting `")),
    (Step.FIRMWARE, re.compile(r"SeaBIOS \(version|UEFI firmware \(version|EDK II|BdsDxe|"
                               r"UEFI Interactive Shell|Press (?:F2|DEL|ESC)")),
)
# The first line a firmware prints at each start (power on, reset): a new boot after any
# milestone. iPXE's banner also comes again within a boot (the ROM's iPXE chaining another).
FIRMWARE_BANNER = re.compile(r"SeaBIOS \(version|UEFI firmware \(version")
IPXE_BANNER = re.compile(r"iPXE initialising devices|iPXE \d.* -- Open Source Network Boot Firmware")
# What a boot shows only once its kernel has started: a firmware line after one is a reset.
KERNEL_STAGE = frozenset({Step.KEXEC, Step.KERNEL_STARTED, Step.INIT, Step.AGENT_STARTED, Step.JOINED,
                          Step.PANIC, Step.NO_NETWORK, Step.GATEWAY_UNREACHABLE, Step.GATEWAY_REFUSED})
# What a kernel and its init print once each per boot: one after its init's stage (init, the
# agent, the join, a panic) with no firmware and no kexec line between is a kernel that the one
# before loaded and started itself (a kexec it did not announce, a crash kernel). Not every
# init line: systemd's come all through a boot.
NEW_KERNEL = re.compile(r"\bLinux version \d|Booting Linux on physical CPU|"
                        r"bc-init \[[\d.]+\]: up, kernel|Run /init as init process")
AFTER_INIT = frozenset({Step.INIT, Step.AGENT_STARTED, Step.JOINED, Step.PANIC, Step.NO_NETWORK,
                        Step.GATEWAY_UNREACHABLE, Step.GATEWAY_REFUSED})
# CSI sequences with any parameter bytes (ECMA-48: 0x30-0x3F, so OVMF's "ESC [ = 3 h" too, whose
# "[=3h" was left in front of its first line), charset selections, the short ones.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78cM]")

BUSY_PATTERNS = ("already active on another session", "sol payload already active")
# What a BMC without SOL answers (ipmi_sim without a ``sol`` line: "Error activating SOL
# payload: Invalid command"), or with SOL disabled.
NO_SOL_PATTERNS = ("sol payload disabled", "sol is not enabled", "sol not supported",
                   "error activating sol payload: invalid command",
                   "error activating sol payload: command not supported", "invalid payload")
AUTH_PATTERNS = ("rakp 2 hmac is invalid", "unauthorized name", "invalid user name", "password invalid")


def milestone(line: str) -> Step | None:
    for step, pattern in MILESTONES:
        if pattern.search(line):
            return step
    return None


def starts_boot(line: str, step: Step | None, seen: set[str]) -> bool:
    """Whether ``line`` (milestone ``step``) begins a new boot of a node whose console showed
    the milestones ``seen`` since its last boot began."""
    if not seen:
        return False
    if FIRMWARE_BANNER.search(line):
        return True
    return bool(seen & KERNEL_STAGE) and (step == Step.FIRMWARE or bool(IPXE_BANNER.search(line)))


def kexecs(line: str, step: Step | None, seen: set[str]) -> bool:
    """Whether ``line`` (milestone ``step``) shows a kexec in a boot whose console showed the
    milestones ``seen``: a kexec line (not a second one of the same hand-over: the agent's,
    then the kernel's), or a new kernel's first line after the init stage with no firmware."""
    if step == Step.KEXEC:
        return seen != {Step.KEXEC}
    return bool(seen & AFTER_INIT) and bool(NEW_KERNEL.search(line))


def payload_holder(text: str) -> int | None:
    """The session ID in ``ipmitool raw``'s answer to Get Payload Instance Info: its first
    four data bytes, least significant first (0: the payload is not active); None when the
    answer holds no such bytes."""
    data: list[int] = []
    for line in text.splitlines():
        cells = line.split()
        if cells and all(re.fullmatch(r"[0-9a-fA-F]{2}", c) for c in cells):
            data += [int(c, 16) for c in cells]
    return int.from_bytes(bytes(data[:4]), "little") if len(data) >= 4 else None


def clean(raw: str) -> str:
    """A console line without escape sequences, carriage returns or other control characters,
    and without secrets (agent/redact.py: a kernel prints its command line, bc.token= in it)."""
    text = _ANSI.sub("", raw)
    return redact.scrub_text("".join(c for c in text if c == "\t" or c.isprintable())[:MAX_LINE])


@dataclass(frozen=True)
class Bmc:
    address: str
    protocol: str            # "ipmi" (SOL) or "redfish" (no SOL here)
    credentials_ref: str
    console: str = ""        # an SSH console's plan (sshconsole.py SshConsole.encode); "": SOL


class Ring:
    """A node's console on disk: two files, at most ``size`` bytes together."""

    def __init__(self, folder: Path, size: int,
                 also: Callable[[float, str], None] | None = None) -> None:
        self.folder = folder
        self.also = also          # each line handed on too (the console store's append)
        self.size = max(size, 4096)
        self.current = folder / "console.log"
        self.older = folder / "console.log.1"
        self._lock = threading.Lock()

    def append(self, t: float, line: str) -> None:
        record = f"{int(t * 1000)} {line}\n".encode()
        if self.also is not None:
            self.also(t, line)
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                held = self.current.stat().st_size
            except FileNotFoundError:
                held = 0
            if held and held + len(record) > self.size // 2:
                os.replace(self.current, self.older)
            fd = os.open(self.current, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, record[: self.size // 2])
            finally:
                os.close(fd)

    def bytes(self) -> int:
        total = 0
        for path in (self.current, self.older):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def read(self, since: float = 0.0, until: float = 0.0) -> list[tuple[float, str]]:
        """The lines kept, oldest first, within [since, until] (0: no bound), compared at the
        millisecond the ring keeps: a line is in a window that starts at its own moment (an
        attempt begun by that line), though its stamp drops what is finer."""
        lo, hi = int(since * 1000), int(until * 1000)
        out: list[tuple[float, str]] = []
        with self._lock:
            for path in (self.older, self.current):
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                for raw in data.decode("utf-8", "replace").splitlines():
                    stamp, _, text = raw.partition(" ")
                    if not stamp.isdigit():
                        continue      # a line torn by a crash
                    ms = int(stamp)
                    if (lo and ms < lo) or (hi and ms > hi):
                        continue
                    out.append((ms / 1000, text))
        return out

    def oldest(self) -> float:
        """The time of the oldest line kept (0.0: none), from the first lines of the older file
        (else the newer): no more than a few KiB read."""
        with self._lock:
            for path in (self.older, self.current):
                try:
                    with path.open("rb") as f:
                        head = f.read(2 * MAX_LINE + 64)
                except FileNotFoundError:
                    continue
                for raw in head.split(b"\n")[:-1]:
                    stamp = raw.partition(b" ")[0]
                    if stamp.isdigit():
                        return int(stamp) / 1000
        return 0.0

    def remove(self) -> None:
        with self._lock:
            for path in (self.current, self.older):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.folder.rmdir()


@dataclass(frozen=True)
class Ended:
    """How one console session ended, as its transport judged it, and what comes next."""

    state: str                  # said: dropped, busy, auth failed, no SOL, host_key_changed ...
    detail: str = ""
    wait: float | None = None   # seconds before the next session; None: backing off
    final: bool = False         # not tried again
    steady: bool = False        # it was up long enough: the backoff starts over


class SolSession:
    """One node's SOL session under a thread of its own, reconnected until ``stop``. The loop
    (``_loop``) is every transport's; a transport gives its ``_session`` and ``_ended_by``
    (sshconsole.py's SshSession)."""

    def __init__(self, node_id: str, bmc: Bmc, ring: Ring, store: SecretStore, *,
                 report: Callable[[str, str, str], None], ipmitool: str = "ipmitool",
                 resumed: bool = False) -> None:
        self.node_id = node_id
        self.bmc = bmc
        self.ring = ring
        self.store = store
        self.report = report            # (node_id, step, line)
        self.ipmitool = ipmitool
        self.state = "starting"         # attached, busy, no SOL, dropped, auth failed, failed, stopped
        self.leave = b"\r~."            # what ends the session at the BMC (ipmitool's escape)
        self.connects = 0
        self._stop = threading.Event()
        self._child: proc.Child | None = None
        self._lock = threading.Lock()
        # a resumed console's node is somewhere in a boot: its next firmware line is no new one
        self._seen: set[str] = {Step.FIRMWARE} if resumed else set()
        self._partial = ""
        self._holder: int | None = None  # the BMC's ID of the site's own SOL session
        self._former: int | None = None  # that of the site's session before this one
        self._activated = False          # the session just activated: its ID to be asked
        self._taken_by: int | None = None   # another session found holding the SOL
        self._ended_why = ""             # why the site ended the session itself
        self._unanswered = False         # a question of _still_held went unanswered (said once)
        self._thread = threading.Thread(target=self._run, name=f"sol-{node_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            child = self._child
        if child is not None:
            with contextlib.suppress(OSError, ValueError):
                if child.popen.stdin is not None:
                    child.popen.stdin.write(self.leave)   # ends the session at the BMC
                    child.popen.stdin.flush()
            deadline = time.monotonic() + 2.0
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            child.stop()
        self._thread.join(wait)
        self.state = "stopped"

    def _say(self, state: str, detail: str = "") -> None:
        if state != self.state:
            text = f"{state}: {detail}" if detail else state
            log.info("console of %s (%s): %s", self.node_id, self.bmc.address, text)
            self.ring.append(time.time(), f"[site: console {text}]")
            self.report(self.node_id, Step.CONSOLE, text)
            self.state = state

    def _argv(self, creds: Credentials) -> list[str]:
        host, port = split_address(self.bmc.address)
        # stdbuf: ipmitool's stdout is block-buffered when it is not a terminal, and a
        # console's lines must come as they are written (coreutils' stdbuf, -o0).
        return ["stdbuf", "-o0", self.ipmitool, "-v", "-I", "lanplus", "-H", host, "-p", str(port),
                "-U", creds.username, "-E", "-C", CIPHER_SUITE, "sol", "activate"]

    @property
    def alive(self) -> bool:
        """Still keeping (or trying to keep) the console: not ended for no SOL or refused
        credentials."""
        return self._thread.is_alive() or self.state == "starting"

    def _run(self) -> None:
        """The session's thread: a fault of the site's own (a bug, not the BMC's word) is said
        ``failed`` with what it was, not left as a console that says attached and keeps nothing."""
        try:
            self._loop()
        except Exception as exc:   # the thread's last word: nothing above it would hear it
            log.exception("console of %s: its session failed", self.node_id)
            self._say("failed", f"the site's console session failed: {type(exc).__name__}: {exc}"[:200])

    def _loop(self) -> None:
        """Sessions one after another until ``stop``: the credentials read at each (a rotation
        followed), the transport's session run, its end judged by the transport
        (``_ended_by``), said, and waited on as it says: never again, a fixed wait (busy), or
        backing off (agent/retry.py), started over after a session that was up long enough."""
        redial = Backoff(first=RECONNECT_MIN, cap=RECONNECT_MAX).start(cancel=self._stop)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                creds = self.store.get(self.bmc.credentials_ref)
                said = self._session(creds)
            except AgentError as exc:
                end = Ended("dropped", exc.message[:200])
            else:
                end = self._ended_by(said, time.monotonic() - started)
            if self._stop.is_set():
                return
            self._say(end.state, end.detail)
            if end.final:
                return
            if end.steady:
                redial.reset()
            if end.wait is not None:
                self._stop.wait(end.wait)
            else:
                redial.sleep(redial.next() or RECONNECT_MAX)   # never None: no bound nor deadline

    def _ended_by(self, stderr: str, up: float) -> Ended:
        """How the SOL session that ran ``up`` seconds ended, from what the site saw and what
        ipmitool said (``stderr``)."""
        if self._taken_by is not None:
            # another client took the node's SOL: busy from the moment it is seen, and
            # tried again as any busy console (never taken back)
            return Ended("busy", f"{self._ended_why}; tried again every {BUSY_RETRY:.0f}s, "
                         "never taken over", wait=BUSY_RETRY)
        if self._ended_why:
            return Ended("dropped", self._ended_why, wait=RECONNECT_MIN)
        lower = stderr.lower()
        if any(p in lower for p in AUTH_PATTERNS):
            return Ended("auth failed", "the BMC refused the credentials; not retried", final=True)
        if any(p in lower for p in BUSY_PATTERNS):
            return Ended("busy", "another session holds the node's SOL; tried again every "
                         f"{BUSY_RETRY:.0f}s, never taken over", wait=BUSY_RETRY)
        if any(p in lower for p in NO_SOL_PATTERNS) and not self.connects:
            return Ended("no SOL", _tail(stderr), final=True)
        return Ended("dropped", _tail(stderr) or "the session ended", steady=up > 30)

    def _session(self, creds: Credentials) -> str:
        """One ipmitool sol activate, its output into the ring; returns its stderr. After
        LIVENESS_SILENCE seconds without a byte, the BMC is asked whether the session still
        holds the node's SOL (``_still_held``); when not, ipmitool is stopped."""
        env = proc.clean_env({"IPMI_PASSWORD": creds.password})
        self._former = self._holder if self._holder is not None else self._former
        self._holder, self._ended_why, self._taken_by, self._activated = None, "", None, False
        with proc.running(self._argv(creds), stdin=subprocess.PIPE, env=env, check=False) as child:
            with self._lock:
                self._child = child
            if self._stop.is_set():
                child.stop()
            fd = child.popen.stdout.fileno() if child.popen.stdout is not None else -1
            poller = select.poll()
            if fd >= 0:
                poller.register(fd, select.POLLIN)
            heard = time.monotonic()
            while fd >= 0:
                wait = heard + LIVENESS_SILENCE - time.monotonic()
                if wait <= 0 or not poller.poll(int(wait * 1000) + 1):
                    if self.state == "attached" and not self._ended_why and not self._stop.is_set() \
                            and not self._still_held(creds):
                        child.stop(grace=1.0)      # its EOF ends the loop
                    heard = time.monotonic()
                    continue
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                heard = time.monotonic()
                self._lines(data.decode("utf-8", "replace"))
                if self._activated:
                    self._activated = False
                    self._own_session(creds)
            self._ended()
            child.stop(grace=1.0)
        with self._lock:
            self._child = None
        said = child.stderr_text()
        if any(p in said.lower() for p in BUSY_PATTERNS) and self._end_own_former(creds):
            self._ended_why = (f"the BMC still gave the node's SOL to the site's own former session "
                               f"({self._former:#x}); that one ended, attached again")
        return said.replace(creds.password, "<hidden>") if creds.password else said

    def _client(self, creds: Credentials) -> IpmiClient:
        """An ipmitool client of the console's own, for one question: no site lock or slot."""
        return IpmiClient(
            Target(self.bmc.address, creds),
            CallContext(cancel=self._stop, deadline=time.monotonic() + LIVENESS_TIMEOUT,
                        pacing=Pacing(min_interval=1.0, max_interval=4.0)),
            ipmitool=self.ipmitool)

    def _end_own_former(self, creds: Credentials) -> bool:
        """Refused as busy right after the BMC ended the site's own session (ipmi_sim, when
        the node's serial line goes away at a power cycle, closes the session and still counts
        it as holding the SOL until its 30 s timeout): where the holder the BMC names is the
        site's own former session, that instance is deactivated (no one else's) and the console
        attaches at once, instead of BUSY_RETRY later with the boot's first lines lost."""
        if self._former is None or self._holder_now(creds) != self._former:
            return False
        try:
            self._client(creds).run("sol", "deactivate")
        except AgentError as exc:
            log.info("console of %s: its former SOL session not ended (%s)", self.node_id, exc.message[:200])
            return False
        log.info("console of %s: the BMC still held the site's former SOL session %#x; ended",
                 self.node_id, self._former)
        return True

    def boot_begins(self) -> None:
        """A power on, cycle or reset is about to be sent: a new boot, whose milestones are
        reported again (its firmware's first line may come before, or be lost to, a
        reconnect)."""
        self._seen = set()

    def _holder_now(self, creds: Credentials) -> int | None:
        """The BMC's ID of the session that holds the node's SOL (0: none), asked in an IPMI
        session of its own (Get Payload Instance Info, SOL instance 1), no site lock or slot
        taken; None when the BMC gave no answer."""
        client = self._client(creds)
        try:
            return payload_holder(client.run("raw", "0x06", "0x4b", "0x01", "0x01"))
        except AgentError as exc:
            log.log(logging.DEBUG if self._unanswered else logging.INFO,
                    "console of %s: who holds its SOL? no answer (%s)", self.node_id, exc.message[:200])
            self._unanswered = True
            return None

    def _own_session(self, creds: Credentials) -> None:
        """The session has just activated: the session the BMC gives the SOL to now is the
        site's own, recorded, so that a client taking the console later is told from it (a
        healthy boot is never silent long enough to learn it later, and what held the SOL
        after a silence may already be the other client)."""
        holder = self._holder_now(creds)
        if holder:
            self._holder = holder
            log.debug("console of %s: the site's SOL session is the BMC's %#x", self.node_id, holder)

    def _still_held(self, creds: Credentials) -> bool:
        """Whether the BMC still gives the node's SOL to the site's session (``_own_session``
        recorded its ID at the activation; where that went unanswered, the first holder seen
        is taken for it). Nobody holding it: not held, ``_ended_why`` says so; another: not
        held, ``_taken_by`` is it (busy). No answer (the BMC busy, this ipmitool's own
        failure): held, nothing concluded."""
        holder = self._holder_now(creds)
        if holder is None:
            return True
        if holder == 0:
            self._ended_why = "the BMC ended the SOL session (no session holds it)"
        elif self._holder is not None and holder != self._holder:
            self._taken_by = holder
            self._ended_why = (f"another session took the node's SOL (the BMC's session {holder:#x}, "
                               f"not the site's {self._holder:#x})")
        else:
            self._holder = holder
            return True
        return False

    def _ended(self) -> None:
        """The session's output is over: a line it cut short is kept as it is, not joined to
        what the next session writes first (its "[SOL Session operational" mark)."""
        if self._partial:
            self._lines("\n")

    def _lines(self, text: str) -> None:
        text = self._partial + text
        *whole, self._partial = re.split(r"\r\n|\n|\r", text)
        if len(self._partial) > MAX_LINE:
            whole.append(self._partial)
            self._partial = ""
        for raw in whole:
            line = clean(raw).rstrip()
            if not line:
                continue
            if line.startswith("[SOL Session operational"):
                self.connects += 1
                self._activated = True       # the site's own session: its ID asked at once
                self._say("attached")
                continue
            if line.endswith("[terminated ipmitool]"):    # ipmitool's answer to our "~."
                continue
            self._milestones(line)
            # Stamped once its milestones are reported, never before: an attempt the line
            # begins (the timeline's clock at the report) starts no later than the line, so
            # the attempt's window holds it (a boot loop's only line was left out of its own
            # attempt when the ring's stamp came a few milliseconds before the report's).
            self.ring.append(time.time(), line)

    def _milestones(self, line: str) -> None:
        step = milestone(line)
        if kexecs(line, step, self._seen):
            self._seen = {Step.KEXEC}    # a new boot, by the kernel before: no firmware
            self.report(self.node_id, Step.KEXEC, line)
        elif starts_boot(line, step, self._seen):
            self._seen.clear()           # a new boot: its milestones are reported again
            if step != Step.FIRMWARE:    # iPXE's banner, the first line this boot showed
                self._seen.add(Step.FIRMWARE)
                self.report(self.node_id, Step.FIRMWARE, line)
        if step is None:
            return
        if step == Step.NO_BOOT_DEVICE and Step.FIRMWARE not in self._seen:
            # the firmware's own words, its first this boot (x86 OVMF's first serial line
            # is BdsDxe's failed load of an empty disk): the firmware milestone first, so
            # that its next line (its shell's) is no new boot
            self._seen.add(Step.FIRMWARE)
            self.report(self.node_id, Step.FIRMWARE, line)
        if step not in self._seen:
            self._seen.add(step)
            self.report(self.node_id, step, line)


def _tail(text: str) -> str:
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and "tcgetattr" not in ln]
    return " / ".join(kept[-2:])[:200]


class Consoles:
    """Every attached node's SolSession, the rings, the budget, and the record for restarts."""

    def __init__(self, root: Path, secrets_dir: Path, *, report: Callable[[str, str, str], None],
                 ring_bytes: int = Config.site_console_ring_bytes,
                 budget_bytes: int = Config.site_console_budget_bytes,
                 ipmitool: str = "ipmitool", ssh_session: type[SolSession] | None = None,
                 history: ConsoleStore | None = None) -> None:
        self.root = root
        self.history = history    # every line kept on disk for days (consolestore.py)
        # the session kind of a console over SSH (sshconsole.SshSession, given by the observer:
        # it builds on this module)
        self.ssh_session = ssh_session
        self.store = SecretStore(secrets_dir)
        self.report = report
        self.ring_bytes = ring_bytes
        self.budget_bytes = budget_bytes
        self.ipmitool = ipmitool
        self._sessions: dict[str, SolSession] = {}
        # node -> (its BMC, why its console is not kept): said once per BMC by ``keep``
        self._refused: OrderedDict[str, tuple[Bmc, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._record = root / "sessions.json"

    @property
    def capacity(self) -> int:
        """How many consoles the budget holds at once."""
        return max(1, self.budget_bytes // self.ring_bytes)

    def ring(self, node_id: str) -> Ring:
        history = self.history
        also = None if history is None else (lambda t, line: history.append(node_id, t, line))
        return Ring(self.root / node_id, self.ring_bytes, also)

    def resume(self) -> int:
        """Attach the nodes recorded by the daemon before this one (a restart)."""
        try:
            data = json.loads(self._record.read_text())
            wanted = {str(k): Bmc(**v) for k, v in data.items()}
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, TypeError) as exc:
            log.warning("consoles: %s unreadable (%s); none resumed", self._record, exc)
            return 0
        for node_id, bmc in wanted.items():
            self.attach(node_id, bmc, resumed=True)
        return len(wanted)

    def _save(self) -> None:
        data = {n: asdict(s.bmc) for n, s in self._sessions.items()}
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self._record, json.dumps(data, sort_keys=True).encode(), 0o600)

    def keep(self, node_id: str, bmc: Bmc) -> str:
        """Keep the node's console from the site's first contact with its BMC on (any bmc.*
        command that names the node): attached unless a session for the same BMC is already
        there, alive or ended (an ended one, refused credentials or a changed host key, waits
        for the next power on or prepare, ``attach``), and not said again where it was not kept
        for the same BMC (no console offered, the cap reached). Returns the state, or why not."""
        with self._lock:
            old = self._sessions.get(node_id)
            if old is not None and old.bmc == bmc:
                return old.state
            refused = self._refused.get(node_id)
            if refused is not None and refused[0] == bmc:
                return refused[1]
        return self.attach(node_id, bmc)

    def _refuse(self, node_id: str, bmc: Bmc, why: str) -> str:
        """Say why the node's console is not kept, and remember it (bounded: MAX_REFUSED
        nodes, the oldest forgotten first) so that ``keep`` does not say it again."""
        self.report(node_id, Step.CONSOLE, why)
        with self._lock:
            self._refused[node_id] = (bmc, why)
            self._refused.move_to_end(node_id)
            while len(self._refused) > MAX_REFUSED:
                self._refused.popitem(last=False)
        return why

    def attach(self, node_id: str, bmc: Bmc, *, resumed: bool = False) -> str:
        """Keep the node's console (a session already kept for the same BMC is left as it is;
        an ended one is started again). ``resumed``: kept before a restart of the daemon, the
        node in a boot under way. Returns the session's state, or why it is not kept."""
        if bmc.protocol != "ipmi" and not bmc.console:
            self._refuse(node_id, bmc, f"no SOL: the BMC is driven over {bmc.protocol} and publishes "
                         "no SSH console; the site keeps consoles over SSH or IPMI Serial-over-LAN")
            return "no SOL"
        kind = self.ssh_session if bmc.console else SolSession   # SSH: sshconsole.py's
        if kind is None:
            self._refuse(node_id, bmc, "not kept: an SSH console, and no SSH transport here")
            return "not kept"
        with self._lock:
            old = self._sessions.get(node_id)
            if old is not None and old.bmc == bmc and old.alive:
                return old.state
            held = sum(s.alive for s in self._sessions.values())
            full = old is None and held >= self.capacity
            room = full or old is not None or self._make_room()
        if full:
            why = (f"not kept: the site keeps {self.capacity} consoles at once and holds {held} "
                   "(the cap: site_console_budget_bytes / site_console_ring_bytes)")
            log.warning("console of %s %s", node_id, why)
            return self._refuse(node_id, bmc, why)
        if not room:
            return self._refuse(node_id, bmc, "not kept: the console rings fill the site's budget "
                                "(site_console_budget_bytes)")
        with self._lock:
            self._refused.pop(node_id, None)
            self._sessions.pop(node_id, None)
        if old is not None:
            old.stop()
        session = kind(node_id, bmc, self.ring(node_id), self.store, report=self.report,
                       ipmitool=self.ipmitool, resumed=resumed)
        with self._lock:
            self._sessions[node_id] = session
            self._save()
        session.start()
        return session.state

    def _make_room(self) -> bool:
        """Within the budget for one more ring: the rings of nodes not attached removed,
        least recently written first, as needed."""
        rings = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                if folder.is_dir():
                    ring = Ring(folder, self.ring_bytes)
                    written = ring.current.stat().st_mtime if ring.current.exists() else 0.0
                    rings.append((written, folder.name, ring))
        held = sum(r.bytes() for _, _, r in rings)
        for _, name, ring in sorted(rings):
            if held + self.ring_bytes <= self.budget_bytes:
                break
            if name in self._sessions:
                continue
            held -= ring.bytes()
            ring.remove()
        return held + self.ring_bytes <= self.budget_bytes

    def detach(self, node_id: str) -> bool:
        with self._lock:
            session = self._sessions.pop(node_id, None)
            if session is not None:
                self._save()
        if session is None:
            return False
        session.stop()
        self.report(node_id, Step.CONSOLE, "released")
        return True

    def boot_begins(self, node_id: str) -> None:
        """The node is about to be powered on, cycled or reset: its kept console's milestones
        are a new boot's (console.py SolSession.boot_begins)."""
        with self._lock:
            session = self._sessions.get(node_id)
        if session is not None:
            session.boot_begins()

    def state(self, node_id: str) -> str:
        with self._lock:
            session = self._sessions.get(node_id)
            return session.state if session is not None else "not kept"

    def alive(self) -> int:
        """How many consoles are kept (or being tried) now."""
        with self._lock:
            return sum(s.alive for s in self._sessions.values())

    def attached(self) -> list[str]:
        with self._lock:
            return sorted(self._sessions)

    def read(self, node_id: str, since: float = 0.0, until: float = 0.0) -> list[tuple[float, str]]:
        """The node's lines within [since, until] (0: no bound), oldest first: the ring's, and
        before the ring's oldest line the store's."""
        ring = self.ring(node_id)
        first = ring.oldest()
        lines = ring.read(since, until)
        if self.history is None or (first and since >= first):
            return lines
        if not first:
            return self.history.read(node_id, since, until)
        older = [(t, text) for t, text in self.history.read(node_id, since, until or first)
                 if t < first]
        return older + lines

    def oldest(self, node_id: str) -> float:
        """The oldest moment of the node's console kept (0.0: none): the store's, else the ring's."""
        ring = self.ring(node_id).oldest()
        stored = self.history.oldest(node_id) if self.history is not None else 0.0
        return min(t for t in (ring, stored) if t) if ring or stored else 0.0

    def last_lines(self, node_id: str, n: int = 5) -> list[str]:
        return [text for _, text in self.read(node_id)[-n:]]

    def stop(self) -> None:
        """Stop every session and keep the record: the next start resumes them."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.stop()
        if self.history is not None:
            self.history.close()
