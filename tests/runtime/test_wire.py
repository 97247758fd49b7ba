"""Framing: length prefix, hard size limit, malformed frames, the Channel's I/O loop."""

from __future__ import annotations

import queue
import socket
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.link import wire
from agent.proto import session_pb2


def _frame(n: int = 0) -> session_pb2.Frame:
    return session_pb2.Frame(heartbeat=session_pb2.Heartbeat(seq=n, time_unix_ms=1))


def test_encode_is_length_prefixed_big_endian() -> None:
    frame = session_pb2.Frame(ack=session_pb2.Ack(command_id="c1"))
    data = wire.encode(frame)
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert wire.Decoder().feed(data) == [frame]


def test_encode_refuses_oversized_frames() -> None:
    frame = session_pb2.Frame(log=session_pb2.LogLine(message="x" * 2000))
    with pytest.raises(wire.WireError) as err:
        wire.encode(frame, max_bytes=1000)
    assert err.value.code == wire.FRAME_TOO_LARGE


def test_decoder_reassembles_byte_by_byte() -> None:
    frames = [session_pb2.Frame(ack=session_pb2.Ack(command_id=f"c{i}")) for i in range(5)]
    data = b"".join(wire.encode(f) for f in frames)
    dec = wire.Decoder()
    out: list[session_pb2.Frame] = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    assert out == frames
    assert dec.buffered == 0


def test_decoder_refuses_an_oversized_header_before_the_body_arrives() -> None:
    dec = wire.Decoder(max_bytes=1024)
    with pytest.raises(wire.WireError) as err:
        dec.feed(struct.pack(">I", 1025))
    assert err.value.code == wire.FRAME_TOO_LARGE


@pytest.mark.parametrize(
    "body",
    [b"\xff\xff\xff", b"\x0a\x05abc", b"", b"\x08\x01"],  # garbage, truncated field, empty, unknown-only
    ids=["garbage", "truncated-field", "empty", "no-message"],
)
def test_decoder_malformed_frames(body: bytes) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.Decoder().feed(struct.pack(">I", len(body)) + body)
    assert err.value.code == wire.MALFORMED_FRAME


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_decoder_never_raises_anything_but_wire_error(data: bytes) -> None:
    dec = wire.Decoder(max_bytes=4096)
    try:
        for frame in dec.feed(data):
            assert frame.WhichOneof("msg") is not None
    except wire.WireError as exc:
        assert exc.code in (wire.FRAME_TOO_LARGE, wire.MALFORMED_FRAME)


def _pair(**kwargs: object) -> tuple[wire.Channel, socket.socket, queue.Queue[session_pb2.Frame], list[str]]:
    a, b = socket.socketpair()
    got: queue.Queue[session_pb2.Frame] = queue.Queue()
    closed: list[str] = []
    ch = wire.Channel(a, got.put, closed.append, name="test", **kwargs)  # type: ignore[arg-type]
    return ch.start(), b, got, closed


def test_channel_delivers_frames_both_ways() -> None:
    ch, peer, got, closed = _pair()
    try:
        for i in range(100):
            ch.send(session_pb2.Frame(ack=session_pb2.Ack(command_id=f"c{i}")))
        for i in range(100):
            assert wire.recv_frame(peer, 10).ack.command_id == f"c{i}"
        big = session_pb2.Frame(log=session_pb2.LogLine(message="y" * 1_000_000))
        peer.setblocking(True)
        import threading

        threading.Thread(target=peer.sendall, args=(wire.encode(big),), daemon=True).start()
        assert got.get(timeout=10) == big
    finally:
        ch.close("done")
        ch.join(5)
        peer.close()
    assert closed == ["done"]


def test_channel_answers_oversized_frame_with_error_then_closes() -> None:
    ch, peer, got, closed = _pair(max_frame_bytes=1024)
    peer.sendall(struct.pack(">I", 10_000) + b"\0" * 100)
    reply = wire.recv_frame(peer, 10)
    assert reply.error.code == wire.FRAME_TOO_LARGE
    assert ch.closed.wait(10)
    assert closed == [wire.FRAME_TOO_LARGE]
    assert got.empty()
    peer.close()


def test_channel_answers_malformed_frame_with_error_then_closes() -> None:
    ch, peer, got, closed = _pair()
    good = wire.encode(session_pb2.Frame(ack=session_pb2.Ack(command_id="before")))
    peer.sendall(good + struct.pack(">I", 3) + b"\xff\xff\xff")
    assert got.get(timeout=10).ack.command_id == "before"
    assert wire.recv_frame(peer, 10).error.code == wire.MALFORMED_FRAME
    assert ch.closed.wait(10)
    assert closed == [wire.MALFORMED_FRAME]
    peer.close()


def test_channel_sends_heartbeats_and_detects_a_dead_peer() -> None:
    ch, peer, _got, closed = _pair(heartbeat_interval=0.05, dead_after=0.5)
    seen = [wire.recv_frame(peer, 10) for _ in range(3)]
    assert all(f.WhichOneof("msg") == "heartbeat" for f in seen)
    assert [f.heartbeat.seq for f in seen] == [1, 2, 3]
    # The peer sends nothing at all: the channel gives up on it.
    assert ch.closed.wait(10)
    assert closed == [wire.PEER_DEAD]
    peer.close()


def test_channel_heartbeats_from_the_peer_keep_it_alive() -> None:
    ch, peer, got, _closed = _pair(dead_after=0.4)
    start = time.monotonic()
    while time.monotonic() - start < 1.2:
        wire.send_frame(peer, _frame())
        time.sleep(0.05)
    assert not ch.closed.is_set()
    assert got.empty()  # heartbeats are handled by the channel, not passed on
    ch.close("done")
    assert ch.closed.wait(10)
    peer.close()


def test_channel_notices_the_peer_closing() -> None:
    ch, peer, _got, closed = _pair()
    peer.close()
    assert ch.closed.wait(10)
    assert closed == [wire.PEER_CLOSED]
    assert not ch.send(_frame())


def test_channel_close_flushes_what_is_queued() -> None:
    ch, peer, _got, closed = _pair()
    for i in range(50):
        ch.send(session_pb2.Frame(ack=session_pb2.Ack(command_id=f"c{i}")))
    ch.close("bye", error=wire.error_frame("test", "last"))
    frames = [wire.recv_frame(peer, 10) for _ in range(51)]
    assert frames[-1].error.code == "test"
    assert ch.closed.wait(10)
    assert closed == ["bye"]
    peer.close()


def test_recv_frame_reports_a_truncated_frame() -> None:
    a, b = socket.socketpair()
    b.sendall(struct.pack(">I", 100) + b"abc")
    b.close()
    with pytest.raises(wire.WireError) as err:
        wire.recv_frame(a, 5)
    assert err.value.code == wire.PEER_CLOSED
    a.close()
