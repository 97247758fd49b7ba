"""Making a connection: the TLS context, connections pinned to addresses checked before they
were dialled, and whether an idle connection is still open.

    ssl_context(ca_pem="", ca_file=None, verify=True)   # the TLS context every connection uses
    connect(parts, opts)                     # a connection to the URL's host (not yet dialled)
    pinned(parts, addresses, timeout, context)   # one that dials only ``addresses``
    server_context(cert, key)                # the context of a TLS listener (the site's https)
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import select
import socket
import ssl
import urllib.parse
from pathlib import Path

from agent.errors import InvalidParameters
from agent.net.exchange import HttpOptions

# What a connection can fail with, from the dial to the answer's last byte.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ssl.SSLError)


def ssl_context(ca_pem: str = "", ca_file: Path | None = None, *, verify: bool = True) -> ssl.SSLContext:
    """System trust store plus the given CAs; certificate and host name verified unless
    ``verify`` is False (then nothing is checked: the caller asked for it by name).

    One context per set of arguments (and CA file as it is on disk), made once and shared:
    making one reads the system's trust store, about 20 ms of CPU, which every request to a
    BMC paid before (bench/site_fleet.py)."""
    stamp = 0
    if ca_file is not None:
        with contextlib.suppress(OSError):
            stamp = ca_file.stat().st_mtime_ns
    return _context(ca_pem, ca_file, stamp, verify)


@functools.lru_cache(maxsize=32)
def _context(ca_pem: str, ca_file: Path | None, stamp: int, verify: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        if ca_file is not None:
            ctx.load_verify_locations(cafile=str(ca_file))
        if ca_pem.strip():
            ctx.load_verify_locations(cadata=ca_pem)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InvalidParameters(f"CA bundle is not usable: {exc}") from exc
    return ctx


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The context of a TLS listener: ``cert`` (PEM, the chain) and its ``key``, TLS 1.2 at
    least (a BMC's media client may not speak 1.3), no client certificate asked for.
    InvalidParameters when the files cannot be used, naming them, never their content."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc.__class__.__name__
        raise InvalidParameters(f"TLS certificate {cert} with key {key} is not usable: {why}") from None
    return ctx


def tls_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a server certificate that did not verify (never worth a retry)."""
    return isinstance(exc, ssl.SSLCertVerificationError) or (
        isinstance(exc, ssl.SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(exc)
    )


class PinnedConnection(http.client.HTTPConnection):
    """A connection to ``addresses``, checked before it was made, not to what the host name
    resolves to when http.client looks it up again (a name that resolves elsewhere a moment
    after the check gains nothing)."""

    addresses: tuple[str, ...] = ()

    def connect(self) -> None:
        error: OSError | None = None
        for address in self.addresses:
            try:
                self.sock = socket.create_connection((address, self.port), self.timeout)
            except OSError as exc:
                error = exc
                continue
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return
        raise error or OSError("no address to connect to")


class PinnedTLSConnection(http.client.HTTPSConnection, PinnedConnection):
    """The same over TLS: the certificate is checked against the URL's host name."""


def pinned(parts: urllib.parse.SplitResult, addresses: tuple[str, ...], timeout: float | None,
           context: ssl.SSLContext | None, port: int | None = None) -> PinnedConnection:
    """A connection to the host of ``parts`` that dials ``addresses`` only (the caller checked
    them), on ``port`` (the URL's by default); over TLS with ``context`` for https."""
    host, port = parts.hostname or "", parts.port if port is None else port
    conn = (PinnedTLSConnection(host, port, timeout=timeout, context=context)
            if parts.scheme == "https" else PinnedConnection(host, port, timeout=timeout))
    conn.addresses = addresses
    return conn


def connect(
    parts: urllib.parse.SplitResult, opts: HttpOptions, timeout: float | None = None, *,
    context: ssl.SSLContext | None = None,
) -> http.client.HTTPConnection:
    """A connection to the host of ``parts`` under ``opts`` (its TLS trust, its ``resolve``
    policy: then pinned to the addresses it allows), dialled on first use."""
    host = parts.hostname or ""
    timeout = opts.timeout if timeout is None else timeout
    tls = parts.scheme == "https"
    if tls:
        context = context or ssl_context(opts.ca_pem, opts.ca_file, verify=opts.verify)
    if opts.resolve is not None:
        return pinned(parts, tuple(opts.resolve(host, parts.port or (443 if tls else 80))),
                      timeout, context)
    if tls:
        return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=context)
    return http.client.HTTPConnection(host, parts.port, timeout=timeout)


def still_open(conn: http.client.HTTPConnection) -> bool:
    """True when an idle connection's socket has nothing to read: the server has not closed
    it (a FIN reads as readable) and sent nothing unasked. poll(2), not select: a site daemon's
    descriptors go past select's 1024."""
    sock = conn.sock
    if sock is None:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def close_quietly(conn: http.client.HTTPConnection) -> None:
    with contextlib.suppress(OSError):
        conn.close()
