"""Fast sequential writes to a disk: a pool of page-aligned buffers, a writer thread, O_DIRECT
where the device allows it, and zero skipping.

    with DiskWriter(fd, dfd, size=disk.size, skip_zeros=True, cancel=ctx.cancel_event) as w:
        buf = w.take()               # a free aligned buffer (memoryview of BUFFER bytes)
        ... fill buf[:n] ...
        w.submit(buf, offset, n)     # written (or skipped) by the writer thread
    w.written, w.skipped

The producer fills the next buffer while the writer threads write the previous ones (two
writes in flight by default: a sparse image makes many small writes, and one at a time
would wait out each one's latency), so decompression or data generation overlaps the
device's write time. Writes never overlap each other, so their order does not matter. A sync
thread flushes the device (fdatasync) after every SYNC_EVERY bytes written, while the writers
go on, so the fsync at the end has little left to wait for. ``dfd`` is an O_DIRECT
fd (or None): aligned whole blocks go through it, a tail that is not a multiple of the
logical block size goes through the buffered ``fd``. ``close`` fsyncs.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import queue
import threading
from types import TracebackType

from agent.errors import AgentError, Cancelled, Reason

BUFFER = 8 * 1024 * 1024     # bytes per write buffer
GRANULE = 64 * 1024          # zero-skip granularity
SYNC_EVERY = 64 * 1024 * 1024  # bytes written between two background fdatasyncs

# libc's memcmp through ctypes: it compares without a copy and without the GIL (ctypes lets it
# go for the call), where ``view[a:b].tobytes() == zeros`` copies every granule and holds the
# GIL, which the thread hashing the image needs (4 GB/s against 16 GB/s here).
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_memcmp.restype = ctypes.c_int


def all_zero(view: memoryview, address: int, start: int, end: int) -> bool:
    """Whether ``view[start:end]`` (at ``address`` in memory) is all zeros: its first byte is,
    and every byte equals the next one (one pass over the memory, no second buffer)."""
    if end <= start:
        return True
    # Data almost never starts or ends a granule with a zero byte: those cost nothing.
    if view[start] != 0 or view[end - 1] != 0:
        return False
    return bool(_memcmp(address + start, address + start + 1, end - start - 1) == 0)


class DiskWriter:
    def __init__(
        self,
        fd: int,
        dfd: int | None,
        *,
        size: int,
        skip_zeros: bool = False,
        cancel: threading.Event | None = None,
        buffers: int = 16,
        buffer_size: int = BUFFER,
        block: int = 4096,
        writers: int = 2,
    ) -> None:
        self.fd, self.dfd, self.size = fd, dfd, size
        self.skip_zeros = skip_zeros
        self.stop = threading.Event()          # set when this writer must stop
        self.cancel = cancel                    # the command's cancel event (only read)
        self.block = max(512, block)
        self.buffer_size = buffer_size
        self._maps = [mmap.mmap(-1, buffer_size) for _ in range(buffers)]
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(buffers):
            self._free.put(i)
        self._views = [memoryview(m) for m in self._maps]
        self._pins = [ctypes.c_char.from_buffer(m) for m in self._maps]  # for the addresses
        self._addresses = [ctypes.addressof(c) for c in self._pins]
        self._todo: queue.Queue[tuple[int, int, int] | None] = queue.Queue()
        self.written = 0
        self.skipped = 0
        self._count = threading.Lock()
        self.error: BaseException | None = None
        self._closed = False
        self._sync_due = threading.Event()
        self._synced = 0                        # `written` when the last background sync was asked
        self._threads = [
            threading.Thread(target=self._loop, name=f"disk-writer-{k}", daemon=True) for k in range(writers)
        ]
        self._syncer = threading.Thread(target=self._sync_loop, name="disk-sync", daemon=True)
        for t in (*self._threads, self._syncer):
            t.start()

    # -- producer side -------------------------------------------------------------------

    def take(self) -> memoryview:
        """A free buffer; raises the writer's error, or Cancelled when stopped."""
        while True:
            self._raise_if_failed()
            try:
                i = self._free.get(timeout=0.1)
                return self._views[i]
            except queue.Empty:
                continue

    def submit(self, buf: memoryview, offset: int, length: int) -> None:
        """Write ``buf[:length]`` at ``offset`` (then the buffer goes back to the pool)."""
        self._raise_if_failed()
        i = next(k for k, v in enumerate(self._views) if v is buf)
        if offset + length > self.size:
            self._free.put(i)
            raise AgentError(
                f"the image does not fit: writing up to byte {offset + length} of a {self.size}-byte disk",
                reason=Reason.TOO_LARGE,
            )
        self._todo.put((i, offset, length))

    def give_back(self, buf: memoryview) -> None:
        """Return an unused buffer."""
        i = next(k for k, v in enumerate(self._views) if v is buf)
        self._free.put(i)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.stop.is_set() or (self.cancel is not None and self.cancel.is_set()):
            raise Cancelled("write stopped")

    # -- writer thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while (item := self._todo.get()) is not None:
            i, offset, length = item
            try:
                if self.error is None and not self.stop.is_set() and not (
                    self.cancel is not None and self.cancel.is_set()
                ):
                    self._write(i, offset, length)
            except BaseException as exc:
                if self.error is None:
                    self.error = exc
                break
            finally:
                self._free.put(i)
        else:
            return
        while self._todo.get() is not None:  # keep the producer from blocking
                pass

    def _write(self, i: int, offset: int, length: int) -> None:
        view = self._views[i]
        if not self.skip_zeros:
            self._pwrite(view, offset, 0, length)
            return
        run_start = -1
        pos = 0
        while pos < length:
            end = min(pos + GRANULE, length)
            if all_zero(view, self._addresses[i], pos, end):
                if run_start >= 0:
                    self._pwrite(view, offset, run_start, pos)
                    run_start = -1
                with self._count:
                    self.skipped += end - pos
            elif run_start < 0:
                run_start = pos
            pos = end
        if run_start >= 0:
            self._pwrite(view, offset, run_start, length)

    def _sync_loop(self) -> None:
        """fdatasync whenever SYNC_EVERY more bytes were written: the device flushes its cache
        (and a file target's filesystem commits its blocks) while the deploy goes on, instead
        of all of it in the final fsync. (The sixteen buffers let the producer run on while a
        sync holds the writers up.) A failure here is left to the final fsync to report."""
        while not self._closed:
            if self._sync_due.wait(0.1) and not self._closed:
                self._sync_due.clear()
                with contextlib.suppress(OSError):
                    os.fdatasync(self.dfd if self.dfd is not None else self.fd)

    def _pwrite(self, view: memoryview, base: int, start: int, end: int) -> None:
        """Write view[start:end] at base+start, aligned part direct, unaligned tail buffered."""
        pos = start
        if self.dfd is not None:
            aligned_end = start + (end - start) // self.block * self.block
            while pos < aligned_end:
                pos += os.pwrite(self.dfd, view[pos:aligned_end], base + pos)
        while pos < end:
            pos += os.pwrite(self.fd, view[pos:end], base + pos)
        with self._count:
            self.written += end - start
            if self.written - self._synced >= SYNC_EVERY:
                self._synced = self.written
                self._sync_due.set()

    # -- end -----------------------------------------------------------------------------

    def close(self, *, sync: bool = True) -> None:
        """Wait for the queued writes, fsync, release the buffers; raise the writer's error."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._todo.put(None)
        for t in self._threads:
            t.join()
        self._syncer.join()
        for v in self._views:
            v.release()
        self._pins.clear()  # a mapping with exported pointers cannot be closed
        for m in self._maps:
            m.close()
        if self.error is not None:
            raise self.error
        if sync:
            if self.dfd is not None:
                os.fsync(self.dfd)
            os.fsync(self.fd)

    def __enter__(self) -> DiskWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is not None:
            self.stop.set()
            with contextlib.suppress(BaseException):  # the first error is the one to report
                self.close(sync=False)
        else:
            self.close()
