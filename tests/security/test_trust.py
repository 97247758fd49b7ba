"""Trust: every refusal case of a signed command, each with its own reason, and signed results."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import pytest

from agent import catalog
from agent.errors import InvalidParameters, Reason, Untrusted
from agent.proto import agent_pb2, session_pb2
from agent.security.trust import (
    CONSOLE_STATE_ID,
    SigningKey,
    TrustStore,
    key_id,
    parse_public_key,
    verify_result,
)

NODE = "node-7"


def now_ms() -> int:
    return int(time.time() * 1000)


def wipe_body(**overrides: object) -> session_pb2.CommandBody:
    fields: dict[str, object] = {
        "command_id": "c-1",
        "kind": "disk.wipe",
        "node_id": NODE,
        "payload": agent_pb2.WipeRequest().SerializeToString(),
        "issued_at_unix_ms": now_ms(),
        "expires_at_unix_ms": now_ms() + 60_000,
    }
    fields.update(overrides)
    return session_pb2.CommandBody(**fields)  # type: ignore[arg-type]


def refused(store: TrustStore, signed: session_pb2.SignedCommand, kind: str = "disk.wipe") -> Reason:
    with pytest.raises(Untrusted) as info:
        store.verify_command(signed, node_id=NODE, now_ms=now_ms(), kind=kind)
    return info.value.reason


def test_key_id_is_first_16_hex_of_sha256() -> None:
    key = SigningKey.generate()
    assert key.key_id == hashlib.sha256(key.public_raw).hexdigest()[:16] == key_id(key.public_raw)


def test_valid_destructive_command_passes() -> None:
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])
    body = store.verify_command(cp.sign_command(wipe_body()), node_id=NODE, now_ms=now_ms(), kind="disk.wipe")
    assert body.command_id == "c-1"
    # kind looked up from the body, or given as a catalog entry
    looked_up = store.verify_command(cp.sign_command(wipe_body()), node_id=NODE, now_ms=now_ms())
    assert looked_up.kind == "disk.wipe"
    kind = catalog.KINDS["disk.wipe"]
    assert store.verify_command(cp.sign_command(wipe_body()), node_id=NODE, now_ms=now_ms(), kind=kind)


def test_destructive_without_signature_is_refused() -> None:
    store = TrustStore([SigningKey.generate().public_raw])
    raw = wipe_body().SerializeToString()
    assert refused(store, session_pb2.SignedCommand(body=raw)) is Reason.SIGNATURE_MISSING


def test_unknown_key_is_refused() -> None:
    store = TrustStore([SigningKey.generate().public_raw])
    stranger = SigningKey.generate()
    assert refused(store, stranger.sign_command(wipe_body())) is Reason.SIGNATURE_UNKNOWN_KEY


def test_no_trusted_keys_at_all_refuses_destructive() -> None:
    signed = SigningKey.generate().sign_command(wipe_body())
    assert refused(TrustStore(), signed) is Reason.SIGNATURE_UNKNOWN_KEY


def test_modified_payload_is_refused() -> None:
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])
    signed = cp.sign_command(wipe_body())
    body = session_pb2.CommandBody.FromString(signed.body)
    body.payload = agent_pb2.WipeRequest(passes=3).SerializeToString()
    tampered = session_pb2.SignedCommand(
        body=body.SerializeToString(), key_id=signed.key_id, signature=signed.signature
    )
    assert tampered.body != signed.body
    assert refused(store, tampered) is Reason.SIGNATURE_INVALID
    # a single flipped bit anywhere in the body
    flipped = bytearray(signed.body)
    flipped[-1] ^= 0x01
    bad = session_pb2.SignedCommand(body=bytes(flipped), key_id=signed.key_id, signature=signed.signature)
    with pytest.raises((Untrusted, InvalidParameters)) as info:
        store.verify_command(bad, node_id=NODE, now_ms=now_ms(), kind="disk.wipe")
    assert info.value.reason in (Reason.SIGNATURE_INVALID, Reason.INVALID_PARAMETERS)


def test_signature_by_trusted_key_under_other_key_id_is_invalid() -> None:
    a, b = SigningKey.generate(), SigningKey.generate()
    store = TrustStore([a.public_raw, b.public_raw])
    signed = b.sign_command(wipe_body())
    lying = session_pb2.SignedCommand(body=signed.body, key_id=a.key_id, signature=signed.signature)
    assert refused(store, lying) is Reason.SIGNATURE_INVALID


def test_other_node_is_refused() -> None:
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])
    assert refused(store, cp.sign_command(wipe_body(node_id="node-8"))) is Reason.WRONG_NODE
    assert refused(store, cp.sign_command(wipe_body(node_id=""))) is Reason.WRONG_NODE


def test_expired_is_refused() -> None:
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])
    with pytest.raises(Untrusted) as info:
        store.verify_command(
            cp.sign_command(wipe_body(expires_at_unix_ms=now_ms() - 1)),
            node_id=NODE, now_ms=now_ms(), kind="disk.wipe",
        )
    assert info.value.reason is Reason.EXPIRED
    assert info.value.details["problem"] == "past"


def test_missing_expiry_on_destructive_is_refused() -> None:
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])
    with pytest.raises(Untrusted) as info:
        store.verify_command(
            cp.sign_command(wipe_body(expires_at_unix_ms=0)), node_id=NODE, now_ms=now_ms(), kind="disk.wipe"
        )
    assert info.value.reason is Reason.EXPIRED
    assert info.value.details["problem"] == "missing"


def test_non_destructive_may_be_unsigned_but_not_expired_or_other_node() -> None:
    store = TrustStore()
    body = session_pb2.CommandBody(command_id="i-1", kind="inventory.refresh", node_id=NODE)
    got = store.verify_command(
        session_pb2.SignedCommand(body=body.SerializeToString()), node_id=NODE, now_ms=now_ms()
    )
    assert got.command_id == "i-1"
    # no node binding at all is fine for a non-destructive kind
    body.node_id = ""
    unbound = session_pb2.SignedCommand(body=body.SerializeToString())
    assert store.verify_command(unbound, node_id=NODE, now_ms=now_ms()).node_id == ""
    body.node_id = "elsewhere"
    with pytest.raises(Untrusted) as info:
        store.verify_command(
            session_pb2.SignedCommand(body=body.SerializeToString()), node_id=NODE, now_ms=now_ms()
        )
    assert info.value.reason is Reason.WRONG_NODE
    body.node_id = NODE
    body.expires_at_unix_ms = now_ms() - 1000
    with pytest.raises(Untrusted) as info:
        store.verify_command(
            session_pb2.SignedCommand(body=body.SerializeToString()), node_id=NODE, now_ms=now_ms()
        )
    assert info.value.reason is Reason.EXPIRED


def test_non_destructive_that_is_signed_must_verify() -> None:
    store = TrustStore([SigningKey.generate().public_raw])
    body = session_pb2.CommandBody(command_id="i-2", kind="inventory.refresh", node_id=NODE)
    stranger = SigningKey.generate()
    reason = refused(store, stranger.sign_command(body), kind="inventory.refresh")
    assert reason is Reason.SIGNATURE_UNKNOWN_KEY


def test_rotation_two_trusted_keys_both_accepted() -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    store = TrustStore([old.public_raw, new.public_raw])
    assert store.key_ids == {old.key_id, new.key_id}
    for key in (old, new):
        body = store.verify_command(key.sign_command(wipe_body()), node_id=NODE, now_ms=now_ms())
        assert body.command_id == "c-1"
    # once the old key is retired, its commands are refused
    retired = TrustStore([new.public_raw])
    assert refused(retired, old.sign_command(wipe_body())) is Reason.SIGNATURE_UNKNOWN_KEY


def test_trust_store_loads_pem_raw_hex_and_directories(tmp_path: Path) -> None:
    a, b, c = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    keys = tmp_path / "keys"
    keys.mkdir()
    a.save_public(keys / "a.pem")
    (keys / "b.raw").write_bytes(b.public_raw)
    single = tmp_path / "c.hex"
    single.write_text(c.public_raw.hex() + "\n")
    store = TrustStore.load([keys, single])
    assert store.key_ids == {a.key_id, b.key_id, c.key_id}
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(InvalidParameters):
        TrustStore.load([tmp_path / "junk"])
    with pytest.raises(InvalidParameters):
        parse_public_key(a.private_pem())


def test_signing_key_save_load_0600_and_load_or_create(tmp_path: Path) -> None:
    path = tmp_path / "state" / "node.key"
    key = SigningKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = SigningKey.load_or_create(path)
    assert again.public_raw == key.public_raw
    assert SigningKey.load(path).key_id == key.key_id


def test_forged_result_signature_is_refused() -> None:
    node = SigningKey.generate()
    body = session_pb2.ResultBody(
        command_id="c-1", kind="disk.wipe", node_id=NODE, status=session_pb2.SUCCEEDED
    )
    signed = node.sign_result(body)
    assert verify_result(signed, node.public_raw).command_id == "c-1"
    forger = SigningKey.generate()
    with pytest.raises(Untrusted) as info:
        verify_result(forger.sign_result(body), node.public_raw)
    assert info.value.reason is Reason.SIGNATURE_INVALID
    changed = session_pb2.ResultBody.FromString(signed.body)
    changed.status = session_pb2.FAILED
    with pytest.raises(Untrusted) as info:
        verify_result(
            session_pb2.SignedResult(body=changed.SerializeToString(), signature=signed.signature),
            node.public_raw,
        )
    assert info.value.reason is Reason.SIGNATURE_INVALID
    with pytest.raises(Untrusted) as info:
        verify_result(session_pb2.SignedResult(body=signed.body), node.public_raw)
    assert info.value.reason is Reason.SIGNATURE_MISSING


def test_domains_are_separated() -> None:
    key = SigningKey.generate()
    store = TrustStore([key.public_raw])
    body = wipe_body()
    # a result signature over the same bytes does not pass as a command signature
    as_result = key.sign(b"bettercompute.result.v1\0", body.SerializeToString())
    signed = session_pb2.SignedCommand(body=body.SerializeToString(), key_id=key.key_id, signature=as_result)
    assert refused(store, signed) is Reason.SIGNATURE_INVALID
    # a command signature does not pass as a result signature
    cmd = key.sign_command(body)
    with pytest.raises(Untrusted):
        verify_result(session_pb2.SignedResult(body=cmd.body, signature=cmd.signature), key.public_raw)


def test_artifact_signature() -> None:
    key = SigningKey.generate()
    store = TrustStore([key.public_raw])
    digest = hashlib.sha256(b"zipapp bytes").digest()
    sig = key.sign_artifact(digest)
    store.verify_artifact(digest, sig, key.key_id)
    with pytest.raises(Untrusted) as info:
        store.verify_artifact(hashlib.sha256(b"other").digest(), sig, key.key_id)
    assert info.value.reason is Reason.SIGNATURE_INVALID
    with pytest.raises(Untrusted) as info:
        store.verify_artifact(digest, sig, "0" * 16)
    assert info.value.reason is Reason.SIGNATURE_UNKNOWN_KEY
    with pytest.raises(Untrusted) as info:
        store.verify_artifact(digest, b"", key.key_id)
    assert info.value.reason is Reason.SIGNATURE_MISSING


BOOT = "3f0c2a9e-boot-of-node-7"


def test_destructive_command_is_bound_to_the_boot_it_was_issued_for() -> None:
    """After a reboot the journal of the ids already run is gone (tmpfs): the boot binding is
    what stops a captured, still unexpired destructive command from running again."""
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])

    def check(body: session_pb2.CommandBody, kind: str = "disk.wipe") -> session_pb2.CommandBody:
        signed = cp.sign_command(body)
        return store.verify_command(signed, node_id=NODE, now_ms=now_ms(), kind=kind, boot_id=BOOT)

    assert check(wipe_body(boot_id=BOOT)).boot_id == BOOT
    for body, problem in ((wipe_body(), "missing"), (wipe_body(boot_id="an-earlier-boot"), "other")):
        with pytest.raises(Untrusted) as info:
            check(body)
        assert (info.value.reason, info.value.details["problem"]) == (Reason.WRONG_BOOT, problem)
    # A non-destructive command without a boot id still runs (older control planes); one that
    # names a boot must name this one.
    inventory = wipe_body(kind="inventory.refresh", payload=b"")
    assert check(inventory, "inventory.refresh").boot_id == ""
    inventory.boot_id = "an-earlier-boot"
    with pytest.raises(Untrusted) as info:
        check(inventory, "inventory.refresh")
    assert info.value.reason is Reason.WRONG_BOOT
    # Without a boot id to compare (a caller that does not know it), the check is skipped.
    assert store.verify_command(cp.sign_command(wipe_body()), node_id=NODE, now_ms=now_ms(), kind="disk.wipe")


def test_a_signature_valid_for_longer_than_the_agent_allows_is_refused() -> None:
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])
    limit = 15 * 60_000
    ok = wipe_body(expires_at_unix_ms=now_ms() + limit - 5_000)
    assert store.verify_command(cp.sign_command(ok), node_id=NODE, now_ms=now_ms(), max_lifetime_ms=limit)
    for kind in ("disk.wipe", "inventory.refresh"):
        far = wipe_body(kind=kind, payload=b"", expires_at_unix_ms=now_ms() + 24 * 3600_000)
        with pytest.raises(Untrusted) as info:
            store.verify_command(cp.sign_command(far), node_id=NODE, now_ms=now_ms(), max_lifetime_ms=limit)
        assert (info.value.reason, info.value.details["problem"]) == (Reason.EXPIRED, "too_long")
        assert "at most 900s" in info.value.message


def test_a_huge_trusted_key_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    huge = tmp_path / "keys" / "huge.pem"
    huge.parent.mkdir()
    with open(huge, "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that must never be read into memory
    with pytest.raises(InvalidParameters, match="over its limit"):
        TrustStore.load([huge.parent])


STATE = "5b1d0c7a9e3f4a2b8c6d0e1f2a3b4c5d"


def test_destructive_command_is_bound_to_the_agent_state_it_was_issued_for() -> None:
    """A journal lost within one boot is a new state: a command bound to the old one, or a
    destructive one bound to none, is refused; the console's word is its own state."""
    cp = SigningKey.generate()
    store = TrustStore([cp.public_raw])

    def check(body: session_pb2.CommandBody, state: str = STATE, kind: str = "disk.wipe") -> None:
        store.verify_command(cp.sign_command(body), node_id=NODE, now_ms=now_ms(), kind=kind,
                             boot_id=BOOT, state_id=state)

    check(wipe_body(boot_id=BOOT, state_id=STATE))
    check(wipe_body(boot_id=BOOT, state_id=CONSOLE_STATE_ID), CONSOLE_STATE_ID)
    for body, state, problem in ((wipe_body(boot_id=BOOT), STATE, "missing"),
                                 (wipe_body(boot_id=BOOT, state_id="an-older-state"), STATE, "other"),
                                 (wipe_body(boot_id=BOOT, state_id=CONSOLE_STATE_ID), STATE, "other"),
                                 (wipe_body(boot_id=BOOT, state_id=STATE), CONSOLE_STATE_ID, "other")):
        with pytest.raises(Untrusted) as info:
            check(body, state)
        assert (info.value.reason, info.value.details["problem"]) == (Reason.WRONG_STATE, problem)
    # A non-destructive command may name none; one that names a state must name this one.
    inventory = wipe_body(kind="inventory.refresh", payload=b"")
    check(inventory, kind="inventory.refresh")
    inventory.state_id = "an-older-state"
    with pytest.raises(Untrusted, match="an-older-state"):
        check(inventory, kind="inventory.refresh")
