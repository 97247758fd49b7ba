"""One boot timeline per node and boot attempt, from what the site daemon itself sees.

    tl = Timelines(root)                       # <state_dir>/site/timeline/<node id>.json
    tl.power(node_id, "on")                    # bmc.power on / cycle / reset: a new attempt
    tl.prepared(node_id, mac, "pxe", ...)      # boot.prepareRamdisk
    tl.dhcp_line(line)                         # a line of dnsmasq's log (agent/site/observe/dhcplog.py)
    tl.fetch(client_ip, kind, key, status, n, seconds)   # an HTTP fetch of the boot service
    tl.console(node_id, Step.KERNEL_STARTED, line)       # a console milestone
    tl.evaluate()                              # name the causes the rules can tell now
    tl.attempts(node_id)                       # the last KEEP_ATTEMPTS, oldest first

Sources, each the site's own record: the bmc.* handlers (power, boot device), the boot
handlers (prepareRamdisk, cleanUp, a digest refused), dnsmasq's log (a PXE request ignored, the
proxy offer, the TFTP transfer of the boot loader), the HTTP service (the chain and node
scripts, the kernel, initrd and ISO with bytes and seconds), the kept console's milestones
(agent/site/observe/console.py), and the join: the agent's "connected to gateway" line on the
node's console (the ramdisk's init sends the agent's log there), or a verdict the gateway
hands the site (``verdict``: a join refused, e.g. by attestation, which boot.cleanUp's
``join_refused`` carries; it outweighs the console's join).

A new attempt starts at bmc.power on, cycle or reset (continuing one only set up: prepared,
boot device, console; such a set-up once the last attempt is over begins the next), at a
boot.prepareRamdisk when the node's
last attempt is over (joined, failed, cleaned up), when the console reports the firmware in an
attempt that holds a console milestone already (the console reports each once per boot, the
firmware again at a new one: a reboot the site did not order, even one whose kernel says
nothing), when the console reports a kexec (a running kernel handing over to a new one, no
firmware between: method "kexec", continuing an attempt only set up), and at a PXE request of
the node's MAC once its last attempt is over (a boot the site did not order). Bounded: KEEP_ATTEMPTS attempts
per node, MAX_EVENTS events per attempt (the first ones and the newest kept), MAX_NODES nodes
(the least recently active forgotten first), MAX_PENDING unattributed addresses; a changed
node's file is written whole (write_atomic) by ``flush``, at the site's timer (each second) and
at stop, off the request threads and the lock (a PXE storm's fetches never wait for a disk), so a
restart of the daemon keeps them (a kill loses at most the last second).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.atomicfile import write_atomic
from agent.net.neighbours import read_arp
from agent.site.boot.fields import parse_node_id

log = logging.getLogger(__name__)

KEEP_ATTEMPTS = 8
MAX_EVENTS = 256
MAX_NODES = 4096
MAX_PENDING = 1024          # client addresses whose events wait to be attributed to a MAC
PENDING_SECONDS = 120.0     # how long such events wait
OFFER_MATCH_SECONDS = 60.0  # a TFTP client is the MAC offered last, when only one was


class Step(enum.StrEnum):
    # the commands
    PREPARED = "prepared"                  # boot.prepareRamdisk: a PXE entry or media set
    BOOT_DEVICE = "boot_device"            # bmc.boot set_boot_device
    POWER_ON = "power_on"                  # bmc.power on, cycle, reset
    POWER_OFF = "power_off"
    DIGEST_REFUSED = "digest_refused"      # a kernel, initrd or ISO that did not match its digest
    CLEANED = "cleaned"                    # boot.cleanUp
    # dnsmasq
    DHCP_IGNORED = "dhcp_ignored"          # a PXE request of the MAC, not answered
    DHCP_OFFER = "dhcp_offer"              # the proxy offer
    TFTP_SENT = "tftp_sent"                # the boot loader, sent whole
    TFTP_MISSING = "tftp_missing"          # a file the firmware asked that the site does not serve
    # the HTTP service
    CHAIN_SCRIPT = "chain_script"          # GET /boot.ipxe
    NODE_SCRIPT = "node_script"            # GET /pxe/<mac>.ipxe
    KERNEL = "kernel"                      # GET /cache/<digest> of the entry's kernel
    INITRD = "initrd"
    ISO = "iso"                            # GET /vm/<token>/ramdisk.iso
    CONFIG_MEDIUM = "config_medium"        # GET /vm/<token>/config.iso
    # the console
    CONSOLE = "console"                    # attached, busy, no SOL, dropped (detail)
    FIRMWARE = "firmware"
    BOOT_LOADER = "boot_loader"
    KERNEL_STARTED = "kernel_started"
    INIT = "init"
    AGENT_STARTED = "agent_started"
    KEXEC = "kexec"                        # a running kernel hands over to a new one: a new boot
    PANIC = "panic"
    NO_NETWORK = "no_network"
    GATEWAY_UNREACHABLE = "gateway_unreachable"
    GATEWAY_REFUSED = "gateway_refused"    # reached, but TLS failed or the gateway refused the session
    NO_BOOT_DEVICE = "no_boot_device"
    SECURE_BOOT_DENIED = "secure_boot_denied"  # the firmware refused an image it could not verify
    # the join
    JOINED = "joined"
    REFUSED = "refused"


def _sets_up(event: BootEvent) -> bool:
    """Whether ``event`` is the next attempt's set-up when the last one is over."""
    return event.step == Step.BOOT_DEVICE or (
        event.step == Step.CONSOLE and not event.detail.startswith(("released", "dropped")))


