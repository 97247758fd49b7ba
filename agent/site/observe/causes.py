"""Why a boot attempt failed, named by rules over its timeline: the one table, RULES.

    diagnose = Diagnosis()                      # or Diagnosis(waits={"no_kernel": 5.0}): site_cause_waits
    diagnose(attempt, prepared, now)            # -> (rule name, detail) or None

Each rule looks for a step of the attempt that did not lead to the next one. A rule whose
``wait`` is 0 can tell at once (a PXE request ignored, a digest refused, a kernel panic on the
console); the others fire ``wait`` seconds after the step they wait on, while the attempt is
still booting, so a late boot is named as soon as it is late rather than at the control
plane's timeout (the site's timer runs them each second). The first rule that fires names
the cause; a later step (the node joins after all) ends the attempt as joined. docs/site.md
("Why a node did not come up") has the same table for people.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.site.observe.timeline import Attempt, Prepared, Step

BOOTED = (Step.KERNEL_STARTED, Step.INIT, Step.AGENT_STARTED)
# What only a live console reports (agent/site/observe/console.py's milestones)
CONSOLE_SEEN = frozenset({Step.FIRMWARE, Step.BOOT_LOADER, Step.KEXEC, Step.KERNEL_STARTED, Step.INIT,
                          Step.AGENT_STARTED, Step.PANIC, Step.NO_NETWORK, Step.GATEWAY_UNREACHABLE,
                          Step.GATEWAY_REFUSED,
                          Step.NO_BOOT_DEVICE})


def _when(t: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(t))


def _refused(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    e = a.first(Step.REFUSED)
    return f"the gateway refused the join: {e.detail or 'no reason given'}" if e else None


def _digest(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    e = a.first(Step.DIGEST_REFUSED)
    return e.detail or "a file did not match its digest" if e else None


def _panic(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    e = a.first(Step.PANIC)
    return f"kernel panic on the console: {e.detail}" if e else None


def _secure_boot(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    e = a.first(Step.SECURE_BOOT_DENIED)
    if e is None or a.first(*BOOTED, Step.JOINED) is not None:
        return None
    if "Exec format error" in e.detail:
        # iPXE's word for the firmware's LoadImage refusing an image: only an EFI iPXE's (the
        # site sent ipxe.efi); a BIOS iPXE says the same of any EFI image it cannot run.
        sent = a.last(Step.TFTP_SENT)
        if sent is None or not sent.detail.endswith(".efi"):
            return None
    return ("the firmware refused to start an image Secure Boot could not verify (unsigned, signed "
            f"by a key not in db, or its hash in dbx); the console: {e.detail}")


def _network_boot(a: Attempt) -> bool:
    """Whether the attempt is a network boot: an entry was live (method pxe), or the BMC was
    told to boot from the network (bmc.boot pxe) with nothing prepared: a node whose entry was
    cleaned up, or never made, booted by PXE on purpose, is not a disk that fell through."""
    if a.method == "pxe":
        return True
    device = a.last(Step.BOOT_DEVICE)
    return a.method == "disk" and device is not None and device.detail == "pxe"


def _ignored(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    e = a.last(Step.DHCP_IGNORED)
    if not _network_boot(a) or e is None or any(x.step == Step.DHCP_OFFER and x.t >= e.t for x in a.events):
        return None
    if p is None:
        return f"a PXE request from {e.detail or 'the node'} but no offer: the MAC has no boot entry"
    if p.expires_at <= e.t:
        return f"a PXE request from {e.detail} but no offer: its entry expired at {_when(p.expires_at)}"
    if p.method != "pxe":
        return f"a PXE request from {e.detail}, but the node was prepared for virtual media"
    return f"a PXE request from {e.detail} but no offer (the entry was not live then)"


def _no_loader(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    missing = a.first(Step.TFTP_MISSING)
    if missing is not None and a.first(Step.TFTP_SENT, Step.CHAIN_SCRIPT, Step.NODE_SCRIPT) is None:
        return (f"the firmware asked for {missing.detail}, which the site does not serve: a "
                "firmware or architecture mismatch with the entry's boot file")
    offer = a.last(Step.DHCP_OFFER)
    if offer is None or now - offer.t < wait:
        return None
    if any(x.step in (Step.TFTP_SENT, Step.CHAIN_SCRIPT, Step.NODE_SCRIPT) and x.t >= offer.t
           for x in a.events):
        return None
    return (f"a proxy offer at {_when(offer.t)} but no boot loader fetched in {wait:.0f}s: a "
            "firmware or architecture mismatch (BIOS/UEFI, the entry's boot_file)")


def _no_script(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    failed = a.first(Step.NODE_SCRIPT, ok=False)
    if failed is not None and a.first(Step.NODE_SCRIPT, ok=True) is None:
        return f"the node's script was refused ({failed.status}): its entry was not live"
    sent = a.last(Step.TFTP_SENT)
    if sent is None or now - sent.t < wait:
        return None
    if any(x.step in (Step.CHAIN_SCRIPT, Step.NODE_SCRIPT) and x.t >= sent.t for x in a.events):
        return None
    return f"the boot loader ({sent.detail}) was sent but fetched no script in {wait:.0f}s"


def _no_kernel(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    if p is not None and (p.method != "pxe" or p.script_url):
        return None   # the kernel comes from elsewhere (a script of its own, a medium)
    failed = a.first(Step.KERNEL, ok=False)
    if failed is not None and a.first(Step.KERNEL, ok=True) is None:
        return f"the kernel's fetch failed ({failed.status} {failed.detail})"
    script = a.first(Step.NODE_SCRIPT, ok=True)
    if script is None or now - script.t < wait or a.first(Step.KERNEL, ok=True) is not None:
        return None
    if a.first(*BOOTED) is not None:
        return None
    return f"the node's script was fetched but no kernel in {wait:.0f}s"


def _no_initrd(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    if p is not None and (p.method != "pxe" or p.script_url or not p.initrd):
        return None
    failed = a.first(Step.INITRD, ok=False)
    if failed is not None and a.first(Step.INITRD, ok=True) is None:
        return f"the initrd's fetch failed ({failed.status} {failed.detail})"
    kernel = a.first(Step.KERNEL, ok=True)
    if kernel is None or now - kernel.t < wait or a.first(Step.INITRD, ok=True) is not None:
        return None
    if a.first(Step.INIT, Step.AGENT_STARTED) is not None:
        return None
    return f"a kernel but no initrd in {wait:.0f}s"


def _no_dhcp(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    if a.method != "pxe":
        return None
    power = a.first(Step.POWER_ON)
    if power is None or now - power.t < wait:
        return None
    if a.first(Step.DHCP_IGNORED, Step.DHCP_OFFER, Step.TFTP_SENT, Step.TFTP_MISSING,
               Step.CHAIN_SCRIPT, Step.NODE_SCRIPT, Step.KERNEL, *BOOTED) is not None:
        return None
    seen = a.last(Step.FIRMWARE, Step.BOOT_LOADER, Step.NO_BOOT_DEVICE)
    console = f"; the console's last milestone: {seen.step} ({seen.detail})" if seen else ""
    return f"no DHCP request seen in {wait:.0f}s after power on{console}"


def _late_join(step: Step, what: str) -> Callable[[Attempt, Prepared | None, float, float], str | None]:
    def rule(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
        if a.first(Step.JOINED) is not None:
            return None
        e = a.first(step)
        if e is None or now - e.t < wait:
            return None
        last = a.last(step)
        return f"{what} for {now - e.t:.0f}s: {(last or e).detail}"
    return rule


def _watched(a: Attempt, since: float) -> bool:
    """Whether the site could have seen a join in this attempt from ``since`` (the boot) on:
    its console was its own the whole time (attached by then, or speaking: a milestone, a
    kexec, is a line the console showed; and neither busy, dropped, released nor any other
    state after, each a gap in which the agent's "connected to gateway" line may have gone to
    another client or nowhere), or the gateway told a verdict. Otherwise the site cannot tell
    a join from none, and names no never_joined."""
    if a.first(Step.REFUSED) is not None:
        return True
    own = False
    for e in a.events:
        if e.step == Step.CONSOLE:
            attached = e.detail.startswith("attached")
            if e.t > since and not attached:
                return False
            own = attached if e.t <= since else own
        elif e.step in CONSOLE_SEEN and e.t <= since:
            own = True
    return own


def _never_joined(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    if a.method == "disk" or a.first(Step.JOINED) is not None:
        return None
    booted = a.first(Step.INITRD, Step.ISO, *BOOTED, ok=True)
    if booted is None or now - booted.t < wait or not _watched(a, booted.t):
        return None
    seen = a.last(*BOOTED, Step.NO_NETWORK, Step.GATEWAY_UNREACHABLE, Step.GATEWAY_REFUSED)
    if seen is not None:
        console = f"; the console's last word: {seen.step} ({seen.detail})"
    else:
        # the console is the site's and attached (``_watched``), and nothing of the kernel came
        before = a.last(Step.BOOT_LOADER, Step.FIRMWARE, Step.KEXEC)
        line = f" (its last line: {before.detail})" if before is not None else ""
        console = (f"; the console went silent after the kernel{line}: a kernel command line "
                   "without console= for this node's serial port is the usual reason")
    what = "the kexec'd kernel" if a.method == "kexec" else "the ramdisk"
    return f"{what} booted ({booted.step} at {_when(booted.t)}) but never joined in {wait:.0f}s{console}"


def _disk(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    if a.method != "disk" or _network_boot(a):
        return None
    e = a.first(Step.NO_BOOT_DEVICE)
    if e is not None and a.first(Step.KERNEL_STARTED) is None:
        return f"no boot entry on the disk: {e.detail}"
    pxe = a.first(Step.DHCP_IGNORED)
    if pxe is not None and a.first(Step.KERNEL_STARTED) is None:
        return "the disk did not boot: the firmware fell through to a network boot (PXE request ignored)"
    power = a.first(Step.POWER_ON)
    attached = a.first(Step.CONSOLE)
    if power is None or attached is None or "attached" not in attached.detail or now - power.t < wait:
        return None
    if a.first(*BOOTED, Step.JOINED) is not None:
        return None
    seen = a.last(Step.FIRMWARE, Step.BOOT_LOADER)
    return (f"the disk did not boot a kernel in {wait:.0f}s after power on; the console's last "
            f"milestone: {seen.step + ' (' + seen.detail + ')' if seen else 'none'}")


def _kexec_mute(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    e = a.first(Step.KEXEC)
    if a.method != "kexec" or e is None or now - e.t < wait:
        return None
    if a.first(*BOOTED, Step.JOINED, Step.FIRMWARE, Step.NO_NETWORK, Step.GATEWAY_UNREACHABLE,
               Step.GATEWAY_REFUSED) is not None:
        return None
    return (f"a kexec at {_when(e.t)} ({e.detail}) but no new kernel on the console in {wait:.0f}s: "
            "the loaded kernel or its command line (console=) is wrong, or it hung early")


LOOP_ATTEMPTS = 8     # attempts without a join within boot_loop's wait: a reboot loop


def _boot_loop(a: Attempt, p: Prepared | None, now: float, wait: float) -> str | None:
    """The node began LOOP_ATTEMPTS attempts (this one the last) within ``wait`` seconds, none
    of them joined: it reboots by itself (a watchdog, a firmware or boot loader that resets, an
    init that reboots), whatever each attempt showed."""
    starts = [*a.unjoined_before, a.started][-LOOP_ATTEMPTS:]
    if len(starts) < LOOP_ATTEMPTS or a.first(Step.JOINED) is not None or starts[-1] - starts[0] > wait:
        return None
    return (f"{len(starts)} boot attempts in {starts[-1] - starts[0]:.0f}s, none joined: a reboot "
            f"loop (no panic named; the console shows what each attempt reached)")


@dataclass(frozen=True)
class Rule:
    name: str
    says: str                # the cause, for a person
    wait: float              # seconds it waits after its step (0: it tells at once)
    check: Callable[[Attempt, Prepared | None, float, float], str | None]


# The causes, in the order they are tried (the first that fires names the attempt's cause).
RULES: tuple[Rule, ...] = (
    Rule("refused",             "joined but refused by the gateway (e.g. attestation)",     0,   _refused),
    Rule("digest_refused",      "a kernel, initrd or ISO did not match its digest",         0,   _digest),
    Rule("kernel_panic",        "the kernel panicked (console)",                            0,   _panic),
    Rule("secure_boot_violation", "the firmware refused an unsigned or wrongly signed image (console)",
         0, _secure_boot),
    Rule("not_registered",      "a PXE request but no offer: the MAC not registered, or its entry expired",
         0, _ignored),
    Rule("no_boot_loader",      "an offer but no boot loader fetched: firmware/architecture mismatch",
         60, _no_loader),
    Rule("no_script",           "a boot loader but no script",                              60,  _no_script),
    Rule("no_kernel",           "a script but no kernel",                                   60,  _no_kernel),
    Rule("no_initrd",           "a kernel but no initrd",                                   60,  _no_initrd),
    Rule("no_dhcp_request",     "no DHCP request seen after power on",                      180, _no_dhcp),
    Rule("no_network",          "the ramdisk booted but never joined: no network (console)", 120,
         _late_join(Step.NO_NETWORK, "the agent has had no network")),
    # the gateway reached and answering (before the unreachable one: a TLS failure is no lost route)
    Rule("gateway_refused",     "the ramdisk reached its gateway: TLS or the session refused (console)", 90,
         _late_join(Step.GATEWAY_REFUSED, "the agent reaches its gateway but is refused")),
    Rule("gateway_unreachable", "the ramdisk booted but never joined: the gateway unreachable (console)", 90,
         _late_join(Step.GATEWAY_UNREACHABLE, "the agent cannot reach its gateway")),
    Rule("kexec_no_kernel",     "a kexec but no new kernel on the console",                120, _kexec_mute),
    Rule("never_joined",        "the ramdisk (or a kexec'd kernel) booted but never joined", 300,
         _never_joined),
    Rule("disk_not_bootable",   "deployed but the disk does not boot (no boot entry)",     180, _disk),
    # the wait is the window the attempts fall in
    Rule("boot_loop",           "the node reboots by itself: 8 attempts in the wait, none joined", 180,
         _boot_loop),
)  # fmt: skip

NAMES = tuple(r.name for r in RULES)

# The console's step whose lines show each cause (the last of them in the attempt): the lines
# printed under a cause are the attempt's around it, not the ring's newest (the next boot's
# banner after a panic, a firmware's fall-through after iPXE gave up). A cause not listed: the
# attempt's last lines.
EVIDENCE: dict[str, tuple[Step, ...]] = {
    "kernel_panic": (Step.PANIC,),
    "not_registered": (Step.BOOT_LOADER, Step.FIRMWARE),
    "no_boot_loader": (Step.BOOT_LOADER, Step.FIRMWARE),
    "no_script": (Step.BOOT_LOADER,),
    "no_kernel": (Step.BOOT_LOADER,),
    "no_initrd": (Step.KERNEL_STARTED, Step.BOOT_LOADER),
    "no_dhcp_request": (Step.BOOT_LOADER, Step.FIRMWARE),
    "no_network": (Step.NO_NETWORK,),
    "gateway_unreachable": (Step.GATEWAY_UNREACHABLE,),
    "gateway_refused": (Step.GATEWAY_REFUSED,),
    "kexec_no_kernel": (Step.KEXEC,),
    "never_joined": (Step.AGENT_STARTED, Step.INIT, Step.KERNEL_STARTED),
    "disk_not_bootable": (Step.NO_BOOT_DEVICE, Step.BOOT_LOADER, Step.FIRMWARE),
}


class Diagnosis:
    """RULES with their waits (``waits`` overrides some, by name: the site_cause_waits setting)."""

    def __init__(self, waits: Mapping[str, float] | None = None) -> None:
        unknown = set(waits or ()) - set(NAMES)
        if unknown:
            raise ValueError(f"no such rule: {', '.join(sorted(unknown))}")
        self.waits = {r.name: (waits or {}).get(r.name, r.wait) for r in RULES}

    def __call__(self, attempt: Attempt, prepared: Prepared | None, now: float) -> tuple[str, str] | None:
        for rule in RULES:
            detail = rule.check(attempt, prepared, now, self.waits[rule.name])
            if detail is not None:
                return rule.name, detail
        return None
