"""`agent install --root DIR`: the installed layout of the node role, and that the unit's
command line really serves a gateway in the node role from it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from tests.runtime.harness import start_gateway, wait_until

ROOT = Path(__file__).resolve().parents[2]
VERSION = "1.0.0"     # test_lifecycle_upgrade's old build: one build for both in a process


@pytest.fixture(scope="module")
def archive(zipapp_of: Callable[[str], Path]) -> Path:
    return zipapp_of(VERSION)


@pytest.fixture
def gateway(pki: DevPki) -> Iterator[Gateway]:
    gw = start_gateway(pki)
    yield gw
    gw.stop()


UNIT = "etc/systemd/system/bettercompute-agent.service"


def run_install(archive: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["BC_AGENT_CACHE"] = str(root.parent / "cache")
    return subprocess.run([sys.executable, str(archive), "install", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120, env=env)


@contextlib.contextmanager
def unit_running(root: Path, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The installed unit's ExecStart (its /usr/lib and /etc paths under ``root``) as a process
    of its own, its output in tmp_path/service.log; once the body is done, waits until its
    session to the gateway is up, then stops it (SIGTERM; the process group killed after)."""
    unit = (root / UNIT).read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = [str(root) + a if a.startswith(("/usr/lib/", "/etc/")) else a
            for a in shlex.split(exec_start.removeprefix("ExecStart="))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["BC_AGENT_CACHE"] = str(tmp_path / "cache")
    log = tmp_path / "service.log"
    with log.open("wb") as out:
        service = subprocess.Popen([*argv, "--cmdline-file", "/dev/null"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        yield service
        # Stop it once it is fully connected (Gateway.wait_node returns at the Hello).
        wait_until(lambda: b"connected to gateway" in log.read_bytes(), 60,
                   "the session to be established")
    finally:
        service.terminate()
        try:
            service.wait(60)
        except subprocess.TimeoutExpired as exc:
            service.kill()
            service.wait()
            raise AssertionError("the service did not stop:\n" + log.read_text()) from exc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.pid, signal.SIGKILL)


def test_install_writes_the_layout_and_enables_the_unit(tmp_path: Path, archive: Path) -> None:
    root = tmp_path / "root"
    out = run_install(archive, root, "--gateway", "gw.example:7443", "--trusted-key", "/etc/bc/cp.pub",
                      "--trusted-key", "/etc/bc/cp2.pub")
    assert out.returncode == 0, out.stderr
    lib = root / "usr/lib/bettercompute"
    assert (lib / "agent.pyz").read_bytes() == archive.read_bytes()
    assert os.access(lib / "agent.pyz", os.X_OK)
    assert (lib / "launcher.py").read_bytes() == (ROOT / "agent" / "launcher.py").read_bytes()
    config = json.loads((root / "etc/bettercompute/agent.json").read_text())
    assert config == {"role": "node", "state_dir": "/var/lib/bettercompute-agent",
                      "gateway": "gw.example:7443", "trusted_keys": ["/etc/bc/cp.pub", "/etc/bc/cp2.pub"]}
    assert (root / "etc/bettercompute/agent.json").stat().st_mode & 0o077 == 0
    unit = (root / UNIT).read_text()
    assert ("ExecStart=/usr/bin/python3 /usr/lib/bettercompute/launcher.py /usr/lib/bettercompute/agent.pyz "
            "run --config /etc/bettercompute/agent.json") in unit
    assert "Restart=always" in unit and "StateDirectory=bettercompute-agent" in unit
    link = root / "etc/systemd/system/multi-user.target.wants/bettercompute-agent.service"
    assert os.readlink(link) == "/etc/systemd/system/bettercompute-agent.service"
    assert (root / "var/lib/bettercompute-agent").is_dir()
    # Again: updates in place, same result.
    assert run_install(archive, root, "--gateway", "gw2.example:7443").returncode == 0
    assert json.loads((root / "etc/bettercompute/agent.json").read_text())["gateway"] == "gw2.example:7443"


def test_install_refuses_the_ramdisk_role_and_a_source_tree(tmp_path: Path, archive: Path) -> None:
    out = run_install(archive, tmp_path / "root", "--role", "ramdisk")
    assert out.returncode != 0 and "node role" in out.stderr
    src = subprocess.run([sys.executable, "-m", "agent", "install", "--root", str(tmp_path / "r2")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert src.returncode != 0 and "--archive" in src.stderr


def test_unit_verifies_with_systemd_analyze(tmp_path: Path, archive: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    root = tmp_path / "root"
    assert run_install(archive, root, "--python", sys.executable).returncode == 0
    unit = root / UNIT
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "bettercompute-agent" not in out.stderr, out.stderr


def test_the_units_command_serves_the_gateway_in_the_node_role(tmp_path: Path, archive: Path, pki: DevPki,
                                                                gateway: Gateway) -> None:
    root = tmp_path / "root"
    state = tmp_path / "state"
    out = run_install(
        archive, root, "--python", sys.executable, "--gateway", gateway.address, "--node", "node-7",
        "--ca", str(pki.ca), "--cert", str(pki.client_cert("node-7")), "--key", str(pki.client_key("node-7")),
        "--trusted-key", str(pki.signing_pub), "--state-dir", str(state),
    )
    assert out.returncode == 0, out.stderr
    with unit_running(root, tmp_path) as service:
        node = gateway.wait_node("node-7", 60)
        assert node.hello.role == "node" and node.hello.agent_version == VERSION
        assert "daemon.upgrade" in node.hello.kinds and "node.reboot" in node.hello.kinds
        assert (state / "journal").exists()
    assert service.returncode == 0, (tmp_path / "service.log").read_text()
