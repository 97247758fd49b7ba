"""What a URL is to the HTTP client: checked before use, logged without its secrets, and
reduced to its origin (where a connection may be kept and a caller's headers may go)."""

from __future__ import annotations

import re
import urllib.parse

from agent.errors import InvalidParameters

Origin = tuple[str, str, int]   # scheme, host (lower case), port

_UNSAFE_IN_URL = re.compile(r"[\x00-\x20\x7f]")


def redact(url: str) -> str:
    """The URL as it may be logged: no user info, no query string."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def check_url(url: str) -> urllib.parse.SplitResult:
    """Parse and validate an http(s) URL from the wire; InvalidParameters otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise InvalidParameters(f"bad URL {redact(url)!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidParameters(f"URL scheme must be http or https, not {parts.scheme!r}")
    if not parts.hostname:
        raise InvalidParameters(f"URL has no host: {redact(url)!r}")
    if _UNSAFE_IN_URL.search(url):
        raise InvalidParameters("URL contains whitespace or control characters")
    if not url.isascii():
        raise InvalidParameters(f"URL {redact(url).encode('ascii', 'backslashreplace').decode()!r} "
                                "is not ASCII: percent-encode its other characters")
    return parts


def origin(url: str | urllib.parse.SplitResult) -> Origin:
    """A URL's origin: scheme, host (lower case) and port (the scheme's default if none)."""
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def target(parts: urllib.parse.SplitResult) -> str:
    """The request target of ``parts``: its path (``/`` if none) and query."""
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path
