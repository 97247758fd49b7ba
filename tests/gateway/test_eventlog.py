"""The event log parser and replay, against tpm2_eventlog, against a TPM that was measured, and
against event logs published from real machines (tests/published.py) with the PCR values their
TPMs reported."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.gateway.verifier import eventlog
from agent.gateway.verifier.policy import Policy
from agent.gateway.verifier.refused import PolicyFailed
from agent.hw.tpm import BANKS
from tests.published import go_eventlog, reported_pcrs
from tests.tpmsim import BIOS_BOOT, UEFI_BOOT, SimTpm, event_log, manufactured_tpm, measure, sim

__all__ = ["manufactured_tpm", "sim"]

ALGORITHMS = {name: alg for alg, name in BANKS.items()}  # as tpm2_eventlog names them
EVENT_TYPES = {f"EV_{name}": value for name, value in vars(eventlog.Ev).items() if name.isupper()}


@dataclass(frozen=True)
class Oracle:
    """What tpm2_eventlog read: each event after the Spec ID header, and the SHA-256 bank."""

    events: list[tuple[int, str, dict[int, bytes]]]  # PCR, type name, algorithm -> digest
    pcrs: dict[int, bytes]


def tpm2_eventlog(path: Path) -> Oracle:
    if shutil.which("tpm2_eventlog") is None:
        pytest.skip("tpm2_eventlog is not installed")
    out = subprocess.run(["tpm2_eventlog", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    listing, _, banks = out.stdout.partition("\npcrs:")
    bank = re.search(r"^\s+sha256:\n((?:\s+\d+\s*:\s*0x[0-9a-fA-F]+\n?)+)", banks, re.M)
    assert bank, banks
    pcrs = {int(m[1]): bytes.fromhex(m[2]) for m in re.finditer(r"(\d+)\s*:\s*0x([0-9a-fA-F]+)", bank[1])}
    events = []
    for text in re.split(r"^- EventNum: ", listing, flags=re.M)[2:]:  # the preamble, the header event
        pcr = re.search(r"^  PCRIndex: (\d+)$", text, re.M)
        kind = re.search(r"^  EventType: (\S+)$", text, re.M)
        assert pcr and kind, text
        digests = re.findall(r"AlgorithmId: (\w+)\n\s+Digest: \"([0-9a-f]*)\"", text)
        events.append((int(pcr[1]), kind[1], {ALGORITHMS[a]: bytes.fromhex(d) for a, d in digests}))
    return Oracle(events, pcrs)


@pytest.mark.parametrize("boot", [UEFI_BOOT, BIOS_BOOT], ids=["uefi", "bios"])
@pytest.mark.parametrize("locality", [None, 3])
def test_replay_agrees_with_tpm2_eventlog(boot: list[tuple[int, int, bytes, bytes]], locality: int | None,
                                          tmp_path: Path) -> None:
    data = event_log(boot, locality=locality)
    (tmp_path / "log.bin").write_bytes(data)
    oracle = tpm2_eventlog(tmp_path / "log.bin").pcrs
    log = eventlog.parse(data)
    assert log.locality == (locality or 0)
    replayed = log.replay(oracle)
    if locality is None:
        assert replayed == oracle
    else:
        # tpm2-tools 5.4 extends the StartupLocality event (an EV_NO_ACTION) into PCR 0 and
        # ignores the locality; the PC Client PFP (10.4.5.3) starts PCR 0 at the locality instead.
        assert {p: v for p, v in replayed.items() if p} == {p: v for p, v in oracle.items() if p}
        expected = bytes(31) + bytes([locality])
        for _, _kind, digest, _ in (e for e in boot if e[0] == 0):
            expected = hashlib.sha256(expected + digest).digest()
        assert replayed[0] == expected
    assert len(log.events) == len(boot) + (1 if locality is not None else 0)


def test_replay_agrees_with_the_tpm(sim: SimTpm) -> None:
    with sim.tpm() as tpm:
        data = measure(tpm, UEFI_BOOT)
        pcrs = tpm.pcr_read(range(13))
    assert eventlog.parse(data).replay(range(13)) == pcrs


def test_the_events_of_one_pcr() -> None:
    log = eventlog.parse(event_log(UEFI_BOOT))
    apps = log.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)
    assert [e.sha256 for e in apps] == [UEFI_BOOT[-2][2]]


def test_bad_logs_are_refused() -> None:
    data = event_log(UEFI_BOOT)
    with pytest.raises(eventlog.BadEventLog, match="truncated"):
        eventlog.parse(data[:-3])
    sha1_only = struct.pack("<II", 0, 8) + bytes(20) + struct.pack("<I", 4) + b"1.0\0"
    with pytest.raises(eventlog.BadEventLog, match="Spec ID"):
        eventlog.parse(sha1_only)
    huge = data + struct.pack("<IIIH", 4, 1, 1, 0x000B) + bytes(32) + struct.pack("<I", 1 << 30)
    with pytest.raises(eventlog.BadEventLog):
        eventlog.parse(huge)
    foreign_alg = data + struct.pack("<IIIH", 4, 1, 1, 0x0004) + bytes(20) + struct.pack("<I", 0)
    with pytest.raises(eventlog.BadEventLog, match="not in the header"):
        eventlog.parse(foreign_alg)


# go-eventlog's published logs (tests/published.py), what each was read from as its authors say.
# All are TPM 2.0 crypto-agile logs but the last three.
PUBLISHED = {
    "eventlogs/tpm/arch-linux-workstation.bin": "an Arch Linux workstation, systemd-boot, Secure Boot off",
    "eventlogs/tpm/glinux-alex.bin": "a laptop (Lenovo's UEFI CA), Secure Boot off, PCR 0 from locality 3",
    "legacydata/crypto_agile_eventlog": "a machine with Intel firmware, Boot Guard's S-CRTM; SHA-256 only",
    "legacydata/sb_cert_eventlog": "the log of go-attestation#157 (Secure Boot certificates)",
    "eventlogs/tpm/rhel8-uefi.bin": "a RHEL 8 GCE instance, Secure Boot on",
    "eventlogs/tpm/ubuntu-1804-amd-sev.bin": "an Ubuntu 18.04 GCE instance on AMD SEV",
    "eventlogs/tpm/ubuntu-2104-no-dbx.bin": "an Ubuntu 21.04 GCE instance, no dbx",
    "eventlogs/tpm/ubuntu-2104-no-secure-boot.bin": "an Ubuntu 21.04 GCE instance, Secure Boot off",
    "eventlogs/tpm/ubuntu-2404-amd-sevsnp.bin": "an Ubuntu 24.04 GCE instance on AMD SEV-SNP",
    "eventlogs/tpm/cos-85-amd-sev.bin": "a Container-Optimized OS 85 GCE instance on AMD SEV",
    "eventlogs/tpm/cos-93-amd-sev.bin": "a Container-Optimized OS 93 GCE instance on AMD SEV",
    "eventlogs/tpm/cos-101-amd-sev.bin": "a Container-Optimized OS 101 GCE instance on AMD SEV",
    "legacydata/coreos_36_shielded_vm_no_secure_boot_eventlog": "a Fedora CoreOS 36 shielded VM",
    "eventlogs/tpm/debian-10.bin": "a Debian 10 GCE instance: SHA-1 only, the TPM 1.2 layout",
    "legacydata/option_rom_eventlog": "an HP machine with option ROMs: SHA-1 only, the TPM 1.2 layout",
    "legacydata/ebs_event_missing_eventlog": "an HP machine: SHA-1 only, the TPM 1.2 layout",
}
SHA1_LAYOUT = list(PUBLISHED)[-3:]
WITH_TPM_VALUES = [n for n in PUBLISHED if n.startswith("eventlogs/tpm/") and n not in SHA1_LAYOUT]


def published(name: str) -> bytes:
    path = go_eventlog() / "testdata" / name
    if not path.is_file():
        pytest.skip(f"{name} is not in this version of the package")
    return path.read_bytes()


@pytest.mark.parametrize("name", WITH_TPM_VALUES)
def test_a_published_log_replays_to_what_its_tpm_reported(name: str) -> None:
    """The PCR values the machine's TPM gave, published beside the log: the replay must reach them."""
    reported = reported_pcrs(go_eventlog()).get(name)
    assert reported, f"go-eventlog's replay test lists no SHA-256 bank for {name}"
    log = eventlog.parse(published(name))
    assert log.replay(reported) == reported, PUBLISHED[name]


