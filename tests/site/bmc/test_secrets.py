"""agent/site/bmc/secrets.py: the site's secret store, on a real directory."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agent.errors import AgentError, InvalidParameters, NotFound, Unsupported
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import PasswordPolicy, SecretStore, SecretStoreError, check_ref

OLD = Credentials("admin", "old-Secret-1")
NEW = Credentials("admin", "new-Secret-2")


@pytest.fixture
def store(tmp_path: Path) -> SecretStore:
    s = SecretStore(tmp_path / "secrets")
    s.put("rack1-n01", OLD)
    return s


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_put_is_root_only_and_reads_back(store: SecretStore) -> None:
    assert store.get("rack1-n01") == OLD
    assert mode(store.root) == 0o700
    assert mode(store.root / "rack1-n01") == 0o700
    assert mode(store.root / "rack1-n01" / "current.json") == 0o600
    # No temp file is left behind by the atomic write.
    assert sorted(p.name for p in (store.root / "rack1-n01").iterdir()) == ["current.json"]


@pytest.mark.parametrize("ref", ["../etc", "a/b", "..", ".hidden", "", "x" * 200, "a..b", "n 1", "é"])
def test_refs_that_could_leave_the_store_are_refused(store: SecretStore, ref: str) -> None:
    with pytest.raises(InvalidParameters, match="credentials_ref"):
        store.get(ref)
    with pytest.raises(InvalidParameters):
        check_ref(ref)


def test_unknown_ref_is_not_found_and_says_so(store: SecretStore) -> None:
    with pytest.raises(NotFound, match="'rack9-n99': no such entry") as info:
        store.get("rack9-n99")
    assert info.value.to_wire()[0] == "not_found"


def test_errors_never_quote_a_secret(store: SecretStore) -> None:
    path = store.root / "rack1-n01" / "current.json"
    path.write_text('{"username": "admin", "password": "old-Secret-1"')   # torn, not JSON
    with pytest.raises(SecretStoreError) as info:
        store.get("rack1-n01")
    assert "not JSON" in str(info.value) and "old-Secret-1" not in repr(info.value.to_wire())
    path.write_text(json.dumps({"username": "admin"}))
    with pytest.raises(SecretStoreError, match="'password'"):
        store.get("rack1-n01")


def test_an_entry_readable_by_others_is_refused(store: SecretStore) -> None:
    path = store.root / "rack1-n01" / "current.json"
    os.chmod(path, 0o644)
    with pytest.raises(SecretStoreError, match="readable by others"):
        store.get("rack1-n01")


def test_a_store_open_to_others_is_not_written(tmp_path: Path) -> None:
    root = tmp_path / "open"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with pytest.raises(SecretStoreError, match="chmod 700"):
        SecretStore(root).put("n1", OLD)


def test_a_symlinked_entry_file_is_not_followed(store: SecretStore, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"username": "x", "password": "y"}))
    os.chmod(elsewhere, 0o600)
    (store.root / "n2").mkdir(mode=0o700)
    (store.root / "n2" / "current.json").symlink_to(elsewhere)
    with pytest.raises(SecretStoreError):
        store.get("n2")


def test_rotation_keeps_both_until_promoted(store: SecretStore) -> None:
    store.stage("rack1-n01", NEW)
    # Halfway (a crash here): both are readable, the working one is still current.
    assert store.get("rack1-n01") == OLD
    assert store.pending("rack1-n01") == NEW
    store.promote("rack1-n01")
    assert store.get("rack1-n01") == NEW
    assert store.pending("rack1-n01") is None


def test_discard_keeps_the_old_one(store: SecretStore) -> None:
    store.stage("rack1-n01", NEW)
    store.discard("rack1-n01")
    assert store.get("rack1-n01") == OLD and store.pending("rack1-n01") is None


@pytest.mark.parametrize(("bmc_has", "kept"), [(NEW, NEW), (OLD, OLD)])
def test_reconcile_keeps_what_the_bmc_accepts(store: SecretStore, bmc_has: Credentials,
                                              kept: Credentials) -> None:
    store.stage("rack1-n01", NEW)
    tried: list[Credentials] = []

    def accepted(c: Credentials) -> bool:
        tried.append(c)
        return c == bmc_has

    assert store.reconcile("rack1-n01", accepted) == kept
    assert store.get("rack1-n01") == kept and store.pending("rack1-n01") is None
    assert tried[0] == NEW


def test_reconcile_when_the_bmc_takes_neither_keeps_both(store: SecretStore) -> None:
    store.stage("rack1-n01", NEW)
    with pytest.raises(AgentError, match="neither"):
        store.reconcile("rack1-n01", lambda c: False)
    assert store.get("rack1-n01") == OLD and store.pending("rack1-n01") == NEW


def test_reconcile_without_pending_does_not_ask_the_bmc(store: SecretStore) -> None:
    def never(c: Credentials) -> bool:
        raise AssertionError("no BMC call without a pending rotation")

    assert store.reconcile("rack1-n01", never) == OLD


def test_mounted_secret_manager_entries_are_read_only(store: SecretStore) -> None:
    entry = store.root / "vault-n3"
    entry.mkdir()
    (entry / "username").write_text("root\n")
    (entry / "password").write_text("from-Vault-9\n")
    assert store.get("vault-n3") == Credentials("root", "from-Vault-9")
    assert store.is_mounted("vault-n3")
    with pytest.raises(Unsupported, match="mounted secret manager"):
        store.stage("vault-n3", NEW)


def test_stage_needs_an_existing_entry(store: SecretStore) -> None:
    with pytest.raises(NotFound):
        store.stage("nobody", NEW)


def test_generated_passwords_follow_the_policy() -> None:
    policy = PasswordPolicy(min_length=12, max_length=20)
    seen = {policy.generate() for _ in range(50)}
    assert len(seen) == 50
    for pw in seen:
        assert 12 <= len(pw) <= 20
        assert any(c.islower() for c in pw) and any(c.isupper() for c in pw)
        assert any(c.isdigit() for c in pw) and any(c in policy.symbols for c in pw)
    assert len(policy.generate(20)) == 20
    with pytest.raises(InvalidParameters, match="accepts 12 to 20"):
        policy.generate(21)


def test_an_entry_that_is_a_symlink_out_of_the_store_is_refused(store: SecretStore, tmp_path: Path) -> None:
    """A symlinked entry is neither read (bmc.power) nor written (bmc.rotate) through."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "current.json").write_text(json.dumps({"username": "x", "password": "outside-Pw-1"}))
    os.chmod(outside / "current.json", 0o600)
    (store.root / "n4").symlink_to(outside)
    with pytest.raises(SecretStoreError, match="'n4': the entry is not a directory of the store"):
        store.get("n4")
    with pytest.raises(SecretStoreError, match="not a directory of the store"):
        store.stage("n4", NEW)
    with pytest.raises(SecretStoreError, match="not a directory of the store"):
        store.put("n4", NEW)
    with pytest.raises(SecretStoreError):
        store.promote("n4")
    with pytest.raises(SecretStoreError):
        store.discard("n4")
    assert sorted(p.name for p in outside.iterdir()) == ["current.json"]
    assert json.loads((outside / "current.json").read_text())["password"] == "outside-Pw-1"
    # A mounted-style entry linked out of the store is refused the same way.
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "username").write_text("root\n")
    (mounted / "password").write_text("out-Pw-2\n")
    (store.root / "n5").symlink_to(mounted)
    with pytest.raises(SecretStoreError, match="not a directory of the store"):
        store.get("n5")
    with pytest.raises(SecretStoreError, match="not a directory of the store"):
        store.is_mounted("n5")


