"""Data that others published from real machines, for the parsers' and verifiers' tests.

Event logs, for the event-log parser's tests:

They are go-eventlog's test data (Google, Apache-2.0), which Debian ships in
golang-github-google-go-eventlog-dev: TCG logs read from a workstation, a laptop, an Intel
machine with Boot Guard and Google Compute Engine instances, and beside several of them the PCR
values their TPMs reported. Nothing of it is copied into the project: ``./dev test`` fetches
the package from Debian's archive (``python -m tests.published``) into a cache outside the
checkout, the tests read it there and skip where it is absent.

The package is pinned by its SHA-256. Unstable's pool keeps only the current version: when the
pinned one is gone, the current one is taken from unstable's package index, whose signature
gpgv checks against Debian's archive keyring. The tests then check what they read against the
PCR values published beside it, so a changed log fails them rather than passing unseen.

A real GPU's SPDM attestation, for the SPDM and RIM verifiers' tests: NVIDIA's local GPU
verifier (PyPI ``nv-local-gpu-verifier``, BSD-3-Clause) ships in its wheel an H100's
GET_MEASUREMENTS / MEASUREMENTS exchange, that GPU's certificate chain, NVIDIA's device and RIM
roots and signed RIMs. ``pip download`` fetches the pinned wheel (its SHA-256 checked) and only
its ``verifier/samples`` and ``verifier/certs`` are unpacked into the cache.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

MIRROR = "http://deb.debian.org/debian"
PACKAGE = "golang-github-google-go-eventlog-dev"
PINNED = ("pool/main/g/golang-github-google-go-eventlog/golang-github-google-go-eventlog-dev_0.0.2-2_all.deb",
          "366f6e404bfe1228982f2ffc40e3cfaba2c2c5aab5fc9cb0cd0a413908737d4d")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
INSIDE = Path("usr/share/gocode/src/github.com/google/go-eventlog")


def cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "bettercompute" / "go-eventlog"


def go_eventlog() -> Path:
    """The unpacked go-eventlog source with its testdata, or a skip saying how to get it."""
    root = cache() / INSIDE
    if not (root / "testdata").is_dir():
        pytest.skip(f"the published event logs are absent ({root}): `python -m tests.published` fetches them")
    return root


def reported_pcrs(root: Path) -> dict[str, dict[int, bytes]]:
    """The SHA-256 PCR values each log's machine reported, as go-eventlog's replay test lists them.

    Keyed by the log's path under testdata/. Read from the Go source (its ``var X = eventLog{
    RawLog: testdata.Y, ...}`` tables and testdata/eventlog_data.go's ``//go:embed`` lines).
    """
    embedded = (root / "testdata" / "eventlog_data.go").read_text()
    files = {m[2]: m[1] for m in re.finditer(r"//go:embed (\S+)\s+(\w+) \[\]byte", embedded)}
    source = (root / "tpmeventlog" / "replay_test.go").read_text()
    found: dict[str, dict[int, bytes]] = {}
    for m in re.finditer(r"^var \w+ = eventLog\{\s*RawLog:\s*testdata\.(\w+),(.*?)^\}$", source, re.M | re.S):
        bank = re.search(r"HashAlgo_SHA256, map\[uint32\]\[\]byte\{(.*?)\}\)", m[2], re.S)
        if bank and m[1] in files:
            values = re.findall(r"(\d+):\s*decodeHex\(\"([0-9a-f]{64})\"\)", bank[1])
            found[files[m[1]]] = {int(pcr): bytes.fromhex(value) for pcr, value in values}
    return found


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return bytes(response.read())


def _checked(data: bytes, sha256: str, what: str) -> bytes:
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(f"{what}: SHA-256 {got}, expected {sha256}")
    return data


def _from_the_index() -> tuple[str, str]:
    """(pool path, SHA-256) of the package's current version in unstable, through signed metadata."""
    with tempfile.TemporaryDirectory() as tmp:
        signed = Path(tmp) / "InRelease"
        signed.write_bytes(_get(f"{MIRROR}/dists/unstable/InRelease"))
        subprocess.run(["gpgv", "--keyring", str(KEYRING), str(signed)], check=True, capture_output=True)
        release = signed.read_text(errors="replace")
    index = re.search(r"^ ([0-9a-f]{64})\s+\d+ main/binary-all/Packages\.xz$", release, re.M)
    if index is None:
        raise ValueError("unstable's Release names no main/binary-all/Packages.xz")
    packages = lzma.decompress(_checked(_get(f"{MIRROR}/dists/unstable/main/binary-all/Packages.xz"),
                                        index[1], "Packages.xz")).decode(errors="replace")
    for stanza in packages.split("\n\n"):
        if re.search(rf"^Package: {re.escape(PACKAGE)}$", stanza, re.M):
            filename = re.search(r"^Filename: (\S+)$", stanza, re.M)
            sha256 = re.search(r"^SHA256: ([0-9a-f]{64})$", stanza, re.M)
            if filename and sha256:
                return filename[1], sha256[1]
    raise ValueError(f"{PACKAGE} is not in unstable's index")


