"""Which chunk reader a manifest deploy's source allows (agent/images/readers.py's pick)."""

from __future__ import annotations

import pytest

from agent.errors import Unsupported
from agent.images import readers
from agent.images.readers import Reader
from agent.proto import agent_pb2

Fmt = agent_pb2.ImageFormat


@pytest.mark.parametrize(("fmt", "local", "ranged", "must_hash", "want"), [
    (Fmt.RAW, False, True, False, Reader.RANGE),     # data runs only, by Range
    (Fmt.RAW, False, True, True, Reader.STREAM),     # the whole file hashed: downloaded whole
    (Fmt.RAW, False, False, False, Reader.STREAM),   # a server without Range
    (Fmt.RAW, True, False, False, Reader.FILE),      # by offset, holes not read
    (Fmt.RAW, True, False, True, Reader.FILE),       # by offset; its digest on a thread of its own
    (Fmt.QCOW2, True, False, False, Reader.QCOW2),   # through its tables
    (Fmt.ZSTD, False, True, False, Reader.STREAM),   # compressed: in order
    (Fmt.GZIP, True, False, False, Reader.STREAM),
])
def test_pick(fmt: int, local: bool, ranged: bool, must_hash: bool, want: Reader) -> None:
    assert readers.pick(fmt, local=local, ranged=ranged, must_hash=must_hash) is want


def test_a_qcow2_image_over_http_is_refused() -> None:
    with pytest.raises(Unsupported, match="local_path"):
        readers.pick(Fmt.QCOW2, local=False, ranged=True, must_hash=False)