# What sets an attempt up before the node is powered: a power on after them continues it.
_SETUP = frozenset({Step.PREPARED, Step.BOOT_DEVICE, Step.CONSOLE, Step.POWER_OFF})
# What the kept console reports, each once per boot (agent/site/observe/console.py): the
# firmware reported again within an attempt that holds any of them is a new boot.
MILESTONES = frozenset({Step.FIRMWARE, Step.BOOT_LOADER, Step.KEXEC, Step.KERNEL_STARTED, Step.INIT,
                        Step.AGENT_STARTED, Step.PANIC, Step.NO_NETWORK, Step.GATEWAY_UNREACHABLE,
                        Step.GATEWAY_REFUSED, Step.NO_BOOT_DEVICE, Step.SECURE_BOOT_DENIED, Step.JOINED})
KEXEC_TRIGGER = "kexec seen on the console"
FETCHES = frozenset({Step.CHAIN_SCRIPT, Step.NODE_SCRIPT, Step.KERNEL, Step.INITRD, Step.ISO,
                     Step.CONFIG_MEDIUM})


class Outcome(enum.StrEnum):
    BOOTING = "booting"
    JOINED = "joined"
    FAILED = "failed"        # a cause is named (it may still go on and join)
    ENDED = "ended"          # cleaned up or powered off before anything was named


@dataclass
class BootEvent:
    """One step the site saw of a node's boot (a DHCP answer, a fetch, a power action)."""

    t: float                 # time.time()
    step: str
    detail: str = ""
    status: int = 0          # an HTTP fetch's status
    bytes: int = 0           # bytes sent (fetches, TFTP)
    seconds: float = 0.0     # how long a fetch took

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> BootEvent:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)  # type: ignore[arg-type]  # checked by the types of the JSON we wrote

    @property
    def ok(self) -> bool:
        return self.step not in FETCHES or 200 <= self.status < 300


