"""The zipapp's __main__: make the bundled dependencies importable, then run the agent.

Pure-Python dependencies are imported from the archive itself (``_vendor/``). Native ones
(cryptography and cffi, and protobuf's native build, upb, which builds the descriptors in C
where the pure one of ``_vendor/`` spends most of a start) cannot be imported from a zip:
their wheels travel stored in ``_native/`` and are unpacked once, hashes checked, into a
cache directory keyed by the build id (a root-owned 0700 directory on tmpfs when run as
root), under a file lock, into a temporary sibling that is renamed into place. Where no
wheel fits this machine, the agent falls back to what the system has (and the archive's
pure protobuf); a module that is still missing is reported in one line by agent.deps where
it is needed.

Standard library only, and nothing here may fail loudly: at worst the cache is skipped. And
nothing is imported that a start does not need: an archive without native wheels (the
ramdisk's, which uses the system's) is read through zipimport, already loaded, because
zipfile and its company cost over a second of a start under emulation.
"""

import os
import sys

if False:  # for the type checker only: a start imports nothing it does not need
    import zipfile

ARCHIVE = os.path.dirname(os.path.abspath(__file__))


def _cache_root() -> str:
    env = os.environ.get("BC_AGENT_CACHE")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/bettercompute-agent/cache"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bettercompute-agent")


def _fits(wheel: "dict[str, object]") -> bool:
    if wheel["arch"] != os.uname().machine:
        return False
    py = "{}.{}".format(*sys.version_info[:2])
    # abi3 wheels work on their minimum Python and later; others need an exact match.
    if wheel["abi3"]:
        return tuple(map(int, py.split("."))) >= tuple(map(int, str(wheel["python"]).split(".")))
    return py == wheel["python"]


def _unpack(
    zf: "zipfile.ZipFile", manifest: "dict[str, object]", wheels: "list[dict[str, object]]", target: str
) -> None:
    import compileall
    import fcntl
    import hashlib
    import py_compile
    import shutil
    import tempfile
    import zipfile

    parent = os.path.dirname(target)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    for path in (os.path.dirname(parent), parent):
        os.chmod(path, 0o700)
    with open(os.path.join(parent, ".lock"), "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(target, ".complete")):
            return
        tmp = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
        try:
            for wheel in wheels:
                data = zf.read("_native/" + str(wheel["file"]))
                if hashlib.sha256(data).hexdigest() != wheel["sha256"]:
                    raise OSError("hash mismatch for bundled " + str(wheel["file"]))
                path = os.path.join(tmp, ".whl")
                with open(path, "wb") as f:
                    f.write(data)
                with zipfile.ZipFile(path) as whl:
                    whl.extractall(tmp)
                os.unlink(path)
            if os.path.isdir(os.path.join(tmp, "google")):
                # protobuf's native build: a regular package here (the archive's own
                # __init__), so that it comes before the pure one of _vendor/ and is imported.
                with open(os.path.join(tmp, "google", "__init__.py"), "wb") as f:
                    f.write(zf.read("_vendor/google/__init__.py"))
            # The wheels' modules compiled once, here: a start must not compile them (about
            # 0.1 s of protobuf's), and under PYTHONDONTWRITEBYTECODE (the service sets it) no
            # import would ever write their bytecode. Unchecked, as the archive's own: nothing
            # changes them after the rename below.
            compileall.compile_dir(tmp, quiet=2, workers=1, invalidation_mode=(
                py_compile.PycInvalidationMode.UNCHECKED_HASH))
            with open(os.path.join(tmp, ".complete"), "w") as f:
                f.write(str(manifest["build_id"]) + "\n")
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _native_path() -> "str | None":
    try:
        data = __loader__.get_data(os.path.join(ARCHIVE, "_native", "MANIFEST.json"))  # type: ignore[name-defined]  # zipimport's, for __main__
    except (OSError, AttributeError):
        return None  # no native wheels in this archive: the system's are used
    import json

    try:
        manifest = json.loads(data)
        wheels = [w for w in manifest["wheels"] if _fits(w)]
        if not wheels:
            return None
        tag = "{}-py{}{}".format(os.uname().machine, *sys.version_info[:2])
        target = os.path.join(_cache_root(), manifest["build_id"], tag)
        if not os.path.isfile(os.path.join(target, ".complete")):
            import zipfile

            try:
                with zipfile.ZipFile(ARCHIVE) as zf:
                    _unpack(zf, manifest, wheels, target)
            except zipfile.BadZipFile as exc:
                raise OSError(f"bad archive: {exc}") from exc
        return target
    except (OSError, KeyError, ValueError) as exc:
        sys.stderr.write(f"agent: bundled native dependencies not usable ({exc}); using the system's\n")
        return None


def main() -> None:
    sys.path.insert(1, os.path.join(ARCHIVE, "_vendor"))
    native = _native_path()
    if native:
        sys.path.insert(1, native)
    import agent.version

    agent.version.ARCHIVE = ARCHIVE  # the running zipapp, for self-upgrade
    from agent.cli import main as agent_main

    sys.exit(agent_main())


main()