def test_a_published_laptop_starts_pcr_0_at_locality_3() -> None:
    """The H-CRTM case tpm2-tools 5.4 gets wrong, on a real machine's log and TPM values."""
    name = "eventlogs/tpm/glinux-alex.bin"
    log = eventlog.parse(published(name))
    assert log.locality == 3
    assert log.replay([0]) == {0: reported_pcrs(go_eventlog())[name][0]}


@pytest.mark.parametrize("name", [n for n in PUBLISHED if n not in SHA1_LAYOUT])
def test_a_published_log_parses_as_tpm2_eventlog_reads_it(name: str) -> None:
    """Every event (PCR, type, each bank's digest) and the SHA-256 bank, against tpm2_eventlog."""
    data = published(name)
    oracle = tpm2_eventlog(go_eventlog() / "testdata" / name)
    log = eventlog.parse(data)
    assert [(e.pcr, e.digests) for e in log.events] == [(pcr, digests) for pcr, _, digests in oracle.events]
    for ours, (_, kind, _) in zip(log.events, oracle.events, strict=True):
        assert kind not in EVENT_TYPES or ours.type == EVENT_TYPES[kind], kind
    replayed = log.replay(oracle.pcrs)
    if log.locality:  # tpm2-tools 5.4 extends the StartupLocality event instead (see above)
        replayed.pop(0), oracle.pcrs.pop(0)
    assert replayed == oracle.pcrs
    apps = [d[eventlog.SHA256] for pcr, kind, d in oracle.events
            if pcr == 4 and kind == "EV_EFI_BOOT_SERVICES_APPLICATION"]
    # what the policy reads: the boot applications in PCR 4
    assert [e.sha256 for e in log.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)] == apps


