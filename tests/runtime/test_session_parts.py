"""Pieces of agent/session.py that need no network: addresses, backoff, Hello size."""

from __future__ import annotations

import random

import pytest

from agent import wire
from agent.errors import InvalidParameters
from agent.proto import session_pb2
from agent.session import _fit_hello, backoff_delay, parse_address


def test_parse_address() -> None:
    assert parse_address("gw.example:7443") == ("gw.example", 7443)
    assert parse_address("[fd00::1]:7443") == ("fd00::1", 7443)
    for bad in ("gw", "gw:", ":7443", "gw:port"):
        with pytest.raises(InvalidParameters):
            parse_address(bad)


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    rng = random.Random(1)
    for attempt in range(12):
        ceiling = min(30.0, 0.5 * 2**attempt)
        samples = [backoff_delay(attempt, 0.5, 30.0, rng) for _ in range(200)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > 0.8 * ceiling  # spread over the whole range (full jitter)
        assert min(samples) < 0.2 * ceiling
    assert backoff_delay(1000, 0.5, 30.0) <= 30.0


def test_hello_keeps_under_the_frame_limit() -> None:
    big = [session_pb2.SignedResult(body=bytes([i]) * (1024 * 1024)) for i in range(6)]
    hello = session_pb2.Hello(node_id="n", unacked_results=big)
    later = _fit_hello(hello, wire.MAX_FRAME_BYTES)
    assert len(hello.unacked_results) + len(later) == 6
    assert later and len(hello.unacked_results) >= 2
    assert len(wire.encode(session_pb2.Frame(hello=hello))) <= wire.MAX_FRAME_BYTES
    small = session_pb2.Hello(node_id="n", unacked_results=big[:1])
    assert _fit_hello(small, wire.MAX_FRAME_BYTES) == [] and len(small.unacked_results) == 1
