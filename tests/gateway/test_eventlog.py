"""The event log parser and replay, against tpm2_eventlog and against a TPM that was measured."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from agent.gateway import eventlog
from tests.tpmsim import BIOS_BOOT, UEFI_BOOT, SimTpm, event_log, manufactured_tpm, measure, sim

__all__ = ["manufactured_tpm", "sim"]


def tpm2_eventlog_pcrs(path: Path) -> dict[int, bytes]:
    if shutil.which("tpm2_eventlog") is None:
        pytest.skip("tpm2_eventlog is not installed")
    out = subprocess.run(["tpm2_eventlog", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    bank = out.stdout.split("pcrs:", 1)[1]
    found = re.finditer(r"^\s+(\d+)\s*:\s*0x([0-9a-fA-F]{64})", bank, re.M)
    return {int(m[1]): bytes.fromhex(m[2]) for m in found}


@pytest.mark.parametrize("boot", [UEFI_BOOT, BIOS_BOOT], ids=["uefi", "bios"])
@pytest.mark.parametrize("locality", [None, 3])
def test_replay_agrees_with_tpm2_eventlog(boot: list[tuple[int, int, bytes, bytes]], locality: int | None,
                                          tmp_path: Path) -> None:
    data = event_log(boot, locality=locality)
    (tmp_path / "log.bin").write_bytes(data)
    oracle = tpm2_eventlog_pcrs(tmp_path / "log.bin")
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
