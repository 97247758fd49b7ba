"""Who may tell this agent what to do, and how the agent vouches for what it did.

Control-plane keys (Ed25519) sign commands; the agent refuses a destructive command unless a
trusted key signed its exact bytes, bound to this node, with an expiry that has not passed.
The node's own key signs the results of attested kinds, so the receiver can verify them before
acting. Several control-plane keys may be trusted at once (rotation); a command names the key
that signed it by ``key_id`` (first 16 hex chars of the SHA-256 of the raw 32-byte key).

Every signature is domain-separated: a command signature can never pass as a result signature
or an artifact signature, and the other way round.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from agent import atomicfile, catalog, limits
from agent.errors import InvalidParameters, Reason, Untrusted
from agent.proto import session_pb2
from agent.security import ed25519

log = logging.getLogger(__name__)

COMMAND_DOMAIN = b"bettercompute.command.v1\0"
RESULT_DOMAIN = b"bettercompute.result.v1\0"
ARTIFACT_DOMAIN = b"bettercompute.artifact.v1\0"

# The state id of `agent exec`: its journal is temporary (new each run, never announced), so a
# command signed for the console names this word instead; no daemon's journal has it.
CONSOLE_STATE_ID = "console"

RAW_KEY_BYTES = 32
SIGNATURE_BYTES = 64
MAX_KEY_FILE_BYTES = 64 * 1024  # a PEM public key is a few hundred bytes


def key_id(public_key_raw: bytes) -> str:
    """First 16 hex chars of sha256(raw 32-byte public key)."""
    return hashlib.sha256(public_key_raw).hexdigest()[:16]


def parse_public_key(data: bytes, *, source: str = "key") -> bytes:
    """A raw 32-byte Ed25519 public key from PEM, raw 32 bytes, or 64 hex characters."""
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        return ed25519.public_from_pem(text, source=source)
    if len(data) == RAW_KEY_BYTES:
        return bytes(data)
    if len(text) == 2 * RAW_KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise InvalidParameters(
        f"{source}: not an Ed25519 public key (expected PEM, 32 raw bytes or 64 hex characters)"
    )


class SigningKey:
    """An Ed25519 private key: the node key, or a control-plane key (gateway, tests)."""

    def __init__(self, private_key: ed25519.PrivateKey) -> None:
        self._key = private_key
        self.public_raw: bytes = private_key.public
        self.key_id: str = key_id(self.public_raw)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(ed25519.PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        return cls(ed25519.PrivateKey.from_pem(Path(path).read_bytes(), source=str(path)))

    @classmethod
    def load_or_create(cls, path: Path) -> SigningKey:
        """Load the key at ``path``; create it (0600, atomically) when there is none."""
        path = Path(path)
        if path.exists():
            return cls.load(path)
        key = cls.generate()
        key.save(path)
        log.info("created key %s at %s", key.key_id, path)
        return key

    def private_pem(self) -> bytes:
        return self._key.pem()

    def public_pem(self) -> bytes:
        return ed25519.public_pem(self.public_raw)

    def save(self, path: Path) -> None:
        """Write the private key as PEM, mode 0600, whole or not at all."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomicfile.write_atomic(path, self.private_pem(), 0o600)

    def save_public(self, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomicfile.write_atomic(path, self.public_pem(), 0o644)

    def sign(self, domain: bytes, data: bytes) -> bytes:
        return self._key.sign(domain + data)

    def sign_command(self, body: session_pb2.CommandBody) -> session_pb2.SignedCommand:
        raw = body.SerializeToString(deterministic=True)
        return session_pb2.SignedCommand(
            body=raw, key_id=self.key_id, signature=self.sign(COMMAND_DOMAIN, raw)
        )

    def sign_result(self, body: session_pb2.ResultBody) -> session_pb2.SignedResult:
        raw = body.SerializeToString(deterministic=True)
        return session_pb2.SignedResult(body=raw, signature=self.sign(RESULT_DOMAIN, raw))

    def sign_artifact(self, sha256: bytes) -> bytes:
        if len(sha256) != hashlib.sha256().digest_size:
            raise InvalidParameters("sign_artifact takes the 32-byte SHA-256 digest of the file")
        return self.sign(ARTIFACT_DOMAIN, sha256)


# The node's own key is a SigningKey kept at state_dir / "node.key".
NodeKey = SigningKey


def _refuse(reason: Reason, message: str, **details: Any) -> Untrusted:
    return Untrusted(message, reason=reason, **details)


def decode_command_body(data: bytes) -> session_pb2.CommandBody:
    body = session_pb2.CommandBody()
    try:
        body.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidParameters("command body is not a valid CommandBody") from exc
    return body


class TrustStore:
    """The control-plane public keys this agent trusts; several at once during a rotation."""

    def __init__(self, public_keys: Iterable[bytes] = ()) -> None:
        self._keys: dict[str, bytes] = {}
        for raw in public_keys:
            self.add(raw)

    @classmethod
    def load(cls, paths: Iterable[Path]) -> TrustStore:
        """Keys from files (PEM, raw or hex) and directories (every regular file in them)."""
        store = cls()
        for path in paths:
            path = Path(path)
            files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
            for f in files:
                data = limits.read_bounded(f, what="trusted key file", max_bytes=MAX_KEY_FILE_BYTES)
                store.add(parse_public_key(data, source=str(f)))
        return store

    def add(self, public_raw: bytes) -> str:
        if len(public_raw) != RAW_KEY_BYTES:
            raise InvalidParameters(f"an Ed25519 public key has {RAW_KEY_BYTES} bytes, not {len(public_raw)}")
        kid = key_id(public_raw)
        self._keys[kid] = bytes(public_raw)
        return kid

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    @property
    def keys(self) -> Mapping[str, bytes]:
        return dict(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def _check_signature(self, key: str, signature: bytes, domain: bytes, data: bytes) -> None:
        public = self._keys.get(key)
        if public is None:
            raise _refuse(
                Reason.SIGNATURE_UNKNOWN_KEY,
                f"signed by key {key or '(none named)'!r}, which this agent does not trust",
                key_id=key,
            )
        if not ed25519.verify(public, signature, domain + data):
            raise _refuse(
                Reason.SIGNATURE_INVALID,
                f"signature by key {key} does not match the signed bytes (modified or wrong key)",
                key_id=key,
            )

    def verify_command(
        self,
        signed: session_pb2.SignedCommand,
        *,
        node_id: str,
        now_ms: int,
        kind: catalog.Kind | str | None = None,
        boot_id: str | None = None,
        state_id: str | None = None,
        max_lifetime_ms: int | None = None,
    ) -> session_pb2.CommandBody:
        """The command's body once every check passed; Untrusted with its reason otherwise.

        ``kind`` is the catalog entry (or name) of the body's kind; by default it is looked up
        from the body. Destructive kinds need a signature by a trusted key, this node's id and
        an expiry; any command that is signed must verify, and any command past its expiry or
        bound to another node is refused.

        ``boot_id`` is this agent's boot id: a destructive command must name it (so a captured
        command cannot be replayed after a reboot, when the journal of the ids already run is
        gone), and any command that names a boot must name this one. ``state_id`` is the id of
        this agent's journal, checked the same way (a journal lost within one boot is a new
        state: check_state). ``max_lifetime_ms`` is
        the longest signature lifetime this agent accepts: an expiry further out than that
        from now is refused, whatever the signer chose. None skips either check (callers that
        do not know them, e.g. a gateway verifying its own commands).
        """
        body = decode_command_body(signed.body)
        if kind is None or isinstance(kind, str):
            name = body.kind if kind is None else kind
            resolved = catalog.get(name)
            if resolved is None:
                raise InvalidParameters(f"unknown kind {name!r}")
            kind = resolved
        if body.kind != kind.name:
            raise InvalidParameters(f"command body is for {body.kind!r}, not {kind.name!r}")
        cid = body.command_id
        if signed.signature:
            self._check_signature(signed.key_id, signed.signature, COMMAND_DOMAIN, signed.body)
        elif kind.destructive:
            raise _refuse(
                Reason.SIGNATURE_MISSING,
                f"{kind.name} is destructive and must be signed by a control-plane key",
                command_id=cid,
            )
        if body.node_id != node_id and (kind.destructive or body.node_id):
            raise _refuse(
                Reason.WRONG_NODE,
                f"command {cid} is bound to node {body.node_id or '(none)'!r}, this is {node_id!r}",
                command_id=cid,
                node_id=body.node_id,
            )
        if kind.destructive and body.expires_at_unix_ms <= 0:
            raise _refuse(
                Reason.EXPIRED,
                f"{kind.name} is destructive and must carry an expiry (expires_at_unix_ms)",
                command_id=cid,
                problem="missing",
            )
        if body.expires_at_unix_ms > 0 and now_ms > body.expires_at_unix_ms:
            raise _refuse(
                Reason.EXPIRED,
                f"command {cid} expired {(now_ms - body.expires_at_unix_ms) / 1000:.1f}s ago",
                command_id=cid,
                problem="past",
            )
        if max_lifetime_ms is not None and body.expires_at_unix_ms - now_ms > max_lifetime_ms:
            raise _refuse(
                Reason.EXPIRED,
                f"command {cid} expires {(body.expires_at_unix_ms - now_ms) / 1000:.0f}s from now; this "
                f"agent accepts signatures valid for at most {max_lifetime_ms / 1000:.0f}s",
                command_id=cid,
                problem="too_long",
                max_lifetime_seconds=max_lifetime_ms // 1000,
            )
        if boot_id is not None:
            check_boot(body, kind, boot_id)
        if state_id is not None:
            check_state(body, kind, state_id)
        return body

    def verify_artifact(self, sha256: bytes, signature: bytes, key_id: str) -> None:
        """Raise Untrusted unless a trusted key signed this SHA-256 digest as an artifact."""
        if not signature:
            raise _refuse(Reason.SIGNATURE_MISSING, "artifact carries no signature")
        self._check_signature(key_id, signature, ARTIFACT_DOMAIN, sha256)


def _check_binding(body: session_pb2.CommandBody, kind: catalog.Kind, *, reason: Reason, field: str,
                   bound: str, current: str, noun: str, missing: str, other: str) -> None:
    """The one rule of both bindings: a destructive command must name ``field``, and any
    command that names it must name ``current``."""
    cid = body.command_id
    if kind.destructive and not bound:
        raise _refuse(reason, f"{kind.name} is destructive and must name the {noun} it is for ({missing})",
                      command_id=cid, problem="missing")
    if bound and bound != current:
        raise _refuse(reason, f"command {cid} was issued for {noun} {bound!r}; {other}",
                      command_id=cid, problem="other", **{field: bound})


def check_boot(body: session_pb2.CommandBody, kind: catalog.Kind, boot_id: str) -> None:
    """Refuse (``wrong_boot``) a command for another boot, or a destructive one for none.

    The journal of the command ids already run lives on tmpfs and is gone after a reboot; the
    boot binding is what keeps a captured destructive command from running again then.
    """
    _check_binding(body, kind, reason=Reason.WRONG_BOOT, field="boot_id", bound=body.boot_id,
                   current=boot_id, noun="boot", missing="boot_id, from the Hello",
                   other=f"this node now runs boot {boot_id or '(unknown)'!r}")


def check_state(body: session_pb2.CommandBody, kind: catalog.Kind, state_id: str) -> None:
    """Refuse (``wrong_state``) a command for another state of this agent, or a destructive
    one for none.

    Within one boot the journal can still be lost (its tmpfs directory removed): the boot id
    is unchanged, the ids already run are forgotten. Its state id is new then, so a captured
    destructive command, bound to the old one, cannot run again.
    """
    other = (f"agent exec takes commands signed for the console (state_id {CONSOLE_STATE_ID!r})"
             if state_id == CONSOLE_STATE_ID else
             f"this agent's state is {state_id!r} (its journal is new: the ids it ran are not known)")
    _check_binding(body, kind, reason=Reason.WRONG_STATE, field="state_id", bound=body.state_id,
                   current=state_id, noun="agent state",
                   missing="state_id, from the Hello; 'console' for agent exec", other=other)


def verify_result(signed: session_pb2.SignedResult, node_public_raw: bytes) -> session_pb2.ResultBody:
    """The result's body when the node key signed it; Untrusted otherwise (attested kinds)."""
    if not signed.signature:
        raise _refuse(Reason.SIGNATURE_MISSING, "result carries no node signature")
    if not ed25519.verify(node_public_raw, signed.signature, RESULT_DOMAIN + signed.body):
        raise _refuse(
            Reason.SIGNATURE_INVALID,
            f"result signature does not match node key {key_id(node_public_raw)} (forged or modified)",
        )
    body = session_pb2.ResultBody()
    try:
        body.ParseFromString(signed.body)
    except DecodeError as exc:
        raise _refuse(Reason.SIGNATURE_INVALID, "signed result body is not a ResultBody") from exc
    return body
