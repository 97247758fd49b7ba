"""Build dist/agent.pyz: the agent, its pure-Python dependencies and native wheels, one file.

    python3 build/zipapp.py [--out dist/agent.pyz] [--arch x86_64,aarch64] [--version V]

Reproducible: entries sorted, fixed timestamps and modes, wheels pinned by sha256 in
build/wheels.lock (downloaded once into build/.wheels with pip). Two builds of the same tree
are byte-identical. ``--version`` overrides agent/version.py inside the archive only (the
upgrade tests build two versions from one tree). Prints the size and the build id.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "build" / ".wheels"
LOCK = ROOT / "build" / "wheels.lock"
EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Wheel:
    native: bool
    requirement: str
    platform: str
    python: str
    sha256: str

    @property
    def arch(self) -> str:
        for arch in ("x86_64", "aarch64"):
            if self.platform.endswith(arch):
                return arch
        return "any"


def read_lock() -> list[Wheel]:
    wheels = []
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, req, plat, py, sha = line.split()
        wheels.append(Wheel(kind == "native", req, plat, py, sha))
    return wheels


def fetch(wheel: Wheel) -> Path:
    """The wheel file, downloaded once with pip and checked against its pinned hash."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    for path in WHEELS.glob("*.whl"):
        if hashlib.sha256(path.read_bytes()).hexdigest() == wheel.sha256:
            return path
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--dest", str(WHEELS), "--python-version", wheel.python, wheel.requirement]
    cmd += ["--platform", wheel.platform]
    if wheel.native:
        cmd += ["--implementation", "cp"]
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)
    for path in WHEELS.glob("*.whl"):
        if hashlib.sha256(path.read_bytes()).hexdigest() == wheel.sha256:
            return path
    sys.exit(f"build/zipapp.py: no wheel for {wheel.requirement} ({wheel.platform}) matches its pin")


def agent_files(version: str | None) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted((ROOT / "agent").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = path.relative_to(ROOT).as_posix()
        data = path.read_bytes()
        if version is not None and name == "agent/version.py":
            data = data.replace(b'__version__ = "', b'__version__ = "' + version.encode() + b'"  # ', 1)
        files[name] = data
    for path in sorted((ROOT / "agent").rglob("*")):
        if path.is_file() and path.suffix in {".service", ".json"} and "__pycache__" not in path.parts:
            files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    return files


# Wheel files nothing imports from a zip: nvidia-ml-py's sample script; pynvml 13's smi helpers
# with their tests, and its .pth redirector (twice), which only a site-packages install runs.
# pynvml 13 is a shim over nvidia-ml-py, whose pynvml module is the one the agent imports.
NOT_VENDORED = ("example.py", "pynvml_utils/", "_pynvml_redirector.", "site-packages/")


def vendor_files(wheel_path: Path) -> dict[str, bytes]:
    files = {}
    with zipfile.ZipFile(wheel_path) as whl:
        for info in whl.infolist():
            name = info.filename
            if info.is_dir() or ".dist-info/" in name or name.endswith(".pyi"):
                continue
            if name.startswith(NOT_VENDORED):
                continue
            files["_vendor/" + name] = whl.read(info)
    # zipimport cannot import implicit namespace packages (google.protobuf): make it explicit.
    for name in list(files):
        if name.startswith("_vendor/google/"):
            files["_vendor/google/__init__.py"] = (
                b"__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n"
            )
            break
    return files


# What would let the product load code that is not its own: test modules, or a loader of code
# named by the environment (tests register their handlers through tests/runtime/agent_main.py).
TEST_HOOKS = (b"BC_AGENT_TEST_HANDLERS", b"spec_from_file_location", b"agent_test_handlers")


def check_no_test_hooks(files: dict[str, bytes]) -> None:
    """Refuse to build an archive that carries tests or a hook that loads outside code."""
    for name, data in files.items():
        if name.startswith("tests/"):
            raise SystemExit(f"build/zipapp.py: {name}: test code must not ship")
        if name.startswith("agent/") and any(hook in data for hook in TEST_HOOKS):
            raise SystemExit(f"build/zipapp.py: {name} carries a test hook; tests have their own entry point")


def build(out: Path, arches: set[str], version: str | None) -> str:
    files: dict[str, bytes] = {"__main__.py": (ROOT / "build" / "bootstrap.py").read_bytes()}
    files.update(agent_files(version))
    check_no_test_hooks(files)
    manifest: list[dict[str, object]] = []
    for wheel in read_lock():
        if wheel.native and wheel.arch not in arches:
            continue
        path = fetch(wheel)
        if not wheel.native:
            files.update(vendor_files(path))
            continue
        files["_native/" + path.name] = path.read_bytes()
        manifest.append({
            "file": path.name, "sha256": wheel.sha256, "arch": wheel.arch,
            "python": wheel.python, "abi3": "-abi3-" in path.name,
        })
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    build_id = digest.hexdigest()[:16]
    files["_native/MANIFEST.json"] = json.dumps(
        {"build_id": build_id, "wheels": sorted(manifest, key=lambda w: str(w["file"]))},
        indent=1, sort_keys=True,
    ).encode()

    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.external_attr = 0o644 << 16
            stored = name.endswith(".whl")
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name], compresslevel=None if stored else 9)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.chmod(0o755)
    tmp.replace(out)
    return build_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "agent.pyz")
    parser.add_argument("--arch", default="x86_64,aarch64",
                        help="native wheels to carry (comma-separated; default both)")
    parser.add_argument("--version", help="override the version inside the archive (tests)")
    args = parser.parse_args()
    build_id = build(args.out, set(args.arch.split(",")), args.version)
    size = args.out.stat().st_size
    print(f"{args.out}: {size} bytes ({size / 1048576:.1f} MiB), build id {build_id}")


if __name__ == "__main__":
    main()
