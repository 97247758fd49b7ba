"""The kernel's log, read in-band: through syslog(2) in one call where the kernel allows it, else
/dev/kmsg a record at a time (the slower way, under emulation above all). logs.collect sends it;
the Xid catalogue (agent/policy/xid.py) reads GPU events out of it."""

from __future__ import annotations

import ctypes
import errno
import os


def read(cap: int) -> bytes | None:
    """The kernel log as dmesg prints it: the ring buffer, else /dev/kmsg; None if neither reads."""
    data = read_ring_buffer()
    return data if data is not None else read_kmsg(cap)


SYSLOG_ACTION_READ_ALL, SYSLOG_ACTION_SIZE_BUFFER = 3, 10


def read_ring_buffer() -> bytes | None:
    """The kernel's log buffer through syslog(2) (glibc's klogctl); None where it is refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        size = int(libc.klogctl(SYSLOG_ACTION_SIZE_BUFFER, None, 0))
        if size <= 0:
            return None
        buf = ctypes.create_string_buffer(size)
        got = int(libc.klogctl(SYSLOG_ACTION_READ_ALL, buf, size))
    except (OSError, AttributeError):
        return None
    return buf.raw[:got] if got >= 0 else None


def read_kmsg(cap: int) -> bytes | None:
    """The kernel ring buffer from /dev/kmsg (non-blocking), formatted like dmesg; None if
    /dev/kmsg cannot be read."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    lines: list[bytes] = []
    size = 0
    try:
        while True:
            try:
                record = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: continue with the next
                    continue
                raise
            if not record:
                break
            head, _, text = record.partition(b";")
            fields = head.split(b",")
            usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
            message = text.split(b"\n", 1)[0]
            line = b"[%12.6f] %s\n" % (usec / 1e6, message)
            lines.append(line)
            size += len(line)
            while size > 2 * cap and lines:
                size -= len(lines.pop(0))
    finally:
        os.close(fd)
    return b"".join(lines)
