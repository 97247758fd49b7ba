"""Reading the guest bytes of a local qcow2 file (version 2 or 3) without qemu-img, for a deploy
that verifies each chunk against a manifest before it writes it.

    with Qcow2File(path) as q:
        q.size                        # the virtual (raw image) size
        q.read(offset, view)          # guest bytes into view: data clusters read, others zeros
        q.allocated(offset, length)   # whether any cluster there holds data
        q.check()                     # every table entry inside the file, or SourceFailed
    Header.parse(head, what)          # the header's fields, checked (qcow2stream.py's too)

Only what a published image uses: no backing file, no encryption, no external data file, no
extended L2 entries (all refused with Unsupported); compressed clusters with deflate (zlib)
are inflated, zstd-compressed ones are refused. The tables are read once per L2 table.
``check`` walks every table before a deploy without a manifest hands the file to qemu-img
(agent/images/deploy.py's Qcow2Deployment): the same header refusals and the same "outside the
file" refusal as ``read``, so a file is deployed, or refused, the same with and without one.
Format: QEMU's docs/interop/qcow2.txt.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from agent.errors import InvalidParameters, SourceFailed, Unsupported

MAGIC = b"QFI\xfb"
OFFSET_MASK = 0x00FFFFFFFFFFFE00
COMPRESSED = 1 << 62
ZERO_FLAG = 1
INCOMPATIBLE_DIRTY = 1
INCOMPATIBLE_COMPRESSION = 8   # a compression type other than deflate (zstd)
ZSTD_REFUSED = "qcow2 clusters compressed with zstd are not supported; use deflate or none"
INCOMPATIBLE_OK = INCOMPATIBLE_DIRTY  # dirty: refcounts may be stale, the tables are fine
INCOMPATIBLE_NAMES = {2: "marked corrupt", 4: "external data file", 16: "extended L2 entries"}


HEADER_READ = 112          # what ``Header.parse`` needs of the file's start (version 3's fields)
MAX_L1 = 32 << 20          # bytes of L1 table at most (QEMU's own bound)


@dataclass(frozen=True)
class Header:
    """What a qcow2 file's header says, checked: the features we refuse are refused here."""

    cluster_bits: int
    size: int                  # the virtual (raw image) size
    l1_size: int               # entries
    l1_offset: int
    compression: int           # 0: deflate, 1: zstd

    @classmethod
    def parse(cls, head: bytes, what: str) -> Header:
        if len(head) < 72 or head[:4] != MAGIC:
            raise InvalidParameters(f"{what} is not a qcow2 file")
        (version, backing, _bsize, cluster_bits, size, crypt, l1_size, l1_offset) = struct.unpack(
            ">IQIIQIIQ", head[4:48])
        if version not in (2, 3):
            raise Unsupported(f"qcow2 version {version}")
        if backing:
            raise InvalidParameters("qcow2 image has a backing file: refused (it would read another file)")
        if crypt:
            raise Unsupported("encrypted qcow2 images are not supported")
        if not 9 <= cluster_bits <= 21:
            raise InvalidParameters(f"qcow2: cluster_bits {cluster_bits} out of range")
        compression = 0
        if version == 3:
            if len(head) < 104:
                raise InvalidParameters(f"{what}: the qcow2 header is cut short")
            incompatible = struct.unpack(">Q", head[72:80])[0]
            if incompatible & INCOMPATIBLE_COMPRESSION:
                raise Unsupported(ZSTD_REFUSED)
            if incompatible & ~INCOMPATIBLE_OK:
                named = [name for bit, name in INCOMPATIBLE_NAMES.items() if incompatible & bit]
                raise Unsupported(f"qcow2 incompatible features {incompatible:#x}"
                                  f" ({', '.join(named) or 'unknown'}) are not supported")
            header_length = struct.unpack(">I", head[100:104])[0]
            if header_length > 104 and len(head) > 104:
                compression = head[104]
        cluster = 1 << cluster_bits
        if l1_size * (cluster // 8) * cluster < size:
            raise InvalidParameters("qcow2: the L1 table is too small for the virtual size")
        if l1_size * 8 > MAX_L1:
            raise InvalidParameters(f"qcow2: an L1 table of {l1_size} entries is over the bound"
                                    f" ({MAX_L1} bytes)")
        return cls(cluster_bits, size, l1_size, l1_offset, compression)

    @property
    def cluster(self) -> int:
        return 1 << self.cluster_bits

    @property
    def l2_entries(self) -> int:
        return self.cluster // 8

    def compressed_extent(self, entry: int) -> tuple[int, int]:
        """Where a compressed cluster's deflate stream lies in the file: (offset, length at most)."""
        shift = 62 - (self.cluster_bits - 8)
        host = entry & ((1 << shift) - 1)
        sectors = ((entry & ~COMPRESSED & ((1 << 62) - 1)) >> shift) + 1
        return host, sectors * 512 - (host & 511)

    def inflate(self, data: bytes | memoryview) -> bytes:
        """A compressed cluster's bytes: exactly one cluster, or SourceFailed."""
        if self.compression != 0:
            raise Unsupported(ZSTD_REFUSED)
        try:
            out = zlib.decompressobj(-12).decompress(data, self.cluster)
        except zlib.error as exc:
            raise SourceFailed(f"qcow2: corrupt compressed cluster ({exc})") from exc
        if len(out) != self.cluster:
            raise SourceFailed("qcow2: a compressed cluster inflates to the wrong size")
        return out


class Qcow2File:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._header(path)
        except BaseException:
            os.close(self.fd)
            raise
        self._l2: dict[int, tuple[int, ...]] = {}
        self.fetched = 0

    def _pread(self, n: int, offset: int) -> bytes:
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise SourceFailed(f"qcow2: the file ends before byte {offset + n} (truncated image)")
        return data

    def _header(self, path: Path) -> None:
        h = self.header = Header.parse(os.pread(self.fd, HEADER_READ, 0), str(path))
        self.compression = h.compression
        self.cluster = h.cluster
        self.cluster_bits = h.cluster_bits
        self.size: int = h.size
        self.l2_entries = h.l2_entries
        self.l1 = struct.unpack(f">{h.l1_size}Q", self._pread(8 * h.l1_size, h.l1_offset)) \
            if h.l1_size else ()

    def _entry(self, cluster_index: int) -> int:
        """The L2 entry of a guest cluster (0: unallocated)."""
        l1_index, l2_index = divmod(cluster_index, self.l2_entries)
        if l1_index >= len(self.l1):
            return 0
        table = self._l2.get(l1_index)
        if table is None:
            l2_offset = self.l1[l1_index] & OFFSET_MASK
            table = struct.unpack(f">{self.l2_entries}Q", self._pread(self.cluster, l2_offset)) \
                if l2_offset else ()
            self._l2[l1_index] = table
        return table[l2_index] if table else 0

    def check(self) -> None:
        """Every table entry against the file, before anything is written (a deploy without a
        manifest: qemu-img convert reads a cluster past the file's end as zeros and succeeds):
        each L2 table and each data cluster's guest bytes inside the file, each compressed
        cluster starting inside it, every offset cluster-aligned; SourceFailed naming the first
        that is not, as ``read`` fails on it with a manifest."""
        end = os.fstat(self.fd).st_size
        mask = self.cluster - 1
        for l1_index, l1_entry in enumerate(self.l1):
            l2_offset = l1_entry & OFFSET_MASK
            if not l2_offset:
                continue
            if l2_offset & mask or l2_offset + self.cluster > end:
                raise SourceFailed(f"qcow2: L2 table {l1_index} at byte {l2_offset} is outside the"
                                   f" {end}-byte file or misaligned (corrupt or truncated image)")
            # One table at a time, not kept (``_entry`` keeps them for the reads to come).
            table = struct.unpack(f">{self.l2_entries}Q", self._pread(self.cluster, l2_offset))
            for l2_index, entry in enumerate(table):
                guest = (l1_index * self.l2_entries + l2_index) << self.cluster_bits
                if guest >= self.size:
                    break
                if not entry:
                    continue
                if entry & COMPRESSED:
                    host, _length = self.header.compressed_extent(entry)
                    bad = host >= end
                else:
                    host = self._data_offset(entry)
                    bad = host != 0 and (host & mask != 0
                                         or host + min(self.cluster, self.size - guest) > end)
                if bad:
                    raise SourceFailed(f"qcow2: guest byte {guest} maps to byte {host}, outside the"
                                       f" {end}-byte file or misaligned (corrupt or truncated image)")

    def _data_offset(self, entry: int) -> int:
        """The host offset of an uncompressed data cluster, or 0 when it reads zeros."""
        if entry & COMPRESSED:
            return -1
        if entry & ZERO_FLAG:
            return 0
        return entry & OFFSET_MASK

    def allocated(self, offset: int, length: int) -> bool:
        first, last = offset >> self.cluster_bits, (offset + length - 1) >> self.cluster_bits
        return any(self._data_offset(self._entry(c)) != 0 for c in range(first, last + 1))

    def read(self, offset: int, view: memoryview) -> None:
        """Exactly len(view) guest bytes from ``offset``; contiguous host clusters in one pread."""
        if offset + len(view) > self.size:
            raise SourceFailed(f"qcow2: reading past the virtual size {self.size}")
        pos = 0
        while pos < len(view):
            guest = offset + pos
            c = guest >> self.cluster_bits
            within = guest & (self.cluster - 1)
            entry = self._entry(c)
            host = self._data_offset(entry)
            n = min(self.cluster - within, len(view) - pos)
            if host == 0:
                view[pos : pos + n] = bytes(n)
            elif host < 0:
                view[pos : pos + n] = self._inflate(entry)[within : within + n]
                self.fetched += n
            else:  # extend over the following clusters that follow on the host too
                while pos + n < len(view):
                    nxt = self._data_offset(self._entry(c + 1))
                    if nxt != host + within + n:
                        break
                    n = min(n + self.cluster, len(view) - pos)
                    c += 1
                got = os.preadv(self.fd, [view[pos : pos + n]], host + within)
                if got != n:
                    raise SourceFailed("qcow2: the file ends inside a data cluster (truncated image)")
                self.fetched += n
            pos += n

    def _inflate(self, entry: int) -> bytes:
        host, length = self.header.compressed_extent(entry)
        return self.header.inflate(os.pread(self.fd, length, host))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Qcow2File:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
