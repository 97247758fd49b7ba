"""`agent exec`: one command at the console, with the test-only handlers as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent.cli.app import targets_of
from agent.gateway.certs import DevPki, make_dev_pki
from agent.hw.bootid import boot_id
from agent.proc import alive
from agent.schema import payload_from_json
from tests.runtime.harness import AGENT_MAIN, ROOT, wait_until

WIPE = json.dumps({"disks": [{"serial": "S-1"}, {"name": "sdb"}]})


def agent_exec(test_dir: Path, *args: str, timeout: float = 60) -> tuple[int, dict[str, object], str]:
    (test_dir / "spec").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, BC_TEST_DIR=str(test_dir),
               PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(AGENT_MAIN), "exec", "--cmdline-file", "/dev/null", "--node", "n1", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, out, proc.stderr


def runs(test_dir: Path) -> int:
    log = test_dir / "executions.log"
    return log.read_text().count("start ") if log.exists() else 0


def test_targets_of_a_payload() -> None:
    assert targets_of(payload_from_json("disk.wipe", WIPE)) == ["S-1", "sdb"]
    assert targets_of(payload_from_json("deploy.image", {"target": {"wwn": "0x5000"}})) == ["0x5000"]
    assert targets_of(payload_from_json("gpu.reset", {"gpu": "GPU-1234"})) == ["GPU-1234"]
    assert targets_of(payload_from_json("node.reboot", {})) == []
    assert targets_of(payload_from_json("bmc.boot", {"bmc_address": "10.0.0.9:623"})) == ["10.0.0.9:623"]


def test_exec_runs_a_command_and_prints_its_result(tmp_path: Path) -> None:
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "inv.json").write_text(json.dumps({"progress": 4}))
    code, out, err = agent_exec(tmp_path, "inventory.refresh", "--payload", "{}", "--command-id", "inv")
    assert code == 0, err
    assert out["status"] == "SUCCEEDED" and out["kind"] == "inventory.refresh"
    assert "100.0% 4 B/4 B step 4" in err  # plain progress lines: stderr is not a terminal


def test_destructive_exec_needs_confirmation_naming_every_target(tmp_path: Path) -> None:
    code, out, err = agent_exec(tmp_path, "disk.wipe", "--payload", WIPE)
    assert code == 2 and out["status"] == "REFUSED" and "'S-1', 'sdb'" in str(out["message"])
    code, out, _ = agent_exec(tmp_path, "disk.wipe", "--payload", WIPE, "--confirm", "S-1")
    assert code == 2 and "sdb" in str(out["message"])
    assert runs(tmp_path) == 0
    both = ("--confirm", "S-1", "--confirm", "sdb")
    code, out, err = agent_exec(tmp_path, "disk.wipe", "--payload", WIPE, *both)
    assert code == 0, err
    assert out["status"] == "SUCCEEDED"
    assert runs(tmp_path) == 1


def test_destructive_exec_without_a_target_needs_the_node_id(tmp_path: Path) -> None:
    code, out, _ = agent_exec(tmp_path, "driver.invoke", "--payload", "{}")
    assert code == 2 and "'n1'" in str(out["message"])
    code, out, err = agent_exec(tmp_path, "driver.invoke", "--payload", "{}", "--confirm", "n1")
    assert code == 0, err


def test_exec_with_a_signed_command_file(tmp_path: Path, pki: DevPki) -> None:
    from agent.gateway.cli import main as gateway_main

    cmd = tmp_path / "cmd.json"
    sign = ["sign", "--signing-key", str(pki.signing_key), "--node", "n1", "--kind", "disk.wipe",
            "--payload", WIPE]
    console = ("--state-id", "console")
    assert gateway_main([*sign, "--boot-id", boot_id(), *console, "--out", str(cmd)]) == 0
    trusted = ("--trusted-key", str(pki.signing_pub))
    code, out, err = agent_exec(tmp_path, "disk.wipe", "--signed-command", str(cmd), *trusted)
    assert code == 0, err
    assert out["status"] == "SUCCEEDED"
    # Bound to this boot and to the console: a file for no boot or for another is refused, one
    # for no agent state or for a daemon's (a captured gateway command), as is a lifetime over 15 min.
    for name, extra, reason in (("unbound.json", [*console], "wrong_boot"),
                                ("other-boot", ["--boot-id", "0-other", *console], "wrong_boot"),
                                ("no-state.json", ["--boot-id", boot_id()], "wrong_state"),
                                ("daemon.json", ["--boot-id", boot_id(), "--state-id", "9f" * 16],
                                 "wrong_state"),
                                ("far.json", ["--boot-id", boot_id(), *console, "--expires-in", "1000"],
                                 "expired")):
        assert gateway_main([*sign, *extra, "--out", str(tmp_path / name)]) == 0
        code, out, _ = agent_exec(tmp_path, "disk.wipe", "--signed-command", str(tmp_path / name), *trusted)
        assert (code, out["reason"]) == (2, reason), out
    # Bound to n1: another node refuses it; an untrusted key is refused; a modified file too.
    code, out, _ = agent_exec(tmp_path, "disk.wipe", "--signed-command", str(cmd), *trusted, "--node", "n2")
    assert (code, out["reason"]) == (2, "wrong_node")
    other = make_dev_pki(tmp_path / "other")
    code, out, _ = agent_exec(tmp_path, "disk.wipe", "--signed-command", str(cmd),
                              "--trusted-key", str(other.signing_pub))
    assert (code, out["reason"]) == (2, "signature_unknown_key")
    data = json.loads(cmd.read_text())
    sig = data["signature"]
    data["signature"] = sig[:-4] + ("AAA=" if not sig.endswith("AAA=") else "BBB=")
    cmd.write_text(json.dumps(data))
    code, out, _ = agent_exec(tmp_path, "disk.wipe", "--signed-command", str(cmd), *trusted)
    assert (code, out["reason"]) == (2, "signature_invalid")
    assert runs(tmp_path) == 1


def test_exec_refuses_unknown_kinds_and_other_roles(tmp_path: Path) -> None:
    code, out, _ = agent_exec(tmp_path, "no.such", "--payload", "{}")
    assert (code, out["reason"]) == (2, "unknown_kind")
    code, out, _ = agent_exec(tmp_path, "gpu.reset", "--payload", "{}")  # node role only
    assert (code, out["reason"]) == (2, "wrong_role")
    code, out, _ = agent_exec(tmp_path, "bmc.power", "--payload", "{}")
    assert (code, out["reason"]) == (2, "not_this_daemon")
    code, out, _ = agent_exec(tmp_path, "inventory.refresh", "--payload", '{"nope": 1}')
    assert (code, out["reason"]) == (2, "invalid_parameters")


def test_exec_timeout_kills_the_children(tmp_path: Path) -> None:
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "slow.json").write_text(json.dumps({"child": True}))
    code, out, _ = agent_exec(tmp_path, "deploy.image", "--payload", "{}", "--confirm", "n1",
                              "--command-id", "slow", "--timeout", "2")
    assert code == 124 and out["status"] == "TIMED_OUT"
    pid = int((tmp_path / "child-slow.pid").read_text())
    wait_until(lambda: not alive(pid), 15, "the child to be killed")


def real_exec(*args: str) -> tuple[int, dict[str, object], str]:
    """`agent exec` with the product's own handlers (no test entry point)."""
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "exec", "--cmdline-file", "/dev/null", "--node", "n1", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def test_exec_validates_the_payload_before_asking_for_a_confirmation() -> None:
    code, out, _ = real_exec("disk.wipe", "--payload", "{}")
    assert (code, out["reason"]) == (2, "invalid_parameters")
    assert "needs at least one disk" in str(out["message"])


def test_exec_usage_errors_exit_2_and_the_site_role_is_a_role(tmp_path: Path) -> None:
    code, out, _ = real_exec("inventory.refresh", "--role", "rack")
    assert (code, out["reason"]) == (2, "invalid_parameters")
    code, out, _ = real_exec("deploy.image", "--role", "site", "--payload", "{}")
    assert (code, out["reason"]) == (2, "wrong_role")
    code, out, _ = real_exec("inventory.refresh", "--payload", '{"nope": 1}')
    assert code == 2 and "has no field 'nope'" in str(out["message"])
