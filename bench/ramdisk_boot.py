"""Measure the ramdisk: compressed size, QEMU start -> agent joined, idle RSS, inventory time.

    python bench/ramdisk_boot.py [--runs 3] [--pxe | --iso | --uki [--tpm | --interleave]]
                                 [--uefi] [--arch amd64|arm64] [--idle 20]
    python bench/ramdisk_boot.py --uki --secure-boot [--tpm] [--runs 3]

Builds (cached) the ramdisk, then boots it ``--runs`` times in QEMU (TCG unless
BC_QEMU_KVM=1) against the reference gateway, each time: seconds from QEMU start to the
agent's session being up at the gateway; the agent's resident memory after ``--idle`` seconds
of idling (VmRSS, with its anonymous part and the shmem part: the interpreter and libraries
mapped from the tmpfs root count as shmem, read in the guest through the test ramdisk's
debug shell); inventory.refresh timed by the agent (result.seconds) and end to end through
the gateway; and VmRSS again after ``--idle`` more seconds (the inventory handler and the
kinds' messages are loaded by then). Prints a Markdown table for docs/performance.md. Needs
root. ``--uefi``: OVMF instead of SeaBIOS on x86; ``--arch arm64``: the arm64 ramdisk in
``-M virt`` under TCG, always UEFI (``--pxe``: the firmware's PXE loads GRUB, see harness).
``--iso``: virtual media, as a BMC presents it: the ramdisk ISO (initramfs/iso.py) in the first
CD drive, booted by the firmware, and the node's config medium (agent/site/boot/vmedia.py) in the
second, with a static address on QEMU's user network (10.0.2.15/24) and no DHCP used.
``--uki``: the ramdisk as a UKI (initramfs/uki.py) that OVMF boots from a FAT disk; with
``--tpm`` the machine has a TPM 2.0 (swtpm, qemu/tpm.py) and the gateway attests the join
against the UKI's reference values: "joined" is then QEMU start to the attested verdict
(docs/attestation.md; issue 39: at most 3 s more than the same boot without a TPM).
``--interleave``: with ``--uki``, both in one session, ``--runs`` of each in the order
none, TPM, TPM, none, ... (a shared machine drifts: each side sees the same load), with the
medians of both and their difference. A UKI boot also prints its phases, host seconds read
off the console as it is written: OVMF's "BdsDxe: loading" (the firmware up), its "starting"
(the UKI read and, with a TPM, hashed for PCR 4), the ramdisk's first "bc-init [uptime]" line
(systemd-stub, with a TPM its hashes for PCR 11 and the kernel's for PCR 9, the kernel's own
boot: its uptime there is printed apart), and the join.
``--secure-boot``: with ``--uki``, Secure Boot off and on in one session, ``--runs`` of each
interleaved as ``--interleave`` does; both sides run OVMF's Secure Boot build (SMM, on pflash:
qemu/secureboot.py) and the UKI signed with a fleet db key made for the run; "off" is that
firmware with an empty variable store (setup mode: nothing verified), "on" with the fleet's PK,
KEK and db enrolled (the firmware verifies the UKI's signature before it starts it); the medians
and their difference (issue 52: at most 0.5 s more). With ``--tpm`` both sides attest.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.gateway.verifier import eventlog  # noqa: E402
from agent.gateway.verifier.attest import Verifier, load_certificates  # noqa: E402
from agent.gateway.verifier.join import JoinAttestation  # noqa: E402
from agent.gateway.verifier.policy import Build, Policy  # noqa: E402
from agent.proto import agent_pb2, session_pb2  # noqa: E402
from initramfs import signing  # noqa: E402
from qemu import secureboot  # noqa: E402
from qemu import tpm as qemu_tpm  # noqa: E402
from qemu.harness import Machine  # noqa: E402
from qemu.lab import Lab, Ramdisk, ensure_ramdisk  # noqa: E402
from qemu.sitemedia import user_net_media  # noqa: E402


def agent_rss(machine: Machine) -> dict[str, float]:
    """The agent's VmRSS and its parts, in MiB, read in the guest through the debug shell."""
    _, out = machine.shell("grep -E '^(VmRSS|RssAnon|RssFile|RssShmem)' "
                           "/proc/$(cat /run/bettercompute-agent.pid)/status")
    return {k: int(v) / 1024 for k, v in re.findall(r"(\w+):\s+(\d+) kB", out)}


