"""Bodies sent once and streamed: a PUT, a multipart/form-data POST, a file POSTed whole. None
is retried (a stream cannot be replayed, a write is never sent twice): the caller decides
(agent/net/http.py is the front: ``http.put``, ``http.post_multipart``, ``http.Part``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agent.errors import Cancelled, InvalidParameters
from agent.net.connect import TRANSPORT_ERRORS, connect, tls_refused
from agent.net.exchange import (
    MAX_BODY,
    AmbiguousWrite,
    HttpError,
    HttpOptions,
    Response,
    read_body,
    request_headers,
)
from agent.net.urls import check_url, redact, target

log = logging.getLogger(__name__)


def put(
    url: str,
    source: bytes | BinaryIO | Iterable[bytes],
    opts: HttpOptions | None = None,
    *,
    length: int | None = None,
    content_type: str = "application/octet-stream",
) -> Response:
    """PUT ``source`` to ``url`` (streamed; chunked when the length is unknown). No retry:
    a stream cannot be replayed; the caller retries with a fresh source if it can."""
    opts = opts or HttpOptions()
    parts = check_url(url)
    extra = {"Content-Type": content_type}
    if isinstance(source, bytes | bytearray | memoryview):
        length = len(source)
    if length is not None:
        extra["Content-Length"] = str(length)
    else:
        extra["Transfer-Encoding"] = "chunked"
    body: object = source
    if not isinstance(source, bytes | bytearray | memoryview) and hasattr(source, "read"):
        reader = source

        def chunks() -> Iterator[bytes]:
            while data := reader.read(1 << 20):
                if opts.cancel is not None and opts.cancel.is_set():
                    raise Cancelled("upload cancelled")
                yield data

        body = chunks()
    conn = connect(parts, opts)
    try:
        conn.request(
            "PUT",
            target(parts),
            body=body,  # type: ignore[arg-type]  # an iterator of bytes: http.client streams it
            headers=request_headers(opts, extra),
            encode_chunked=length is None,
        )
        resp = conn.getresponse()
        data = resp.read(1 << 20)
    except TRANSPORT_ERRORS as exc:
        raise HttpError(f"PUT {redact(url)}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    if not 200 <= resp.status < 300:
        first = data.decode("utf-8", "replace").strip().splitlines()[:1]
        raise HttpError(
            f"PUT {redact(url)}: HTTP {resp.status} {resp.reason}" + (f": {first[0]}" if first else ""),
            status=resp.status,
        )
    return Response(resp.status, headers, data)


@dataclass(frozen=True)
class Part:
    """One part of a multipart/form-data body: ``data`` in memory or the file at ``path``."""

    name: str
    data: bytes = b""
    content_type: str = "application/octet-stream"
    path: Path | None = None
    filename: str = ""


def _part_head(boundary: str, part: Part) -> bytes:
    for text in (part.name, part.filename, part.content_type):
        if any(c in text for c in '\r\n"'):
            raise InvalidParameters(f"multipart: bad character in part {part.name!r}")
    disposition = f'form-data; name="{part.name}"'
    filename = part.filename or (part.path.name if part.path is not None else "")
    if filename:
        if any(c in filename for c in '\r\n"'):
            raise InvalidParameters("multipart: bad character in a file name")
        disposition += f'; filename="{filename}"'
    return (
        f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        f"Content-Type: {part.content_type}\r\n\r\n"
    ).encode()


def post_multipart(url: str, parts: Iterable[Part], opts: HttpOptions | None = None, *,
                   max_body: int = MAX_BODY) -> Response:
    """POST a multipart/form-data body, files streamed from disk in 1 MiB chunks (the length is
    computed first, so no chunked encoding: BMCs rarely accept it). Returns the Response
    whatever its status; a transport failure raises HttpError (AmbiguousWrite once the
    connection was made: the server may have taken it), an answer longer than ``max_body``
    BodyTooLarge. No retry: the caller decides."""
    opts = opts or HttpOptions()
    check_url(url)
    boundary = f"bettercompute-{uuid.uuid4().hex}"
    pieces: list[tuple[bytes, Part]] = [(_part_head(boundary, p), p) for p in parts]
    tail = f"--{boundary}--\r\n".encode()
    length = len(tail)
    for head, part in pieces:
        try:
            size = part.path.stat().st_size if part.path is not None else len(part.data)
        except OSError as exc:
            raise InvalidParameters(f"multipart: cannot read {part.path}: {exc.strerror}") from exc
        length += len(head) + size + 2

    def stream() -> Iterator[bytes]:
        for head, part in pieces:
            yield head
            if part.path is None:
                yield part.data
            else:
                with part.path.open("rb") as f:
                    while data := f.read(1 << 20):
                        if opts.cancel is not None and opts.cancel.is_set():
                            raise Cancelled("upload cancelled")
                        yield data
            yield b"\r\n"
        yield tail

    return _post_stream(url, stream(), length, f"multipart/form-data; boundary={boundary}", opts, max_body)


def post_file(url: str, path: Path, opts: HttpOptions | None = None, *,
              content_type: str = "application/octet-stream", max_body: int = MAX_BODY) -> Response:
    """POST the file at ``path`` as the whole body (a Redfish HttpPushUri push), streamed in
    1 MiB chunks with its length; as ``post_multipart`` otherwise (no retry, AmbiguousWrite
    once the connection was made)."""
    opts = opts or HttpOptions()
    try:
        length = path.stat().st_size
    except OSError as exc:
        raise InvalidParameters(f"POST: cannot read {path}: {exc.strerror}") from exc

    def stream() -> Iterator[bytes]:
        with path.open("rb") as f:
            while data := f.read(1 << 20):
                if opts.cancel is not None and opts.cancel.is_set():
                    raise Cancelled("upload cancelled")
                yield data

    return _post_stream(url, stream(), length, content_type, opts, max_body)


def _post_stream(url: str, body: Iterator[bytes], length: int, content_type: str, opts: HttpOptions,
                 max_body: int) -> Response:
    """POST ``body`` (``length`` bytes) once: post_multipart's and post_file's one transport."""
    to = check_url(url)
    hdrs = request_headers(opts, {
        "Content-Type": content_type,
        "Content-Length": str(length),
        "Accept": "application/json",
    })
    where = f"POST {redact(url)}"
    conn = connect(to, opts)
    sent = False
    try:
        conn.connect()
        sent = True
        conn.request("POST", target(to), body=body, headers=hdrs)
        resp = conn.getresponse()
        data = read_body(resp, max_body, where)
    except TRANSPORT_ERRORS as exc:
        tls = "untrusted" if tls_refused(exc) else ""
        if sent and not tls:
            raise AmbiguousWrite(f"{where}: {type(exc).__name__}: {exc} (after the request was "
                                 "sent; not repeated)") from exc
        raise HttpError(f"{where}: {type(exc).__name__}: {exc}", tls=tls) from exc
    finally:
        conn.close()
    log.debug("%s: HTTP %d, %d bytes sent", where, resp.status, length)
    return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
