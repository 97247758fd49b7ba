"""diag.dcgm against a fake dcgmi printing recorded DCGM 3.x and 4.x JSON, and a fake nv-hostengine."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.commands import dcgm as dcgm_command
from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.errors import CommandTimeout, InvalidParameters, ToolFailed, ToolMissing
from agent.proc import alive
from agent.proto import agent_pb2, common_pb2, session_pb2
from agent.schema import payload_from_json
from tests.runtime.harness import wait_until

PASS, WARN, FAIL = common_pb2.PASS, common_pb2.WARN, common_pb2.FAIL
FAKES = Path(__file__).resolve().parents[1] / "fakes"
SAMPLES = FAKES / "dcgm"


@pytest.fixture
def config(nvml_library: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.delenv("FAKE_NVML_CONFIG", raising=False)  # the fake's default: 8 H100s
    for name in ("FAKE_DCGMI_MODE", "FAKE_DCGMI_SAMPLE", "FAKE_DCGMI_EXIT", "FAKE_HOSTENGINE_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_DCGMI_LOG", str(tmp_path / "dcgmi.log"))
    monkeypatch.setenv("FAKE_HOSTENGINE_LOG", str(tmp_path / "hostengine.log"))
    monkeypatch.setenv("FAKE_DCGMI_PIDS", str(tmp_path / "dcgmi.pids"))
    return Config(nvml_library=nvml_library, dcgmi=str(FAKES / "dcgmi"),
                  nv_hostengine=str(FAKES / "nv-hostengine"))


def run(config: Config, request: dict[str, object] | None = None, *,
        timeout: float | None = None) -> agent_pb2.DiagDcgmResult:
    handler = handler_for("diag.dcgm")
    assert handler is not None
    params = handler.parse(payload_from_json("diag.dcgm", request or {}))
    result = handler.run(Context.local("diag.dcgm", config, timeout=timeout), params)
    assert isinstance(result, agent_pb2.DiagDcgmResult)
    return result


def calls(tmp_path: Path, name: str = "dcgmi.log") -> list[list[str]]:
    log = tmp_path / name
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_dcgm4_level1_pass(config: Config, tmp_path: Path) -> None:
    r = run(config)
    assert calls(tmp_path) == [["diag", "-r", "1", "-j"]]
    assert (r.json_format, r.dcgm_version, r.level, r.exit_code) == ("v4", "4.2.3", 1, 0)
    assert r.verdict == PASS and not r.findings and list(r.gpus) == list(range(8))
    assert [(t.name, t.category, t.gpu_index, t.status) for t in r.tests][:2] == [
        ("software", "Deployment", 0, "pass"), ("software", "Deployment", 1, "pass")]
    assert r.raw_json == (SAMPLES / "dcgm4_level1_pass.json").read_text()
    assert not r.hostengine_started


def test_dcgm3_level1_pass(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_SAMPLE", "dcgm3_level1_pass.json")
    r = run(config)
    assert (r.json_format, r.dcgm_version, r.verdict) == ("v2", "3.3.5", PASS)
    assert [t.name for t in r.tests][:3] == ["Denylist", "NVML Library", "CUDA Main Library"]
    assert all(t.gpu_index == -1 for t in r.tests) and list(r.gpus) == list(range(8))


def test_dcgm3_memory_failure(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_SAMPLE", "dcgm3_level2_fail.json")
    r = run(config, {"level": 2})
    assert r.exit_code == 226 and r.verdict == FAIL
    [finding] = r.findings
    assert (finding.code, finding.gpu_index, finding.subject) == ("dcgm_test_failed", 3, "GPU Memory")
    assert "Found 2 faulty memory elements on GPU 3" in finding.message
    [failed] = [t for t in r.tests if t.status == "fail"]
    assert (failed.category, list(failed.error_codes)) == ("Hardware", ["52"])
    pcie = [t for t in r.tests if t.name == "PCIe"]
    assert len(pcie) == 8 and "GPU to Host bandwidth" in pcie[0].info


def test_dcgm4_pcie_failure(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_SAMPLE", "dcgm4_level3_fail.json")
    r = run(config, {"level": 3})
    assert r.verdict == FAIL and [(f.code, f.gpu_index, f.subject) for f in r.findings] == [
        ("dcgm_test_failed", 5, "pcie")]
    assert {t.name for t in r.tests} == {"software", "memory", "diagnostic", "pcie", "targeted_stress",
                                         "targeted_power", "memory_bandwidth"}


def test_everything_skipped_is_a_warning(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_SAMPLE", "dcgm4_level2_skipped.json")
    r = run(config, {"level": 2})
    assert r.verdict == WARN and [f.code for f in r.findings] == ["dcgm_nothing_tested"]
    assert run(config, {"level": 2, "thresholds": {"treat_warn_as_fail": True}}).verdict == FAIL


def test_failing_exit_without_a_failed_test(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_EXIT", "205")
    r = run(config)
    assert r.exit_code == 205 and r.verdict == FAIL and [f.code for f in r.findings] == ["dcgm_exit_status"]


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_levels_gpus_and_parameters_reach_dcgmi(config: Config, tmp_path: Path, level: int) -> None:
    run(config, {"level": level, "gpus": ["3", "0", "3"],
                 "parameters": {"targeted_power.test_duration": "30", "memtest.test_duration": "60"}})
    assert calls(tmp_path) == [["diag", "-r", str(level), "-j", "-i", "0,3",
                                "-p", "memtest.test_duration=60;targeted_power.test_duration=30"]]


def test_gpu_count_is_checked_on_whole_node_runs_only(config: Config) -> None:
    r = run(config, {"thresholds": {"expected_gpu_count": 16}})
    assert r.verdict == FAIL and [f.code for f in r.findings] == ["gpu_count"]
    assert run(config, {"gpus": ["0"], "thresholds": {"expected_gpu_count": 16}}).verdict == PASS


@pytest.mark.parametrize(
    "bad",
    [{"level": 5}, {"gpus": ["GPU-1234"]}, {"gpus": ["0;1"]}, {"parameters": {"bad key": "1"}},
     {"parameters": {"memtest.test_duration": "60;pcie.x=1"}}, {"parameters": {"memtest": "1"}}],
)
def test_bad_requests_are_refused(bad: dict[str, object]) -> None:
    handler = handler_for("diag.dcgm")
    assert handler is not None
    with pytest.raises(InvalidParameters):
        handler.parse(payload_from_json("diag.dcgm", bad))


def test_dcgm_not_installed(config: Config, tmp_path: Path) -> None:
    config = replace(config, dcgmi=str(tmp_path / "bin" / "dcgmi"))
    with pytest.raises(ToolMissing, match="DCGM is not installed"):
        run(config)


def test_host_engine_started_when_none_runs(config: Config, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "no-hostengine")
    r = run(config)
    assert r.hostengine_started and r.verdict == PASS and r.json_format == "v4"
    first, second = calls(tmp_path)
    assert first == ["diag", "-r", "1", "-j"]
    assert second[:4] == first and second[4] == "--host" and second[5].startswith("unix://")
    [engine] = calls(tmp_path, "hostengine.log")
    socket_path = second[5][len("unix://"):]
    assert engine[:3] == ["-n", "-d", socket_path]
    assert not os.path.exists(socket_path)  # stopped and cleaned up
    assert not any(socket_path in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                   for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/cmdline"))


def test_host_engine_that_cannot_start(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "no-hostengine")
    monkeypatch.setenv("FAKE_HOSTENGINE_MODE", "broken")
    with pytest.raises(ToolFailed, match=r"could not start .*Failed to start DCGM Server"):
        run(config)


def test_host_engine_not_installed(config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "no-hostengine")
    config = replace(config, nv_hostengine=str(tmp_path / "nv-hostengine"))
    with pytest.raises(ToolFailed, match="nv-hostengine is not installed"):
        run(config)


def test_timeout_kills_dcgmi_and_its_children(config: Config, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "hang")
    with pytest.raises(CommandTimeout):
        run(config, timeout=5)
    pids = [int(p) for p in (tmp_path / "dcgmi.pids").read_text().split()]
    assert len(pids) == 2
    wait_until(lambda: all(not alive(p) for p in pids), 10, f"dcgmi and its child ({pids}) to be gone")


def test_progress_while_dcgmi_runs(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "hang")
    monkeypatch.setattr(dcgm_command, "PROGRESS_SECONDS", 0.2)
    frames: list[session_pb2.Progress] = []
    handler = handler_for("diag.dcgm")
    assert handler is not None
    params = handler.parse(payload_from_json("diag.dcgm", {"level": 3}))
    ctx = Context.local("diag.dcgm", config, timeout=2, progress_sink=frames.append)  # ~10 ticks
    with pytest.raises(CommandTimeout):
        handler.run(ctx, params)
    ticks = [f for f in frames if "running for" in f.message]
    assert ticks and all(0 < f.fraction < 0.01 and f.eta_seconds > 1700 for f in ticks)
    assert "dcgmi diag -r 3" in ticks[0].message


def test_unparsable_output(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_MODE", "garbage")
    with pytest.raises(ToolFailed, match="does not parse"):
        run(config)


def test_runtime_error_is_reported(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DCGMI_SAMPLE", "dcgm4_runtime_error.json")
    with pytest.raises(ToolFailed, match="A diagnostic instance is already running"):
        run(config)


def test_waits_for_the_gpus_it_covers(config: Config) -> None:
    handler = handler_for("diag.dcgm")
    assert handler is not None
    params = handler.parse(payload_from_json("diag.dcgm", {"gpus": ["2"]}))
    ctx = Context.local("diag.dcgm", config, timeout=0.5)
    held = ctx.locks.hold(["gpu:2"], threading.Event(), time.monotonic() + 60)
    with held, pytest.raises(CommandTimeout, match="waiting for gpu:2"):
        handler.run(ctx, params)
