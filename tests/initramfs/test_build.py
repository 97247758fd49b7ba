"""The ramdisk builder's own checks, on small trees built here."""

from __future__ import annotations

import py_compile
from pathlib import Path

from initramfs.build import checked_bytecode


def test_only_unchecked_hash_bytecode_passes(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/python3.11"
    (lib / "json").mkdir(parents=True)
    for name in ("stamped.py", "checked.py", "kept.py", "json/decoder.py"):
        (lib / name).write_text("X = 1\n")
    mode = py_compile.PycInvalidationMode
    py_compile.compile(str(lib / "stamped.py"), invalidation_mode=mode.TIMESTAMP)
    py_compile.compile(str(lib / "checked.py"), invalidation_mode=mode.CHECKED_HASH)
    py_compile.compile(str(lib / "kept.py"), invalidation_mode=mode.UNCHECKED_HASH)
    py_compile.compile(str(lib / "json/decoder.py"), invalidation_mode=mode.TIMESTAMP)
    stale = checked_bytecode(tmp_path)
    assert [Path(p).name.split(".")[0] for p in stale] == ["checked", "stamped", "decoder"]
    assert all(p.startswith("usr/lib/python3.11/") for p in stale)
