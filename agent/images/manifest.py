"""Image manifests: the digest of every chunk of a raw image, so that a deploy verifies each
chunk before it writes it, hashes on every core, and never hashes nor downloads a zero chunk.

    plan = manifest.parse(data)              # an ImageManifest or a bmaptool .bmap v2 file: a Plan
    plan.segments                            # [Segment(offset, length, digest or None)] (plan.py)
    m = manifest.build(path)                 # ImageManifest of a raw or compressed image
    path, sha256, m = manifest.write(image)  # ... written beside it (what `agent manifest` does)
    agent manifest IMAGE [-o FILE]           # writes IMAGE.manifest, prints its sha256

The format is ``ImageManifest`` (agent/proto/agent.proto), serialized protobuf: version 1,
the raw image's size, a power-of-two chunk size (4 MiB by default), the algorithm (sha256),
the chunk count and the chunks' digests concatenated, plus the digest, size and format of the
published file. What we took from the peers: a digest per chunk of the raw image (RAUC's
block-hash-index, casync's chunk ids, dm-verity's data blocks) and zero chunks known by their
digest alone (RAUC and dm-verity recognise a zero block by its hash, casync its null chunk by
id): there is no "zero" flag that could disagree with the digest. A bmaptool .bmap (v2, sha256)
gives a digest per mapped range, and its unmapped ranges are zeros; it is accepted as it comes.

Parsing is strict: a wrong version, an unknown algorithm, a chunk size that is not a power of
two in range, a count or a digest length that disagree with the size, a .bmap whose own
checksum or ranges are wrong, all raise InvalidParameters before anything is written.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from agent import limits
from agent.atomicfile import write_atomic
from agent.errors import InvalidParameters
from agent.images import image
from agent.images.plan import Plan, Segment
from agent.proto import agent_pb2, common_pb2

VERSION = 1
DEFAULT_CHUNK = 4 << 20
MIN_CHUNK = 64 << 10
MAX_CHUNK = 16 << 20
ALGORITHMS = {"sha256": 32}
MAX_MANIFEST = 64 << 20       # bytes of a manifest file (a 4 MiB-chunk manifest of 8 TiB is 64 MiB)
MAX_BMAP_PIECE = 8 << 20      # a mapped range of a .bmap is read, hashed and written in such pieces

Fmt = agent_pb2.ImageFormat


@functools.lru_cache(maxsize=16)
def zero_digest(algorithm: str, length: int) -> bytes:
    """The digest of ``length`` zero bytes (computed once per length)."""
    h = hashlib.new(algorithm)
    zeros = bytes(min(length, 1 << 20))
    left = length
    while left:
        n = min(left, len(zeros))
        h.update(zeros[:n])
        left -= n
    return h.digest()


# ---------------------------------------------------------------------------- parsing


def parse(data: bytes, what: str = "manifest") -> Plan:
    """An ImageManifest or a .bmap (XML) file; InvalidParameters when it is not a valid one."""
    if len(data) > MAX_MANIFEST:
        raise InvalidParameters(f"{what}: {len(data)} bytes, more than the {MAX_MANIFEST} allowed")
    head = data.lstrip()[:64]
    if head.startswith((b"<?xml", b"<bmap", b"<!--")):
        return parse_bmap(data, what)
    from google.protobuf.message import DecodeError

    m = agent_pb2.ImageManifest()
    try:
        m.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidParameters(f"{what}: not an image manifest nor a .bmap file ({exc})") from exc
    return from_proto(m, what)


def from_proto(m: agent_pb2.ImageManifest, what: str = "manifest") -> Plan:
    if m.version != VERSION:
        raise InvalidParameters(f"{what}: version {m.version}, this agent reads version {VERSION}")
    size = ALGORITHMS.get(m.algorithm)
    if size is None:
        raise InvalidParameters(f"{what}: unknown hash algorithm {m.algorithm!r} (known: sha256)")
    chunk = m.chunk_size
    if chunk & (chunk - 1) or not MIN_CHUNK <= chunk <= MAX_CHUNK:
        raise InvalidParameters(_bad_chunk(chunk, what))
    if m.image_size == 0:
        raise InvalidParameters(f"{what}: the image size is 0")
    count = -(-m.image_size // chunk)
    if m.chunk_count != count:
        raise InvalidParameters(
            f"{what}: {m.chunk_count} chunks, but {m.image_size} bytes in chunks of {chunk} make {count}")
    if len(m.digests) != count * size:
        raise InvalidParameters(f"{what}: {len(m.digests)} bytes of digests, {count * size} expected")
    segments = []
    for i in range(count):
        offset = i * chunk
        length = min(chunk, m.image_size - offset)
        digest = m.digests[i * size : (i + 1) * size]
        zero = digest == zero_digest(m.algorithm, length)
        segments.append(Segment(i, offset, length, None if zero else digest))
    published = None
    if m.HasField("published") and m.published.hex:
        published = image.Digest.from_proto(m.published, what)
    return Plan("manifest", m.algorithm, m.image_size, chunk, tuple(segments), published, m.published_size,
                m.published_format if m.HasField("published") else -1)


_BMAP_FIELD = re.compile(r"<(\w+)>([^<]*)</\1>")
_BMAP_RANGE = re.compile(r'<Range(?:\s+chksum\s*=\s*"([^"]*)")?\s*>\s*([^<]*?)\s*</Range>')


def parse_bmap(data: bytes, what: str = "bmap") -> Plan:
    """A bmaptool block map, format 2.x with sha256: mapped ranges carry a digest, the rest is
    zeros. Its BmapFileChecksum (sha256 of the file with that value zeroed) is checked.

    Read with a strict pattern of bmaptool's small fixed layout rather than an XML parser: the
    ramdisk carries no XML library, and a .bmap has no entities, namespaces or nesting beyond
    <bmap>, its fields and <BlockMap>'s <Range>s; anything else is refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParameters(f"{what}: not a UTF-8 .bmap file") from exc
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"\A\s*<\?xml[^>]*\?>", "", text)
    root = re.fullmatch(r'\s*<bmap\s+version\s*=\s*"([^"]*)"\s*>(.*)</bmap>\s*', text, flags=re.S)
    if root is None:
        raise InvalidParameters(f"{what}: not a .bmap file (no <bmap version=...> element)")
    version, body = root.group(1), root.group(2)
    if not version.startswith("2."):
        raise InvalidParameters(f"{what}: bmap version {version!r}; version 2.x (sha256 per range) is needed")
    block_map = re.search(r"<BlockMap>(.*)</BlockMap>", body, flags=re.S)
    if block_map is None:
        raise InvalidParameters(f"{what}: no <BlockMap>")
    rest = body[: block_map.start()] + body[block_map.end() :]
    fields = {name: value.strip() for name, value in _BMAP_FIELD.findall(rest)}
    if _BMAP_FIELD.sub("", rest).strip():
        raise InvalidParameters(f"{what}: unexpected content in the .bmap file")

    def number(name: str) -> int:
        text = fields.get(name, "")
        if not limits.is_digits(text):
            raise InvalidParameters(f"{what}: <{name}> is missing or not a number: {text!r}")
        return int(text)

    algorithm = fields.get("ChecksumType", "").lower()
    if algorithm not in ALGORITHMS:
        raise InvalidParameters(f"{what}: checksum type {algorithm!r}; only sha256 is accepted")
    image_size, block_size, blocks = number("ImageSize"), number("BlockSize"), number("BlocksCount")
    power_of_two = block_size > 0 and not block_size & (block_size - 1)
    if not image_size or not power_of_two or blocks != -(-image_size // block_size):
        raise InvalidParameters(f"{what}: image size {image_size}, block size {block_size} and"
                                f" {blocks} blocks disagree")
    declared = fields.get("BmapFileChecksum", "").lower()
    zeroed = re.sub(rb"(<BmapFileChecksum>\s*)[0-9A-Fa-f]+", lambda m_: m_.group(1) + b"0" * len(declared),
                    data, count=1)
    if not declared or hashlib.sha256(zeroed).hexdigest() != declared:
        raise InvalidParameters(f"{what}: its BmapFileChecksum does not match its content (damaged file)")
    ranges = block_map.group(1)
    if _BMAP_RANGE.sub("", ranges).strip():
        raise InvalidParameters(f"{what}: unexpected content in <BlockMap>")
    segments: list[Segment] = []
    pos = 0
    for chksum_raw, text in _BMAP_RANGE.findall(ranges):
        first_s, _, last_s = text.partition("-")
        if not limits.is_digits(first_s) or (last_s and not limits.is_digits(last_s)):
            raise InvalidParameters(f"{what}: bad range {text!r}")
        first, last = int(first_s), int(last_s or first_s)
        start, end = first * block_size, min((last + 1) * block_size, image_size)
        if last < first or last >= blocks or start < pos:
            raise InvalidParameters(f"{what}: range {text!r} is out of order, overlaps or lies outside"
                                    " the image")
        chksum = chksum_raw.lower()
        if len(chksum) != 2 * ALGORITHMS[algorithm] or any(c not in "0123456789abcdef" for c in chksum):
            raise InvalidParameters(f"{what}: range {text!r} has no valid {algorithm} chksum")
        if start > pos:
            segments.append(Segment(len(segments), pos, start - pos, None))
        segments.append(Segment(len(segments), start, end - start, bytes.fromhex(chksum)))
        pos = end
    if pos < image_size:
        segments.append(Segment(len(segments), pos, image_size - pos, None))
    return Plan("bmap", algorithm, image_size, MAX_BMAP_PIECE, tuple(segments))


def _bad_chunk(chunk: int, what: str) -> str:
    return f"{what}: chunk size {chunk} is not a power of two from {MIN_CHUNK} to {MAX_CHUNK}"


# ---------------------------------------------------------------------------- building


def build(path: Path, *, chunk_size: int = DEFAULT_CHUNK,
          running: image.Running | None = None, workers: int | None = None,
          cancel: threading.Event | None = None) -> agent_pb2.ImageManifest:
    """The manifest of the image at ``path`` (raw, gzip, xz, bzip2, zstd or qcow2), streamed: one
    thread reads (and decompresses), a pool sized to the cores hashes the chunks, and an
    all-zero chunk (found with memcmp) gets the zero digest without being hashed."""
    from agent.hw.diskio import all_zero

    if chunk_size & (chunk_size - 1) or not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise InvalidParameters(_bad_chunk(chunk_size, "manifest"))
    source = image.FileSource(path, "sha256")
    try:
        fmt = image.detect(source.peek())
        # A qcow2 file: the guest's bytes, through its tables.
        stream: image.RawStream | _Qcow2Stream = (
            _Qcow2Stream(path, source) if fmt == Fmt.QCOW2 else image.RawStream(source, fmt, running)
        )
        digests: list[Future[bytes] | bytes] = []
        size = 0
        slots = threading.BoundedSemaphore((workers or os.cpu_count() or 1) * 2 + 2)

        def digest(buf: bytearray, n: int) -> bytes:
            try:
                return hashlib.sha256(memoryview(buf)[:n]).digest()
            finally:
                slots.release()

        import ctypes

        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1,
                                thread_name_prefix="manifest-hash") as pool:
            try:
                while True:
                    if cancel is not None and cancel.is_set():
                        from agent.errors import Cancelled

                        raise Cancelled("manifest cancelled")
                    buf = bytearray(chunk_size)
                    view = memoryview(buf)
                    n = 0
                    while n < chunk_size and (got := stream.readinto(view[n:])):
                        n += got
                    if n == 0:
                        break
                    size += n
                    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
                    if all_zero(view, address, 0, n):
                        digests.append(zero_digest("sha256", n))
                    else:
                        slots.acquire()
                        digests.append(pool.submit(digest, buf, n))
                    if n < chunk_size:
                        break
            finally:
                stream.close()
            joined = b"".join(d if isinstance(d, bytes) else d.result() for d in digests)
        if size == 0:
            raise InvalidParameters(f"{path}: the image is empty")
        return agent_pb2.ImageManifest(
            version=VERSION, image_size=size, chunk_size=chunk_size, algorithm="sha256",
            chunk_count=len(digests), digests=joined,
            published=common_pb2.Digest(algorithm="sha256", hex=source.hasher.hexdigest()),
            published_size=source.count, published_format=fmt,  # type: ignore[arg-type]  # detect's enum number
        )
    finally:
        source.close()


