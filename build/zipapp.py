"""Build dist/agent.pyz: the agent, its pure-Python dependencies and native wheels, one file.

    python3 build/zipapp.py [--out dist/agent.pyz] [--arch x86_64,aarch64] [--version V]
                            [--without-gateway]

Each module carries its bytecode, compiled by the Python that builds (unchecked hash-based
.pyc, as initramfs/pyc.py adds for the ramdisk; ``--no-bytecode`` leaves it out).
Reproducible: entries sorted (each .pyc after its .py), fixed timestamps and modes, wheels pinned by sha256 in
build/wheels.lock (downloaded once into build/.wheels with pip). Two builds of the same tree
are byte-identical. ``--version`` overrides agent/version.py inside the archive only (the
upgrade tests build two versions from one tree). ``--without-gateway`` leaves out the
reference gateway (agent/gateway/), a test and demo tool: the ramdisk's agent is built so.
Prints the size and the build id.

Every wheel's licence files travel in the archive under ``_legal/licenses/NAME-VERSION/``
(deflated, like every entry but the stored wheels), with a CycloneDX SBOM of the archive,
``_legal/sbom.cdx.json``, also written beside it (OUT.cdx.json): every wheel with its version,
licence and sha256, and where its files are in the archive.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import io
import json
import subprocess
import sys
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # initramfs.pyc: the bytecode the ramdisk's builder adds too
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


# The reference gateway: a test and demo tool, left out by --without-gateway.
GATEWAY = "agent/gateway/"


def agent_files(version: str | None, gateway: bool = True) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted((ROOT / "agent").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        if not gateway and path.relative_to(ROOT).as_posix().startswith(GATEWAY):
            continue
        name = path.relative_to(ROOT).as_posix()
        data = path.read_bytes()
        if version is not None and name == "agent/version.py":
            data = data.replace(b'__version__ = "', b'__version__ = "' + version.encode() + b'"  # ', 1)
        files[name] = data
    for path in sorted((ROOT / "agent").rglob("*")):
        name = path.relative_to(ROOT).as_posix()
        if not gateway and name.startswith(GATEWAY):
            continue
        if path.is_file() and path.suffix in {".service", ".json"} and "__pycache__" not in path.parts:
            files[name] = path.read_bytes()
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


LEGAL = "_legal/"  # every wheel's licence files and the archive's SBOM: one place

# Licence files in a wheel's .dist-info (PEP 639 puts them under licenses/; older wheels
# beside METADATA), and the SBOMs some wheels carry of what they link in (cryptography's Rust).
LICENCE_NAMES = ("LICENSE", "LICENCE", "COPYING", "NOTICE", "AUTHORS")
# Wheels whose .dist-info has no licence file: the file whose leading comment is the notice.
NOTICE_IN_SOURCE = {"nvidia-ml-py": "pynvml.py"}


@dataclass(frozen=True)
class WheelLegal:
    """What a wheel says about itself: name, version, licence, and its licence files."""

    name: str
    version: str
    licence: dict[str, object]  # a CycloneDX licence choice
    files: dict[str, bytes]     # path under _legal/licenses/NAME-VERSION/ -> bytes

    @property
    def folder(self) -> str:
        return f"{LEGAL}licenses/{self.name}-{self.version}/"


def wheel_legal(wheel_path: Path) -> WheelLegal:
    with zipfile.ZipFile(wheel_path) as whl:
        names = whl.namelist()
        meta_name = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        dist_info = meta_name.removesuffix("METADATA")
        meta = email.parser.BytesHeaderParser().parsebytes(whl.read(meta_name))
        name, version = str(meta["Name"]).lower(), str(meta["Version"])
        files: dict[str, bytes] = {}
        for n in names:
            rel = n.removeprefix(dist_info)
            if not n.startswith(dist_info) or n.endswith("/"):
                continue
            base = rel.rsplit("/", 1)[-1].upper()
            if rel.startswith("sboms/"):  # of what this platform's build links in
                platform = wheel_path.stem.rsplit("-", 1)[-1]
                files[f"sboms/{platform}/{rel.removeprefix('sboms/')}"] = whl.read(n)
            elif rel.startswith("licenses/") or base.startswith(LICENCE_NAMES):
                files[rel.removeprefix("licenses/")] = whl.read(n)
        source = NOTICE_IN_SOURCE.get(name)
        if source is not None and not files:
            files[f"NOTICE-{source}.txt"] = _leading_comment(whl.read(source))
    if not files:
        sys.exit(f"build/zipapp.py: {wheel_path.name} carries no licence file; name the file that "
                 "holds its notice in NOTICE_IN_SOURCE")
    if meta["License-Expression"]:
        licence: dict[str, object] = {"expression": str(meta["License-Expression"])}
    else:
        licence = {"license": {"name": str(meta["License"] or "NOASSERTION")}}
    return WheelLegal(name, version, licence, files)


def _leading_comment(source: bytes) -> bytes:
    lines = []
    for line in source.splitlines(keepends=True):
        if not line.startswith(b"#"):
            break
        lines.append(line)
    return b"".join(lines)


def sbom(build_id: str, version: str, gateway: bool,
         wheels: list[tuple[Wheel, Path, WheelLegal]]) -> dict[str, object]:
    """A CycloneDX 1.5 document of the archive: the agent, and every wheel in it with its
    version, licence and sha256, and where its files are (vendored under _vendor/ or stored
    under _native/). Deterministic: no timestamp; the serial number comes from the build id."""
    components = []
    for wheel, path, legal in wheels:
        purl = f"pkg:pypi/{legal.name}@{legal.version}?file_name={path.name}"
        location = f"_native/{path.name}" if wheel.native else "_vendor/"
        components.append({
            "type": "library", "bom-ref": purl, "name": legal.name, "version": legal.version,
            "purl": purl, "hashes": [{"alg": "SHA-256", "content": wheel.sha256}],
            "licenses": [legal.licence],
            "properties": [
                {"name": "bettercompute:location", "value": location},
                {"name": "bettercompute:licence-files", "value": legal.folder},
                {"name": "bettercompute:wheel", "value": path.name},
            ],
        })
    return {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'bettercompute-agent/' + build_id)}",
        "metadata": {
            "component": {
                "type": "application", "bom-ref": "bettercompute-agent", "name": "bettercompute-agent",
                "version": version,
                "properties": [{"name": "bettercompute:build-id", "value": build_id},
                               {"name": "bettercompute:gateway", "value": "yes" if gateway else "no"}],
            },
        },
        "components": sorted(components, key=lambda c: str(c["bom-ref"])),
    }


def agent_version(files: dict[str, bytes]) -> str:
    for line in files["agent/version.py"].decode().splitlines():
        if line.startswith("__version__"):
            return line.split('"')[1]
    raise ValueError("agent/version.py has no __version__")


def build(out: Path, arches: set[str], version: str | None, gateway: bool = True,
          bytecode: bool = True) -> str:
    files: dict[str, bytes] = {"__main__.py": (ROOT / "build" / "bootstrap.py").read_bytes()}
    files.update(agent_files(version, gateway))
    check_no_test_hooks(files)
    manifest: list[dict[str, object]] = []
    carried: list[tuple[Wheel, Path, WheelLegal]] = []
    for wheel in read_lock():
        if wheel.native and wheel.arch not in arches:
            continue
        path = fetch(wheel)
        legal = wheel_legal(path)
        carried.append((wheel, path, legal))
        for rel, data in legal.files.items():
            if files.setdefault(legal.folder + rel, data) != data:
                sys.exit(f"build/zipapp.py: {path.name}: {rel} differs from another wheel's of "
                         f"{legal.name} {legal.version}")
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
    bom = json.dumps(sbom(build_id, agent_version(files), gateway, carried), indent=1,
                     sort_keys=True).encode() + b"\n"
    files[LEGAL + "sbom.cdx.json"] = bom

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
    if bytecode:
        # zipimport never writes a bytecode cache: without .pyc entries every start compiles
        # the agent from source (half of `agent exec`'s start-up; docs/performance.md). The
        # bytecode is this interpreter's; another version falls back to the source.
        from initramfs.pyc import add_bytecode

        source = tmp.with_suffix(".src")
        tmp.replace(source)
        try:
            add_bytecode(str(source), str(tmp))
        finally:
            source.unlink()
    tmp.chmod(0o755)
    tmp.replace(out)
    sbom_path(out).write_bytes(bom)
    return build_id


def sbom_path(artifact: Path) -> Path:
    """Where the SBOM of an artifact is written beside it: OUT.cdx.json."""
    return artifact.with_name(artifact.name + ".cdx.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "agent.pyz")
    parser.add_argument("--arch", default="x86_64,aarch64",
                        help="native wheels to carry (comma-separated; default both)")
    parser.add_argument("--version", help="override the version inside the archive (tests)")
    parser.add_argument("--without-gateway", action="store_true",
                        help="leave out the reference gateway (agent/gateway/; the ramdisk's agent)")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="no .pyc entries (by default each module's, compiled by this Python)")
    args = parser.parse_args()
    build_id = build(args.out, set(args.arch.split(",")), args.version, not args.without_gateway,
                     not args.no_bytecode)
    size = args.out.stat().st_size
    print(f"{args.out}: {size} bytes ({size / 1048576:.1f} MiB), build id {build_id}")


if __name__ == "__main__":
    main()
