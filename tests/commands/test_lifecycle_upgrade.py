"""daemon.upgrade for real: two builds of the zipapp, the agent under its launcher as a
subprocess against the reference gateway, replacing and re-executing itself.

Also the A/B failures: a new build that crashes at start and one that cannot reach the
gateway are rolled back by the launcher, and the previous agent reports the command FAILED
with the reason; a build that does not even start is refused before anything is replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent import launcher
from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from agent.gateway.records import State
from agent.proto import agent_pb2, common_pb2, session_pb2
from agent.security.trust import SigningKey
from tests.loopback_http import LoopbackServer
from tests.runtime.harness import start_gateway, wait_until

ROOT = Path(__file__).resolve().parents[2]
OLD, NEW = "1.0.0", "9.9.9"

pytestmark = pytest.mark.slow


def variant(of: Path, out: Path, prepend: str) -> Path:
    """A copy of the build ``of`` (the builds are deterministic: the same as building it again)
    with ``prepend`` at the top of its __main__.py (whose bytecode is left out: zipimport would
    run it in place of the changed source)."""
    with zipfile.ZipFile(of) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info, data in entries:
            if info.filename == "__main__.pyc":
                continue
            if info.filename == "__main__.py":
                data = prepend.encode() + b"\n" + data
            dst.writestr(info, data)
    out.write_bytes(buf.getvalue())
    return out


# Variants of the new build.
CRASH_ON_RUN = 'import sys\nif "run" in sys.argv:\n    raise SystemExit("new build: crash at start")'
NO_GATEWAY = ('import sys\nif "--gateway" in sys.argv:\n'
              '    sys.argv[sys.argv.index("--gateway") + 1] = "127.0.0.1:9"')
CRASH_ALWAYS = 'raise SystemExit("new build: broken")'


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, zipapp_of: Callable[[str], Path]) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("builds")
    new = zipapp_of(NEW)
    return {
        "old": zipapp_of(OLD),
        "new": new,
        "crash": variant(new, d / "crash.pyz", CRASH_ON_RUN),
        "no_gateway": variant(new, d / "nogw.pyz", NO_GATEWAY),
        "broken": variant(new, d / "broken.pyz", CRASH_ALWAYS),
    }


@pytest.fixture
def gateway(pki: DevPki) -> Iterator[Gateway]:
    gw = start_gateway(pki)
    yield gw
    gw.stop()


@dataclass
class Node:
    lib: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def archive(self) -> Path:
        return self.lib / "agent.pyz"

    def marker(self) -> dict[str, object] | None:
        return launcher.read_marker(str(self.archive))

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def node(tmp_path: Path, pki: DevPki, gateway: Gateway, builds: dict[str, Path]) -> Iterator[Node]:
    """The old build installed under its launcher, serving the gateway in the node role."""
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(builds["old"], lib / "agent.pyz")
    shutil.copy(ROOT / "agent" / "launcher.py", lib / "launcher.py")
    (tmp_path / "cmdline").write_text("")
    argv = [
        sys.executable, str(lib / "launcher.py"), str(lib / "agent.pyz"), "run",
        "--gateway", gateway.address, "--node", "node-1", "--role", "node",
        "--ca", str(pki.ca), "--cert", str(pki.client_cert("node-1")), "--key", str(pki.client_key("node-1")),
        "--state-dir", str(tmp_path / "state"), "--trusted-key", str(pki.signing_pub),
        "--cmdline-file", str(tmp_path / "cmdline"), "--reconnect-min", "0.05", "--reconnect-max", "0.5",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", launcher.LAUNCHER_ENV)}
    env["BC_AGENT_CACHE"] = str(tmp_path / "cache")
    log = tmp_path / "node.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    n = Node(lib, proc, log)
    try:
        gateway.wait_node("node-1", 60)
        assert gateway.nodes["node-1"].hello.agent_version == OLD, n.logs()
        yield n
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the launcher's group outlives the test


def upgrade(gateway: Gateway, pki: DevPki, srv: LoopbackServer, build: Path, *, rejoin: int = 60,
            version: str = NEW) -> str:
    data = build.read_bytes()
    sha = hashlib.sha256(data)
    key = SigningKey.load(pki.signing_key)
    srv.add("/agent.pyz", data)
    payload = agent_pb2.DaemonSection(
        version=version, url=srv.url("/agent.pyz"),
        digest=common_pb2.Digest(algorithm="sha256", hex=sha.hexdigest()),
        signature=key.sign_artifact(sha.digest()), key_id=key.key_id, rejoin_timeout_seconds=rejoin,
    )
    return gateway.send("node-1", "daemon.upgrade", payload)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_upgrade_replaces_and_reexecs_then_completes(gateway: Gateway, pki: DevPki, node: Node,
                                                      builds: dict[str, Path]) -> None:
    pid = node.proc.pid
    with LoopbackServer() as srv:
        cid = upgrade(gateway, pki, srv, builds["new"])
        rec = gateway.wait(cid, 120)
    assert rec.state is State.COMPLETED, (rec, node.logs())
    assert rec.completion is not None and rec.completion.ok, node.logs()
    assert (rec.completion.old_version, rec.completion.new_version) == (OLD, NEW)
    assert gateway.nodes["node-1"].hello.agent_version == NEW
    assert sha(node.archive) == sha(builds["new"])
    assert sha(node.lib / "agent.pyz.prev") == sha(builds["old"])
    assert not (node.lib / "agent.pyz.new").exists()
    wait_until(lambda: (node.marker() or {}).get("state") == launcher.CONFIRMED, 60, "trial confirmed")
    assert node.proc.pid == pid and node.proc.poll() is None  # the launcher kept running
    # Upgrading to the version it runs: a restart of the same build, then complete.
    with LoopbackServer() as srv:
        cid = upgrade(gateway, pki, srv, builds["new"])
        body, _ = gateway.wait_result(cid, 60)
    assert body.status == session_pb2.SUCCEEDED and body.details["new_version"] == NEW
    assert sha(node.archive) == sha(builds["new"])


@pytest.mark.parametrize(("variant", "rejoin", "reason", "words"), [
    ("crash", 120, "bad_image", "did not stay up"),
    ("no_gateway", 4, "timeout", "did not reach the gateway"),
])
def test_failed_upgrade_is_rolled_back_and_reported(gateway: Gateway, pki: DevPki, node: Node,
                                                    builds: dict[str, Path], variant: str, rejoin: int,
                                                    reason: str, words: str) -> None:
    with LoopbackServer() as srv:
        cid = upgrade(gateway, pki, srv, builds[variant], rejoin=rejoin)
        rec = gateway.wait(cid, 180)
    assert rec.state is State.COMPLETED, (rec, node.logs())
    assert rec.completion is not None and not rec.completion.ok, node.logs()
    assert rec.completion.reason == reason, rec.completion
    assert words in rec.completion.message
    assert gateway.nodes["node-1"].hello.agent_version == OLD
    assert sha(node.archive) == sha(builds["old"])
    marker = node.marker()
    assert marker is not None and marker["state"] == launcher.ROLLED_BACK
    # The old agent still serves commands.
    cid = gateway.send("node-1", "daemon.upgrade", agent_pb2.DaemonSection(version="bad version!"))
    with pytest.raises(Exception, match="invalid_parameters"):
        gateway.wait_result(cid, 30)


def test_build_that_does_not_start_is_refused_before_anything_changes(
        gateway: Gateway, pki: DevPki, node: Node, builds: dict[str, Path]) -> None:
    before = sha(node.archive)
    with LoopbackServer() as srv:
        cid = upgrade(gateway, pki, srv, builds["broken"])
        body, _ = gateway.wait_result(cid, 120)
    assert body.reason == "bad_image" and "does not start" in body.message
    assert sha(node.archive) == before and not (node.lib / "agent.pyz.new").exists()
    with LoopbackServer() as srv:
        cid = upgrade(gateway, pki, srv, builds["new"], version="9.9.8")
        body, _ = gateway.wait_result(cid, 120)
    assert body.reason == "bad_image" and "reports version '9.9.9'" in body.message
    assert node.marker() is None and gateway.nodes["node-1"].hello.agent_version == OLD


def test_unsigned_or_tampered_build_is_refused(gateway: Gateway, pki: DevPki, node: Node,
                                               builds: dict[str, Path]) -> None:
    data = builds["new"].read_bytes()
    other = SigningKey.generate()
    with LoopbackServer() as srv:
        srv.add("/agent.pyz", data)
        digest = hashlib.sha256(data)
        payload = agent_pb2.DaemonSection(
            version=NEW, url=srv.url("/agent.pyz"), digest=common_pb2.Digest(hex=digest.hexdigest()),
            signature=other.sign_artifact(digest.digest()), key_id=other.key_id)
        body, _ = gateway.wait_result(gateway.send("node-1", "daemon.upgrade", payload), 60)
        assert body.reason == "signature_unknown_key"
        key = SigningKey.load(pki.signing_key)
        payload.signature = key.sign_artifact(hashlib.sha256(b"another build").digest())
        payload.key_id = key.key_id
        body, _ = gateway.wait_result(gateway.send("node-1", "daemon.upgrade", payload), 60)
        assert body.reason == "signature_invalid"
    assert sha(node.archive) == sha(builds["old"]) and not (node.lib / "agent.pyz.new").exists()
