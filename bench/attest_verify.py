"""What attesting a join costs the gateway (issue 39 item 7: one join verified in at most 50 ms;
256 joins arriving at once verified without stalling other sessions).

A swtpm (manufactured with a local CA, its PCRs extended as OVMF's boot would be and an event
log written to match: tests/tpmsim.py) answers K challenges, one per made-up node, before
anything is timed. Then, on the gateway's side only:

    challenge     Verifier.challenge: the EK certificate's chain, the EK and AK checks, MakeCredential
    verify        Verifier.verify: activation, signature, TPMS_ATTEST, counters, event log replay, policy
    at once       K verifications started together on K threads (as K sessions' own threads do),
                  while a probe thread that sleeps 1 ms at a time records how late it wakes
                  (what another session's frame handling would wait)

One TPM stands in for the K machines: the verifier binds an EK to one node (one TPM, one node),
so the bench's table (``SharedTpm``) answers that no other node holds the EK; the binding's
look-ups and writes are still made, in memory as a gateway without ``--attest-state`` makes them.

Usage: .venv/bin/python bench/attest_verify.py [--joins 256] [--extra-events 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.gateway.verifier.attest import Challenge, Verifier, load_certificates  # noqa: E402
from agent.gateway.verifier.policy import Build, Policy  # noqa: E402
from agent.gateway.verifier.state import NodeStates  # noqa: E402
from agent.security.attest import Attestor  # noqa: E402
from agent.security.attest_contract import Evidence  # noqa: E402
from tests.tpmsim import UEFI_BOOT, Ev, SimTpm, ev, h, measure, variable  # noqa: E402

NODE_KEY = bytes(32)
BOOT = "00000000-0000-4000-8000-000000000000"


Work = list[tuple[str, Challenge, Evidence]]


class SharedTpm(NodeStates):
    """The bench's one TPM answers for K made-up nodes: its EK is held by none of them."""

    def owner(self, ek: bytes) -> str | None:
        return None


def prepared(sim: SimTpm, verifier: Verifier, joins: int, log: Path) -> tuple[Work, list[float]]:
    """``joins`` challenges made and answered by the TPM (measured once, before: ``log``)."""
    out, challenge_ms = [], []
    with sim.tpm() as tpm:
        attestor = Attestor(lambda: tpm, event_log=log)
        identity = attestor.identity()
        for i in range(joins):
            t0 = time.perf_counter()
            ch = verifier.challenge(f"node-{i}", identity)
            challenge_ms.append((time.perf_counter() - t0) * 1000)
            ev = attestor.answer(credential_blob=ch.credential_blob, encrypted_secret=ch.encrypted_secret,
                                 nonce=ch.nonce, boot_id=BOOT, node_public=NODE_KEY)
            out.append((f"node-{i}", ch, ev))
    return out, challenge_ms


def summary(name: str, ms: list[float]) -> None:
    ms = sorted(ms)
    print(f"  {name:<22} median {statistics.median(ms):6.2f} ms   p95 {ms[int(len(ms) * 0.95) - 1]:6.2f} ms"
          f"   max {ms[-1]:6.2f} ms   (n={len(ms)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--joins", type=int, default=256)
    p.add_argument("--extra-events", type=int, default=300,
                   help="events added to the log (PCR 5), as many as a server's firmware logs (default: 300)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimTpm.manufacture(Path(tmp) / "tpm")
        with sim:
            def verifier() -> Verifier:
                policy = Policy(builds=[Build("b1", (h(b"ramdisk uki"),), {})], learn="first")
                return Verifier(policy, ek_roots=load_certificates([sim.ca_root, sim.ca_issuer]),
                                states=SharedTpm())

            with sim.tpm() as tpm:
                extra = [ev(5, Ev.EFI_VARIABLE_BOOT, variable(f"Boot{i:04X}", bytes(60)))
                         for i in range(args.extra_events)]
                (Path(tmp) / "log").write_bytes(measure(tpm, [*UEFI_BOOT, *extra]))
            one = verifier()
            work, challenge_ms = prepared(sim, one, args.joins, Path(tmp) / "log")
            verify_ms = []
            for _node, ch, evidence in work:
                t0 = time.perf_counter()
                verdict = one.verify(ch, evidence, boot_id=BOOT, node_public=NODE_KEY)
                verify_ms.append((time.perf_counter() - t0) * 1000)
                assert verdict.attested, verdict
            print(f"one join at a time ({args.joins} joins, one TPM's evidence, "
                  f"{len(evidence.event_log)} B event log):")
            summary("challenge", challenge_ms)
            summary("verify", verify_ms)

            many = verifier()
            work, _ = prepared(sim, many, args.joins, Path(tmp) / "log")
            late: list[float] = []
            stop = threading.Event()

            def probe() -> None:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    time.sleep(0.001)
                    late.append((time.perf_counter() - t0) * 1000 - 1.0)

            done: list[float] = []
            start = threading.Barrier(len(work) + 1)

            def join(node: str, ch: Challenge, evidence: Evidence) -> None:
                start.wait()
                t0 = time.perf_counter()
                assert many.verify(ch, evidence, boot_id=BOOT, node_public=NODE_KEY).attested
                done.append((time.perf_counter() - t0) * 1000)

            threads = [threading.Thread(target=join, args=w) for w in work]
            prober = threading.Thread(target=probe)
            prober.start()
            for t in threads:
                t.start()
            t0 = time.perf_counter()
            start.wait()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            stop.set()
            prober.join()
            print(f"{args.joins} joins at once, on {args.joins} threads: "
                  f"all verified in {wall * 1000:.0f} ms")
            summary("each join's verify", done)
            summary("probe wakes late by", late)


if __name__ == "__main__":
    main()
