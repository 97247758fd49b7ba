"""daemon.upgrade's parts, fast: request validation, refusals before anything is fetched, and
the two hooks the core calls (completion after a rollback, the core's join confirming a trial)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from agent import launcher, schema, version
from agent.commands.base import Context
from agent.commands.upgrade import UpgradeHandler
from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.launcher import confirm_trial

GOOD = {"version": "2.0.0", "url": "http://127.0.0.1:9/agent.pyz", "digest": {"hex": "0" * 64},
        "signature": base64.b64encode(b"s" * 64).decode(), "keyId": "k1"}


def parse(**changes: object) -> object:
    payload = {**GOOD, **changes}
    payload = {k: v for k, v in payload.items() if v is not None}
    return UpgradeHandler().parse(schema.payload_from_json("daemon.upgrade", payload))


def test_a_good_request_parses() -> None:
    params = parse()
    assert params.version == "2.0.0" and params.rejoin_timeout == 120  # type: ignore[attr-defined]


@pytest.mark.parametrize("changes", [
    {"version": ""}, {"version": "1.0 beta"}, {"version": "../x"}, {"url": None}, {"url": "file:///x"},
    {"digest": None}, {"digest": {"hex": "abc"}}, {"signature": None}, {"signature": "QUFB"},
    {"keyId": None}, {"rejoinTimeoutSeconds": 100000},
])
def test_bad_requests_are_refused_at_parse(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidParameters):
        parse(**changes)


def test_refused_when_not_running_from_a_zipapp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(version, "ARCHIVE", None)
    with pytest.raises(Unsupported, match="zipapp"):
        UpgradeHandler().run(Context.local("daemon.upgrade", Config(role="node")), parse())  # type: ignore[arg-type]


def test_refused_without_the_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "agent.pyz"
    archive.write_bytes(b"PK old build")
    monkeypatch.setattr(version, "ARCHIVE", str(archive))
    monkeypatch.delenv(launcher.LAUNCHER_ENV, raising=False)
    with pytest.raises(Unsupported, match="launcher"):
        UpgradeHandler().run(Context.local("daemon.upgrade"), parse())  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.pyz"]  # nothing fetched or linked


def test_refused_while_another_trial_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "agent.pyz"
    archive.write_bytes(b"PK build")
    monkeypatch.setattr(version, "ARCHIVE", str(archive))
    monkeypatch.setenv(launcher.LAUNCHER_ENV, "/usr/lib/bettercompute/launcher.py")
    launcher.write_marker(str(archive), {"state": launcher.TRIAL, "new_version": "1.5.0"})
    with pytest.raises(Exception, match="still being tried"):
        UpgradeHandler().run(Context.local("daemon.upgrade"), parse())  # type: ignore[arg-type]


def proof(archive: Path) -> dict[str, str]:
    return {"old_version": "1.0.0", "new_version": "2.0.0", "archive": str(archive)}


def test_completion_reports_the_launchers_reason_after_a_rollback(tmp_path: Path) -> None:
    archive = tmp_path / "agent.pyz"
    h = UpgradeHandler()
    assert h.completion(proof(archive), boot_id="b", version="2.0.0") is None  # the core's rule: ok
    assert h.completion(proof(archive), boot_id="b", version="1.0.0") is None  # no marker: core decides
    launcher.write_marker(str(archive), {"state": launcher.ROLLED_BACK, "new_version": "2.0.0",
                                         "reason": "timeout", "message": "did not reach the gateway"})
    ok, reason, message = h.completion(proof(archive), boot_id="b", version="1.0.0")  # type: ignore[misc]
    assert (ok, reason) == (False, "timeout") and "rolled back to 1.0.0" in message
    assert "did not reach the gateway" in message


def test_joining_confirms_only_a_trial_of_the_running_version(tmp_path: Path) -> None:
    archive = tmp_path / "agent.pyz"
    assert not confirm_trial(str(archive), "2.0.0")  # no marker
    launcher.write_marker(str(archive), {"state": launcher.TRIAL, "new_version": "2.0.0"})
    assert not confirm_trial(str(archive), "1.0.0")  # the old build must not confirm the new one
    assert launcher.read_marker(str(archive))["state"] == launcher.TRIAL  # type: ignore[index]
    assert confirm_trial(str(archive), "2.0.0")
    assert launcher.read_marker(str(archive))["state"] == launcher.CONFIRMED  # type: ignore[index]
    assert not confirm_trial(None, "2.0.0")


def test_settle_treats_a_marker_without_the_new_build_as_interrupted(tmp_path: Path) -> None:
    archive = tmp_path / "agent.pyz"
    archive.write_bytes(b"old")
    old = hashlib.sha256(b"old").hexdigest()
    launcher.write_marker(str(archive), {"state": launcher.TRIAL, "old_sha256": old,
                                         "new_sha256": hashlib.sha256(b"new").hexdigest(),
                                         "deadline_unix": 0})
    marker = launcher.settle(str(archive))
    assert marker is not None and marker["state"] == launcher.ROLLED_BACK
    assert marker["reason"] == "interrupted"
    assert archive.read_bytes() == b"old"

