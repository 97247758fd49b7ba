"""This boot's kept disk.wipe results (agent/security/erasure.py): what counts as a certificate
of this release, and why the rest does not."""

from __future__ import annotations

import os
from pathlib import Path

from agent.proto import agent_pb2, common_pb2, session_pb2
from agent.security import erasure
from agent.security.trust import NodeKey

BOOT = "0f3c8a9e-4b1d-4c5e-9a7b-2d6e8f1a3b5c"


def certificate(name: str, serial: str, verified: bool = True,
                error: str = "") -> agent_pb2.ErasureCertificate:
    return agent_pb2.ErasureCertificate(node_id="n1", disk=common_pb2.DiskIdentity(name=name, serial=serial),
                                        method=agent_pb2.NVME_FORMAT_USER_DATA, verified=verified,
                                        error=error)


def signed(key: NodeKey, *certs: agent_pb2.ErasureCertificate, boot: str = BOOT, kind: str = "disk.wipe",
           status: int = session_pb2.SUCCEEDED) -> session_pb2.SignedResult:
    body = session_pb2.ResultBody(command_id="c", kind=kind, node_id="n1", boot_id=boot, status=status,  # type: ignore[arg-type]
                                  payload=agent_pb2.WipeResult(certificates=certs).SerializeToString())
    return key.sign_result(body)


def test_a_verified_certificate_of_this_boot_counts_with_its_signed_result(tmp_path: Path) -> None:
    key = NodeKey.generate()
    result = signed(key, certificate("nvme0n1", "S1"), certificate("nvme1n1", "S2"))
    erasure.keep(tmp_path, "cmd-1", result)
    got = erasure.certified(tmp_path, key.public_raw, BOOT)
    assert [c.disk.serial for c in got.certificates] == ["S1", "S2"] and got.refused == []
    assert got.results == [result.SerializeToString(deterministic=True)] * 2
    files = list((tmp_path / erasure.WIPES).iterdir())
    assert [f.name for f in files] != ["cmd-1"] and len(files) == 1     # named by a digest, not the id
    assert files[0].stat().st_mode & 0o777 == 0o600


def test_what_does_not_count_is_said_why(tmp_path: Path) -> None:
    key, forger = NodeKey.generate(), NodeKey.generate()
    erasure.keep(tmp_path, "other-boot", signed(key, certificate("a", "SA"), boot="another-boot"))
    erasure.keep(tmp_path, "forged", signed(forger, certificate("b", "SB")))
    erasure.keep(tmp_path, "failed", signed(key, certificate("c", "SC"), status=session_pb2.FAILED))
    erasure.keep(tmp_path, "kind", signed(key, certificate("d", "SD"), kind="inventory.refresh"))
    erasure.keep(tmp_path, "unverified", signed(key, certificate("e", "SE", verified=False),
                                                certificate("f", "SF", error="sanitize failed")))
    (tmp_path / erasure.WIPES / "junk.pb").write_bytes(b"\xff\xff not a protobuf")
    got = erasure.certified(tmp_path, key.public_raw, BOOT)
    assert got.certificates == [] and got.results == []
    text = "\n".join(got.refused)
    for why in ("signed in boot another-boot", "does not match node key", "FAILED", "'inventory.refresh'",
                "e: not verified (no verification)", "f: not verified (sanitize failed)"):
        assert why in text, why
    assert len(got.refused) == 7                                   # the junk file too


def test_at_most_max_kept_results_are_kept(tmp_path: Path) -> None:
    key = NodeKey.generate()
    for i in range(erasure.MAX_KEPT + 3):
        erasure.keep(tmp_path, f"cmd-{i}", signed(key, certificate(f"d{i}", f"S{i}")))
        path = max((tmp_path / erasure.WIPES).iterdir(), key=lambda p: p.stat().st_mtime_ns)
        os.utime(path, ns=(i * 10**9, i * 10**9))                   # one a second: a stable order
    assert len(list((tmp_path / erasure.WIPES).iterdir())) == erasure.MAX_KEPT
    got = erasure.certified(tmp_path, key.public_raw, BOOT)
    assert got.certificates[0].disk.serial == f"S{erasure.MAX_KEPT + 2}"   # newest first
    assert "S0" not in {c.disk.serial for c in got.certificates}


def test_the_node_key_is_read_from_the_state_directory(tmp_path: Path) -> None:
    assert erasure.node_public_key(tmp_path) is None
    key = NodeKey.load_or_create(tmp_path / "node.key")
    assert erasure.node_public_key(tmp_path) == key.public_raw
