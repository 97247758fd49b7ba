"""What marks a secret in free text, whoever writes it down: one place for the patterns.

logs.collect's archive (agent/commands/bulk/logs.py, with the agent's own secrets besides) and the
site's kept consoles (agent/site/observe/console.py: a node's kernel prints its command line,
``bc.token=...`` included) replace what these match before it is kept anywhere.
"""

from __future__ import annotations

import re

# (pattern, replacement) on bytes: a private key block, a secret-looking bc.* setting's value
# (bc.token=, bc.*secret=, ...: as a kernel command line or a config echo shows it), an
# Authorization header's value.
PATTERNS: tuple[tuple[re.Pattern[bytes], bytes], ...] = (
    (re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.S),
     b"[REDACTED PRIVATE KEY]"),
    (re.compile(rb"(\bbc\.[\w.]*(?:token|secret|password|passwd|key)\w*=)[^\s\"']+", re.I),
     rb"\1[REDACTED]"),
    (re.compile(rb"(\bauthorization\s*[:=]\s*)(?:\"[^\"\r\n]*\"|[^\r\n,}]+)", re.I), rb"\1[REDACTED]"),
)  # fmt: skip


def scrub(data: bytes) -> bytes:
    """``data`` with what PATTERNS match replaced."""
    for pattern, replacement in PATTERNS:
        data = pattern.sub(replacement, data)
    return data


def scrub_text(text: str) -> str:
    return scrub(text.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")
