"""Bounded input on every path: each parser fed random and adversarial input (hypothesis) ends
in a value or a clear refusal (InvalidParameters, HttpError), never an internal error."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import catalog, limits, schema
from agent.cli import settings as agent_settings
from agent.commands import HandlerTable
from agent.errors import AgentError, InvalidParameters
from agent.net import http
from agent.runtime.journal import MAGIC, scan
from agent.security.trust import decode_command_body
from tests.runtime.harness import AGENT_MAIN, ROOT

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
KINDS = sorted(catalog.KINDS)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def nested(levels: int, kind: str = "list") -> str:
    if kind == "list":
        return "[" * levels + "]" * levels
    return '{"a":' * levels + "1" + "}" * levels


ADVERSARIAL_JSON = [nested(100_000), nested(100_000, "dict"), nested(33), nested(1000, "dict"),
                    "[" * 100_000, '"' + "\\" * 10_001, "1" * 5_000_000, "\ud800", "{" + '"a":1,' * 1000]


# -- JSON --------------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200), st.sampled_from(ADVERSARIAL_JSON)))
def test_loads_json_returns_a_value_or_refuses(text: str | bytes) -> None:
    try:
        value = limits.loads_json(text, what="fuzz")
    except InvalidParameters:
        return
    assert limits.depth(value) <= limits.MAX_JSON_DEPTH


def test_loads_json_limits() -> None:
    assert limits.loads_json(nested(limits.MAX_JSON_DEPTH), what="x") is not None
    for text, words in ((nested(limits.MAX_JSON_DEPTH + 1), "deeper"), (nested(100_000), "deeper"),
                        (nested(100_000, "dict"), "deeper"), (" " * (limits.MAX_JSON_BYTES + 1), "over")):
        with pytest.raises(InvalidParameters, match=words):
            limits.loads_json(text, what="x")


@FUZZ
@given(st.sampled_from(KINDS),
       st.one_of(json_values.map(json.dumps), st.text(max_size=100), st.sampled_from(ADVERSARIAL_JSON)))
def test_payload_from_json_fits_the_kind_or_refuses(kind: str, text: str) -> None:
    try:
        msg = schema.payload_from_json(kind, text)
    except InvalidParameters:
        return
    assert msg.DESCRIPTOR.full_name == catalog.KINDS[kind].payload


# -- protobuf ----------------------------------------------------------------------------------


def deep_groups(levels: int) -> bytes:
    return b"\x0b" * levels + b"\x0c" * levels  # field 1 start-group ... end-group


def deep_messages(levels: int) -> bytes:
    data = b""
    for _ in range(levels):
        data = b"\x0a" + _varint(len(data)) + data  # field 1, length-delimited, around the rest
    return data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


ADVERSARIAL_PROTO = [deep_groups(100_000), deep_groups(200), deep_messages(5_000), b"\x0b" * 100_000,
                     b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 20]


@FUZZ
@given(st.sampled_from(KINDS), st.one_of(st.binary(max_size=300), st.sampled_from(ADVERSARIAL_PROTO)))
def test_decode_payload_parses_or_refuses(kind: str, data: bytes) -> None:
    with contextlib.suppress(InvalidParameters):
        schema.decode_payload(kind, data)


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.sampled_from(ADVERSARIAL_PROTO)))
def test_command_body_parses_or_refuses(data: bytes) -> None:
    with contextlib.suppress(InvalidParameters):
        decode_command_body(data)


STRINGS = ["", "/", "/dev/sda", "../../etc/passwd", "\x00", "a" * 5000, "-rf", "--help", "http://127.0.0.1:1/x",
           "https://[::1]/", "file:///etc/shadow", "é☃", "0" * 64, "nvme0n1", " ", "1", "a;reboot", "$(id)"]
INTEGERS = [0, 1, -1, 7, 2**31 - 1, -2**31, 2**32 - 1, 2**63 - 1, -2**63, 2**64 - 1, 10**12]


def _scalar(field: Any, rnd: random.Random) -> Any:  # a FieldDescriptor (two implementations)
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return rnd.choice(STRINGS)
    if t == FieldDescriptor.TYPE_BYTES:
        return rnd.choice([b"", b"\x00" * 32, b"x" * 100])
    if t == FieldDescriptor.TYPE_BOOL:
        return rnd.random() < 0.5
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rnd.choice([0.0, -1.0, 1e308, float("inf"), float("nan"), 0.5])
    if t == FieldDescriptor.TYPE_ENUM:
        return rnd.choice([v.number for v in field.enum_type.values] + [99])
    return rnd.choice(INTEGERS)


def fill(msg: Message, rnd: random.Random, depth: int = 0) -> None:
    """Set a random subset of a message's fields to adversarial values, recursively."""
    for field in msg.DESCRIPTOR.fields:
        if rnd.random() < 0.4:
            continue
        entry: Any = field.message_type
        with contextlib.suppress(TypeError, ValueError):  # a value out of the field's range
            if entry is not None and entry.GetOptions().map_entry:
                entries = getattr(msg, field.name)
                value_field = entry.fields_by_name["value"]
                for _ in range(rnd.randrange(3)):
                    key = _scalar(entry.fields_by_name["key"], rnd)
                    if value_field.message_type is not None:
                        fill(entries[key], rnd, depth + 1)
                    else:
                        entries[key] = _scalar(value_field, rnd)
            elif field.is_repeated:
                items = getattr(msg, field.name)
                for _ in range(rnd.randrange(4)):
                    if field.message_type is None:
                        items.append(_scalar(field, rnd))
                    elif depth < 4:
                        fill(items.add(), rnd, depth + 1)
            elif field.message_type is not None:
                if depth < 4:
                    fill(getattr(msg, field.name), rnd, depth + 1)
                    getattr(msg, field.name).SetInParent()
            else:
                setattr(msg, field.name, _scalar(field, rnd))


