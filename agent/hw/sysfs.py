"""Reading sysfs and procfs attributes: one small place for "the file's text, or a default"."""

from __future__ import annotations

from pathlib import Path


def read(path: Path, default: str = "") -> str:
    """The attribute's text, stripped; ``default`` when it cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return default


def read_int(path: Path, default: int = 0) -> int:
    """The attribute as an integer, decimal or "0x10de"; ``default`` when absent or not a number."""
    try:
        return int(read(path), 0)
    except ValueError:
        return default
