"""dist/agent.pyz: reproducible, and runs from a bare interpreter with no packages."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

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
    # protobuf's native build from its wheel, before the pure one the archive carries too
    line = next(line for line in first.stdout.splitlines() if line.startswith("google.protobuf"))
    assert str(cache) in line and line.endswith(", implementation upb"), line
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
    assert top == {"google", "pynvml.py", "pynvml.pyc"}, top


def test_every_module_carries_its_bytecode(pyz: Path, tmp_path: Path) -> None:
    """zipimport writes no bytecode cache: each .py has its .pyc (this interpreter's) beside
    it, or every start compiles the agent again; --no-bytecode leaves them out."""
    import importlib.util

    with zipfile.ZipFile(pyz) as z:
        names = set(z.namelist())
        sources = {n for n in names if n.endswith(".py")}
        assert sources and {n + "c" for n in sources} <= names
        assert z.read("agent/cli/__init__.pyc")[:4] == importlib.util.MAGIC_NUMBER
    plain = tmp_path / "plain.pyz"
    build(plain, "--arch", "none", "--no-bytecode")
    with zipfile.ZipFile(plain) as z:
        assert not [n for n in z.namelist() if n.endswith(".pyc")]
    out = bare(plain, "version", "--deps", cache=tmp_path / "cache")
    line = next(line for line in out.stdout.splitlines() if line.startswith("google.protobuf"))
    assert line.endswith(", implementation python"), line  # no wheel: the archive's pure one


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
        build.check_no_test_hooks({"agent/cli/app.py": b"os.environ['BC_AGENT_TEST_HANDLERS']"})
    with pytest.raises(SystemExit, match="test code must not ship"):
        build.check_no_test_hooks({"tests/runtime/agent_test_handlers.py": b""})


# -- licences and the SBOM (issue 19) -----------------------------------------------------------

WHEELS = ROOT / "build" / ".wheels"


def sbom_of(z: zipfile.ZipFile) -> dict[str, Any]:
    bom: dict[str, Any] = json.loads(z.read("_legal/sbom.cdx.json"))
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.5"
    return bom


def prop(component: dict[str, Any], name: str) -> str:
    return next(str(p["value"]) for p in component["properties"] if p["name"] == name)


def wheel_by_hash(sha256: str) -> Path:
    """The wheel the build fetched (build/.wheels) with this hash."""
    for path in WHEELS.glob("*.whl"):
        if hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
            return path
    raise AssertionError(f"no wheel in {WHEELS} has sha256 {sha256}")


def test_sbom_lists_every_wheel_the_archive_carries_with_its_hash(pyz: Path) -> None:
    with zipfile.ZipFile(pyz) as z:
        bom = sbom_of(z)
        names = set(z.namelist())
        stored = {n: hashlib.sha256(z.read(n)).hexdigest() for n in names
                  if n.startswith("_native/") and n.endswith(".whl")}
        vendored = {n: z.read(n) for n in names if n.startswith("_vendor/")}
        manifest = json.loads(z.read("_native/MANIFEST.json"))
    assert pyz.with_name(pyz.name + ".cdx.json").read_bytes() == json.dumps(bom, indent=1, sort_keys=True) \
        .encode() + b"\n"  # the same document beside the archive and inside it
    assert prop(bom["metadata"]["component"], "bettercompute:build-id") == manifest["build_id"]
    components = bom["components"]
    native = {prop(c, "bettercompute:location"): c["hashes"][0]["content"] for c in components
              if prop(c, "bettercompute:location").startswith("_native/")}
    assert native == stored  # every stored wheel listed, with the hash of the bytes carried

    # Every vendored file is one of a listed wheel's, byte for byte, and nothing else is.
    from_wheels: set[str] = set()
    for c in components:
        assert c["version"] and c["licenses"], c["name"]
        if prop(c, "bettercompute:location") != "_vendor/":
            continue
        wheel = wheel_by_hash(c["hashes"][0]["content"])
        assert f"{c['name'].replace('-', '_')}-{c['version']}" in wheel.name
        with zipfile.ZipFile(wheel) as whl:
            for info in whl.infolist():
                name = "_vendor/" + info.filename
                if name in vendored:
                    assert vendored[name] == whl.read(info), name
                    from_wheels.add(name)
    synthesized = {"_vendor/google/__init__.py"}  # makes the namespace package importable
    compiled = {n for n in vendored if n.endswith(".pyc") and n[:-1] in vendored}  # its bytecode
    assert set(vendored) - synthesized - compiled == from_wheels


def test_every_wheel_carries_its_licence_files(pyz: Path) -> None:
    with zipfile.ZipFile(pyz) as z:
        bom = sbom_of(z)
        legal = {n: z.read(n) for n in z.namelist() if n.startswith("_legal/licenses/")}
        infos = {i.filename: i for i in z.infolist()}
    for c in bom["components"]:
        folder = prop(c, "bettercompute:licence-files")
        texts = [data for name, data in legal.items() if name.startswith(folder)]
        assert texts and sum(map(len, texts)) > 500, folder  # a licence text, not a stub
    for name in legal:
        assert infos[name].compress_type == zipfile.ZIP_DEFLATED, name
    # the notices whose licences ask for them in binary copies
    assert b"Redistributions in binary form" in legal["_legal/licenses/protobuf-7.36.2/LICENSE"]
    nvml = legal["_legal/licenses/nvidia-ml-py-13.615.71/NOTICE-pynvml.py.txt"]
    assert b"NVIDIA Corporation" in nvml and b"Redistributions in binary form" in nvml
    names = {c["name"] for c in bom["components"]}
    assert names == {"cryptography", "cffi", "protobuf", "nvidia-ml-py", "pynvml"}


def test_without_gateway_leaves_the_reference_gateway_out(pyz: Path, tmp_path: Path) -> None:
    """The ramdisk's agent (initramfs.build.build_agent) is built so; dist/agent.pyz keeps it
    for operators (`agent gateway`)."""
    small = tmp_path / "ramdisk-agent.pyz"
    build(small, "--arch", "none", "--without-gateway")
    with zipfile.ZipFile(small) as z:
        assert not [n for n in z.namelist() if n.startswith("agent/gateway/")]
        assert prop(sbom_of(z)["metadata"]["component"], "bettercompute:gateway") == "no"
    with zipfile.ZipFile(pyz) as z:
        assert "agent/gateway/server.py" in z.namelist()
        assert prop(sbom_of(z)["metadata"]["component"], "bettercompute:gateway") == "yes"
    kinds = bare(small, "kinds", "--json", cache=tmp_path / "cache")
    assert kinds.returncode == 0, kinds.stderr
    out = bare(small, "gateway", "serve", cache=tmp_path / "cache")
    assert out.returncode == 69, out.stdout + out.stderr
    assert "reference gateway is not in this build" in out.stderr and "Traceback" not in out.stderr