class RecordedJoins(JoinAttestation):
    """The reference gateway's attestation, keeping the last event log a node sent."""

    event_log = b""

    def on_answer(self, node_id: str, answer: session_pb2.AttestAnswer) -> session_pb2.Frame:
        self.event_log = bytes(answer.event_log)
        return super().on_answer(node_id, answer)


def describe_log(data: bytes) -> str:
    """The banks the firmware logged into, and what it hashed for PCRs 4, 9 and 11: which
    images and blobs are hashed in a measured boot (once per bank) that a boot without a TPM
    does not hash."""
    log = eventlog.parse(data)
    names = {0x4: "sha1", 0xB: "sha256", 0xC: "sha384", 0xD: "sha512", 0x12: "sm3"}
    banks = ", ".join(names.get(a, hex(a)) for a in sorted(log.algorithms))
    kinds = {v: k for k, v in vars(eventlog.Ev).items() if isinstance(v, int)}
    events = []
    for e in log.events:
        if e.pcr in (4, 9, 11):
            events.append(f"PCR {e.pcr} {kinds.get(e.type, hex(e.type))}")
            if e.type == eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION and len(e.data) >= 16:
                # UEFI_IMAGE_LOAD_EVENT: the image's address, then its length in memory
                events[-1] += f" ({int.from_bytes(e.data[8:16], 'little') / 1e6:.1f} MB)"
    return f"event log: banks {banks}; " + "; ".join(events)


# The console's landmarks of a UKI boot, in order (module docstring).
PHASES = (("loading", r"BdsDxe: loading"), ("starting", r"BdsDxe: starting"),
          ("init", r"bc-init \[(\d+\.\d+)\]"))