def kubernetes_secret_volume(entry: Path, username: str, password: str) -> None:
    """The layout kubelet's atomic writer makes for a secret volume: the files live in a
    timestamped directory, ``..data`` links to it, and each key links through ``..data``."""
    entry.mkdir()
    stamped = entry / "..2026_12_01_20_00_00.123456789"
    stamped.mkdir()
    (stamped / "username").write_text(username)
    (stamped / "password").write_text(password)
    (entry / "..data").symlink_to(stamped.name)
    (entry / "username").symlink_to("..data/username")
    (entry / "password").symlink_to("..data/password")


def test_a_kubernetes_secret_volume_is_read(store: SecretStore) -> None:
    kubernetes_secret_volume(store.root / "k8s-n6", "root", "from-K8s-7")
    assert store.get("k8s-n6") == Credentials("root", "from-K8s-7")
    assert store.is_mounted("k8s-n6")
    with pytest.raises(Unsupported, match="mounted secret manager"):
        store.stage("k8s-n6", NEW)


@pytest.mark.parametrize("target", ["/etc/hostname", "../../elsewhere/password", "..data/../../x",
                                    "loop"])
def test_a_mounted_file_linked_out_of_its_entry_is_refused(store: SecretStore, tmp_path: Path,
                                                           target: str) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "password").write_text("out-Pw-3")
    entry = store.root / "k8s-n7"
    kubernetes_secret_volume(entry, "root", "in-Pw-4")
    (entry / "password").unlink()
    (entry / "loop").symlink_to("loop")
    (entry / "password").symlink_to(target)
    with pytest.raises(SecretStoreError, match="'k8s-n7': cannot read password") as info:
        store.get("k8s-n7")
    assert "out-Pw-3" not in str(info.value)


def test_a_fifo_in_an_entry_is_refused_not_waited_on(store: SecretStore) -> None:
    entry = store.root / "fifo-n8"
    entry.mkdir(mode=0o700)
    os.mkfifo(entry / "current.json", 0o600)
    with pytest.raises(SecretStoreError, match=r"current\.json is not a file"):
        store.get("fifo-n8")
