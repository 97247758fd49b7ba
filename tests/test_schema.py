"""Every kind has a request and a result message; generated code matches the .proto files."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

from agent import catalog, schema
from agent.errors import InvalidParameters

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(catalog.KINDS))
def test_every_kind_has_request_and_result(name: str) -> None:
    request = schema.payload_class(name)
    assert request.DESCRIPTOR.full_name == catalog.KINDS[name].payload
    result = schema.result_class(name)
    assert result.DESCRIPTOR.full_name.startswith("bettercompute.")


def test_payload_json_round_trip() -> None:
    msg = schema.payload_from_json(
        "deploy.image",
        '{"url": "https://images.example/ubuntu.img.zst", "format": "ZSTD",'
        ' "digest": {"algorithm": "sha256", "hex": "ab"}, "target": {"serial": "S1"}}',
    )
    assert msg.target.serial == "S1"
    again = schema.decode_payload("deploy.image", msg.SerializeToString())
    assert again == msg


def test_bad_payload_json_is_a_clear_error() -> None:
    with pytest.raises(InvalidParameters, match=r"does not fit bettercompute\.agent\.v1\.WipeRequest"):
        schema.payload_from_json("disk.wipe", '{"no_such_field": 1}')
    with pytest.raises(InvalidParameters):
        schema.decode_payload("disk.wipe", b"\xff\xff\xff")


def test_regenerating_protobuf_code_gives_no_diff(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the code")
    subprocess.run([sys.executable, str(ROOT / "build" / "protos.py"), "--out", str(tmp_path)], check=True)
    generated = sorted((tmp_path / "agent" / "proto").glob("*_pb2.py*"))
    assert generated, "protoc wrote nothing"
    for path in generated:
        committed = ROOT / "agent" / "proto" / path.name
        assert committed.exists(), f"{path.name} is generated but not committed"
        assert filecmp.cmp(path, committed, shallow=False), f"{path.name} differs: run build/protos.py"
    committed_names = {p.name for p in (ROOT / "agent" / "proto").glob("*_pb2.py*")}
    assert committed_names == {p.name for p in generated}
