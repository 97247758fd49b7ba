"""The bmc.* kinds through the Agent in role site (admission, trust, journal, results), against
ipmi_sim: destructive kinds unsigned are refused and change nothing; and no secret used in
the test reaches any output: logs, results, frames, journal, error messages, the argv of any
process on the machine while the test runs."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.catalog import Role
from agent.commands import handler_for
from agent.commands.base import Handler
from agent.config import Config
from agent.proto import session_pb2, site_pb2
from agent.runtime.core import Agent
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from tests.runtime.core_harness import NODE, Frames, World, accepted, rejected
from tests.site.conftest import PASSWORD, REF, USERNAME, IpmiSim

KINDS = ("bmc.boot", "bmc.firmware", "bmc.power", "bmc.query", "bmc.rotate", "bmc.storage")
GIVEN = "Given-Secret-8rT"
WRONG = "Wrong-Secret-2pQ"


class ArgvWatcher:
    """Reads every process's command line, every few ms, while the test runs."""

    def __init__(self) -> None:
        self.seen: dict[int, bytes] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._scan, daemon=True)

    def _scan(self) -> None:
        while not self.stop.wait(0.003):
            for pid in os.listdir("/proc"):
                if pid.isdigit() and int(pid) not in self.seen:
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            cmdline = f.read()
                    except OSError:
                        continue
                    if cmdline:
                        self.seen[int(pid)] = cmdline

    def __enter__(self) -> ArgvWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def site_agent(world: World, config: Config, *, kinds: tuple[str, ...] = KINDS,
               extra_handlers: dict[str, Handler[Any, Any]] | None = None,
               **settings: Any) -> tuple[Agent, Frames]:
    """An Agent in role site with the real handlers of ``kinds`` (and ``extra_handlers``),
    on ``config``'s state and secrets, with ``settings`` of Config besides."""
    handlers: dict[str, Handler[Any, Any]] = dict(extra_handlers or {})
    for kind in kinds:
        h = handler_for(kind)
        assert h is not None
        handlers[kind] = h
    agent = Agent(Config(role=Role.SITE, node_id=NODE, state_dir=config.state_dir,
                         trusted_keys=world.keys, secrets_dir=config.secrets_dir, **settings),
                  handlers=handlers, boot_id=world.boot_id, cmdline="")
    frames = Frames()
    agent.subscribe(frames)
    agent.start()
    world.state_id = agent.state_id
    world.agents.append(agent)
    return agent, frames


def bmc(world: World, cid: str, kind: str, sim: IpmiSim, operation: str, *, sign: bool | None = None,
        ref: str = REF, **parameters: str) -> session_pb2.SignedCommand:
    payload = site_pb2.BmcOperationRequest(node_id="n01", bmc_address=sim.address, protocol="ipmi",
                                           operation=operation, credentials_ref=ref, parameters=parameters)
    return world.command(cid, kind, payload, sign=sign)


def test_unsigned_boot_and_rotate_are_refused_and_change_nothing(
        sim: IpmiSim, site_config: Config, world: World) -> None:
    agent, _ = site_agent(world, site_config)
    store = SecretStore(site_config.secrets_dir)
    assert rejected(agent.submit(bmc(world, "r1", "bmc.rotate", sim, "rotate", sign=False))) \
        == "signature_missing"
    assert rejected(agent.submit(bmc(world, "b1", "bmc.boot", sim, "set_boot_device", sign=False,
                                     device="pxe"))) == "signature_missing"
    assert store.get(REF) == Credentials(USERNAME, PASSWORD) and store.pending(REF) is None
    assert sim.node.boot_device() == "disk"
    assert sim.logs_in()                # the old password still works (asked until answered)
    # The non-destructive kinds need no signature.
    accepted(agent.submit(bmc(world, "q1", "bmc.power", sim, "status")))


def test_no_secret_reaches_any_output(sim: IpmiSim, site_config: Config, world: World,
                                      caplog: pytest.LogCaptureFixture,
                                      capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    store = SecretStore(site_config.secrets_dir)
    store.put("given", Credentials("unused", GIVEN))
    store.put("wrong", Credentials(USERNAME, WRONG))
    with ArgvWatcher() as watcher:
        agent, frames = site_agent(world, site_config)
        commands = [
            bmc(world, "c1", "bmc.rotate", sim, "rotate"),                          # generated
            bmc(world, "c2", "bmc.query", sim, "query"),
            bmc(world, "c3", "bmc.rotate", sim, "rotate", new_password_ref="given"),
            bmc(world, "c4", "bmc.power", sim, "status", ref="wrong"),             # auth error
            bmc(world, "c5", "bmc.boot", sim, "set_boot_device", device="pxe"),
        ]
        results: dict[str, session_pb2.ResultBody] = {}
        used = {PASSWORD, GIVEN, WRONG}
        for cmd in commands:
            cid = session_pb2.CommandBody.FromString(cmd.body).command_id
            accepted(agent.submit(cmd))
            results[cid] = frames.result(cid, timeout=60)
            used.add(store.get(REF).password)      # c1's generated one among them
        agent.stop(timeout=5)
    statuses = {cid: (r.status, r.reason) for cid, r in results.items()}
    assert results["c4"].reason == "auth_failed", statuses
    assert all(r.status == session_pb2.SUCCEEDED for cid, r in results.items() if cid != "c4"), statuses
    assert store.get(REF).password == GIVEN
    assert len(used) == 4

    outputs: dict[str, bytes] = {
        "log records": caplog.text.encode(),
        "stdout/stderr": "".join(capfd.readouterr()).encode(),
        "frames": b"".join(f.SerializeToString() for f in frames.frames),
        "results": b"".join(r.SerializeToString() + r.message.encode() for r in results.values()),
    }
    for path in Path(site_config.state_dir).rglob("*"):
        if path.is_file():
            outputs[f"state file {path.name}"] = path.read_bytes()
    for name in ("ipmi_sim.log",):
        outputs[name] = (sim.workdir / name).read_bytes()
    for path in sim.node.dir.glob("*.log"):
        outputs[path.name] = path.read_bytes()
    argvs = b"\n".join(watcher.seen.values())
    outputs["argv of every process"] = argvs
    # The watcher really saw the client's ipmitool runs (so this check can fail).
    assert argvs.count(b"ipmitool\x00-v\x00-I\x00lanplus") >= 5
    assert any(k.startswith("state file") for k in outputs), "the journal was not found"
    for secret in used:
        for where, blob in outputs.items():
            assert secret.encode() not in blob, f"a secret reached {where}"
    # And the check itself can see a secret where there is one (the store's own entry).
    assert GIVEN.encode() in (site_config.secrets_dir / REF / "current.json").read_bytes()
