"""Shared by the in-process Agent tests: test handlers serving real kind names, a frame
collector, and a World that builds Agents on one state dir (a "crash" is an Agent stopped with
its handler still blocked, then a new Agent on the same state dir)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from agent import catalog, schema
from agent.catalog import Role
from agent.commands.base import Context, Handler, SelfTermination
from agent.config import Config
from agent.errors import InvalidParameters
from agent.proto import agent_pb2, session_pb2
from agent.runtime.core import Agent
from agent.security.trust import SigningKey

WAIT = 30.0
NODE = "node-1"


# -- test handlers ----------------------------------------------------------------------------


class Blocking(Handler[Message, Message]):
    """Runs until the test sets ``release`` (or the command is cancelled / times out)."""

    def __init__(self, kind: str) -> None:
        self.kind_name = kind
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def parse(self, payload: Message) -> Message:
        return payload

    def run(self, ctx: Context, params: Message) -> Message:
        with self.lock:
            self.calls.append(ctx.command_id)
        self.started.set()
        while not self.release.wait(0.02):
            ctx.check()
        return schema.result_class(self.kind_name)()


class Quick(Handler[Message, Message]):
    def __init__(self, kind: str, body: Callable[[Context], Message] | None = None) -> None:
        self.kind_name = kind
        self.calls: list[str] = []
        self.interrupted: list[Message] = []  # the params on_interrupted was given
        self.body = body

    def parse(self, payload: Message) -> Message:
        return payload

    def on_interrupted(self, params: Message) -> None:
        self.interrupted.append(params)

    def run(self, ctx: Context, params: Message) -> Message:
        self.calls.append(ctx.command_id)
        if self.body is not None:
            return self.body(ctx)
        return schema.result_class(self.kind_name)()


class Picky(Quick):
    def parse(self, payload: Message) -> Message:
        assert isinstance(payload, agent_pb2.WipeRequest)
        if not payload.disks:
            raise InvalidParameters("disk.wipe: at least one disk")
        return payload


class Terminating(Handler[Message, Message]):
    """A self-terminating handler whose action only records that it was called."""

    def __init__(self, kind: str, proof: dict[str, str] | None = None) -> None:
        self.kind_name = kind
        self.proof = proof or {}
        self.actions: list[float] = []
        self.calls: list[str] = []
        self.boot_ids: list[str] = []

    def parse(self, payload: Message) -> Message:
        return payload

    def run(self, ctx: Context, params: Message) -> SelfTermination:
        self.calls.append(ctx.command_id)
        self.boot_ids.append(ctx.boot_id)
        return SelfTermination(proof=dict(self.proof), action=lambda: self.actions.append(time.monotonic()),
                               result=schema.result_class(self.kind_name)())


# -- harness ----------------------------------------------------------------------------------


class Frames:
    def __init__(self) -> None:
        self.frames: list[session_pb2.Frame] = []
        self.results: dict[str, session_pb2.ResultBody] = {}   # the first result of each command
        self.cond = threading.Condition()

    def __call__(self, frame: session_pb2.Frame) -> None:
        body = (session_pb2.ResultBody.FromString(frame.result.body)
                if frame.WhichOneof("msg") == "result" else None)
        with self.cond:
            self.frames.append(frame)
            if body is not None:
                self.results.setdefault(body.command_id, body)
                self.cond.notify_all()

    def of(self, what: str, cid: str | None = None) -> list[Any]:
        with self.cond:
            items = [getattr(f, what) for f in self.frames if f.WhichOneof("msg") == what]
        if cid is None:
            return items
        if what == "result":
            return [r for r in items if session_pb2.ResultBody.FromString(r.body).command_id == cid]
        return [i for i in items if i.command_id == cid]

    def result(self, cid: str, timeout: float = WAIT) -> session_pb2.ResultBody:
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                if cid in self.results:
                    return self.results[cid]
                left = end - time.monotonic()
                assert left > 0, f"no result for {cid}"
                self.cond.wait(left)


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cp = SigningKey.generate()
        keys = tmp / "keys"
        keys.mkdir()
        self.cp.save_public(keys / "cp.pem")
        self.keys = (keys,)
        self.state = tmp / "state"
        self.agents: list[Agent] = []
        self.boot_id = "boot-A"   # the boot of the latest agent: destructive commands name it
        self.state_id = ""        # ... and the state (journal) of the latest agent
        self.releases: list[threading.Event] = []

    def agent(
        self,
        handlers: dict[str, Handler[Any, Any]],
        *,
        role: Role = Role.RAMDISK,
        boot_id: str = "boot-A",
        cmdline: str = "",
        settings: dict[str, Any] | None = None,   # Config fields beyond the World's
        **kwargs: Any,
    ) -> tuple[Agent, Frames]:
        for h in handlers.values():
            if hasattr(h, "release"):
                self.releases.append(h.release)
        self.boot_id = boot_id
        agent = Agent(
            Config(state_dir=self.state, node_id=NODE, role=role, trusted_keys=self.keys, **(settings or {})),
            handlers=handlers, boot_id=boot_id, cmdline=cmdline, **kwargs,
        )
        frames = Frames()
        agent.subscribe(frames)
        agent.start()
        self.state_id = agent.state_id
        self.agents.append(agent)
        return agent, frames

    def command(
        self, cid: str, kind: str, payload: Message | None = None, *, sign: bool | None = None,
        timeout: int = 0, **fields: Any,
    ) -> session_pb2.SignedCommand:
        k = catalog.KINDS[kind]
        body = session_pb2.CommandBody(
            command_id=cid, kind=kind, node_id=NODE,
            payload=(payload or schema.payload_class(kind)()).SerializeToString(),
            issued_at_unix_ms=int(time.time() * 1000),
            expires_at_unix_ms=int(time.time() * 1000) + 600_000,
            timeout_seconds=timeout,
            boot_id=self.boot_id if k.destructive else "",
            state_id=self.state_id if k.destructive else "",
        )
        for name, value in fields.items():
            setattr(body, name, value)
        if sign if sign is not None else k.destructive:
            return self.cp.sign_command(body)
        return session_pb2.SignedCommand(body=body.SerializeToString())


def world_in(tmp_path: Path, stop_timeout: float = 2.0) -> Iterator[World]:
    """For a fixture: ``yield from world_in(tmp_path)``; stops every Agent afterwards."""
    w = World(tmp_path)
    yield w
    for ev in w.releases:
        ev.set()
    for a in w.agents:
        a.stop(timeout=stop_timeout)


def accepted(answer: Any) -> session_pb2.Accept:
    assert isinstance(answer, session_pb2.Accept), answer
    return answer


def rejected(answer: Any) -> str:
    assert isinstance(answer, session_pb2.Reject), answer
    return answer.reason
