"""dist/agent.pyz: reproducible, and runs from a bare interpreter with no packages."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent import catalog

ROOT = Path(__file__).resolve().parent.parent


def build(out: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "build" / "zipapp.py"), "--out", str(out), *extra],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "bytes" in done.stdout and "build id" in done.stdout  # prints the size
    return done.stdout


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pyz") / "agent.pyz"
    build(out)
    return out


def bare(pyz: Path, *args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """Run the zipapp with -I -S: no site-packages, no user site, no PYTHON* variables."""
    return subprocess.run(
        [sys.executable, "-I", "-S", str(pyz), *args],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "BC_AGENT_CACHE": str(cache)},
    )


def test_two_builds_are_byte_identical(pyz: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.pyz"
    build(again)
    assert pyz.read_bytes() == again.read_bytes()


def test_kinds_from_a_bare_interpreter(pyz: Path, tmp_path: Path) -> None:
    out = bare(pyz, "kinds", "--json", cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr
    assert [row["kind"] for row in json.loads(out.stdout)] == sorted(catalog.KINDS)


def test_native_dependencies_unpack_once_into_a_private_cache(pyz: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = bare(pyz, "version", "--deps", cache=cache)
    assert first.returncode == 0, first.stdout + first.stderr
    assert str(cache) in first.stdout  # cryptography came from the unpacked wheel
    assert "google.protobuf" in first.stdout and "pynvml" in first.stdout
    (build_dir,) = cache.iterdir()
    assert build_dir.stat().st_mode & 0o777 == 0o700
    stamp = [p.stat().st_mtime_ns for p in build_dir.iterdir()]
    second = bare(pyz, "version", "--deps", cache=cache)
    assert second.returncode == 0
    assert [p.stat().st_mtime_ns for p in build_dir.iterdir()] == stamp  # not unpacked again


def test_missing_native_dependency_is_one_line(tmp_path: Path) -> None:
    """A build without a wheel for this machine says what is missing and how to get it."""
    import platform

    other = "aarch64" if platform.machine() == "x86_64" else "x86_64"
    pyz = tmp_path / "other-arch.pyz"
    build(pyz, "--arch", other)
    out = bare(pyz, "version", "--deps", cache=tmp_path / "cache")
    assert out.returncode == 69
    line = next(line for line in out.stdout.splitlines() if line.startswith("cryptography"))
    assert "missing Python dependency 'cryptography'" in line and "pip install cryptography" in line
    assert "Traceback" not in out.stdout + out.stderr


def test_vendors_only_what_the_agent_can_import(pyz: Path) -> None:
    with zipfile.ZipFile(pyz) as z:
        top = {n.split("/")[1] for n in z.namelist() if n.startswith("_vendor/")}
    # protobuf (google/), nvidia-ml-py's pynvml module; not the wheels' samples, tests and
    # site-packages hooks (zipimport never runs a .pth)
    assert top == {"google", "pynvml.py"}, top


def test_the_archive_carries_no_test_hook(pyz: Path) -> None:
    """Nothing in the product loads code named by its environment; the build refuses it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("zipapp_build", ROOT / "build" / "zipapp.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # its dataclasses look their module up
    spec.loader.exec_module(build)
    with zipfile.ZipFile(pyz) as zf:
        names = zf.namelist()
        agent_code = {n: zf.read(n) for n in names if n.startswith("agent/")}
    assert not [n for n in names if n.startswith("tests/")]
    build.check_no_test_hooks(agent_code)  # what shipped passes the build's own check
    with pytest.raises(SystemExit, match="carries a test hook"):
        build.check_no_test_hooks({"agent/app.py": b"os.environ['BC_AGENT_TEST_HANDLERS']"})
    with pytest.raises(SystemExit, match="test code must not ship"):
        build.check_no_test_hooks({"tests/runtime/agent_test_handlers.py": b""})
