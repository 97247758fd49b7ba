"""agent.hw.gpu against the fake libnvidia-ml.so.1 (tests/fakes/nvml), with the real pynvml."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agent.hw import gpu
from tests.fakes.nvml.fakenvml import FakeMachine


def read_gpus(library: str | None,
              refs: Sequence[str] = ()) -> tuple[gpu.SystemInfo, int, list[gpu.GpuState]]:
    """(system, number of GPUs NVML enumerates, the states of ``refs`` or of all GPUs)."""
    with gpu.open_nvml(library) as nvml:
        system = nvml.system()
        count = nvml.count()
        indices = sorted({nvml.resolve(ref) for ref in refs}) if refs else list(range(count))
        return system, count, [nvml.read(i) for i in indices]


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeMachine:
    m = FakeMachine(tmp_path / "machine.json")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(m.path))
    return m


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "600"])
    yield child
    child.kill()
    child.wait()


def test_reads_every_field_of_an_h100(nvml_library: str, machine: FakeMachine) -> None:
    system, count, states = read_gpus(nvml_library)
    assert (system.driver_version, system.cuda_driver_version, system.nvml_version) == (
        "550.90.07", "12.4", "12.550.90.07")
    assert count == 8 and [s.index for s in states] == list(range(8))
    s = states[0]
    assert s.name == "NVIDIA H100 80GB HBM3" and s.uuid.startswith("GPU-") and s.serial
    assert s.pci_bus_id == "00000000:18:00.0" and s.vbios_version == "96.00.74.00.01"
    assert s.memory_total_bytes == 85520809984 and s.memory_used_bytes == 0
    assert (s.temperature_slowdown_c, s.temperature_shutdown_c) == (89, 92)
    assert s.power_limit_mw == 700000 and s.clock_sm_mhz == 1980 and s.clock_mem_mhz == 2619
    assert (s.pcie_generation, s.pcie_generation_max, s.pcie_width, s.pcie_width_max) == (5, 5, 16, 16)
    assert s.ecc_enabled is True and s.ecc_uncorrected_volatile == 0
    assert s.remapped_rows_pending is False and s.remapped_rows_failure is False
    assert len(s.nvlinks) == 18 and all(active for _, active in s.nvlinks)
    assert s.persistence_mode is True and s.processes == [] and not s.lost and s.errors == {}
    assert s.clock_event_names() == [("gpu_idle", False)]


def test_not_supported_is_not_available_not_an_error(nvml_library: str, machine: FakeMachine) -> None:
    # H100 has no page retirement (row remapping instead); V100 the other way round.
    machine.set(1, model="V100", retired_sbe=2, retired_dbe=1, retired_pending=True)
    _, _, states = read_gpus(nvml_library)
    h100, v100 = states[0], states[1]
    assert h100.retired_pages_single_bit is None and h100.retired_pages_pending is None
    assert v100.remapped_rows_pending is None and v100.remapped_rows_failure is None
    assert (v100.retired_pages_single_bit, v100.retired_pages_double_bit) == (2, 1)
    assert v100.retired_pages_pending is True and len(v100.nvlinks) == 6
    assert h100.errors == {} and v100.errors == {}


def test_no_ecc_and_no_nvlink(nvml_library: str, machine: FakeMachine) -> None:
    machine.set(0, ecc_supported=False, nvlinks=0)
    s = read_gpus(nvml_library, ["0"])[2][0]
    assert s.ecc_enabled is None and s.ecc_corrected_volatile is None and s.nvlinks == []
    assert s.errors == {}


def test_lost_gpu_at_handle_and_at_query(nvml_library: str, machine: FakeMachine) -> None:
    machine.set(2, lost="handle").set(5, lost="query")
    _, count, states = read_gpus(nvml_library)
    assert count == 8
    assert [s.index for s in states if s.lost] == [2, 5]
    assert states[2].uuid == "" and states[3].lost is False


def test_unopenable_gpu(nvml_library: str, machine: FakeMachine) -> None:
    machine.set(1, lost="unknown")  # "Unable to determine the device handle ...: Unknown Error"
    s = read_gpus(nvml_library, ["1"])[2][0]
    assert not s.lost and s.errors == {gpu.UNREADABLE: "Unknown Error"}


def test_missing_gpu_is_not_enumerated(nvml_library: str, machine: FakeMachine) -> None:
    machine.set(7, missing=True)
    assert len(gpu.list_gpus(nvml_library)) == 7


def test_resolve_by_index_and_uuid(nvml_library: str, machine: FakeMachine) -> None:
    with gpu.open_nvml(nvml_library) as nvml:
        uuid = nvml.read(4).uuid
        assert nvml.resolve(uuid) == 4 and nvml.resolve("4") == 4
        with pytest.raises(gpu.NotFound):
            nvml.resolve("8")
        with pytest.raises(gpu.NotFound):
            nvml.resolve("GPU-00000000-0000-0000-0000-000000000000")
    machine.set(4, lost="handle")
    with gpu.open_nvml(nvml_library) as nvml:
        assert nvml.resolve(uuid) == 4  # the one lost GPU


def test_processes_are_listed_while_alive(nvml_library: str, machine: FakeMachine,
                                          sleeper: subprocess.Popen[bytes]) -> None:
    machine.set(1, processes=[{"pid": sleeper.pid, "used_memory": 1 << 30},
                              {"pid": 2**22 + 12345, "used_memory": 1}])  # no such pid
    with gpu.open_nvml(nvml_library) as nvml:
        procs = nvml.processes(1)
    assert [(p.pid, p.used_memory_bytes, p.name) for p in procs] == [(sleeper.pid, 1 << 30, "sleep")]
    sleeper.kill()
    sleeper.wait()
    with gpu.open_nvml(nvml_library) as nvml:
        assert nvml.processes(1) == []


def test_list_gpus_for_the_inventory(nvml_library: str, machine: FakeMachine) -> None:
    machine.set(0, model="H200")
    gpus = gpu.list_gpus(nvml_library)
    assert gpus[0].name == "NVIDIA H200" and gpus[0].memory_total_bytes == 150754820096
    assert (gpus[0].vendor_id, gpus[0].device_id) == ("10de", "2335")
    assert (gpus[1].vendor_id, gpus[1].device_id) == ("10de", "2330")
    assert len({g.uuid for g in gpus}) == 8


def test_no_driver_is_a_clean_error(nvml_library: str, machine: FakeMachine, tmp_path: Path) -> None:
    with pytest.raises(gpu.NoDriver, match="cannot load the NVML library"):
        gpu.list_gpus(str(tmp_path / "libnvidia-ml.so.1"))
    machine.update(init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(gpu.NoDriver, match="kernel driver is not loaded"):
        gpu.list_gpus(nvml_library)


def test_default_library_absent_here(nvml_library: str, machine: FakeMachine,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu.LIBRARY_ENV, raising=False)
    gpu.list_gpus(nvml_library)  # loaded once: switching back must still find nothing by default
    try:
        gpu.list_gpus(None)
    except gpu.NoDriver as exc:
        assert "libnvidia-ml.so.1 not found" in str(exc)
    else:
        pytest.skip("this machine has a real libnvidia-ml.so.1")


def test_library_from_the_environment_in_a_subprocess(nvml_library: str, machine: FakeMachine) -> None:
    code = "from agent.hw import gpu; print(len(gpu.list_gpus()))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, gpu.LIBRARY_ENV: nvml_library}, check=True)
    assert out.stdout.strip() == "8"
    assert "Traceback" not in out.stderr


def test_real_gpu_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine with an NVIDIA driver: read every GPU for real (never changes anything)."""
    monkeypatch.delenv(gpu.LIBRARY_ENV, raising=False)
    monkeypatch.delenv("FAKE_NVML_CONFIG", raising=False)
    try:
        system, count, states = read_gpus(None)
    except gpu.NoDriver as exc:
        pytest.skip(f"no real NVIDIA driver here: {exc}")
    assert system.driver_version and count == len(states)
    for s in states:
        assert s.lost or (s.uuid.startswith(("GPU-", "MIG-")) and s.name and s.pci_bus_id), s


def test_reads_what_a_tenant_can_set_against_its_defaults(nvml_library: str, machine: FakeMachine) -> None:
    machine.set(1, mig_mode=True, power_limit_mw=450000, app_clock_graphics=1410)
    machine.set(2, model="V100")
    states = gpu.read_all(nvml_library)
    clean, planted, v100 = states[0], states[1], states[2]
    assert (clean.mig_mode, clean.mig_mode_pending) == (False, False)
    assert clean.power_limit_set_mw == clean.power_limit_default_mw == 700000
    assert (clean.app_clock_graphics_mhz, clean.app_clock_memory_mhz) == (1755, 2619)
    assert (clean.app_clock_graphics_default_mhz, clean.app_clock_memory_default_mhz) == (1755, 2619)
    assert (planted.mig_mode, planted.mig_mode_pending) == (True, True)
    assert (planted.power_limit_set_mw, planted.power_limit_default_mw) == (450000, 700000)
    assert planted.app_clock_graphics_mhz == 1410 and planted.app_clock_graphics_default_mhz == 1755
    assert v100.mig_mode is None and v100.errors == {}        # no MIG on a V100: not available