@dataclass
class Attempt:
    number: int
    started: float
    trigger: str             # "bmc.power on", "boot.prepareRamdisk", "reboot seen on the console",
                             # "kexec seen on the console"
    method: str              # "pxe", "virtual_media", "disk" (nothing prepared) or "kexec" (a
                             # kernel loaded by the one before: no firmware, no fetch the site sees)
    events: list[BootEvent] = field(default_factory=list)
    dropped: int = 0         # events beyond MAX_EVENTS not kept
    outcome: str = Outcome.BOOTING
    cause: str = ""          # a rule's name (agent/site/observe/causes.py)
    cause_detail: str = ""
    cause_at: float = 0.0
    carried: bool = False    # the cause is the boot before's (a reboot seen on the console), until
                             # this attempt's own events name one
    unjoined_before: list[float] = field(default_factory=list)   # when the node's kept attempts
                             # before this one began, those that did not join (a reboot loop)

    def first(self, *steps: str, ok: bool | None = None) -> BootEvent | None:
        for e in self.events:
            if e.step in steps and (ok is None or e.ok == ok):
                return e
        return None

    def last(self, *steps: str) -> BootEvent | None:
        for e in reversed(self.events):
            if e.step in steps:
                return e
        return None

    def add(self, event: BootEvent) -> None:
        if len(self.events) >= MAX_EVENTS:
            del self.events[MAX_EVENTS // 2]    # keep the start and the newest
            self.dropped += 1
        if self.events and event.t < self.events[-1].t:   # one that waited for its address
            at = next(i for i, e in enumerate(self.events) if e.t > event.t)
            self.events.insert(at, event)
        else:
            self.events.append(event)

    @property
    def only_set_up(self) -> bool:
        """Whether the attempt holds nothing but its set-up (nothing booted yet)."""
        return all(e.step in _SETUP for e in self.events)

    @property
    def over(self) -> bool:
        return self.outcome in (Outcome.JOINED, Outcome.ENDED) or self.last(Step.CLEANED) is not None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Attempt:
        raw = data.get("events", [])
        events = [BootEvent.from_dict(e) for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "events"}
        return cls(events=events, **known)  # type: ignore[arg-type]  # our own JSON


@dataclass
class Prepared:
    """What the node's last boot.prepareRamdisk made: how it boots and what it fetches."""

    method: str              # "pxe" or "virtual_media"
    mac: str
    expires_at: float
    kernel: str = ""         # sha256 of the kernel and initrd the site serves (pxe)
    initrd: str = ""
    script_url: bool = False  # the entry chains a script of its own (no kernel from the site)


@dataclass
class NodeTimeline:
    """One node's boots as the site saw them: its MACs, what was prepared, its attempts."""

    node_id: str
    macs: list[str] = field(default_factory=list)
    prepared: Prepared | None = None
    attempts: list[Attempt] = field(default_factory=list)
    next_number: int = 1
    touched: float = 0.0

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> bytes:
        data = asdict(self)
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, text: bytes) -> NodeTimeline:
        data = json.loads(text)
        prepared = data.get("prepared")
        return cls(node_id=parse_node_id(str(data["node_id"])),
                   macs=[str(m) for m in data.get("macs", [])][:16],
                   prepared=Prepared(**prepared) if isinstance(prepared, dict) else None,
                   attempts=[Attempt.from_dict(a) for a in data.get("attempts", [])][-KEEP_ATTEMPTS:],
                   next_number=int(data.get("next_number", 1)),
                   touched=float(data.get("touched", 0.0)))


Diagnose = Callable[[Attempt, "Prepared | None", float], "tuple[str, str] | None"]