class _Qcow2Stream:
    """A qcow2 file's guest bytes in order, for ``build``; the published file is hashed as a
    whole by ``close`` (it is read apart from the guest bytes)."""

    def __init__(self, path: Path, source: object) -> None:
        from agent.images.qcow2 import Qcow2File

        self.q = Qcow2File(path)
        self.source = source
        self.pos = 0

    def readinto(self, view: memoryview) -> int:
        n = min(len(view), self.q.size - self.pos)
        if n > 0:
            self.q.read(self.pos, view[:n])
            self.pos += n
        return max(n, 0)

    def close(self) -> None:
        self.q.close()
        read = self.source.read  # type: ignore[attr-defined]  # an image.FileSource
        while read(8 << 20):  # the published digest and size: the whole qcow2 file
            pass


# ---------------------------------------------------------------------------- agent manifest


def write(image_path: Path, out: Path | None = None, *, chunk_size: int = DEFAULT_CHUNK
          ) -> tuple[Path, str, agent_pb2.ImageManifest]:
    """Build the manifest of ``image_path`` and write it (atomically) to ``out`` (default:
    beside the image, IMAGE.manifest); returns the path, the file's sha256 and the manifest."""
    out = out or image_path.with_name(image_path.name + ".manifest")
    m = build(image_path, chunk_size=chunk_size)
    data = m.SerializeToString(deterministic=True)
    write_atomic(out, data)
    return out, hashlib.sha256(data).hexdigest(), m


def image_format_name(fmt: int) -> str:
    return Fmt.Name(fmt).lower()