class Phases:
    """Host seconds from QEMU start at which each of PHASES first shows on the console,
    polled in a thread (0.1 s apart) while the boot goes on; and the kernel's uptime at init."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.at: dict[str, float] = {}
        self.uptime: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set() and len(self.at) < len(PHASES):
            text = self.machine.console()
            now = self.machine.elapsed()
            for name, pattern in PHASES:
                m = re.search(pattern, text)
                if m and name not in self.at:
                    self.at[name] = now
                    if m.groups():
                        self.uptime = float(m.group(1))
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def row(self, joined: float) -> tuple[float | None, ...]:
        """(firmware up, PCR 4 + read, stub and kernel to init, of which the kernel's uptime,
        init to joined); None where a landmark did not show."""
        at = self.at
        def span(a: str | None, b: str | None) -> float | None:
            start = 0.0 if a is None else at.get(a)
            end = joined if b is None else at.get(b)
            return None if start is None or end is None else end - start
        return (span(None, "loading"), span("loading", "starting"), span("starting", "init"),
                self.uptime, span("init", None))


@dataclass
class Run:
    tpm: bool
    secure_boot: bool | None   # None: not a Secure Boot bench; else the side
    joined: float
    phases: tuple[float | None, ...]
    rss: float
    anon: float
    shmem: float
    inventory: float
    round_trip: float
    after: float

    @property
    def side(self) -> str:
        if self.secure_boot is not None:
            return "Secure Boot " + ("on" if self.secure_boot else "off")
        return "TPM" if self.tpm else "no TPM"


def one_run(lab: Lab, tmp: Path, node: str, args: argparse.Namespace, *, uefi: bool, tpm: bool,
            describe: bool = False, keys: secureboot.FleetKeys | None = None,
            secure_boot: bool | None = None) -> Run:
    """Boot one machine, wait for it to join (attested with ``tpm``), read its memory and time
    an inventory; ``describe``: print what its event log says was measured. ``secure_boot``
    (with ``keys``): OVMF's Secure Boot build, the UKI signed, the keys enrolled when True."""
    media = user_net_media(lab, node, tmp) if args.iso else ()
    esp, swtpm = None, None
    values: dict[str, Any] = {}
    pflash: tuple[Path, Path] | None = None
    if secure_boot is not None:
        assert keys is not None
        variables = tmp / f"{node}-vars.fd"
        if secure_boot:
            keys.enrolled_vars(variables)
        else:
            shutil.copyfile(secureboot.OVMF_VARS_EMPTY, variables)
        pflash = (secureboot.OVMF_SECBOOT_CODE, variables)
    if args.uki:
        db_key = None if keys is None else keys.db_key()
        esp, values = lab.uki(node, sign=None if db_key is None else lambda img: signing.sign(img, db_key))
        print(f"{node}: UKI {sum(f.stat().st_size for f in esp.rglob('*.EFI')) / 1e6:.1f} MB", flush=True)
    lab.gateway.attestation = joins = None
    if tpm:
        qemu_tpm.manufacture(tmp / node / "state", tmp / node / "ca")
        swtpm = qemu_tpm.Swtpm(tmp / node / "state", tmp / node / "swtpm.sock").start()
        build = Build.from_values(values)
        ca = tmp / node / "ca"
        lab.gateway.attestation = joins = RecordedJoins(Verifier(
            Policy(builds=[build], learn="first"),
            ek_roots=load_certificates([ca / qemu_tpm.CA_ROOT, ca / qemu_tpm.CA_ISSUER])))
    try:
        machine = lab.boot(node, disks=lab.standard_disks(node), pxe=args.pxe, uefi=uefi,
                           media=media, esp=esp, tpm=swtpm.socket if swtpm else None,
                           pflash=pflash, secure_boot=pflash is not None)
        phases = Phases(machine)
        try:
            joined = lab.wait_joined(machine, node, 600)
            if joins is not None:
                verdict = joins.wait_verdict(node, 120)
                assert verdict is not None and verdict.attested, verdict
                joined = machine.elapsed()  # to the verdict, not the session
                if describe:
                    print(describe_log(joins.event_log), flush=True)
            phases.stop()
            time.sleep(args.idle)
            rss = agent_rss(machine)
            t0 = time.monotonic()
            cid = lab.gateway.send(node, "inventory.refresh", {})
            body, result = lab.gateway.wait_result(cid, 600)
            round_trip = time.monotonic() - t0
            assert body.status == session_pb2.SUCCEEDED, body.message
            assert isinstance(result, agent_pb2.InventoryRefreshResult), result
            time.sleep(args.idle)
            after = agent_rss(machine)  # idle again, with the inventory handler and agent_pb2 loaded
        finally:
            phases.stop()
            machine.stop()
    finally:
        if swtpm is not None:
            swtpm.stop()
    return Run(tpm, secure_boot, joined, phases.row(joined), rss.get("VmRSS", 0), rss.get("RssAnon", 0),
               rss.get("RssShmem", 0), result.seconds, round_trip, after.get("VmRSS", 0))


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def report(rows: list[Run], boot: str, parts: Ramdisk) -> None:
    print()
    print("| run | boot | joined after (s) | VmRSS idle (MiB) | anon / shmem (MiB) | inventory (s) "
          "| round trip (s) | VmRSS idle after it (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        sides = (" TPM attested" if r.tpm else "") + ("" if r.secure_boot is None else ", " + r.side)
        print(f"| {i} | {boot}{sides} | {r.joined:.1f} | {r.rss:.1f} "
              f"| {r.anon:.1f} / {r.shmem:.1f} | {r.inventory:.2f} | {r.round_trip:.2f} | {r.after:.1f} |")
    if any(v is not None for r in rows for v in r.phases):
        print("\n| run | side | firmware up (s) | UKI loaded, PCR 4 (s) | stub + kernel to /init (s) "
              "| kernel uptime at /init (s) | /init to joined (s) |")
        print("|---|---|---|---|---|---|---|")
        for i, r in enumerate(rows):
            print(f"| {i} | {r.side} | " + " | ".join(fmt(v) for v in r.phases) + " |")
    medians = {}
    for name in sorted({r.side for r in rows}):
        side = [r for r in rows if r.side == name]
        medians[name] = statistics.median(r.joined for r in side)
        phases: list[float | None] = []
        for n in range(len(PHASES) + 2):
            seen = [p for r in side if (p := r.phases[n]) is not None]
            phases.append(statistics.median(seen) if seen else None)
        print(f"\n{name}: median joined {medians[name]:.1f}s, phases "
              f"{' / '.join(fmt(v) for v in phases)}, "
              f"median VmRSS {statistics.median(r.rss for r in side):.1f} MiB "
              f"({statistics.median(r.after for r in side):.1f} after an inventory)")
    if {"TPM", "no TPM"} <= medians.keys():
        print(f"TPM - no TPM: {medians['TPM'] - medians['no TPM']:+.1f}s (medians; target <= +3.0 s)")
    if {"Secure Boot on", "Secure Boot off"} <= medians.keys():
        on, off = medians["Secure Boot on"], medians["Secure Boot off"]
        print(f"Secure Boot on - off: {on - off:+.1f}s, on / off {on / off:.3f} (medians; target <= +0.5 s)")
    print(f"kernel {parts.kernel.stat().st_size / 1e6:.1f} MB, "
          f"the initramfs's base {parts.base.stat().st_size / 1e6:.1f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pxe", action="store_true", help="boot by iPXE instead of -kernel")
    parser.add_argument("--iso", action="store_true",
                        help="boot the ramdisk ISO from a virtual CD, its config medium beside it")
    parser.add_argument("--uefi", action="store_true", help="UEFI firmware (OVMF; always on arm64)")
    parser.add_argument("--arch", choices=("amd64", "arm64"), default="amd64")
    parser.add_argument("--uki", action="store_true",
                        help="the ramdisk as a UKI, booted by OVMF from a FAT disk")
    parser.add_argument("--tpm", action="store_true", help="with --uki: a TPM, and the join attested")
    parser.add_argument("--interleave", action="store_true",
                        help="with --uki: --runs boots without a TPM and --runs with, alternated")
    parser.add_argument("--secure-boot", action="store_true",
                        help="with --uki, amd64: --runs boots with Secure Boot off and --runs on, alternated")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idling before reading RSS")
    args = parser.parse_args()
    if (args.tpm or args.interleave or args.secure_boot) and not args.uki:
        parser.error("--tpm, --interleave and --secure-boot need --uki")
    if args.tpm and args.interleave:
        parser.error("--interleave boots both with and without a TPM: leave out --tpm")
    if args.secure_boot and (args.interleave or args.arch != "amd64"):
        parser.error("--secure-boot: amd64 (OVMF's Secure Boot build), its own interleaving")
    reason = secureboot.missing() if args.secure_boot else None
    if reason:
        parser.error(f"--secure-boot: {reason}")
    parts = ensure_ramdisk(arch=args.arch)
    image = parts.kernel.parent / "initramfs.img"
    uefi = args.uefi or args.arch != "amd64"
    uefi = uefi or args.uki
    boot = ("PXE" if args.pxe else "ISO" if args.iso else "UKI" if args.uki else "-kernel") \
        + (" UEFI" if uefi else "") + f" {args.arch}"
    size = parts.kernel.stat().st_size + image.stat().st_size
    k, i = parts.kernel.stat().st_size, image.stat().st_size
    print(f"kernel {k / 1e6:.1f} MB + initramfs {i / 1e6:.1f} MB = {size / 1e6:.1f} MB compressed")
    # none, TPM, TPM, none, none, TPM, ... (or Secure Boot off, on, on, off, ...)
    alternated = [(run // 2 + run) % 2 == 1 for run in range(2 * args.runs)]
    order = alternated if args.interleave else [args.tpm] * (2 * args.runs if args.secure_boot else args.runs)
    sb_order: list[bool | None] = list(alternated) if args.secure_boot else [None] * len(order)
    rows: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bc-bench-") as tmp, Lab(Path(tmp), parts) as lab:
        keys = secureboot.FleetKeys.generate(Path(tmp) / "fleet-keys") if args.secure_boot else None
        for run, (tpm, sb) in enumerate(zip(order, sb_order, strict=True)):
            r = one_run(lab, Path(tmp), f"bench-{run}", args, uefi=uefi, tpm=tpm,
                        describe=tpm and True not in order[:run], keys=keys, secure_boot=sb)
            rows.append(r)
            print(f"run {run} {r.side}: joined {r.joined:.1f}s, phases "
                  f"{' / '.join(fmt(v) for v in r.phases)}, VmRSS {r.rss:.1f} MiB, inventory "
                  f"{r.inventory:.2f}s (round trip {r.round_trip:.2f}s), VmRSS after it {r.after:.1f} MiB",
                  flush=True)
    report(rows, boot, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
