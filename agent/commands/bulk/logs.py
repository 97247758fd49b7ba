"""logs.collect: the agent's logs, the kernel log, the system journal and named files, as one
compressed tar with a manifest, uploaded by HTTP PUT (with its digest) or returned inline.

What goes in, in this order (the size budget is spent first come, first served):

1. ``agent/``: the agent's log file (``Config.log_file``) and the log and journal files in
   ``Config.state_dir`` (names ``*.log``, ``*.log.N``, ``journal*``; never key files).
2. ``kernel/kmsg.txt``: the kernel ring buffer, read from /dev/kmsg without blocking (or
   ``dmesg`` where /dev/kmsg cannot be read), when ``include_kernel_log``.
3. ``journal/system.txt``: ``journalctl`` output for the last ``since_seconds``, when
   ``include_system_journal`` and journalctl is there.
4. ``files/<path>``: the files the request names, and the files under the directories it
   names. Each path must resolve (symlinks followed) inside ``Config.logs_allow``; a named
   path outside it refuses the whole request; a file found under a named directory whose link
   leads outside is skipped and listed in ``skipped``. Files are opened with O_NOFOLLOW and
   the opened descriptor is checked again, so a link swapped in meanwhile is not followed.

Every file keeps at most ``max_file_bytes`` (its tail: the newest lines) and the archive at
most ``max_bytes``. Secrets of the agent's own configuration (enrollment token, key
material, ``bc.*token=`` on a command line, Authorization headers, secret-looking ``bc.*``
settings) are replaced before anything enters the archive; the manifest says which entries
were redacted or truncated. ``manifest.json`` is the archive's last member (the tar is
written as a stream).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agent import redact
from agent.commands.base import Context, Handler
from agent.commands.bulk import transfer
from agent.config import Config
from agent.errors import AgentError, InvalidParameters, Reason
from agent.hw.kernellog import read_kmsg
from agent.net import http
from agent.proto import agent_pb2, common_pb2

MiB = 1024 * 1024
DEFAULT_MAX_BYTES = 64 * MiB
DEFAULT_MAX_FILE_BYTES = 8 * MiB
LIMIT_MAX_BYTES = 1024 * MiB
MIN_MAX_BYTES = 1 * MiB
INLINE_MAX_BYTES = 2 * MiB                  # the result must fit a 4 MiB session frame (agent.link.wire)
DEFAULT_SINCE_SECONDS = 24 * 3600
MAX_FILES = 5000                            # per named directory, and members in the whole archive
MAX_PATHS = 64                              # named paths in one request
MAX_PATH_BYTES = 4096                       # PATH_MAX
MAX_SKIPPED = 200                           # reasons listed in the manifest and result; the rest counted
TAR_OVERHEAD = 1536                         # header blocks and padding per member, roughly
MANIFEST_ENTRY_BYTES = 256                  # a manifest entry beside its name and source
AGENT_FILE = re.compile(r"(.*\.log(\.\d+)?|journal.*)")
# A deny list, used with fullmatch: a key suffix followed by nothing but whitespace (a newline
# included) still names a key file.
SECRET_FILE = re.compile(r"(?s).*\.(key|p12|pfx)\s*|node\.key\s*")


@dataclass(frozen=True)
class LogsParams:
    paths: tuple[str, ...]
    url: str
    max_bytes: int
    max_file_bytes: int
    kernel: bool
    journal: bool
    since_seconds: int
    headers: tuple[tuple[str, str], ...]
    ca_pem: str
    node_ids: tuple[str, ...] = ()    # role site: these nodes' consoles and timelines
    since: float = 0.0                # their consoles' lines from, until (0: unbounded)
    until: float = 0.0
    last_lines: int = 0                 # only their last lines there (0: all)


# ------------------------------------------------------------------------ redaction


class Redactor:
    """Replaces the secrets of the agent's own configuration in a byte string."""

    MARK = b"[REDACTED]"
    PATTERNS = redact.PATTERNS
    SECRET_SETTING = re.compile(r"token|secret|password|passwd|key", re.I)

    def __init__(self, config: Config) -> None:
        literals: set[bytes] = set()
        if config.enrollment_token:
            literals.add(config.enrollment_token.encode())
        for name, value in config.extra.items():
            if self.SECRET_SETTING.search(name) and value:
                literals.add(value.encode())
        for key in (config.client_key, config.state_dir / "node.key"):
            literals.update(self._key_lines(key))
        # Longest first, so a secret that contains another is replaced whole; short values
        # (under 6 bytes) would redact ordinary words and are left to the patterns.
        self.literals = sorted((s for s in literals if len(s) >= 6), key=len, reverse=True)

    @staticmethod
    def _key_lines(path: Path | None) -> set[bytes]:
        if path is None:
            return set()
        try:
            text = path.read_bytes()
        except OSError:
            return set()
        lines = (line.strip() for line in text.splitlines())
        return {line for line in lines if len(line) >= 16 and b"-----" not in line}

    def __call__(self, data: bytes) -> tuple[bytes, bool]:
        out = data
        for literal in self.literals:
            out = out.replace(literal, self.MARK)
        for pattern, replacement in self.PATTERNS:
            out = pattern.sub(replacement, out)
        return out, out != data


