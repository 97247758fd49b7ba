"""What the bulk-lane commands (logs.collect, instance.snapshot) share.

- ``confine``: a path from the wire, resolved (symlinks followed) and refused unless the
  result stays inside one of the allowed directories.
- ``TokenBucket`` / ``throttled``: bounded bandwidth, so the bulk lane does not starve the
  node's other traffic (progress: a ``ctx.meter`` fed from ``on_chunk``).
- ``upload``: an HTTP(S) PUT through agent.net.http with the request's headers and CA, the
  agent's own CA bundle, the command's cancel event, and digest headers when the digest is
  known before the body is sent.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from agent.commands.base import Context
from agent.errors import InvalidParameters
from agent.net import http

# Largest burst a bucket allows, in seconds of its rate.
BURST_SECONDS = 0.25


def within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def confine(raw: str, roots: Sequence[Path], what: str = "path") -> Path:
    """``raw`` resolved, if it is absolute and its real path lies inside one of ``roots``.

    The roots are resolved too (so /var/run -> /run works). Raises InvalidParameters saying
    which rule it broke; never touches anything outside the roots.
    """
    if not raw or "\x00" in raw:
        raise InvalidParameters(f"{what} is empty or contains a NUL byte")
    if not os.path.isabs(raw):
        raise InvalidParameters(f"{what} {raw!r} must be absolute")
    real = Path(os.path.realpath(raw))
    for root in roots:
        if within(real, Path(os.path.realpath(root))):
            return real
    shown = f"{raw!r}" if str(real) == os.path.normpath(raw) else f"{raw!r} (resolves to {str(real)!r})"
    raise InvalidParameters(
        f"{what} {shown} is outside the allowed directories ({', '.join(str(r) for r in roots)})",
        path=raw,
    )


class TokenBucket:
    """At most ``rate`` bytes per second on average, with a burst of ``BURST_SECONDS``."""

    def __init__(self, rate: int) -> None:
        self.rate = max(1, rate)
        self.capacity = max(1 << 16, int(self.rate * BURST_SECONDS))
        self.tokens = float(self.capacity)
        self.stamp = time.monotonic()

    def delay(self, n: int) -> float:
        """Take ``n`` tokens (going into debt if needed); seconds to wait before sending."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def throttled(
    ctx: Context,
    chunks: Iterable[bytes],
    rate: int,
    *,
    on_chunk: Callable[[bytes], None] | None = None,
) -> Iterator[bytes]:
    """``chunks`` paced by a token bucket; checks cancel and deadline between chunks.

    ``on_chunk`` sees each chunk before it goes (to hash it, to update a ``ctx.meter``).
    """
    bucket = TokenBucket(rate)
    for chunk in chunks:
        ctx.check()
        wait = bucket.delay(len(chunk))
        if wait > 0:
            ctx.sleep(wait)
        if on_chunk is not None:
            on_chunk(chunk)
        yield chunk


def digest_headers(sha256: bytes) -> dict[str, str]:
    """RFC 3230 ``Digest`` plus the hex form many object stores read."""
    return {
        "Digest": "sha-256=" + base64.b64encode(sha256).decode(),
        "X-Content-SHA256": sha256.hex(),
    }


def upload(
    ctx: Context,
    url: str,
    body: bytes | BinaryIO | Iterable[bytes],
    *,
    headers: Mapping[str, str],
    ca_pem: str,
    length: int | None = None,
    sha256: bytes | None = None,
    content_type: str = "application/octet-stream",
) -> http.Response:
    """PUT ``body`` to ``url``; with ``sha256`` the digest travels in the headers."""
    merged = dict(headers)
    if sha256 is not None:
        merged.update(digest_headers(sha256))
    opts = http.HttpOptions(
        ca_pem=ca_pem,
        ca_file=ctx.config.ca_bundle,
        headers=merged,
        timeout=min(60.0, max(1.0, ctx.remaining())),
        cancel=ctx.cancel_event,
    )
    ctx.log.info("uploading to %s", http.redact(url))
    return http.put(url, body, opts, length=length, content_type=content_type)


def check_upload_request(url: str, headers: Mapping[str, str]) -> None:
    """Validate an upload URL and its extra headers before any work (InvalidParameters)."""
    http.check_url(url)
    for name, value in headers.items():
        if not name or any(c in name for c in "\r\n: ") or any(c in value for c in "\r\n"):
            raise InvalidParameters(f"HTTP header {name!r} is not a valid header")
