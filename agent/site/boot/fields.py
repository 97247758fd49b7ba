"""What the site's boot service and routes take from a request: MACs, node ids, TTLs, URLs
that can stand in an iPXE script, kernel command lines and file digests. One place for each
check, shared by the PXE entries (pxe.py), the media sets (vmedia.py) and the routes
(agent/site/serve/routes.py).
"""

from __future__ import annotations

import re

from agent.errors import InvalidParameters
from agent.net import http
from agent.proto import common_pb2

DEFAULT_TTL_SECONDS = 3600
MAX_TTL_SECONDS = 7 * 24 * 3600
MAX_CMDLINE = 2048

_MAC = re.compile(r"[0-9a-f]{2}([:-])[0-9a-f]{2}(\1[0-9a-f]{2}){4}")
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")   # each used with fullmatch
# What may stand in an iPXE script line unquoted: no whitespace or control characters, no "$"
# (iPXE expands ${...}), no quotes or backslash, no "|" or "&&" (iPXE's command separators).
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!&()*+,;=%]+")
CMDLINE_CHARS = re.compile(r"[A-Za-z0-9 ._,:=/+@%~\-]*")


def parse_mac(text: str) -> str:
    """A unicast Ethernet MAC, "aa:bb:cc:dd:ee:ff" (colons or hyphens) -> lower case, colons."""
    mac = text.strip().lower()
    if not _MAC.fullmatch(mac):
        raise InvalidParameters(f"malformed MAC address {text[:40]!r}: expected aa:bb:cc:dd:ee:ff")
    mac = mac.replace("-", ":")
    if int(mac[:2], 16) & 1:
        raise InvalidParameters(f"MAC address {mac} is a multicast address, not a NIC's")
    return mac


def parse_node_id(text: str) -> str:
    if not _NODE_ID.fullmatch(text):
        raise InvalidParameters(
            f"node_id {text[:40]!r}: 1-128 characters of letters, digits and . _ : @ -"
        )
    return text


def script_safe_url(url: str, field: str) -> str:
    """An http(s) URL that can stand in an iPXE script line without changing its meaning."""
    try:
        http.check_url(url)
    except InvalidParameters as exc:
        raise InvalidParameters(f"{field}: {exc.message}") from exc
    if not _URL_CHARS.fullmatch(url) or "&&" in url:
        raise InvalidParameters(
            f"{field}: characters that would break the iPXE script (whitespace, quotes, $, |, "
            "&&, backslash): percent-encode them"
        )
    return url


def parse_ttl(seconds: int, field: str = "ttl_seconds") -> int:
    if seconds == 0:
        return DEFAULT_TTL_SECONDS
    if not 0 < seconds <= MAX_TTL_SECONDS:
        raise InvalidParameters(f"{field} {seconds}: at most {MAX_TTL_SECONDS} (7 days)")
    return seconds


def parse_file_digest(msg: common_pb2.Digest, field: str) -> str:
    """A kernel's, an initrd's or a media ISO's sha256 (what names it in the store)."""
    from agent.images.image import Digest

    if not msg.hex:
        raise InvalidParameters(f"{field}: required with its URL (the sha256 of the file)")
    if (msg.algorithm or "sha256") != "sha256":
        raise InvalidParameters(f"{field}: sha256 (the site's store is keyed by sha256), "
                                f"not {msg.algorithm[:20]!r}")
    return Digest.from_proto(msg, field).hex
