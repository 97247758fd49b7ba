"""A qcow2 image written onto a disk from a stream (a registry's blob, an HTTP download): the
published file read once, in order, hashed as it passes (by the source), its header, L1 and L2
tables parsed as the stream passes them and each data cluster written at its guest offset.

    q = Qcow2Stream(source, check)     # reads and checks the header; nothing written yet
    q.size                             # the virtual (raw image) size
    q.copy(writer, zeros=not skip)     # the rest of the stream; the disk's bytes through writer

It needs the file's tables before the data they map, which is how ``qemu-img convert -O qcow2``
(with or without ``-c``) lays a file out: the header, the refcount table, the L1 table, then
each L2 table just before the first data cluster it maps (QEMU allocates the table before the
cluster). Bytes no table has claimed yet are skipped (a refcount block, a cluster nothing
maps), the last ``WINDOW`` of them held: a table may map a cluster that came up to that far
before it; one that maps a cluster the stream passed longer ago is refused
(``InvalidParameters``: "metadata after its data"; such a file deploys from ``local_path``, or
after ``qemu-img convert`` rewrote it). The pending work is bounded
(``MAX_PENDING`` runs of clusters; the window at most two ``WINDOW``s, or the L1 table's
bound plus one).

Compressed (deflate) clusters are inflated; zstd, backing files, encryption, external data
files and extended L2 entries are refused by agent/images/qcow2.py's ``Header``. Unallocated
and zero clusters are never written where the disk reads zeros (``zeros=False``); elsewhere
``copy`` writes zeros over every guest range no cluster wrote, after the stream. The digest of
the published file is the caller's to check at the end (the source hashed every byte).
"""

from __future__ import annotations

import enum
import heapq
import struct
from collections.abc import Callable

from agent.errors import InvalidParameters, SourceFailed
from agent.hw import diskio
from agent.images import image
from agent.images.qcow2 import COMPRESSED, HEADER_READ, OFFSET_MASK, ZERO_FLAG, Header

WINDOW = 8 << 20            # bytes read from the source at a time
MAX_PENDING = 1 << 20       # runs of clusters mapped but not reached yet


class Kind(enum.IntEnum):
    L1 = 0
    L2 = 1
    DATA = 2        # a run of uncompressed clusters, contiguous on the host and in the guest
    COMPRESSED = 3  # one compressed cluster


# (host offset, sequence, kind, length, guest offset or the L2 table's L1 index)
_Extent = tuple[int, int, Kind, int, int]


class _Batch:
    """Guest writes gathered into the writer's buffers: a write that follows the buffer's last
    one in the guest goes into the same buffer, anything else submits it first."""

    def __init__(self, writer: diskio.DiskWriter) -> None:
        self.writer = writer
        self.buf: memoryview | None = None
        self.start = self.fill = 0

    def put(self, guest: int, data: memoryview | bytes) -> None:
        pos = 0
        while pos < len(data):
            if self.buf is not None and (guest + pos != self.start + self.fill or self.fill == len(self.buf)):
                self.flush()
            if self.buf is None:
                self.buf, self.start, self.fill = self.writer.take(), guest + pos, 0
            n = min(len(data) - pos, len(self.buf) - self.fill)
            self.buf[self.fill : self.fill + n] = data[pos : pos + n]
            self.fill += n
            pos += n

    def flush(self) -> None:
        if self.buf is not None:
            buf, self.buf = self.buf, None
            self.writer.submit(buf, self.start, self.fill)

    def close(self) -> None:
        if self.buf is not None:
            self.writer.give_back(self.buf)
            self.buf = None


