"""A local qcow2 file deployed without a manifest (qemu-img convert) and with one (the agent's
own reader, agent/images/qcow2.py) is deployed, or refused, the same way: files made by the
real qemu-img, then cut or made with features the reader refuses, deployed into a file disk,
and ``agent manifest``'s reader fed the same files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent import proc
from agent.errors import SourceFailed, Unsupported
from agent.images import manifest
from agent.proto import agent_pb2
from tests.commands.test_deploy import Target, deploy, request
from tests.images.test_qcow2stream import mixed_image, qcow2_of

Fmt = agent_pb2.ImageFormat

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")


def test_an_l2_entry_past_the_end_of_the_file_is_refused_before_writing(tmp_path: Path) -> None:
    """qemu-img convert reads the missing clusters as zeros and exits 0: the agent's reader
    refuses the file first (as it does with a manifest), the disk untouched."""
    t = Target(tmp_path)
    cut = qcow2_of(tmp_path, mixed_image())[:-70000]      # its last data clusters gone
    path = tmp_path / "cut.qcow2"
    path.write_bytes(cut)
    # what qemu-img alone would have done: convert without a word
    proc.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(path), str(tmp_path / "out.raw")])
    with pytest.raises(SourceFailed, match=r"outside the \d+-byte file"):
        deploy(request(path, cut, format=Fmt.QCOW2), t.disks)
    assert t.untouched()
    with pytest.raises(SourceFailed, match="truncated"):
        manifest.build(path)                            # the manifest's reader: refused as well


@pytest.mark.parametrize(("opts", "match"), [
    (("-c", "-o", "compression_type=zstd"), "zstd"),
    (("-o", "extended_l2=on"), "extended L2"),
])
def test_features_the_manifest_refuses_are_refused_without_one(tmp_path: Path, opts: tuple[str, ...],
                                                                match: str) -> None:
    """zstd clusters and extended L2 entries: ``agent manifest`` refuses them, and so does a
    deploy without a manifest (it used to hand them to qemu-img), nothing written."""
    t = Target(tmp_path)
    try:
        published = qcow2_of(tmp_path, mixed_image(), *opts)
    except Exception:
        pytest.skip(f"this qemu-img cannot make {' '.join(opts)}")
    path = tmp_path / "img.qcow2"
    with pytest.raises(Unsupported, match=match):
        manifest.build(path)
    with pytest.raises(Unsupported, match=match):
        deploy(request(path, published, format=Fmt.QCOW2), t.disks)
    assert t.untouched()


def test_a_whole_file_still_deploys(tmp_path: Path) -> None:
    t = Target(tmp_path)
    img = mixed_image()
    published = qcow2_of(tmp_path, img, "-c")
    deploy(request(tmp_path / "img.qcow2", published, format=Fmt.QCOW2), t.disks)
    assert t.data()[: len(img)] == img