HANDLERS_BY_KIND = HandlerTable()


@FUZZ
@given(st.sampled_from(sorted(HANDLERS_BY_KIND)), st.randoms(use_true_random=False))
def test_every_handler_parse_accepts_or_refuses_adversarial_payloads(kind: str, rnd: random.Random) -> None:
    """The handler's parse is each kind's parser: typed parameters or InvalidParameters (and
    ``agent exec`` turns that into exit 2), never another exception."""
    handler = HANDLERS_BY_KIND[kind]
    msg = schema.payload_class(kind)()
    fill(msg, rnd)
    with contextlib.suppress(InvalidParameters):   # any other error fails the test
        handler.parse(msg)


# -- config file and kernel command line -------------------------------------------------------


@FUZZ
@given(st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()),
                 st.sampled_from([t.encode("utf-8", "surrogatepass") for t in ADVERSARIAL_JSON])))
def test_config_file_loads_or_refuses(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("cfg") / "agent.json"
    path.write_bytes(data)
    with contextlib.suppress(InvalidParameters):
        agent_settings.load({}, path, "")


def test_an_oversized_or_deep_config_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text('{"gateway": "' + "x" * limits.MAX_CONFIG_BYTES + '"}')
    with pytest.raises(InvalidParameters, match="over its limit"):
        agent_settings.read_config_file(big)
    deep = tmp_path / "deep.json"
    deep.write_text('{"gateway": ' + nested(100_000) + "}")
    with pytest.raises(InvalidParameters, match="deeper"):
        agent_settings.read_config_file(deep)


@FUZZ
@given(st.one_of(st.text(max_size=300), st.sampled_from(['bc.node="unclosed', "bc.trust=" + "," * 1000,
                                                         "bc.heartbeat=nan", "bc.role=\x00", "bc.=x =y"])))
def test_kernel_command_line_loads_or_refuses(text: str) -> None:
    agent_settings.parse_cmdline(text)
    with contextlib.suppress(InvalidParameters):
        agent_settings.load({}, None, text)


def test_an_oversized_command_line_file_is_refused(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    agent_settings.add_arguments(parser)
    big = tmp_path / "cmdline"
    big.write_text("bc.node=n1 " + "quiet " * limits.MAX_CMDLINE_BYTES)
    with pytest.raises(InvalidParameters, match="kernel command line"):
        agent_settings.load_from_args(parser.parse_args(["--cmdline-file", str(big)]))
    big.write_text("bc.node=n1 quiet")
    loaded = agent_settings.load_from_args(parser.parse_args(["--cmdline-file", str(big)]))
    assert loaded.config.node_id == "n1"


# -- journal records ---------------------------------------------------------------------------


def test_a_journal_record_nested_too_deeply_is_skipped_not_fatal() -> None:
    payload = nested(100_000).encode()
    length = struct.pack(">I", len(payload))
    record = MAGIC + length + struct.pack(">I", zlib.crc32(length + payload)) + payload
    result = scan(record)
    assert result.records == [] and result.torn_tail == len(record)


# -- HTTP response headers ---------------------------------------------------------------------


@pytest.fixture
def bad_server() -> Iterator[tuple[str, list[bytes]]]:
    """Answers each connection with the next canned response (and closes)."""
    answers: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                if answers:
                    with contextlib.suppress(OSError):
                        conn.sendall(answers.pop(0))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/x", answers
    stop.set()
    t.join(2)
    server.close()


HEADER_BOMBS = [
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(1000)) + b"\r\nbody",
    b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 200_000 + b"\r\n\r\nbody",
    b"HTTP/1.1 200 " + b"O" * 200_000 + b"\r\n\r\n",
    b"\x00\xff garbage\r\n\r\n",
]
ODD = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nbody",
    b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nbody",
    b"HTTP/1.1 206 Partial\r\nContent-Range: bytes 0-1/99999999999999999999999999\r\n\r\nbody",
]


