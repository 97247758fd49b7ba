"""What verifying one device's SPDM report costs the gateway (issue 54, items 3, 4 and 7).

A real H100's report (NVIDIA's published sample: 64 measurement blocks, a 5-certificate chain,
fetched by ``python -m tests.published`` into ~/.cache) where present, and an exchange made here
(8 blocks, a 2-certificate chain) in every case. Timed, one report at a time:

    parse + verify  parse_report then verify_report: the nonce, the chain to the configured
                    root, the ECDSA P-384 signature over the transcript, each measurement
                    against the fleet's recorded values
    rim             verify_rim on one of NVIDIA's shipped RIMs (C14N 1.1, SHA-384, ECDSA P-384,
                    its 4-certificate chain): done once per RIM when it is configured, not per report

Usage: .venv/bin/python bench/spdm_verify.py [--reports 200]
"""

from __future__ import annotations

import argparse
import base64
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from agent.gateway.verifier.rim import verify_rim  # noqa: E402
from agent.gateway.verifier.spdm import GoldenTable, load_chain, parse_report, split_exchange, verify_report  # noqa: E402
from tests.published import nv_cache  # noqa: E402
from tests.site.bmc.redfish_emulator.spdm import FIRMWARE, INDICES, exchange, make_cert, measurement  # noqa: E402


def timed(n: int, work: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        work()
        out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


def summary(name: str, ms: list[float]) -> None:
    print(f"  {name:<34} median {statistics.median(ms):6.2f} ms   p95 {ms[int(len(ms) * 0.95) - 1]:6.2f} ms"
          f"   (n={len(ms)})")


def published(n: int) -> None:
    root = nv_cache() / "verifier"
    sample = root / "samples" / "hopperAttestationReport.txt"
    if not sample.is_file():
        print("  (NVIDIA's published sample is absent: `python -m tests.published` fetches it)")
        return
    data = bytes.fromhex(sample.read_text().strip())
    chain = load_chain((root / "samples" / "hopperCertChain.txt").read_bytes())
    roots = x509.load_pem_x509_certificates((root / "certs" / "verifier_device_root.pem").read_bytes())
    first = parse_report(*split_exchange(data))
    table = GoldenTable.parse(GoldenTable.record(first, "96.00.9F.00.01"))
    summary("H100 report (64 blocks, 5 certs)", timed(n, lambda: verify_report(
        parse_report(*split_exchange(data)), chain, roots, nonce=first.nonce, table=table)))
    rim = sorted((root / "samples").glob("*_PROD.swidtag"))[0].read_bytes()
    signer = re.search(rb"<ds:X509Certificate>(.*?)</ds:X509Certificate>", rim, re.S)
    assert signer is not None
    at = x509.load_der_x509_certificate(base64.b64decode(b"".join(signer[1].split()))).not_valid_before_utc
    rim_roots = x509.load_pem_x509_certificates((root / "certs" / "verifier_RIM_root.pem").read_bytes())
    summary(f"NVIDIA RIM ({len(rim) // 1024} KiB)",
            timed(max(n // 4, 1), lambda: verify_rim(rim, rim_roots, at=at)))


def made(n: int) -> None:
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = make_cert("CA", ca_key, "CA", ca_key, ca=True)
    chain = [make_cert("leaf", key, "CA", ca_key, ca=False), ca]
    nonce = bytes(32)
    data = exchange(key, nonce, 0, {i: measurement(i) for i in INDICES}, FIRMWARE)
    table = GoldenTable.parse({"firmware": {FIRMWARE: {str(i): [measurement(i).hex()] for i in INDICES}}})
    summary(f"made report ({len(INDICES)} blocks, 2 certs)", timed(n, lambda: verify_report(
        parse_report(*split_exchange(data)), chain, [ca], nonce=nonce, table=table)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reports", type=int, default=200)
    args = p.parse_args()
    print("one report at a time, parse + verify:")
    published(args.reports)
    made(args.reports)


if __name__ == "__main__":
    main()