def fetch() -> Path:
    """Fetch and unpack the package into cache() unless it is there; its go-eventlog directory."""
    dest = cache()
    if (dest / INSIDE / "testdata").is_dir():
        return dest / INSIDE
    try:
        path, sha256 = PINNED
        deb = _checked(_get(f"{MIRROR}/{path}"), sha256, path)
    except (OSError, ValueError) as pinned_failed:
        print(f"tests.published: the pinned package: {pinned_failed}; asking unstable's index",
              file=sys.stderr)
        path, sha256 = _from_the_index()
        deb = _checked(_get(f"{MIRROR}/{path}"), sha256, path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        (Path(tmp) / "p.deb").write_bytes(deb)
        subprocess.run(["dpkg-deb", "-x", str(Path(tmp) / "p.deb"), str(Path(tmp) / "root")], check=True)
        shutil.rmtree(dest, ignore_errors=True)
        (Path(tmp) / "root").rename(dest)
    return dest / INSIDE


NV_WHEEL = ("nv-local-gpu-verifier==2.7.3", "nv_local_gpu_verifier-2.7.3-py3-none-any.whl",
            "27259ce3d828ca102db17f4b70c7b85c1882a55f99153eb706fcb1866db0fe7a")
NV_KEEP = ("verifier/samples/", "verifier/certs/")


def nv_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "bettercompute" / "nv-local-gpu-verifier"


def nv_verifier() -> Path:
    """The unpacked verifier/ directory (samples/, certs/), or a skip saying how to get it."""
    root = nv_cache() / "verifier"
    if not (root / "samples" / "hopperAttestationReport.txt").is_file():
        pytest.skip(f"NVIDIA's published GPU attestation samples are absent ({root}): "
                    "`python -m tests.published` fetches them")
    return root


def fetch_nv_verifier() -> Path:
    """Fetch the pinned wheel with pip, check it, unpack its samples and certs into nv_cache()."""
    dest = nv_cache()
    if (dest / "verifier" / "samples" / "hopperAttestationReport.txt").is_file():
        return dest / "verifier"
    requirement, name, sha256 = NV_WHEEL
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--disable-pip-version-check", "-q", "-d", tmp, requirement],
                       check=True, stdin=subprocess.DEVNULL)
        wheel = _checked((Path(tmp) / name).read_bytes(), sha256, name)
        (Path(tmp) / "w.zip").write_bytes(wheel)
        root = Path(tmp) / "root"
        with zipfile.ZipFile(Path(tmp) / "w.zip") as z:
            for member in z.namelist():
                if member.startswith(NV_KEEP) and not member.endswith("/") and ".." not in member:
                    (root / member).parent.mkdir(parents=True, exist_ok=True)
                    (root / member).write_bytes(z.read(member))
        shutil.rmtree(dest, ignore_errors=True)
        root.rename(dest)
    return dest / "verifier"


if __name__ == "__main__":
    try:
        print(f"tests.published: {fetch()}")
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        # Not fatal: the tests that read these logs skip and say so.
        print(f"tests.published: not fetched ({e}); the published-event-log tests will skip", file=sys.stderr)
    try:
        print(f"tests.published: {fetch_nv_verifier()}")
    except (OSError, ValueError, subprocess.CalledProcessError, zipfile.BadZipFile) as e:
        print(f"tests.published: not fetched ({e}); the published SPDM and RIM tests will skip",
              file=sys.stderr)
