"""The site's view of each node's boot, composed: timelines, causes, consoles and their metrics.
The handlers and services tell it what they did (one call each); it is ``SiteServices.observe``.

    obs = Observer(ObserverSettings(root, secrets_dir), metrics)
    obs.start()                                  # load the timelines, resume the consoles
    obs.bmc_done(node_id, bmc, "bmc.power", "on")        # agent/commands/bmc.py
    obs.prepared(node_id, Prepared(...))                 # agent/commands/boot.py
    obs.cleaned(node_id)
    obs.verdict(node_id, joined=False, detail=why)      # boot.cleanUp's join_refused
    obs.dnsmasq_line(line)                               # the dnsmasq supervisor's log reader
    obs.http_fetch(ip, path, status, sent, seconds, mac) # the HTTP service
    obs.tick()                                           # the site's timer: late boots named
    obs.stop()

When the console is kept: from the site's first contact with the node's BMC (the first bmc.*
command that names the node and succeeds, or boot.prepareRamdisk of a node whose BMC the site
knows), for good: across boots, power off and on, boot.cleanUp and kexecs, reconnected by its
session whenever the BMC drops it (console.py, sshconsole.py), so that a node's history holds
everything it wrote since (consolestore.py). A power on, cycle or reset, or a prepare, starts
again a console that had ended (refused credentials, a changed host key, no SOL). Bounded: at
most ``Consoles.capacity`` at once, one past it said ``not kept`` with the cap named.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.atomicfile import write_atomic
from agent.config import Config
from agent.errors import AgentError, InvalidParameters
from agent.proto import agent_pb2
from agent.site.boot.fields import parse_mac, parse_node_id
from agent.site.metrics import Metrics
from agent.site.observe import dhcplog
from agent.site.observe.causes import EVIDENCE, Diagnosis
from agent.site.observe.console import Bmc, Consoles
from agent.site.observe.consolestore import ConsoleStore
from agent.site.observe.sshconsole import SshSession, bmc_host, offered
from agent.site.observe.timeline import Attempt, BootEvent, Outcome, Prepared, Step, Timelines, render

log = logging.getLogger(__name__)

MAX_BMCS = 4096
CONSOLE_READY_SECONDS = 5.0   # how long a power on waits for the node's SOL session to be up
PHASE_HISTOGRAM = "bettercompute_site_boot_phase_seconds"
CAUSE_LINES = 12     # console lines under a cause (inventory.refresh's node_boots)

# (phase, from the first of, to the first of): a joined attempt's durations, for /metrics.
PHASES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("power_to_dhcp", (Step.POWER_ON,), (Step.DHCP_OFFER, Step.DHCP_IGNORED)),
    ("dhcp_to_boot_loader", (Step.DHCP_OFFER,), (Step.TFTP_SENT, Step.CHAIN_SCRIPT, Step.NODE_SCRIPT)),
    ("boot_loader_to_kernel", (Step.TFTP_SENT, Step.CHAIN_SCRIPT, Step.NODE_SCRIPT), (Step.KERNEL, Step.ISO)),
    ("kernel_fetch", (Step.KERNEL, Step.ISO), (Step.INITRD, Step.KERNEL_STARTED)),
    ("kernel_to_join", (Step.KERNEL_STARTED, Step.INITRD, Step.ISO), (Step.JOINED,)),
    ("power_to_join", (Step.POWER_ON,), (Step.JOINED,)),
    ("kexec_to_join", (Step.KEXEC,), (Step.JOINED,)),
)


@dataclass(frozen=True)
class ObserverSettings:
    root: Path                       # <state_dir>/site/observe: timeline/, console/, bmcs.json
    secrets_dir: Path
    console_ring_bytes: int = Config.site_console_ring_bytes
    console_budget_bytes: int = Config.site_console_budget_bytes
    console_dir: Path | None = None  # the rings (default: root / "console"): put it on a disk
    # every console's history (consolestore.py; default: root / "console-store")
    console_store_dir: Path | None = None
    console_keep_days: float = Config.site_console_keep_days
    console_node_bytes: int = Config.site_console_node_bytes
    console_site_bytes: int = Config.site_console_site_bytes
    # how long a Redfish BMC's "no console offered" is kept before it is read again (console_for)
    console_recheck_seconds: float = Config.site_console_recheck_seconds
    ipmitool: str = "ipmitool"
    waits: dict[str, float] = field(default_factory=dict)   # rule name -> seconds (causes.py)


def _ipmi_address(address: str) -> str:
    """A Redfish BMC's address as IPMI's (port 623): its host alone."""
    try:
        host = bmc_host(address)
    except InvalidParameters:
        return address
    return f"[{host}]" if ":" in host else host


def _node_id_ok(node_id: str) -> bool:
    """A bmc.* request's node_id names files: checked before it is kept ("" is none)."""
    if not node_id:
        return False
    try:
        parse_node_id(node_id)
    except InvalidParameters:
        log.warning("node_id %r is no node id; not in the timelines", node_id[:40])
        return False
    return True