# -------------------------------------------------------------------------- archive


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to ``out``."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]  # the tar writer passes bytes only
        self.out.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)


class Archive:
    """A streamed tar.gz with a budget and a manifest (written last, as manifest.json)."""

    def __init__(self, out: BinaryIO, max_bytes: int, redact: Redactor) -> None:
        self.sink = _HashingWriter(out)
        self.tar = tarfile.open(fileobj=self.sink, mode="w|gz", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        # Room kept for the manifest and for gzip's worst case on incompressible data.
        self.budget = max_bytes - max_bytes // 100 - 256 * 1024
        self.redact = redact
        self.entries: list[agent_pb2.ManifestEntry] = []
        self.skipped: list[str] = []
        self.more_skipped = 0                # beyond MAX_SKIPPED: counted, not listed
        self.names: set[str] = set()

    def room(self, name: str = "", source: str = "") -> int:
        """Bytes of data that still fit for a member of this name and source."""
        return self.budget - self.cost(name, source)

    def skip(self, why: str) -> None:
        """Say what was left out and why; beyond MAX_SKIPPED lines only a count is kept, so
        the manifest and the result stay bounded however many files a request reaches."""
        if len(self.skipped) < MAX_SKIPPED:
            self.skipped.append(why[:MAX_PATH_BYTES + 200])
        else:
            self.more_skipped += 1

    @staticmethod
    def cost(name: str, source: str) -> int:
        """What a member costs beside its data: tar headers (a PAX header holds a long name)
        and its manifest entry (name and source again)."""
        return TAR_OVERHEAD + MANIFEST_ENTRY_BYTES + 2 * len(name.encode()) + 2 * len(source.encode())

    def add(self, name: str, source: str, data: bytes, *, truncated: bool, mtime: float) -> None:
        data, redacted = self.redact(data)
        if len(self.entries) >= MAX_FILES:
            self.skip(f"{source}: more than {MAX_FILES} files in the archive")
            return
        if len(data) + self.cost(name, source) > self.budget:
            self.skip(f"{source}: archive size cap reached")
            return
        base, n = name, 1
        while name in self.names:
            n += 1
            name = f"{base}.{n}"
        self.names.add(name)
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
        info.uname = info.gname = "root"
        self.tar.addfile(info, io.BytesIO(data))
        self.budget -= len(data) + self.cost(name, source)
        self.entries.append(
            agent_pb2.ManifestEntry(
                name=name,
                source=source,
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                truncated=truncated,
                redacted=redacted,
            )
        )

    def close(self) -> None:
        if self.more_skipped:
            self.skipped.append(f"... and {self.more_skipped} more left out")
            self.more_skipped = 0
        manifest = {
            "created_unix": int(time.time()),
            "entries": [
                {f.name: getattr(e, f.name) for f in e.DESCRIPTOR.fields} for e in self.entries
            ],
            "skipped": self.skipped,
        }
        data = json.dumps(manifest, indent=2, sort_keys=True).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        self.tar.addfile(info, io.BytesIO(data))
        self.tar.close()


# -------------------------------------------------------------------------- readers


def keep_tail(data: bytes, cap: int, *, truncated: bool) -> tuple[bytes, bool]:
    """At most ``cap`` bytes from the end; a cut line at the start is dropped."""
    if len(data) > cap:
        data, truncated = data[len(data) - cap :], True
    if truncated:
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1 :]
    return data, truncated


