"""agent.hw.power: graceful and forced reboot with the final action recorded, EFI BootNext and
OsIndications written to a stand-in efivarfs directory."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from agent.errors import InvalidParameters, NotFound, Unsupported
from agent.hw import kexec, power
from tests.hw.test_kexec import RecordingRunner, RecordingSyscalls

GUID = power.EFI_GLOBAL_GUID


def efivar(root: Path, name: str, value: bytes, attrs: int = 7) -> None:
    (root / f"{name}-{GUID}").write_bytes(struct.pack("<I", attrs) + value)


@pytest.fixture
def efivars(tmp_path: Path) -> Path:
    root = tmp_path / "efivars"
    root.mkdir()
    efivar(root, "Boot0000", b"entry 0")
    efivar(root, "Boot0003", b"entry 3")
    efivar(root, "OsIndicationsSupported", struct.pack("<Q", 0x1 | 0x4), attrs=6)
    return root


def make(tmp_path: Path, efivars: Path | None = None, systemd: bool = True) -> tuple[
        power.Power, RecordingSyscalls, RecordingRunner]:
    sc, runner = RecordingSyscalls(), RecordingRunner()
    marker = tmp_path / "systemd-system"
    if systemd:
        marker.mkdir(exist_ok=True)
    p = power.Power(sc, runner, efivars=efivars or tmp_path / "no-efi", systemd_marker=marker,
                    graceful_wait=42.0)
    p.sleep = lambda s: sc.calls.append(("slept", s))
    return p, sc, runner


def test_forced_reboot_syncs_then_calls_reboot(tmp_path: Path) -> None:
    p, sc, runner = make(tmp_path)
    p.reboot(power.Mode.FORCED)
    assert sc.calls == [("sync", None), ("reboot", kexec.LINUX_REBOOT_CMD_RESTART)]
    assert runner.argvs == []


def test_graceful_reboot_goes_through_systemd_and_forces_only_when_ignored(tmp_path: Path) -> None:
    p, sc, runner = make(tmp_path)
    p.reboot(power.Mode.GRACEFUL)
    assert runner.argvs == [["systemctl", "reboot"]]
    # Still alive after the grace period (the recording double does not end us): forced.
    assert sc.calls == [("slept", 42.0), ("sync", None), ("reboot", kexec.LINUX_REBOOT_CMD_RESTART)]


def test_graceful_reboot_without_systemd_uses_the_init_reboot(tmp_path: Path) -> None:
    p, _, runner = make(tmp_path, systemd=False)
    p.reboot(power.Mode.GRACEFUL)
    assert runner.argvs == [["reboot"]]


def test_boot_next_is_written_with_attributes(tmp_path: Path, efivars: Path) -> None:
    p, sc, _ = make(tmp_path, efivars)
    assert p.set_boot_next("0003") == 3
    assert (efivars / f"BootNext-{GUID}").read_bytes() == struct.pack("<IH", 7, 3)
    assert sc.calls == []  # nothing rebooted yet


def test_boot_next_for_a_missing_entry_is_refused(tmp_path: Path, efivars: Path) -> None:
    p, _, _ = make(tmp_path, efivars)
    with pytest.raises(NotFound, match="Boot0007"):
        p.set_boot_next("7")
    assert not (efivars / f"BootNext-{GUID}").exists()


@pytest.mark.parametrize("bad", ["", "xyz", "12345", "00 3"])
def test_bad_boot_entry_is_invalid(bad: str) -> None:
    with pytest.raises(InvalidParameters):
        power.parse_boot_entry(bad)


def test_firmware_setup_sets_the_bit_and_keeps_the_others(tmp_path: Path, efivars: Path) -> None:
    efivar(efivars, "OsIndications", struct.pack("<Q", 0x4))
    p, _, _ = make(tmp_path, efivars)
    p.request_firmware_setup()
    assert (efivars / f"OsIndications-{GUID}").read_bytes() == struct.pack("<IQ", 7, 0x5)


def test_firmware_setup_needs_firmware_support(tmp_path: Path, efivars: Path) -> None:
    efivar(efivars, "OsIndicationsSupported", struct.pack("<Q", 0x4), attrs=6)
    p, _, _ = make(tmp_path, efivars)
    with pytest.raises(Unsupported, match="setup"):
        p.request_firmware_setup()


def test_no_efi_is_unsupported(tmp_path: Path) -> None:
    p, _, _ = make(tmp_path)
    with pytest.raises(Unsupported, match="EFI"):
        p.set_boot_next("0003")
    with pytest.raises(Unsupported, match="EFI"):
        p.request_firmware_setup()