class Qcow2Stream:
    """One qcow2 file read from ``source`` in order (see the module docstring)."""

    def __init__(self, source: image.Source, check: Callable[[], None] = lambda: None,
                 progress: Callable[[int], None] = lambda done: None) -> None:
        self.source, self.check, self.progress = source, check, progress
        self._win = bytearray()
        self._base = 0              # host offset of self._win[0]
        self._eof = False
        self._heap: list[_Extent] = []
        self._seq = 0
        self._written: list[tuple[int, int]] = []   # guest (offset, length) written by clusters
        self.guest_bytes = 0        # data (inflated) bytes written at their guest offsets
        self.compressed_clusters = 0
        self._fill(HEADER_READ)
        self.header = Header.parse(bytes(self._win[:HEADER_READ]), "the image")
        self.size = self.header.size
        if self.header.l1_size:
            self._push(self.header.l1_offset, Kind.L1, 8 * self.header.l1_size, 0)
        self._batch: _Batch | None = None

    # -- reading -------------------------------------------------------------------------

    def _fill(self, end: int) -> None:
        """Read until the window holds the host bytes before ``end`` (or the stream ended)."""
        while self._base + len(self._win) < end and not self._eof:
            self.check()
            data = self.source.read(max(WINDOW, end - self._base - len(self._win)))
            if not data:
                self._eof = True
            self._win += data

    def _drop(self, keep: int) -> None:
        """Forget the window's bytes before host offset ``keep``."""
        del self._win[: keep - self._base]
        self._base = keep

    def _push(self, host: int, kind: Kind, length: int, guest: int) -> None:
        if len(self._heap) >= MAX_PENDING:
            raise InvalidParameters(f"qcow2: more than {MAX_PENDING} runs of clusters mapped ahead of the"
                                    " stream; deploy this file from local_path")
        self._seq += 1
        heapq.heappush(self._heap, (host, self._seq, kind, length, guest))

    # -- the copy ------------------------------------------------------------------------

    def copy(self, writer: diskio.DiskWriter, *, zeros: bool) -> None:
        """The rest of the stream onto the disk through ``writer``; with ``zeros``, the guest
        ranges no cluster wrote are written with zeros at the end. Raises SourceFailed for a
        stream that ends before a table or cluster it maps, InvalidParameters for a file this
        reader cannot stream (see the module docstring)."""
        self._batch = _Batch(writer)
        try:
            while True:
                keep = self._process()
                if self._eof:
                    break
                self._drop(min(keep, max(self._base, self._base + len(self._win) - WINDOW)))
                self._fill(max(keep + self._need(), self._base + len(self._win) + 1))
                self.progress(self.guest_bytes)
            if self._heap:
                host = self._heap[0][0]
                raise SourceFailed(f"qcow2: the file ends at byte {self._base + len(self._win)}, before the"
                                   f" table or cluster at byte {host} (truncated image)")
            if zeros:
                blank = memoryview(bytes(WINDOW))
                for start, length in self._gaps():
                    while length:
                        n = min(length, len(blank))
                        self._batch.put(start, blank[:n])
                        start += n
                        length -= n
            self._batch.flush()
        finally:
            self._batch.close()

    def _need(self) -> int:
        """The bytes the next extent needs held whole (a table or a compressed cluster)."""
        if self._heap and self._heap[0][2] != Kind.DATA:
            return self._heap[0][3]
        return 0

    def _process(self) -> int:
        """Handle every extent that starts inside the window; the first host offset whose bytes
        are still needed (where an extent to be held whole does not fit yet)."""
        end = self._base + len(self._win)
        view = memoryview(self._win)
        try:
            while self._heap and self._heap[0][0] < end:
                host, _, kind, length, guest = self._heap[0]
                if host < self._base:
                    raise InvalidParameters(
                        f"qcow2: the {kind.name} at byte {host} is mapped by a table that comes after it"
                        " in the file (metadata after its data): it cannot be streamed; deploy it from"
                        " local_path, or rewrite it with qemu-img convert -O qcow2")
                stop = host + length
                if kind == Kind.DATA:
                    heapq.heappop(self._heap)
                    n = min(stop, end) - host
                    self._data(guest, view[host - self._base : host - self._base + n])
                    if n < length:
                        self._push(host + n, Kind.DATA, length - n, guest + n)
                    continue
                if stop > end and not self._eof:
                    return host
                heapq.heappop(self._heap)
                piece = view[host - self._base : min(stop, end) - self._base]
                if kind == Kind.COMPRESSED:  # its length is an upper bound: the file may end first
                    self._data(guest, memoryview(self.header.inflate(piece))[: self._clip(guest)])
                    self.compressed_clusters += 1
                elif stop > end:
                    raise SourceFailed(f"qcow2: the file ends inside its {kind.name} table at byte {host}")
                elif kind == Kind.L1:
                    self._l1(piece)
                else:
                    self._l2(guest, piece)
            return end
        finally:
            view.release()

    def _clip(self, guest: int) -> int:
        return min(self.header.cluster, self.size - guest)

    def _data(self, guest: int, data: memoryview) -> None:
        assert self._batch is not None
        self._batch.put(guest, data)
        if self._written and sum(self._written[-1]) == guest:   # one entry per run in the guest
            self._written[-1] = (self._written[-1][0], self._written[-1][1] + len(data))
        else:
            self._written.append((guest, len(data)))
        self.guest_bytes += len(data)

    def _aligned(self, offset: int, what: str) -> int:
        if offset % self.header.cluster:
            raise InvalidParameters(f"qcow2: {what} at byte {offset} is not aligned to a cluster"
                                    " (corrupt image)")
        return offset

    def _l1(self, table: memoryview) -> None:
        for index, entry in enumerate(struct.unpack(f">{len(table) // 8}Q", table)):
            if offset := entry & OFFSET_MASK:
                self._push(self._aligned(offset, "an L2 table"), Kind.L2, self.header.cluster, index)

    def _l2(self, l1_index: int, table: memoryview) -> None:
        h = self.header
        base = l1_index * h.l2_entries * h.cluster
        run: list[int] = []     # the current run of DATA: host, length, guest
        for index, entry in enumerate(struct.unpack(f">{h.l2_entries}Q", table)):
            if not entry:
                continue
            guest = base + index * h.cluster
            if guest >= self.size:
                break
            if entry & COMPRESSED:
                host, length = h.compressed_extent(entry)
                self._push(host, Kind.COMPRESSED, length, guest)
                continue
            host = entry & OFFSET_MASK
            if entry & ZERO_FLAG or not host:
                continue
            host = self._aligned(host, "a data cluster")
            length = self._clip(guest)
            if run and run[0] + run[1] == host and run[2] + run[1] == guest:
                run[1] += length
                continue
            if run:
                self._push(run[0], Kind.DATA, run[1], run[2])
            run = [host, length, guest]
        if run:
            self._push(run[0], Kind.DATA, run[1], run[2])

    def _gaps(self) -> list[tuple[int, int]]:
        """The guest ranges (offset, length) that no cluster wrote."""
        out = []
        pos = 0
        for start, length in sorted(self._written):
            if start > pos:
                out.append((pos, start - pos))
            pos = max(pos, start + length)
        if pos < self.size:
            out.append((pos, self.size - pos))
        return out

