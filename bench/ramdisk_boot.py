"""Measure the ramdisk: compressed size, QEMU start -> agent joined, idle RSS, inventory time.

    python bench/ramdisk_boot.py [--runs 3] [--pxe | --iso | --uki [--tpm]] [--uefi]
                                 [--arch amd64|arm64] [--idle 20]

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
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.gateway.attest import Verifier, load_certificates  # noqa: E402
from agent.gateway.attest_join import JoinAttestation  # noqa: E402
from agent.gateway.attest_policy import Build, Policy  # noqa: E402
from agent.proto import session_pb2  # noqa: E402
from qemu import tpm as qemu_tpm  # noqa: E402
from qemu.harness import Machine  # noqa: E402
from qemu.lab import Lab, ensure_ramdisk  # noqa: E402
from qemu.sitemedia import user_net_media  # noqa: E402


def agent_rss(machine: Machine) -> dict[str, float]:
    """The agent's VmRSS and its parts, in MiB, read in the guest through the debug shell."""
    _, out = machine.shell("grep -E '^(VmRSS|RssAnon|RssFile|RssShmem)' "
                           "/proc/$(cat /run/bettercompute-agent.pid)/status")
    return {k: int(v) / 1024 for k, v in re.findall(r"(\w+):\s+(\d+) kB", out)}


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
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idling before reading RSS")
    args = parser.parse_args()
    if args.tpm and not args.uki:
        parser.error("--tpm needs --uki")
    parts = ensure_ramdisk(arch=args.arch)
    image = parts.kernel.parent / "initramfs.img"
    uefi = args.uefi or args.arch != "amd64"
    uefi = uefi or args.uki
    boot = ("PXE" if args.pxe else "ISO" if args.iso else "UKI" if args.uki else "-kernel") \
        + (" UEFI" if uefi else "") + (" TPM attested" if args.tpm else "") + f" {args.arch}"
    size = parts.kernel.stat().st_size + image.stat().st_size
    k, i = parts.kernel.stat().st_size, image.stat().st_size
    print(f"kernel {k / 1e6:.1f} MB + initramfs {i / 1e6:.1f} MB = {size / 1e6:.1f} MB compressed")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bc-bench-") as tmp, Lab(Path(tmp), parts) as lab:
        for run in range(args.runs):
            node = f"bench-{run}"
            media = user_net_media(lab, node, Path(tmp)) if args.iso else ()
            esp, swtpm = None, None
            if args.uki:
                esp, values = lab.uki(node)
            if args.tpm:
                qemu_tpm.manufacture(Path(tmp) / node / "state", Path(tmp) / node / "ca")
                swtpm = qemu_tpm.Swtpm(Path(tmp) / node / "state", Path(tmp) / node / "swtpm.sock").start()
                build = Build(values["build_id"], tuple(bytes.fromhex(v) for v in values["pcr4"]),
                              {11: bytes.fromhex(values["pcr11"]), 12: bytes.fromhex(values["pcr12"])})
                ca = Path(tmp) / node / "ca"
                lab.gateway.attestation = JoinAttestation(Verifier(
                    Policy(builds=[build], learn="first"),
                    ek_roots=load_certificates([ca / qemu_tpm.CA_ROOT, ca / qemu_tpm.CA_ISSUER])))
            machine = lab.boot(node, disks=lab.standard_disks(node), pxe=args.pxe, uefi=uefi,
                               media=media, esp=esp, tpm=swtpm.socket if swtpm else None)
            joined = lab.wait_joined(machine, node, 600)
            if lab.gateway.attestation is not None:
                verdict = lab.gateway.attestation.wait_verdict(node, 120)
                assert verdict is not None and verdict.attested, verdict
                joined = machine.elapsed()  # to the verdict, not the session
            time.sleep(args.idle)
            rss = agent_rss(machine)
            t0 = time.monotonic()
            cid = lab.gateway.send(node, "inventory.refresh", {})
            body, result = lab.gateway.wait_result(cid, 600)
            round_trip = time.monotonic() - t0
            assert body.status == session_pb2.SUCCEEDED, body.message
            time.sleep(args.idle)
            after = agent_rss(machine)  # idle again, with the inventory handler and agent_pb2 loaded
            rows.append((joined, rss.get("VmRSS", 0), rss.get("RssAnon", 0), rss.get("RssShmem", 0),
                         result.seconds, round_trip, after.get("VmRSS", 0)))
            print(f"run {run}: joined {joined:.1f}s, RSS {rss}, inventory {result.seconds:.2f}s "
                  f"(round trip {round_trip:.2f}s), VmRSS after it {after.get('VmRSS', 0):.1f} MiB",
                  flush=True)
            machine.stop()
            if swtpm is not None:
                swtpm.stop()
    print()
    print("| run | boot | joined after (s) | VmRSS idle (MiB) | anon / shmem (MiB) | inventory (s) "
          "| round trip (s) | VmRSS idle after it (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (j, rss, anon, shmem, inv, rt, after) in enumerate(rows):
        print(f"| {i} | {boot} | {j:.1f} | {rss:.1f} | {anon:.1f} / {shmem:.1f} "
              f"| {inv:.2f} | {rt:.2f} | {after:.1f} |")
    print(f"\nmedian joined {statistics.median(r[0] for r in rows):.1f}s, "
          f"median VmRSS {statistics.median(r[1] for r in rows):.1f} MiB "
          f"({statistics.median(r[6] for r in rows):.1f} after an inventory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