@pytest.mark.parametrize("response", HEADER_BOMBS + ODD)
def test_http_responses_with_unbounded_headers_are_refused(bad_server: tuple[str, list[bytes]],
                                                           response: bytes) -> None:
    """Too many header lines, a line too long: refused (http.client's bounds: 100 headers of at
    most 64 KiB each). Odd lengths: read or refused with a reason, never an internal error."""
    url, answers = bad_server
    opts = http.HttpOptions(max_retries=0, timeout=5)
    answers.append(response)
    try:
        with http.get(url, opts) as dl:
            while dl.read():
                pass
        refused = False
    except AgentError:
        refused = True
    assert refused or response in ODD
    answers.append(response)
    try:
        http.put(url, b"data", opts)
        refused = False
    except AgentError:
        refused = True
    assert refused or response in ODD


# -- agent exec: exit 2, never 70 --------------------------------------------------------------


def agent_exec(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BC_TEST_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    (tmp_path / "spec").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(AGENT_MAIN), "exec", "--node", "n1", "--state-dir", str(tmp_path / "st"), *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )


def test_agent_exec_refuses_unbounded_input_with_exit_2(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(nested(100_000))
    deep_object = tmp_path / "deep-object.json"
    deep_object.write_text(nested(100_000, "dict"))
    big = tmp_path / "big.json"
    big.write_text('{"paths": ["' + "a" * limits.MAX_JSON_BYTES + '"]}')
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("x" * (limits.MAX_CMDLINE_BYTES + 1))
    cases: list[tuple[list[str], str]] = [
        (["inventory.refresh", "--payload", nested(5_000, "dict")], "nested deeper"),
        (["inventory.refresh", "--payload-file", str(deep)], "nested deeper"),
        (["logs.collect", "--payload-file", str(big)], "over its limit"),
        (["inventory.refresh", "--config", str(deep)], "nested deeper"),
        (["inventory.refresh", "--cmdline-file", str(cmdline)], "kernel command line"),
        (["inventory.refresh", "--signed-command", str(deep_object)], "nested deeper"),
    ]
    for args, words in cases:
        if "--cmdline-file" not in args:
            args = [*args, "--cmdline-file", "/dev/null"]
        done = agent_exec(tmp_path, *args)
        assert done.returncode == 2, (args[:2], done.returncode, done.stderr[-500:])
        assert words in done.stderr, done.stderr[-500:]
        assert "internal error" not in done.stderr