class Observer:
    def __init__(self, settings: ObserverSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.timelines = Timelines(settings.root / "timeline", diagnose=Diagnosis(settings.waits),
                                   on_cause=self._on_cause)
        self.timelines.on_attempt = self._on_attempt
        self.timelines.on_joined = self._on_joined
        self.consoles = Consoles(settings.console_dir or settings.root / "console", settings.secrets_dir,
                                 report=self._console_report, ring_bytes=settings.console_ring_bytes,
                                 budget_bytes=settings.console_budget_bytes, ipmitool=settings.ipmitool,
                                 ssh_session=SshSession, history=ConsoleStore(
                                     settings.console_store_dir or settings.root / "console-store",
                                     report=self._console_report,
                                     keep_seconds=settings.console_keep_days * 86400.0,
                                     node_bytes=settings.console_node_bytes,
                                     site_bytes=settings.console_site_bytes))
        self._bmcs: OrderedDict[str, Bmc] = OrderedDict()
        # Redfish BMCs that offered no console, (address, credentials_ref) -> when they said so
        # (``clock``); at most MAX_BMCS, the oldest answer dropped first.
        self._no_console: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.clock: Callable[[], float] = time.monotonic
        self._lock = threading.Lock()
        self.metrics.gauge("consoles_kept", lambda: float(self.consoles.alive()))

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        self.settings.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.timelines.load()
        self._load_bmcs()
        resumed = self.consoles.resume()
        log.info("site observer: %d nodes' timelines, %d consoles resumed",
                 len(self.timelines.nodes()), resumed)

    def stop(self) -> None:
        self.consoles.stop()
        self.timelines.flush()

    def tick(self) -> None:
        self.timelines.evaluate()
        self.timelines.expire_pending()
        self.timelines.flush()
        if self.consoles.history is not None:
            self.consoles.history.tick()    # a quiet console's held lines; the time limit

    # -- the BMCs the site knows, by node (what a console needs) ------------------------------

    def _load_bmcs(self) -> None:
        try:
            data = json.loads((self.settings.root / "bmcs.json").read_text())
            for node_id, bmc in list(data.items())[-MAX_BMCS:]:
                self._bmcs[str(node_id)] = Bmc(**bmc)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            log.warning("site observer: bmcs.json unreadable (%s); relearned from bmc.* commands", exc)

    def _learn(self, node_id: str, bmc: Bmc) -> None:
        with self._lock:
            known = self._bmcs.get(node_id)
            if known is not None and bmc.protocol == "redfish" and not bmc.console and \
                    known.credentials_ref == bmc.credentials_ref and \
                    known.address in (bmc.address, _ipmi_address(bmc.address)) and \
                    (known.console or known.protocol == "ipmi"):
                bmc = known     # its console's transport, learned at a power on (console_for)
            if self._bmcs.get(node_id) == bmc:
                self._bmcs.move_to_end(node_id)
                return
            self._bmcs[node_id] = bmc
            while len(self._bmcs) > MAX_BMCS:
                self._bmcs.popitem(last=False)
            data = {n: asdict(b) for n, b in self._bmcs.items()}
        write_atomic(self.settings.root / "bmcs.json", json.dumps(data).encode(), 0o600)

    def console_for(self, node_id: str, bmc: Bmc, client: object) -> Bmc:
        """The node's BMC as its console is kept, from what a Redfish BMC says (``client``,
        logged in by a bmc.power command): an SSH console where it offers one (sshconsole.py),
        else SOL where its IPMI is on, else none (said at attach). Asked once per BMC: what
        was learned is kept (bmcs.json); that it offers none is kept too, for
        ``console_recheck_seconds`` (in memory: its IPMI or SSH may be turned on later), so that
        its every command does not read the offer again. An offer that could not be read is
        asked again at the next command. An IPMI BMC: SOL, as it is."""
        from agent.site.bmc.redfish.session import RedfishSession

        if bmc.protocol != "redfish" or not isinstance(client, RedfishSession):
            return bmc
        known = self.bmc_of(node_id)
        if known is not None and known.credentials_ref == bmc.credentials_ref and \
                known.address in (bmc.address, _ipmi_address(bmc.address)) and \
                (known.console or known.protocol == "ipmi"):
            return known
        asked = (bmc.address, bmc.credentials_ref)
        with self._lock:
            said = self._no_console.get(asked)
        if said is not None and self.clock() - said < self.settings.console_recheck_seconds:
            return bmc              # it offered none a moment ago
        try:
            plan, ipmi_on = offered(client)
        except AgentError as exc:
            log.info("console of %s: the BMC's console offer unread (%s)", node_id, exc.message[:200])
            return bmc
        with self._lock:
            self._no_console.pop(asked, None)
            if plan is None and not ipmi_on:
                self._no_console[asked] = self.clock()
                while len(self._no_console) > MAX_BMCS:
                    self._no_console.popitem(last=False)
        if plan is not None:
            return dataclasses.replace(bmc, console=plan.encode())
        if ipmi_on:
            return Bmc(_ipmi_address(bmc.address), "ipmi", bmc.credentials_ref)
        return bmc

    def bmc_of(self, node_id: str) -> Bmc | None:
        with self._lock:
            return self._bmcs.get(node_id)

    # -- what the commands did ----------------------------------------------------------------

    def bmc_done(self, node_id: str, bmc: Bmc, kind: str, operation: str, device: str = "") -> None:
        """A bmc.* command that succeeded for ``node_id`` (none: the site cannot tell whose)."""
        if not _node_id_ok(node_id):
            return
        self._learn(node_id, bmc)
        known = self.bmc_of(node_id) or bmc      # with its console's transport, once learned
        if kind == "bmc.power" and operation in ("on", "cycle", "reset"):
            self.consoles.attach(node_id, known)   # the attempt began at power_requested
        else:
            self.consoles.keep(node_id, known)     # from the first contact on, for good
        if kind == "bmc.power" and operation == "off":
            self.timelines.power(node_id, "off")   # the console stays: the next boot's firmware
        elif kind == "bmc.boot" and operation == "set_boot_device":
            self.timelines.boot_device(node_id, device)

    def before_power(self, node_id: str, bmc: Bmc, *, wait: float = CONSOLE_READY_SECONDS) -> None:
        """Before bmc.power on, cycle or reset: the node's console attached first (waited for,
        ``wait`` seconds at most), so that SOL carries the firmware's first lines: a BMC drops
        what the serial port says while no SOL session is active."""
        if not _node_id_ok(node_id):
            return
        self._learn(node_id, bmc)
        self.consoles.attach(node_id, bmc)
        self.consoles.boot_begins(node_id)   # a console kept from before: a new boot now
        deadline = time.monotonic() + wait
        while self.consoles.state(node_id) == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)

    def power_requested(self, node_id: str, operation: str) -> None:
        """bmc.power on, cycle or reset is about to be sent: the attempt begins now (the
        firmware may fail before the command has settled)."""
        if _node_id_ok(node_id):
            self.timelines.power(node_id, operation)

    def bmc_failed(self, node_id: str, kind: str, operation: str, why: str) -> None:
        """A power on, cycle or reset that failed: its attempt ends there."""
        if kind == "bmc.power" and operation in ("on", "cycle", "reset") and _node_id_ok(node_id):
            self.timelines.power(node_id, "off", f"bmc.power {operation} failed: {why[:200]}")

    def prepared(self, node_id: str, prepared: Prepared) -> None:
        self.timelines.prepared(node_id, prepared)
        bmc = self.bmc_of(node_id)
        if bmc is not None:
            self.consoles.attach(node_id, bmc)

    def digest_refused(self, node_id: str, detail: str) -> None:
        self.timelines.digest_refused(node_id, detail)

    def cleaned(self, node_id: str) -> None:
        """boot.cleanUp: the attempt's end in the timeline; the console stays attached (what
        the node does next, a kexec into the deployed system, a power cycle, is kept)."""
        self.timelines.cleaned(node_id)

    def verdict(self, node_id: str, joined: bool, detail: str = "") -> None:
        """The join as the gateway judged it: a refused one (attestation) comes with
        boot.cleanUp's ``join_refused`` (agent/commands/boot.py), and names the cause
        ``refused`` even when the console saw the agent connect. A node this site keeps no
        timeline of (another site's, or one it never saw) is not started one by a verdict."""
        if not _node_id_ok(node_id) or not self.timelines.attempts(node_id):
            log.info("verdict for %s, a node with no boot timeline here: not kept", node_id[:64])
            return
        self.timelines.verdict(node_id, joined, detail)

    # -- what the services saw ----------------------------------------------------------------

    def dnsmasq_line(self, line: str) -> None:
        got = dhcplog.parse(line)
        if got is None:
            return
        event = BootEvent(self.timelines.clock(), got.step, got.detail)
        if got.mac:
            if got.ip:
                self.timelines.learn_ip(got.ip, got.mac)
            self.timelines.by_mac(got.mac, event)
        else:
            self.timelines.by_ip(got.ip, event)

    def http_fetch(self, ip: str, path: str, status: int, sent: int, seconds: float,
                   mac: str = "") -> None:
        """A request to the boot service: /boot.ipxe (/boot.grub, arm64's), /pxe/<mac>.ipxe
        (.grub), /cache/<sha256>, or a medium (``mac`` given by the service, which knows the
        medium's set)."""
        if path in ("/boot.ipxe", "/boot.grub"):
            self.timelines.fetch(ip, Step.CHAIN_SCRIPT, "", status, sent, seconds)
        elif path.startswith("/pxe/") and path.endswith((".ipxe", ".grub")):
            try:
                name = parse_mac(path[len("/pxe/"):].rpartition(".")[0])
            except InvalidParameters:
                return
            self.timelines.fetch(ip, Step.NODE_SCRIPT, name, status, sent, seconds)
        elif path.startswith("/cache/"):
            self.timelines.cache_fetch(ip, path[len("/cache/"):], status, sent, seconds)
        elif path.startswith("/vm/") and mac:
            step = Step.ISO if path.endswith("/ramdisk.iso") else Step.CONFIG_MEDIUM
            self.timelines.fetch(ip, step, mac, status, sent, seconds)

    # -- the rest ------------------------------------------------------------------------------

    def _console_report(self, node_id: str, step: str, line: str) -> None:
        self.timelines.console(node_id, step, line)

    def _on_attempt(self, node_id: str, attempt: Attempt) -> None:
        self.metrics.inc("boot_attempts_total")

    def _on_cause(self, node_id: str, attempt: Attempt) -> None:
        self.metrics.inc("boot_failures_total", cause=attempt.cause)

    def joined_phases(self, attempt: Attempt) -> dict[str, float]:
        """A joined attempt's phase durations (PHASES)."""
        out = {}
        for phase, start, end in PHASES:
            a, b = attempt.first(*start), attempt.first(*end)
            if a is not None and b is not None and b.t >= a.t:
                out[phase] = b.t - a.t
        return out

    def _on_joined(self, node_id: str, attempt: Attempt) -> None:
        for phase, seconds in self.joined_phases(attempt).items():
            self.metrics.observe(PHASE_HISTOGRAM, seconds, phase=phase)

    # -- how it reaches people ----------------------------------------------------------------

    def node_boot(self, node_id: str) -> agent_pb2.NodeBoot | None:
        """The node's last attempt, for inventory.refresh in role site (None: none kept)."""
        a = self.timelines.last(node_id)
        if a is None:
            return None
        boot = agent_pb2.NodeBoot(
            node_id=node_id, attempt=a.number, method=a.method, trigger=a.trigger,
            started_unix_ms=int(a.started * 1000), outcome=a.outcome, cause=a.cause,
            cause_detail=a.cause_detail, console=self.consoles.state(node_id),
            console_oldest_unix_ms=int(self.consoles.oldest(node_id) * 1000),
            steps=[f"+{e.t - a.started:.1f}s {e.step} {e.detail}".rstrip() for e in a.events][-64:])
        if a.outcome == Outcome.FAILED:
            boot.last_lines.extend(self.cause_lines(node_id))
        return boot

    def cause_lines(self, node_id: str) -> list[str]:
        """The console's lines that show the cause of the node's last attempt: that attempt's
        lines (the boot before's, for a cause it carried), around the step the cause names
        (causes.EVIDENCE: 4 lines before it, it, 7 after), headed by which attempt and step;
        the attempt's last 12 lines where no such step is kept."""
        attempts = self.timelines.attempts(node_id)
        if not attempts:
            return []
        a, until = attempts[-1], 0.0
        if a.carried and len(attempts) > 1:
            a, until = attempts[-2], a.started - 0.001   # the next boot's first line is its own
        lines = self.consoles.read(node_id, a.started, until)
        steps = EVIDENCE.get(a.cause, ())
        event = a.last(*steps) if steps else None
        if event is None:
            head = f"[site: the console of attempt {a.number}, its last lines]"
            return [head, *(text for _, text in lines[-CAUSE_LINES:])] if lines else []
        near = [i for i, (t, text) in enumerate(lines)
                if abs(t - event.t) <= 2.0 and event.detail and text.startswith(event.detail[:200])]
        at = near[0] if near else next((i for i, (t, _) in enumerate(lines) if t >= event.t), len(lines))
        shown = lines[max(0, at - 4):at + 8]
        head = f"[site: the console of attempt {a.number} at its {event.step} (+{event.t - a.started:.1f}s)]"
        return [head, *(text for _, text in shown)] if shown else []

    def node_boots(self) -> list[agent_pb2.NodeBoot]:
        return [b for n in self.timelines.nodes() if (b := self.node_boot(n)) is not None]

    def node_files(self, node_id: str, since: float = 0.0, until: float = 0.0,
                   last: int = 0) -> dict[str, bytes]:
        """What logs.collect gathers of a node: its console within [since, until] (its
        ``last`` lines there, 0: all), each line with its time, and its timelines (JSON and
        text)."""
        lines = self.consoles.read(node_id, since, until)
        if last:
            lines = lines[-last:]
        console = "".join(
            f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t))}.{int(t * 1000) % 1000:03d}Z {text}\n"
            for t, text in lines)
        attempts = self.timelines.attempts(node_id)
        return {
            "console.txt": console.encode(),
            "timeline.json": json.dumps([a.to_dict() for a in attempts], indent=1).encode(),
            "timeline.txt": render(node_id, attempts).encode(),
        }
