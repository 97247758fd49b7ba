"""This boot's erasure certificates, kept for the release report (docs/lifecycle.md, "Release").

The runtime keeps every disk.wipe result as it signed it (``keep``): one file per command in
the state directory's ``wipes/`` (tmpfs in the ramdisk), named by the sha256 of the command id
(no name from the wire), written whole or not at all, at most ``MAX_KEPT`` (the oldest go). The
release reads them back with ``certified``: a result counts only when its signature is the node
key's, it was signed in this boot (its ``boot_id``), it is disk.wipe's and succeeded; of it, a
certificate counts only when ``verified`` and without ``error``. Whatever does not count is
said why, for the report's message; nothing here trusts a file for being in the directory.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from agent.atomicfile import write_atomic
from agent.errors import AgentError
from agent.proto import agent_pb2, session_pb2
from agent.security.trust import NodeKey, verify_result

log = logging.getLogger(__name__)

WIPES = "wipes"
KIND = "disk.wipe"
MAX_KEPT = 64
MAX_FILE_BYTES = 1 << 20          # a WipeResult of 64 disks is a few tens of KiB


def keep(state_dir: Path, command_id: str, signed: session_pb2.SignedResult) -> None:
    """Keep one disk.wipe result as signed; the oldest beyond ``MAX_KEPT`` are removed."""
    folder = state_dir / WIPES
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = hashlib.sha256(command_id.encode()).hexdigest() + ".pb"
    write_atomic(folder / name, signed.SerializeToString(deterministic=True), 0o600)
    kept = sorted(folder.glob("*.pb"), key=lambda p: p.stat().st_mtime_ns)
    for old in kept[:-MAX_KEPT]:
        old.unlink(missing_ok=True)


@dataclass
class Certified:
    """The certificates that count, each with the signed result that carries it, and why the
    rest do not."""

    certificates: list[agent_pb2.ErasureCertificate] = field(default_factory=list)
    results: list[bytes] = field(default_factory=list)        # a serialized SignedResult per certificate
    refused: list[str] = field(default_factory=list)


def _read(path: Path) -> session_pb2.SignedResult:
    with path.open("rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError("larger than any wipe result")
    signed = session_pb2.SignedResult()
    signed.ParseFromString(data)
    return signed


def certified(state_dir: Path, node_public: bytes, boot_id: str) -> Certified:
    """The verified certificates of this boot's kept disk.wipe results (newest first)."""
    out = Certified()
    try:
        files = sorted((state_dir / WIPES).glob("*.pb"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        files = []
    for path in files[:MAX_KEPT]:
        try:
            signed = _read(path)
            body = verify_result(signed, node_public)
            if body.kind != KIND:
                raise ValueError(f"a result of {body.kind!r}, not {KIND}")
            if body.boot_id != boot_id:
                raise ValueError(f"signed in boot {body.boot_id or '(none)'}, not this one")
            if body.status != session_pb2.SUCCEEDED:
                raise ValueError(f"{session_pb2.Status.Name(body.status)}: {body.message}")
            result = agent_pb2.WipeResult()
            result.ParseFromString(body.payload)
        except AgentError as exc:
            out.refused.append(f"{path.name[:12]}: {exc.message}")
            continue
        except (OSError, ValueError, DecodeError) as exc:
            out.refused.append(f"{path.name[:12]}: {exc}")
            continue
        data = signed.SerializeToString(deterministic=True)
        for cert in result.certificates:
            if cert.verified and not cert.error:
                out.certificates.append(cert)
                out.results.append(data)
            else:
                out.refused.append(f"{cert.disk.name}: not verified ({cert.error or 'no verification'})")
    if out.refused:
        log.info("release: kept wipe results that do not count: %s", "; ".join(out.refused))
    return out


def node_public_key(state_dir: Path) -> bytes | None:
    """The node key's public half, from the state directory; None where there is none yet."""
    path = state_dir / "node.key"
    if not path.exists():
        return None
    return NodeKey.load(path).public_raw
