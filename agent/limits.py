"""Bounds on what the agent reads from outside, in one place.

Every text the agent parses has a size limit, and JSON a nesting limit as well: a payload,
a config file, a signed-command file or a kernel command line over its limit is refused with
InvalidParameters (``invalid_parameters`` on the wire, exit 2 for ``agent exec``), never an
internal error (RecursionError, MemoryError).

``loads_json`` is the one reader of JSON that came from the wire or from a file someone else
controls (a registry's manifest or token answer, an image layout's index.json, a BMC's answer,
a payload): its refusals are the caller's own error (``error``: a RegistryError for a
registry), so a hostile document is named as that source's bad input.
tests/test_json_readers.py keeps every other ``json.loads`` in agent/ to an allow-list of
readers of the agent's own files and its own tools' output, each with its reason.

Protobuf input needs no limit of its own here: frames are bounded by wire.MAX_FRAME_BYTES, and
both protobuf implementations refuse nesting deeper than 100 with a DecodeError, which the
callers already turn into a refusal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import AgentError, InvalidParameters

MAX_JSON_BYTES = 4 * 1024 * 1024       # a command payload in JSON: as large as a frame
MAX_JSON_DEPTH = 32                    # objects and arrays inside each other; payloads use < 8
MAX_CONFIG_BYTES = 1024 * 1024         # a --config file, a --signed-command file
MAX_CMDLINE_BYTES = 64 * 1024          # the kernel allows 2-4 KiB; a --cmdline-file a little more


def is_digits(text: str) -> bool:
    """``text`` is a whole number in ASCII digits. ``str.isdigit`` alone also takes "²" or "①"
    (which ``int`` then refuses with a ValueError) and other scripts' digits: never for input."""
    return text.isascii() and text.isdigit()


def read_bounded(path: Path, *, what: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, refused when there are more than ``max_bytes``."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidParameters(f"{what} {path}: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        raise InvalidParameters(f"{what} {path} is over its limit of {max_bytes} bytes", limit=max_bytes)
    return data


def depth(value: Any) -> int:
    """How deeply objects and arrays nest in a parsed JSON value (a scalar is 0); iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        stack.extend((child, level) for child in children)
    return deepest


def loads_json(
    text: str | bytes,
    *,
    what: str,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    error: Callable[..., AgentError] = InvalidParameters,
) -> Any:
    """Parse JSON text, refusing what is too large, too deep or not JSON with ``error`` (called
    with the message and a ``limit`` detail where a bound was passed; InvalidParameters by
    default, the caller's bad-input error for what came from a source it does not trust)."""
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > max_bytes:
        raise error(f"{what}: {size} bytes of JSON, over the limit of {max_bytes}", limit=max_bytes)
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what}: JSON nested deeper than {max_depth} levels", limit=max_depth) from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise error(f"{what}: not JSON ({str(exc)[:200]})") from exc
    if depth(value) > max_depth:
        raise error(f"{what}: JSON nested deeper than {max_depth} levels", limit=max_depth)
    return value