def read_confined(path: Path, roots: tuple[Path, ...], cap: int) -> tuple[bytes, bool, float]:
    """(tail of the file, truncated, mtime). ``path`` is already resolved; raises OSError or
    InvalidParameters (the opened file is not what the checked path named)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        transfer.confine(os.readlink(f"/proc/self/fd/{fd}"), roots)
        start = max(0, st.st_size - cap)
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], cap
        while left > 0 and (chunk := os.read(fd, min(left, MiB))):
            chunks.append(chunk)
            left -= len(chunk)
        data, truncated = keep_tail(b"".join(chunks), cap, truncated=start > 0)
        return data, truncated, st.st_mtime
    finally:
        os.close(fd)


def stream_tail(ctx: Context, argv: list[str], cap: int) -> tuple[bytes, bool]:
    """Run ``argv`` and keep the last ``cap`` bytes of its output, streamed."""
    buf = bytearray()
    dropped = False
    # Its exit is not checked: what it printed is the log, however it ended.
    with ctx.running(argv, stderr=subprocess.DEVNULL, check=False, grace=0.5) as child:
        for chunk in child.chunks(MiB):
            ctx.check()
            buf += chunk
            if len(buf) > 2 * cap:
                del buf[: len(buf) - cap]
                dropped = True
    return keep_tail(bytes(buf), cap, truncated=dropped)


# -------------------------------------------------------------------------- handler


def _limit(value: int, default: int, name: str, lowest: int, highest: int) -> int:
    if value == 0:
        return default
    if not lowest <= value <= highest:
        raise InvalidParameters(
            f"logs.collect: {name} must be between {lowest} and {highest} bytes (got {value})"
        )
    return value


class LogsCollect(Handler[agent_pb2.LogsCollectRequest, LogsParams], kind="logs.collect"):
    def parse(self, payload: agent_pb2.LogsCollectRequest) -> LogsParams:
        if len(payload.paths) > MAX_PATHS:
            raise InvalidParameters(f"logs.collect: at most {MAX_PATHS} paths (got {len(payload.paths)})")
        for raw in payload.paths:
            if len(raw.encode()) > MAX_PATH_BYTES:
                raise InvalidParameters(f"logs.collect: a path is longer than {MAX_PATH_BYTES} bytes")
            if not raw or "\x00" in raw or not os.path.isabs(raw):
                raise InvalidParameters(f"logs.collect: path {raw!r} must be absolute")
        if payload.upload_url:
            transfer.check_upload_request(payload.upload_url, payload.http_headers)
        max_bytes = _limit(payload.max_bytes, DEFAULT_MAX_BYTES, "max_bytes", MIN_MAX_BYTES, LIMIT_MAX_BYTES)
        max_file = _limit(payload.max_file_bytes, min(DEFAULT_MAX_FILE_BYTES, max_bytes), "max_file_bytes",
                          4096, max_bytes)
        if len(payload.node_ids) > MAX_PATHS:
            raise InvalidParameters(f"logs.collect: at most {MAX_PATHS} node_ids")
        from agent.site.boot.fields import parse_node_id

        node_ids = tuple(dict.fromkeys(parse_node_id(n) for n in payload.node_ids))
        if payload.from_unix_ms < 0 or payload.until_unix_ms < 0 or (
                payload.until_unix_ms and payload.until_unix_ms < payload.from_unix_ms):
            raise InvalidParameters("logs.collect: from_unix_ms and until_unix_ms: 0 or a time, "
                                    "until not before from")
        return LogsParams(
            paths=tuple(payload.paths),
            url=payload.upload_url,
            max_bytes=max_bytes,
            max_file_bytes=max_file,
            kernel=payload.include_kernel_log,
            journal=payload.include_system_journal,
            since_seconds=payload.since_seconds or DEFAULT_SINCE_SECONDS,
            headers=tuple(sorted(payload.http_headers.items())),
            ca_pem=payload.ca_bundle_pem,
            node_ids=node_ids,
            since=payload.from_unix_ms / 1000,
            until=payload.until_unix_ms / 1000,
            last_lines=payload.console_last_lines,
        )

    def admit(self, config: Config, params: LogsParams) -> None:
        """At admission, before anything is accepted: every named path must lie inside
        ``config.logs_allow`` and not be key material. ``run`` checks again (a link may have
        been swapped in since), and opens each file without following links."""
        roots = tuple(config.logs_allow)
        for raw in params.paths:
            path = transfer.confine(raw, roots, "logs.collect path")
            if self._secret(config, path):
                raise InvalidParameters(f"logs.collect: {raw!r} is key material, never collected", path=raw)

    def run(self, ctx: Context, params: LogsParams) -> agent_pb2.LogsCollectResult:
        roots = tuple(ctx.config.logs_allow)
        named = [transfer.confine(raw, roots, "logs.collect path") for raw in params.paths]
        for raw, path in zip(params.paths, named, strict=True):
            if not path.exists():
                raise InvalidParameters(f"logs.collect: {raw!r} does not exist", path=raw)
            if self._secret(ctx.config, path):
                raise InvalidParameters(f"logs.collect: {raw!r} is key material and is never collected")
        site = ctx.site() if params.node_ids else None   # Unsupported outside the site daemon
        spool_dir = ctx.config.cache_dir if ctx.config.cache_dir.is_dir() else None
        with tempfile.TemporaryFile(dir=spool_dir) as spool:
            archive = Archive(spool, params.max_bytes, Redactor(ctx.config))
            self._agent_logs(ctx, archive, params)
            if params.kernel:
                self._kernel_log(ctx, archive, params)
            if params.journal:
                self._system_journal(ctx, archive, params)
            for raw, path in zip(params.paths, named, strict=True):
                self._named(ctx, archive, params, raw, path, roots)
            for node_id in params.node_ids:
                assert site is not None   # ctx.site() above, or Unsupported
                for name, data in site.observe.node_files(node_id, params.since, params.until,
                                                                 params.last_lines).items():
                    cap = min(params.max_file_bytes, archive.room(f"nodes/{node_id}/{name}", node_id))
                    if cap < 4096:
                        archive.skip(f"node {node_id} {name}: archive size cap reached")
                        continue
                    kept, truncated = keep_tail(data, cap, truncated=False)
                    archive.add(f"nodes/{node_id}/{name}", f"site: node {node_id}", kept,
                                truncated=truncated, mtime=time.time())
            archive.close()
            size, digest = archive.sink.size, archive.sink.sha256
            result = agent_pb2.LogsCollectResult(
                manifest=archive.entries,
                archive_bytes=size,
                archive_digest=common_pb2.Digest(algorithm="sha256", hex=digest.hexdigest()),
                skipped=archive.skipped,
            )
            spool.seek(0)
            if not params.url:
                if size > INLINE_MAX_BYTES:
                    raise AgentError(
                        f"logs.collect: the archive is {size} bytes, over the {INLINE_MAX_BYTES} bytes"
                        " an inline result may carry; give an upload_url or a smaller max_bytes",
                        reason=Reason.TOO_LARGE,
                        archive_bytes=size,
                    )
                result.inline_archive = spool.read()
                return result
            rate = ctx.config.bulk_bandwidth_bytes_per_second
            meter = ctx.meter(total=size)

            def sent(_chunk: bytes) -> None:
                meter.update(spool.tell(), message="uploading the log archive")

            transfer.upload(
                ctx,
                params.url,
                transfer.throttled(ctx, iter(lambda: spool.read(MiB), b""), rate, on_chunk=sent),
                headers=dict(params.headers),
                ca_pem=params.ca_pem,
                length=size,
                sha256=digest.digest(),
                content_type="application/gzip",
            )
            meter.update(size, message="uploading the log archive", force=True)
            result.uploaded_to = http.redact(params.url)
            return result

    # -- sources ------------------------------------------------------------------------

    @staticmethod
    def _secret(config: Config, path: Path) -> bool:
        keys = {Path(os.path.realpath(p)) for p in (config.client_key, config.state_dir / "node.key") if p}
        return path in keys or bool(SECRET_FILE.fullmatch(path.name))

    def _add_file(
        self,
        ctx: Context,
        archive: Archive,
        params: LogsParams,
        name: str,
        path: Path,
        roots: tuple[Path, ...],
    ) -> None:
        ctx.check()
        if self._secret(ctx.config, path):
            archive.skip(f"{path}: key material, never collected")
            return
        cap = min(params.max_file_bytes, archive.room(name, str(path)))
        if cap < 4096:
            archive.skip(f"{path}: archive size cap reached")
            return
        try:
            data, truncated, mtime = read_confined(path, roots, cap)
        except InvalidParameters:
            archive.skip(f"{path}: outside the allowed directories")
            return
        except OSError as exc:
            reason = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            archive.skip(f"{path}: {reason}")
            return
        archive.add(name, str(path), data, truncated=truncated, mtime=mtime)
        ctx.progress(done=len(archive.entries), message=f"collected {name}", subject=str(path))

    def _agent_logs(self, ctx: Context, archive: Archive, params: LogsParams) -> None:
        config = ctx.config
        candidates: list[Path] = []
        if config.log_file is not None and config.log_file.is_file():
            candidates.append(config.log_file)
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(config.state_dir), key=lambda e: e.name):
                if entry.is_file(follow_symlinks=False) and AGENT_FILE.fullmatch(entry.name):
                    candidates.append(Path(entry.path))
        for path in dict.fromkeys(Path(os.path.realpath(p)) for p in candidates):
            self._add_file(ctx, archive, params, f"agent/{path.name}", path, (path.parent,))

    def _kernel_log(self, ctx: Context, archive: Archive, params: LogsParams) -> None:
        cap = min(params.max_file_bytes, archive.room("kernel/kmsg.txt", "/dev/kmsg"))
        data = read_kmsg(cap)
        source = "/dev/kmsg"
        truncated = False
        if data is None and shutil.which("dmesg"):
            source = "dmesg"
            data, truncated = stream_tail(ctx, ["dmesg"], cap)
        if data is None:
            archive.skip("kernel log: neither /dev/kmsg nor dmesg can be read")
            return
        data, truncated = keep_tail(data, cap, truncated=truncated)
        archive.add("kernel/kmsg.txt", source, data, truncated=truncated, mtime=time.time())

    def _system_journal(self, ctx: Context, archive: Archive, params: LogsParams) -> None:
        if shutil.which("journalctl") is None:
            archive.skip("system journal: journalctl is not installed")
            return
        since = int(time.time()) - params.since_seconds
        argv = ["journalctl", "--no-pager", "--quiet", "-o", "short-iso", f"--since=@{since}"]
        cap = min(params.max_file_bytes, archive.room("journal/system.txt", "journalctl"))
        data, truncated = stream_tail(ctx, argv, cap)
        archive.add("journal/system.txt", "journalctl", data, truncated=truncated, mtime=time.time())

    def _named(
        self,
        ctx: Context,
        archive: Archive,
        params: LogsParams,
        raw: str,
        path: Path,
        roots: tuple[Path, ...],
    ) -> None:
        if not path.is_dir():
            self._add_file(ctx, archive, params, "files" + str(path), path, roots)
            return
        count = 0
        for file in self._walk(path):
            count += 1
            if count > MAX_FILES:
                archive.skip(f"{raw}: more than {MAX_FILES} files, the rest left out")
                return
            try:
                real = transfer.confine(str(file), roots)
            except InvalidParameters:
                archive.skip(f"{file}: link leads outside the allowed directories")
                continue
            self._add_file(ctx, archive, params, "files" + str(file), real, roots)

    @staticmethod
    def _walk(top: Path) -> Iterator[Path]:
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                yield Path(dirpath) / name

