"""Every kind has a request and a result message; generated code matches the .proto files."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

from agent import catalog, schema
from agent.commands import Handler, handler_class
from agent.errors import InvalidParameters

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(catalog.KINDS))
def test_every_kind_has_request_and_result(name: str) -> None:
    request = schema.payload_class(name)
    assert request.DESCRIPTOR.full_name == catalog.KINDS[name].payload
    result = schema.result_class(name)
    assert result.DESCRIPTOR.full_name == catalog.KINDS[name].result


@pytest.mark.parametrize("name", sorted(catalog.KINDS))
def test_every_kind_of_every_role_resolves_to_its_handler(name: str) -> None:
    """The catalog row names the module; the module's Handler serves the kind and declares the
    catalog's request type (Handler checks it when the class is made)."""
    kind = catalog.KINDS[name]
    cls = handler_class(name)
    assert cls is not None, f"{kind.handler_module} registers no handler for {name}"
    assert cls.__module__ == kind.handler_module
    assert cls.request_type.DESCRIPTOR.full_name == kind.payload


def test_a_handler_declaring_another_request_type_is_refused() -> None:
    from agent.proto import agent_pb2

    with pytest.raises(TypeError, match=r"deploy\.image takes bettercompute\.agent\.v1\.DeployImageRequest"):
        class Wrong(Handler[agent_pb2.WipeRequest, None], kind="deploy.image"):
            pass
    with pytest.raises(TypeError, match="not a kind of the catalog"):
        class Unknown(Handler[agent_pb2.WipeRequest, None], kind="disk.shred"):
            pass


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
    with pytest.raises(InvalidParameters, match=r"^disk\.wipe: the payload has no field 'no_such_field' "
                       r"\(WipeRequest's fields: disks, method, passes, verify, minimum_level, samples\)$"):
        schema.payload_from_json("disk.wipe", '{"no_such_field": 1}')
    with pytest.raises(InvalidParameters, match=r"^disk\.wipe: .* no field 'bogus' in 'disks\[0\]'"):
        schema.payload_from_json("disk.wipe", '{"disks": [{"bogus": 1}]}')
    with pytest.raises(InvalidParameters, match=r"does not fit bettercompute\.agent\.v1\.WipeRequest"):
        schema.payload_from_json("disk.wipe", '{"passes": "many"}')
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
