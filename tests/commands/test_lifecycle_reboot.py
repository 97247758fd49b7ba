"""node.reboot: EFI preparation in run (failures fail the command before anything ends), the
reboot itself in the SelfTermination's action, recorded by a double."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from agent import schema
from agent.commands.base import Context, SelfTermination
from agent.commands.reboot import RebootHandler
from agent.errors import InvalidParameters, NotFound, Unsupported
from agent.hw import kexec, power
from agent.hw.bootid import boot_id
from agent.proto import agent_pb2
from tests.hw.test_kexec import RecordingRunner, RecordingSyscalls
from tests.hw.test_power import GUID, efivar


@pytest.fixture
def efivars(tmp_path: Path) -> Path:
    root = tmp_path / "efivars"
    root.mkdir()
    efivar(root, "Boot0003", b"entry")
    efivar(root, "OsIndicationsSupported", struct.pack("<Q", 1), attrs=6)
    return root


def handler(tmp_path: Path, efivars: Path | None = None) -> tuple[RebootHandler, RecordingSyscalls,
                                                                   RecordingRunner]:
    sc, runner = RecordingSyscalls(), RecordingRunner()
    (tmp_path / "systemd").mkdir(exist_ok=True)
    pw = power.Power(sc, runner, efivars=efivars or tmp_path / "none", systemd_marker=tmp_path / "systemd")
    pw.sleep = lambda s: None
    return RebootHandler(pw), sc, runner


def run(h: RebootHandler, payload: dict[str, object]) -> SelfTermination:
    params = h.parse(schema.payload_from_json("node.reboot", payload))
    out = h.run(Context.local("node.reboot"), params)
    assert isinstance(out, SelfTermination)
    return out


def test_forced_reboot_only_when_the_runtime_calls_the_action(tmp_path: Path) -> None:
    h, sc, _ = handler(tmp_path)
    out = run(h, {"mode": "FORCED"})
    assert sc.calls == []
    assert out.proof == {}  # the core adds its own boot id as old_boot_id
    assert isinstance(out.result, agent_pb2.NodeRebootResult) and out.result.old_boot_id == boot_id()
    out.action()
    assert sc.calls == [("sync", None), ("reboot", kexec.LINUX_REBOOT_CMD_RESTART)]


def test_graceful_reboot_asks_systemd(tmp_path: Path) -> None:
    h, _, runner = handler(tmp_path)
    run(h, {}).action()
    assert runner.argvs == [["systemctl", "reboot"]]


def test_one_time_boot_entry_is_set_before_the_reboot(tmp_path: Path, efivars: Path) -> None:
    h, sc, _ = handler(tmp_path, efivars)
    out = run(h, {"mode": "FORCED", "target": "ONE_TIME_BOOT_ENTRY", "bootEntry": "0003"})
    assert (efivars / f"BootNext-{GUID}").read_bytes() == struct.pack("<IH", 7, 3)
    assert sc.calls == []
    out.action()
    assert sc.calls[-1] == ("reboot", kexec.LINUX_REBOOT_CMD_RESTART)


def test_firmware_setup_target(tmp_path: Path, efivars: Path) -> None:
    h, _, _ = handler(tmp_path, efivars)
    run(h, {"target": "FIRMWARE_SETUP"})
    assert (efivars / f"OsIndications-{GUID}").read_bytes() == struct.pack("<IQ", 7, 1)


def test_efi_failures_fail_the_command_and_reboot_nothing(tmp_path: Path, efivars: Path) -> None:
    h, sc, runner = handler(tmp_path, efivars)
    with pytest.raises(NotFound):
        run(h, {"target": "ONE_TIME_BOOT_ENTRY", "bootEntry": "0009"})
    h2, sc2, runner2 = handler(tmp_path)  # no EFI at all
    with pytest.raises(Unsupported):
        run(h2, {"target": "FIRMWARE_SETUP"})
    assert sc.calls == sc2.calls == [] and runner.argvs == runner2.argvs == []


@pytest.mark.parametrize(
    "payload",
    [{"target": "ONE_TIME_BOOT_ENTRY"}, {"target": "ONE_TIME_BOOT_ENTRY", "bootEntry": "zz"},
     {"bootEntry": "0003"}, {"mode": 7}],
)
def test_bad_requests_are_refused_at_parse(tmp_path: Path, payload: dict[str, object]) -> None:
    h, _, _ = handler(tmp_path)
    with pytest.raises(InvalidParameters):
        h.parse(schema.payload_from_json("node.reboot", payload))