class Timelines:
    """Every node's attempts; thread-safe. ``diagnose`` names a cause (the rules of
    agent/site/observe/causes.py); ``on_cause`` hears each cause named (metrics)."""

    def __init__(self, root: Path, *, diagnose: Diagnose | None = None,
                 on_cause: Callable[[str, Attempt], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.diagnose = diagnose
        self.on_cause = on_cause
        self.on_attempt: Callable[[str, Attempt], None] | None = None   # a new attempt began
        self.on_joined: Callable[[str, Attempt], None] | None = None    # an attempt joined
        self.clock = clock
        self._lock = threading.RLock()
        self._nodes: OrderedDict[str, NodeTimeline] = OrderedDict()   # least recently active first
        self._by_mac: dict[str, str] = {}
        self._by_ip: OrderedDict[str, str] = OrderedDict()        # client address -> MAC
        self._pending: OrderedDict[str, list[BootEvent]] = OrderedDict()   # address -> its events
        self._offers: OrderedDict[str, float] = OrderedDict()     # MAC -> last proxy offer, no IP known
        self._dirty: set[str] = set()                             # nodes changed since the last flush
        self._flushing = threading.Lock()                         # one flush at a time
        self.arp: Callable[[str], str] = read_arp

    # -- state on disk ---------------------------------------------------------------------

    def load(self) -> int:
        """Read the nodes' files (a damaged one is dropped, said). Returns how many."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock:
            records = []
            for path in self.root.glob("*.json"):
                try:
                    records.append(NodeTimeline.from_json(path.read_bytes()))
                except (OSError, ValueError, TypeError, KeyError) as exc:
                    log.warning("timeline %s unreadable (%s); dropped", path.name, exc)
                    path.unlink(missing_ok=True)
            for record in sorted(records, key=lambda r: r.touched):
                self._nodes[record.node_id] = record
                for mac in record.macs:
                    self._by_mac[mac] = record.node_id
            while len(self._nodes) > MAX_NODES:
                self._forget_oldest()
            return len(self._nodes)

    def _save(self, record: NodeTimeline) -> None:
        """The record changed: written at the next ``flush`` (under the lock)."""
        self._dirty.add(record.node_id)

    def flush(self) -> int:
        """Write the nodes changed since the last flush, each whole; returns how many."""
        with self._flushing:
            with self._lock:
                changed = [(node_id, self._nodes[node_id].to_json())
                           for node_id in sorted(self._dirty) if node_id in self._nodes]
                self._dirty.clear()
            for node_id, data in changed:
                try:
                    self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
                    write_atomic(self.root / f"{node_id}.json", data, 0o600)
                except OSError as exc:
                    log.error("timeline of %s not saved: %s", node_id, exc)
            return len(changed)

    def _forget_oldest(self) -> None:
        node_id, record = self._nodes.popitem(last=False)
        self._dirty.discard(node_id)
        for mac in record.macs:
            if self._by_mac.get(mac) == node_id:
                del self._by_mac[mac]
        (self.root / f"{node_id}.json").unlink(missing_ok=True)

    def _node(self, node_id: str) -> NodeTimeline:
        record = self._nodes.get(node_id)
        if record is None:
            record = self._nodes[node_id] = NodeTimeline(node_id)
            while len(self._nodes) > MAX_NODES:
                self._forget_oldest()
        self._nodes.move_to_end(node_id)
        record.touched = self.clock()
        return record

    # -- what the node's attempts are ------------------------------------------------------

    def _begin(self, record: NodeTimeline, trigger: str, now: float, method: str = "") -> Attempt:
        prepared = record.prepared
        live = prepared is not None and prepared.expires_at > now
        attempt = Attempt(record.next_number, now, trigger,
                          method or (prepared.method if live and prepared is not None else "disk"))
        record.next_number += 1
        current = record.current
        if current is not None and current.outcome == Outcome.BOOTING:
            current.outcome = Outcome.ENDED
        attempt.unjoined_before = [a.started for a in record.attempts
                                   if a.outcome != Outcome.JOINED][-(KEEP_ATTEMPTS - 1):]
        record.attempts.append(attempt)
        del record.attempts[:-KEEP_ATTEMPTS]
        if self.on_attempt is not None:
            self.on_attempt(record.node_id, attempt)
        return attempt

    def _add(self, node_id: str, event: BootEvent, *, begin: str = "") -> Attempt:
        """Add ``event`` to the node's current attempt (a new one when ``begin`` names why, or
        when there is none), save, and run the rules."""
        with self._lock:
            record = self._node(node_id)
            attempt = record.current
            if begin and attempt is not None and attempt.outcome == Outcome.BOOTING and attempt.only_set_up:
                # the power on of an attempt that was only being set up: it is what began it,
                # unless a boot.prepareRamdisk did
                if attempt.trigger != "boot.prepareRamdisk":
                    attempt.trigger = begin
                begin = ""
            if not begin and attempt is not None and attempt.over and _sets_up(event):
                # the next boot being set up (its boot device, its console) once the last is over
                attempt = self._begin(record, event.step, event.t)
            elif not begin and attempt is not None and event.step in (Step.DHCP_IGNORED, Step.DHCP_OFFER) \
                    and attempt.over:
                # a node the site did not power asks to boot from the network (a reboot of its
                # own, an operator at its BMC): a new attempt, by PXE
                attempt = self._begin(record, "a PXE request seen", event.t, method="pxe")
            elif not begin and event.step == Step.KEXEC:
                # the running kernel hands over to a new one: a boot of its own, whatever the
                # one before was (an attempt only set up, its boot device or console, is it)
                if attempt is not None and attempt.outcome == Outcome.BOOTING and attempt.only_set_up:
                    attempt.trigger, attempt.method = KEXEC_TRIGGER, "kexec"
                else:
                    attempt = self._begin(record, KEXEC_TRIGGER, event.t, method="kexec")
            elif begin or attempt is None:
                attempt = self._begin(record, begin or event.step, event.t)
            elif event.step == Step.FIRMWARE and attempt.first(*MILESTONES) is not None:
                before = attempt
                attempt = self._begin(record, "reboot seen on the console", event.t)
                if before.cause:
                    # a node that fails and reboots at once (a panic with panic=-1) shows its
                    # cause between boots too, not only in the second before each reboot
                    attempt.cause, attempt.cause_at = before.cause, event.t
                    attempt.cause_detail = f"the boot before (attempt {before.number}): " \
                                           f"{before.cause_detail}"[:300]
                    attempt.outcome, attempt.carried = Outcome.FAILED, True
            attempt.add(event)
            if event.step == Step.BOOT_DEVICE and event.detail == "pxe" and attempt.method == "disk" \
                    and attempt.only_set_up:
                # an attempt being set up to boot from the network, nothing prepared for it: a
                # PXE boot (its request ignored is not_registered, not a disk that fell through)
                attempt.method = "pxe"
            if event.step == Step.JOINED and attempt.outcome != Outcome.JOINED \
                    and attempt.first(Step.REFUSED) is None:
                attempt.outcome = Outcome.JOINED
                if self.on_joined is not None:
                    self.on_joined(record.node_id, attempt)
            elif event.step == Step.REFUSED and attempt.outcome == Outcome.JOINED:
                # the console saw the agent connect; the gateway then refused the join: the
                # attempt is judged again (the refused rule comes first)
                attempt.outcome = Outcome.BOOTING
            elif event.step in (Step.CLEANED, Step.POWER_OFF) and attempt.outcome == Outcome.BOOTING:
                attempt.outcome = Outcome.ENDED
            self._judge(record, attempt, event.t)
            self._save(record)
            return attempt

    def _judge(self, record: NodeTimeline, attempt: Attempt, now: float) -> None:
        if self.diagnose is None or attempt.outcome in (Outcome.JOINED, Outcome.ENDED):
            return
        named = self.diagnose(attempt, record.prepared, now)
        if named is None or (named[0] == attempt.cause and not attempt.carried):
            return
        attempt.cause, attempt.cause_detail = named
        attempt.carried = False
        attempt.cause_at = now
        attempt.outcome = Outcome.FAILED
        log.warning("node %s boot attempt %d: %s (%s)", record.node_id, attempt.number,
                    attempt.cause, attempt.cause_detail)
        if self.on_cause is not None:
            self.on_cause(record.node_id, attempt)

    def evaluate(self, now: float | None = None) -> None:
        """Run the rules over every attempt still booting (the site's timer, each second):
        a late boot gets its cause as soon as a rule can tell."""
        now = self.clock() if now is None else now
        with self._lock:
            for record in list(self._nodes.values()):
                attempt = record.current
                if attempt is None or attempt.outcome != Outcome.BOOTING:
                    continue
                before = attempt.cause
                self._judge(record, attempt, now)
                if attempt.cause != before:
                    self._save(record)

    # -- the sources -----------------------------------------------------------------------

    def power(self, node_id: str, action: str, detail: str = "") -> None:
        """bmc.power: on, cycle and reset start an attempt; off ends it."""
        if action == "off":
            self._add(node_id, BootEvent(self.clock(), Step.POWER_OFF, detail))
        elif action in ("on", "cycle", "reset"):
            self._add(node_id, BootEvent(self.clock(), Step.POWER_ON, detail or action),
                      begin=f"bmc.power {action}")

    def boot_device(self, node_id: str, device: str) -> None:
        self._add(node_id, BootEvent(self.clock(), Step.BOOT_DEVICE, device))

    def prepared(self, node_id: str, prepared: Prepared) -> None:
        """boot.prepareRamdisk: the node's entry or media set; a new attempt when the last one
        is over."""
        with self._lock:
            record = self._node(node_id)
            record.prepared = prepared
            if prepared.mac not in record.macs:
                record.macs = [*record.macs, prepared.mac][-16:]
            old = self._by_mac.get(prepared.mac)
            if old is not None and old != node_id and old in self._nodes:
                other = self._nodes[old]
                other.macs = [m for m in other.macs if m != prepared.mac]
            self._by_mac[prepared.mac] = node_id
            current = record.current
            begin = "boot.prepareRamdisk" if current is None or current.over \
                or current.outcome == Outcome.FAILED else ""
            detail = f"{prepared.method} {prepared.mac} until {prepared.expires_at:.0f}"
            self._add(node_id, BootEvent(self.clock(), Step.PREPARED, detail), begin=begin)

    def digest_refused(self, node_id: str, detail: str) -> None:
        self._add(node_id, BootEvent(self.clock(), Step.DIGEST_REFUSED, detail[:300]))

    def cleaned(self, node_id: str) -> None:
        with self._lock:
            if node_id not in self._nodes:
                return
            self._nodes[node_id].prepared = None
            self._add(node_id, BootEvent(self.clock(), Step.CLEANED))

    def console(self, node_id: str, step: str, line: str) -> None:
        """A console milestone (or the console's own state: Step.CONSOLE)."""
        self._add(node_id, BootEvent(self.clock(), step, line[:300]))

    def verdict(self, node_id: str, joined: bool, detail: str = "") -> None:
        """The join as the gateway saw it: joined, or refused (e.g. attestation) with why."""
        self._add(node_id, BootEvent(self.clock(), Step.JOINED if joined else Step.REFUSED, detail[:300]))

    def node_of_mac(self, mac: str) -> str | None:
        with self._lock:
            return self._by_mac.get(mac)

    def by_mac(self, mac: str, event: BootEvent) -> bool:
        node_id = self.node_of_mac(mac)
        if node_id is None:
            log.debug("timeline: %s of %s, a MAC no node has", event.step, mac)
            return False
        if event.step == Step.DHCP_OFFER:
            with self._lock:
                self._offers[mac] = event.t
                self._offers.move_to_end(mac)
                while len(self._offers) > MAX_PENDING:
                    self._offers.popitem(last=False)
        self._add(node_id, event)
        return True

    def learn_ip(self, ip: str, mac: str) -> None:
        """``ip`` is ``mac``'s: the events waiting for that address go to its node."""
        with self._lock:
            self._by_ip[ip] = mac
            self._by_ip.move_to_end(ip)
            while len(self._by_ip) > MAX_PENDING:
                self._by_ip.popitem(last=False)
            self._offers.pop(mac, None)
            waiting = self._pending.pop(ip, [])
        for event in waiting:
            self.by_mac(mac, event)

    def by_ip(self, ip: str, event: BootEvent) -> None:
        """An event known by the client's address: its MAC from what was learned (a PXE boot
        server request, a node script's fetch), the site's neighbour table, or the only MAC
        offered lately; else it waits for the address to be learned."""
        with self._lock:
            mac = self._by_ip.get(ip) or self.arp(ip)
            if not mac:
                now = self.clock()
                recent = [m for m, t in self._offers.items() if now - t <= OFFER_MATCH_SECONDS]
                mac = recent[0] if len(recent) == 1 else ""
            if not mac:
                self._pending.setdefault(ip, []).append(event)
                self._pending.move_to_end(ip)
                del self._pending[ip][:-16]
                while len(self._pending) > MAX_PENDING:
                    self._pending.popitem(last=False)
                return
        self.learn_ip(ip, mac)
        self.by_mac(mac, event)

    def expire_pending(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        with self._lock:
            for ip in [ip for ip, events in self._pending.items()
                       if not events or now - events[-1].t > PENDING_SECONDS]:
                del self._pending[ip]

    def fetch(self, ip: str, step: str, mac: str, status: int, sent: int, seconds: float,
              detail: str = "") -> None:
        """An HTTP fetch of the boot service: by the MAC when the path names it (a node's
        script, a medium), else by the client's address."""
        # stamped with the request's start: answers told from several threads keep their order
        event = BootEvent(self.clock() - seconds, step, detail, status=status, bytes=sent,
                      seconds=round(seconds, 3))
        if mac:
            if ip:
                self.learn_ip(ip, mac)
            self.by_mac(mac, event)
        else:
            self.by_ip(ip, event)

    def cache_fetch(self, ip: str, digest: str, status: int, sent: int, seconds: float) -> None:
        """GET /cache/<digest>: the kernel or the initrd of the client's node."""
        with self._lock:
            mac = self._by_ip.get(ip) or self.arp(ip)
            node_id = self._by_mac.get(mac, "") if mac else ""
            prepared = self._nodes[node_id].prepared if node_id in self._nodes else None
        step = Step.KERNEL
        if prepared is not None and digest == prepared.initrd and digest != prepared.kernel:
            step = Step.INITRD
        self.fetch(ip, step, "", status, sent, seconds, detail=digest[:12])

    # -- reading ---------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def attempts(self, node_id: str) -> list[Attempt]:
        """The node's kept attempts, oldest first (copies)."""
        with self._lock:
            record = self._nodes.get(node_id)
            if record is None:
                return []
            return [Attempt.from_dict(json.loads(json.dumps(a.to_dict()))) for a in record.attempts]

    def last(self, node_id: str) -> Attempt | None:
        got = self.attempts(node_id)
        return got[-1] if got else None


def render(node_id: str, attempts: Iterable[Attempt]) -> str:
    """A person's view of a node's attempts: one line per event, times from the attempt's start."""
    lines = []
    for a in attempts:
        head = f"{node_id} attempt {a.number} ({a.method}, {a.trigger}) at " \
               f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(a.started))}Z: {a.outcome}"
        if a.cause:
            head += f": {a.cause} ({a.cause_detail})"
        lines.append(head)
        for e in a.events:
            extra = ""
            if e.step in FETCHES:
                extra = f" {e.status} {e.bytes} B in {e.seconds:.2f}s"
            elif e.bytes:
                extra = f" {e.bytes} B"
            lines.append(f"  +{e.t - a.started:7.1f}s  {e.step}{extra}  {e.detail}".rstrip())
    return "\n".join(lines) + ("\n" if lines else "")