@pytest.mark.parametrize("name", SHA1_LAYOUT)
def test_a_published_sha1_only_log_is_refused_by_name(name: str) -> None:
    """The quote is over the SHA-256 bank: a log with SHA-1 digests alone cannot be replayed to it."""
    with pytest.raises(eventlog.BadEventLog, match=r"not a TPM 2\.0 crypto-agile log"):
        eventlog.parse(published(name))


# The published logs' boots, before the policy: each log's own PCR 4 images as the build (the
# last) and its loaders, its own PCRs 9, 11 and 12 as the build's, so that every check left is
# the events' (judge_events): the types each PCR holds, the actions, the separators. Honest
# boots of real machines pass them; those that do not are said here and in docs/attestation.md.
POLICY_REFUSES = {
    # an excerpt (go-attestation#157's Secure Boot events): no separator in PCRs 0, 2 and 4
    "legacydata/sb_cert_eventlog": "policy_separator",
}


@pytest.mark.parametrize("name", [n for n in PUBLISHED if n not in SHA1_LAYOUT])
def test_the_policy_judges_the_events_of_a_published_log(name: str) -> None:
    log = eventlog.parse(published(name))
    pcrs = log.replay(range(13))
    images = [e.sha256 for e in log.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)]
    assert images, PUBLISHED[name]
    policy = Policy.from_json({
        "builds": [{"build_id": "its own", "pcr4": images[-1].hex(),
                    **{f"pcr{p}": pcrs[p].hex() for p in (9, 11, 12)}}],
        "loaders": [i.hex() for i in images[:-1]], "learn": "first"})
    if name in POLICY_REFUSES:
        with pytest.raises(PolicyFailed) as err:
            policy.judge(log, pcrs, "published")
        assert err.value.check == POLICY_REFUSES[name], err.value
        return
    assert policy.judge(log, pcrs, "published")["build"] == "its own", PUBLISHED[name]
    listed_none = Policy.from_json({**policy.to_json(), "loaders": []})
    if len(images) > 1 and images[0] != images[-1]:  # and their loaders are judged, not skipped
        with pytest.raises(PolicyFailed, match="no accepted loader"):
            listed_none.judge(log, pcrs, "published")
