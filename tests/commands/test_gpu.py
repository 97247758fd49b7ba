"""diag.nvml and gpu.reset against the fake libnvidia-ml.so.1 and a fake nvidia-smi."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.commands import gpu as gpu_commands
from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import CommandTimeout, InvalidParameters, NotFound, ProtectedDevice, ToolFailed
from agent.proto import agent_pb2, common_pb2
from agent.schema import payload_from_json
from tests.fakes.nvml.fakenvml import FAKE_NVIDIA_SMI, FakeMachine

PASS, WARN, FAIL = common_pb2.PASS, common_pb2.WARN, common_pb2.FAIL


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeMachine:
    m = FakeMachine(tmp_path / "machine.json")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(m.path))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOG", str(tmp_path / "nvidia-smi.log"))
    return m


@pytest.fixture
def config(nvml_library: str) -> Config:
    return Config(nvml_library=nvml_library, nvidia_smi=str(FAKE_NVIDIA_SMI))


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    children: list[subprocess.Popen[bytes]] = []
    yield children
    for child in children:
        child.kill()
        child.wait()


def spawn_sleeper(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(["sleep", "600"])
    children.append(child)
    threading.Thread(target=child.wait, daemon=True).start()  # reap at once, as init would
    return child


def diag(config: Config, request: dict[str, object] | None = None) -> agent_pb2.DiagNvmlResult:
    handler = handler_for("diag.nvml")
    assert handler is not None
    params = handler.parse(payload_from_json("diag.nvml", request or {}))
    result = handler.run(Context.local("diag.nvml", config), params)
    assert isinstance(result, agent_pb2.DiagNvmlResult)
    return result


def codes(result: agent_pb2.DiagNvmlResult | agent_pb2.GpuHealth, index: int | None = None) -> set[str]:
    if isinstance(result, agent_pb2.GpuHealth):
        return {f.code for f in result.findings}
    if index is None:
        return {f.code for f in result.findings}
    return {f.code for f in result.gpus[index].findings}


# -- diag.nvml -------------------------------------------------------------------------------


def test_healthy_node_passes(config: Config, machine: FakeMachine) -> None:
    r = diag(config, {"thresholds": {"expected_gpu_count": 8, "expected_model": "H100"}})
    assert r.driver_present and r.driver_version == "550.90.07" and r.cuda_driver_version == "12.4"
    assert r.verdict == PASS and len(r.gpus) == 8 and not r.findings
    g = r.gpus[0]
    assert g.verdict == PASS and g.name == "NVIDIA H100 80GB HBM3" and g.pcie_width == 16
    assert [c.name for c in g.clock_event_reasons] == ["gpu_idle"] and len(g.nvlinks) == 18
    assert "retired_pages_single_bit" in g.unavailable and "remapped_rows_pending" not in g.unavailable


def test_no_driver_is_a_result_not_a_traceback(tmp_path: Path) -> None:
    config = Config(nvml_library=str(tmp_path / "absent" / "libnvidia-ml.so.1"))
    r = diag(config)
    assert not r.driver_present and "no NVIDIA driver" in r.message and r.verdict == WARN
    r = diag(config, {"thresholds": {"expected_gpu_count": 8}})
    assert r.verdict == FAIL and codes(r) == {"no_driver"}


def test_driver_not_loaded(config: Config, machine: FakeMachine) -> None:
    machine.update(init_error=9)
    r = diag(config, {"thresholds": {"expected_gpu_count": 8}})
    assert not r.driver_present and "kernel driver is not loaded" in r.message and r.verdict == FAIL


@pytest.mark.parametrize(
    ("fault", "code", "verdict"),
    [
        ({"lost": "handle"}, "gpu_lost", FAIL),
        ({"lost": "query"}, "gpu_lost", FAIL),
        ({"lost": "unknown"}, "gpu_unreadable", FAIL),
        ({"ecc_uncorrected_volatile": 3}, "ecc_uncorrected", FAIL),
        ({"ecc_corrected_volatile": 12}, "ecc_corrected", WARN),
        ({"ecc_uncorrected_aggregate": 1}, "ecc_uncorrected_history", WARN),
        ({"ecc_enabled": False}, "ecc_disabled", WARN),
        ({"remap_failure": True}, "row_remap_failure", FAIL),
        ({"remap_pending": True}, "row_remap_pending", FAIL),
        ({"model": "V100", "retired_pending": True}, "retired_pages_pending", FAIL),
        ({"model": "V100", "retired_sbe": 3}, "retired_pages", WARN),
        ({"temperature": 91}, "overheating", FAIL),
        ({"temperature": 86}, "temperature_high", WARN),
        ({"clock_event_reasons": 0x40}, "clock_throttled", WARN),
        ({"pcie_width": 8}, "pcie_width_degraded", FAIL),
        ({"pcie_gen": 3, "clock_event_reasons": 0}, "pcie_generation_low", WARN),
        ({"nvlink_down": [3, 7]}, "nvlink_inactive", WARN),
    ],
)
def test_each_fault_gives_its_verdict(config: Config, machine: FakeMachine, fault: dict[str, object],
                                      code: str, verdict: int) -> None:
    machine.set(3, **fault)
    r = diag(config, {"thresholds": {"expected_gpu_count": 8}})
    assert r.verdict == verdict
    assert codes(r, 3) == {code}
    assert [g.verdict for i, g in enumerate(r.gpus) if i != 3] == [PASS] * 7
    assert r.gpus[3].verdict == verdict


def test_model_mismatch(config: Config, machine: FakeMachine) -> None:
    machine.set(3, model="H200")
    r = diag(config, {"thresholds": {"expected_model": "h100"}})
    assert r.verdict == FAIL and codes(r, 3) == {"model_mismatch"} and r.gpus[2].verdict == PASS
    assert diag(config, {"thresholds": {"expected_model": "NVIDIA H"}}).verdict == PASS


def test_lost_gpu_is_reported_with_its_index(config: Config, machine: FakeMachine) -> None:
    machine.set(6, lost="handle")
    r = diag(config)
    assert r.gpus[6].lost and r.gpus[6].index == 6 and r.verdict == FAIL


def test_idle_gpu_may_run_its_link_slower(config: Config, machine: FakeMachine) -> None:
    machine.set(0, pcie_gen=1)  # idle (the default clock event reason): power saving, not a fault
    assert diag(config).verdict == PASS


def test_missing_gpu_fails_the_count(config: Config, machine: FakeMachine) -> None:
    machine.set(5, missing=True)
    r = diag(config, {"thresholds": {"expected_gpu_count": 8}})
    assert r.verdict == FAIL and codes(r) == {"gpu_count"} and len(r.gpus) == 7
    assert "7 GPU(s) found, expected 8" in r.findings[0].message
    assert diag(config).verdict == PASS  # no count expected: 7 healthy GPUs


def test_more_gpus_than_expected_warns(config: Config, machine: FakeMachine) -> None:
    assert diag(config, {"thresholds": {"expected_gpu_count": 4}}).verdict == WARN


def test_thresholds_override_the_defaults(config: Config, machine: FakeMachine) -> None:
    machine.set(1, ecc_corrected_volatile=5, temperature=70, pcie_width=8)
    r = diag(config, {"thresholds": {"max_ecc_corrected_volatile": 10, "max_temperature_c": 75,
                                     "min_pcie_width": 8}})
    assert r.verdict == PASS
    r = diag(config, {"thresholds": {"max_temperature_c": 60, "min_pcie_width": 8,
                                     "max_ecc_corrected_volatile": 10}})
    assert codes(r, 1) == {"temperature_high"} and r.verdict == WARN
    r = diag(config, {"thresholds": {"max_temperature_c": 60, "min_pcie_width": 8,
                                     "max_ecc_corrected_volatile": 10, "treat_warn_as_fail": True}})
    assert r.verdict == FAIL


def test_persistence_mode_only_when_required(config: Config, machine: FakeMachine) -> None:
    machine.set(2, persistence_mode=False)
    assert diag(config).verdict == PASS
    r = diag(config, {"thresholds": {"require_persistence_mode": True}})
    assert codes(r, 2) == {"persistence_mode_off"}


def test_processes_warn_unless_allowed(config: Config, machine: FakeMachine,
                                       sleepers: list[subprocess.Popen[bytes]]) -> None:
    child = spawn_sleeper(sleepers)
    machine.set(4, processes=[{"pid": child.pid, "used_memory": 2 << 30}])
    r = diag(config)
    assert codes(r, 4) == {"processes_running"} and r.verdict == WARN
    assert [(p.pid, p.name) for p in r.gpus[4].processes] == [(child.pid, "sleep")]
    assert diag(config, {"thresholds": {"allow_compute_processes": True}}).verdict == PASS


def test_subset_by_index_and_uuid(config: Config, machine: FakeMachine) -> None:
    uuid = diag(config).gpus[6].uuid
    r = diag(config, {"gpus": ["1", uuid, "1"]})
    assert [g.index for g in r.gpus] == [1, 6] and r.verdict == PASS
    r = diag(config, {"gpus": ["9"]})
    assert r.verdict == FAIL and codes(r) == {"gpu_missing"}


def test_bad_requests_are_refused_before_work() -> None:
    handler = handler_for("diag.nvml")
    assert handler is not None
    for bad in ({"gpus": ["zero"]}, {"gpus": ["../../x"]}, {"thresholds": {"min_pcie_width": 3}},
                {"thresholds": {"max_temperature_c": 500}}):
        with pytest.raises(InvalidParameters):
            handler.parse(payload_from_json("diag.nvml", bad))


def test_waits_for_a_reset_of_the_same_gpu(config: Config, machine: FakeMachine) -> None:
    ctx = Context.local("diag.nvml", config, timeout=0.5)
    handler = handler_for("diag.nvml")
    assert handler is not None
    params = handler.parse(payload_from_json("diag.nvml", {"gpus": ["2"]}))
    held = ctx.locks.hold([gpu_commands.gpu_lock(2)], threading.Event(), time.monotonic() + 60)
    with held, pytest.raises(CommandTimeout, match="deadline reached while waiting for gpu:2"):
        handler.run(ctx, params)


# -- gpu.reset -------------------------------------------------------------------------------


def reset(config: Config, request: dict[str, object]) -> agent_pb2.GpuResetResult:
    handler = handler_for("gpu.reset")
    assert handler is not None
    params = handler.parse(payload_from_json("gpu.reset", request))
    result = handler.run(Context.local("gpu.reset", config), params)
    assert isinstance(result, agent_pb2.GpuResetResult)
    return result


def smi_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "nvidia-smi.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_reset_clears_a_pending_remap(config: Config, machine: FakeMachine, tmp_path: Path) -> None:
    machine.set(3, remap_pending=True, ecc_uncorrected_volatile=1)
    assert diag(config).gpus[3].verdict == FAIL
    r = reset(config, {"gpu": "3"})
    assert smi_calls(tmp_path) == [["--gpu-reset", "-i", "3"]]
    assert r.method == "nvidia-smi" and r.index == 3 and "successfully reset" in r.output
    assert r.health.verdict == PASS and r.health.remapped_rows_uncorrectable == 1
    assert r.uuid == r.health.uuid and not r.stopped_processes
    assert machine.read()["gpus"][3]["resets"] == 1


def test_reset_by_uuid(config: Config, machine: FakeMachine, tmp_path: Path) -> None:
    uuid = diag(config).gpus[5].uuid
    r = reset(config, {"gpu": uuid})
    assert r.index == 5 and smi_calls(tmp_path) == [["--gpu-reset", "-i", "5"]]


def test_reset_refuses_a_busy_gpu(config: Config, machine: FakeMachine, tmp_path: Path,
                                  sleepers: list[subprocess.Popen[bytes]]) -> None:
    child = spawn_sleeper(sleepers)
    machine.set(1, processes=[{"pid": child.pid, "used_memory": 1 << 30, "name": "python3 train.py"}])
    with pytest.raises(ProtectedDevice) as info:
        reset(config, {"gpu": "1"})
    assert f"{child.pid} (python3 train.py)" in info.value.message
    assert info.value.details["processes"] == str(child.pid)
    assert smi_calls(tmp_path) == [] and child.poll() is None


def test_reset_stops_processes_when_asked(config: Config, machine: FakeMachine, tmp_path: Path,
                                          sleepers: list[subprocess.Popen[bytes]]) -> None:
    first, second = spawn_sleeper(sleepers), spawn_sleeper(sleepers)
    machine.set(0, processes=[{"pid": first.pid, "used_memory": 1}, {"pid": second.pid, "used_memory": 2}])
    r = reset(config, {"gpu": "0", "stop_processes": True})
    assert sorted(p.pid for p in r.stopped_processes) == sorted([first.pid, second.pid])
    for child in (first, second):
        child.wait(timeout=10)
        assert child.returncode == -15  # SIGTERM was enough
    assert smi_calls(tmp_path) == [["--gpu-reset", "-i", "0"]] and r.health.verdict == PASS


def test_reset_failure_is_a_tool_failure(config: Config, machine: FakeMachine) -> None:
    machine.set(2, reset_fails=True)
    with pytest.raises(ToolFailed, match="could not be reset"):
        reset(config, {"gpu": "2"})


def test_reset_of_a_lost_gpu_that_comes_back(config: Config, machine: FakeMachine) -> None:
    machine.set(4, lost="handle", reset_recovers=True)
    r = reset(config, {"gpu": "4"})
    assert not r.health.lost and r.health.verdict == PASS


def test_reset_of_an_unknown_gpu(config: Config, machine: FakeMachine, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        reset(config, {"gpu": "8"})
    with pytest.raises(InvalidParameters):
        handler = handler_for("gpu.reset")
        assert handler is not None
        handler.parse(payload_from_json("gpu.reset", {"gpu": "-i 0; reboot"}))
    assert smi_calls(tmp_path) == []


def test_reset_missing_tool(nvml_library: str, machine: FakeMachine, tmp_path: Path) -> None:
    config = Config(nvml_library=nvml_library, nvidia_smi=str(tmp_path / "no-nvidia-smi"))
    with pytest.raises(Exception, match="not installed"):
        reset(config, {"gpu": "0"})


def test_reset_waits_for_a_diagnostic_of_the_same_gpu(config: Config, machine: FakeMachine,
                                                      tmp_path: Path) -> None:
    handler = handler_for("gpu.reset")
    assert handler is not None
    params = handler.parse(payload_from_json("gpu.reset", {"gpu": "1"}))
    ctx = Context.local("gpu.reset", config, timeout=0.5)
    held = ctx.locks.hold([gpu_commands.gpu_lock(1)], threading.Event(), time.monotonic() + 60)
    with held, pytest.raises(CommandTimeout, match="waiting for gpu:1"):
        handler.run(ctx, params)
    assert smi_calls(tmp_path) == []
    other = Context.local("gpu.reset", config, timeout=30)
    other.locks = ctx.locks
    held = ctx.locks.hold([gpu_commands.gpu_lock(1)], threading.Event(), time.monotonic() + 60)
    with held:  # another GPU is not held up
        result = handler.run(other, handler.parse(payload_from_json("gpu.reset", {"gpu": "2"})))
    assert isinstance(result, agent_pb2.GpuResetResult) and result.index == 2


def test_xid_events_since_boot_are_findings(config: Config, machine: FakeMachine) -> None:
    from agent.policy import xid
    from tests.policy.test_xid import KERNEL_LOG

    machine.set(5, pci_bus=0xAB)  # the GPU the log's Xid 79 names (0000:ab:00.0)
    handler = gpu_commands.DiagNvml()
    handler.kernel_log = lambda: xid.parse(KERNEL_LOG)
    result = handler.run(Context.local("diag.nvml", config), handler.parse(agent_pb2.DiagNvmlRequest()))
    assert isinstance(result, agent_pb2.DiagNvmlResult)
    assert result.kernel_log_read and [e.xid for e in result.xid_events] == [13, 13, 79, 154, 999]
    found = {(f.code, f.gpu_index, f.subject, f.verdict) for f in result.findings}
    assert ("xid_reboot", 5, "0000:ab:00.0", FAIL) in found               # 79: fallen off the bus
    assert ("xid_reboot", 1, "0000:2a:00.0", FAIL) in found               # 154: recovery says reboot
    assert ("xid_unknown", 2, "0000:3a:00.0", WARN) in found
    assert not any(f.subject == "0000:18:00.0" for f in result.findings)  # 13: the application's
    assert result.verdict == FAIL
    message = next(f.message for f in result.findings if f.gpu_index == 5)
    assert message == "GPU 5: Xid 79 (GPU has fallen off the bus) 1 time(s) since boot: reboot the node"


def test_an_unreadable_kernel_log_is_said(config: Config, machine: FakeMachine) -> None:
    handler = gpu_commands.DiagNvml()
    handler.kernel_log = lambda: None
    result = handler.run(Context.local("diag.nvml", config), handler.parse(agent_pb2.DiagNvmlRequest()))
    assert isinstance(result, agent_pb2.DiagNvmlResult)
    assert not result.kernel_log_read and not result.xid_events and result.verdict == PASS
