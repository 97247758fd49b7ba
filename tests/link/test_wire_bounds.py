"""agent/link/wire.py's send queue is bounded: a peer that stops reading gets the channel closed
with a named reason, never a sender that grows without bound (a real socket pair, a peer that
reads nothing)."""

from __future__ import annotations

import socket
import threading

from agent.link import wire
from agent.proto import session_pb2

FRAME = wire.error_frame("test", "x" * 16_000)     # about 16 KiB on the wire


def test_a_peer_that_reads_nothing_closes_the_channel_with_send_queue_full() -> None:
    ours, theirs = socket.socketpair()
    closed: list[str] = []
    bound = 256 * 1024
    channel = wire.Channel(ours, lambda frame: None, closed.append, name="bounded",
                           max_queued_bytes=bound).start()
    try:
        sent = 0
        while channel.send(FRAME):
            sent += 1
            assert channel.queued() * len(wire.encode(FRAME)) <= bound + 65536
            assert sent < 10_000, "the queue took 160 MB without refusing"
        assert channel.closed.wait(5)
        assert channel.close_reason == wire.SEND_QUEUE_FULL
        assert closed == [wire.SEND_QUEUE_FULL]
        assert channel.queued() == 0                  # what was queued is dropped, not kept
        assert not channel.send(FRAME)                # and the closed channel takes nothing more
        # Refused no earlier than the bound: the frames taken fill it (some written meanwhile).
        assert (sent + 1) * len(wire.encode(FRAME)) > bound
    finally:
        channel.abort("test over")
        channel.join(5)
        theirs.close()


def test_a_peer_that_reads_gets_everything_under_the_same_bound() -> None:
    ours, theirs = socket.socketpair()
    channel = wire.Channel(ours, lambda frame: None, name="reader",
                           max_queued_bytes=256 * 1024).start()
    got: list[session_pb2.Frame] = []
    decoder = wire.Decoder()

    def read() -> None:
        while len(got) < 200:
            data = theirs.recv(65536)
            if not data:
                return
            got.extend(decoder.feed(data))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(200):
            while channel.queued() * len(wire.encode(FRAME)) > 128 * 1024:   # a sender that waits
                channel.flush(0.05)
            assert channel.send(FRAME)
        reader.join(10)
        assert len(got) == 200 and not channel.closed.is_set()
    finally:
        channel.abort("test over")
        channel.join(5)
        theirs.close()
