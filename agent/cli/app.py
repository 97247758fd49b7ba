"""``agent run`` (serve the gateway) and ``agent exec`` (one command at the console).

Settings for both come from agent/cli/settings.py: flags, then a JSON config file, then the
kernel command line's ``bc.*`` parameters, then the defaults.

``agent exec KIND --payload JSON`` runs one command here, without a gateway, for a person
doing a recovery at the console. It goes through the same admission, lanes, deadlines and
result code as a gateway's command (an Agent with a private, temporary journal), so the two
can never disagree. It shows a progress bar on a terminal (plain lines when stderr is not
one) and prints the result as JSON on stdout. A destructive kind runs only with
``--signed-command FILE`` (a SignedCommand verified against the trusted keys, bound to this
node and boot, and to the state id ``console``: the temporary journal keeps no ids, so a
command signed for a daemon's state never runs here, nor one signed for the console there)
or ``--confirm TARGET`` naming every target of the payload (disk serial, WWN or name; GPU
index or UUID; for kinds without a target, the node id), checked after the payload is
validated. Exit codes: 0 succeeded, 1 ran and failed, 2 refused before running (bad payload,
no confirmation, untrusted, wrong role), 69 a tool or dependency is missing, 124 timed out,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError, Message

from agent import catalog, limits, schema
from agent.cli import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, command, settings
from agent.errors import AgentError, Cancelled, InvalidParameters, MissingDependency, Reason
from agent.proto import session_pb2
from agent.security.trust import CONSOLE_STATE_ID, decode_command_body

if TYPE_CHECKING:
    from agent.progressbar import ProgressBar
    from agent.runtime.core import Agent

log = logging.getLogger(__name__)

EXIT_TIMEOUT, EXIT_INTERRUPTED = 124, 130
SWITCH_INTERVAL_SECONDS = 0.0005


def _setup_file_log(path: Path | None) -> None:
    if path is None:
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)


# -- agent run ---------------------------------------------------------------------------------


def _run_args(p: argparse.ArgumentParser) -> None:
    p.epilog = f"Settings precedence: {settings.PRECEDENCE}."
    settings.add_arguments(p)


@command("run", "serve commands from the gateway (dials out over TLS 1.3)", _run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from agent.link.options import SessionOptions
    from agent.link.session import Session

    loaded = settings.load_from_args(args)
    Session.check_config(loaded.config)  # before anything is created on disk
    _setup_file_log(loaded.config.log_file)
    from agent.runtime.core import Agent

    # A handler that computes in Python holds the GIL; hand it over more often than the default
    # 5 ms so the control lane and the session stay responsive (bench/lane_latency.py).
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    # -- site role: its boot service and proxy routes (agent/site/services.py), in the context --
    site = None
    if loaded.config.role == catalog.Role.SITE:
        from agent.site import services as site_services

        site = site_services.start(loaded.config)
    try:
        agent = Agent(loaded.config, cmdline=loaded.cmdline, site=site)
        if site is not None:
            site.bmc = agent.scheduler.keyed     # the BMC executor's counters, for /metrics
        session = Session(agent, loaded.config, SessionOptions(**loaded.session))
        stopping = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            log.info("%s: stopping", signal.Signals(signum).name)
            stopping.set()
            # Not in the handler itself: the interrupted main thread may hold the session's lock.
            threading.Thread(target=session.stop, name="stop", daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        agent.start()
        log.info("agent %s serving as %s in role %s, gateway %s", _version(), loaded.config.node_id,
                 loaded.config.role, loaded.config.gateway)
        try:
            session.run()
        finally:
            agent.stop(10.0)
    finally:
        if site is not None:
            site.stop()
    return EXIT_OK


def _version() -> str:
    from agent.version import __version__

    return __version__


# -- agent exec --------------------------------------------------------------------------------


def _exec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", help="command kind (see `agent kinds`)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--payload", metavar="JSON", help="the payload as JSON (default: {})")
    src.add_argument("--payload-file", type=Path, metavar="FILE", help="the payload JSON from a file")
    src.add_argument("--signed-command", type=Path, metavar="FILE",
                     help="a SignedCommand (binary protobuf or JSON) signed by a trusted control-plane key")
    p.add_argument("--confirm", action="append", default=[], metavar="TARGET",
                   help="destructive kinds without a signed command: name each target (repeatable)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="less than the kind's timeout")
    p.add_argument("--command-id", metavar="ID", help="an id for the logs (default: exec-PID-TIME)")
    p.epilog = (
        "Exit codes: 0 succeeded, 1 failed, 2 refused before running, 69 tool missing, "
        f"124 timed out, 130 interrupted. Settings precedence: {settings.PRECEDENCE}."
    )
    settings.add_arguments(p)


def targets_of(msg: Message) -> list[str]:
    """What a destructive payload acts on: disks (serial, WWN, name, path), GPUs, a BMC."""
    found: list[str] = []
    if msg.DESCRIPTOR.full_name == "bettercompute.site.v1.BmcOperationRequest":
        from agent.proto import site_pb2

        assert isinstance(msg, site_pb2.BmcOperationRequest)
        return [msg.bmc_address]  # the BMC, whichever node it serves
    if msg.DESCRIPTOR.full_name == "bettercompute.agent.v1.DiskHints":
        for name in ("serial", "wwn", "name", "by_path", "model"):
            if value := getattr(msg, name):
                return [str(value)]
        return ["(any disk)"]
    for field, value in msg.ListFields():
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                continue
            items = value if field.is_repeated else [value]
            for item in items:
                found.extend(targets_of(item))
        elif field.name in ("gpu", "gpus"):
            found.extend(value if field.is_repeated else [value])
    return found


def _read_signed(path: Path) -> session_pb2.SignedCommand:
    from google.protobuf import json_format

    data = limits.read_bounded(path, what="signed command file", max_bytes=limits.MAX_CONFIG_BYTES)
    signed = session_pb2.SignedCommand()
    if data.lstrip()[:1] == b"{":
        obj = limits.loads_json(data, what=f"signed command file {path}", max_bytes=limits.MAX_CONFIG_BYTES)
        try:
            json_format.ParseDict(obj, signed)
        except (json_format.ParseError, ValueError, TypeError, AttributeError) as exc:
            raise InvalidParameters(f"{path}: not a SignedCommand in JSON ({exc})") from exc
        return signed
    try:
        signed.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidParameters(f"{path}: neither a SignedCommand in JSON nor in binary protobuf") from exc
    return signed


def _signed_command(args: argparse.Namespace, kind_name: str, node_id: str) -> tuple[
        session_pb2.SignedCommand, Callable[[catalog.Kind, Message], None] | None]:
    """The command to submit, and the console's authorisation when it is not signed."""
    if args.signed_command is not None:
        signed = _read_signed(args.signed_command)
        body = decode_command_body(signed.body)
        if body.kind != kind_name:
            raise InvalidParameters(f"{args.signed_command} is a {body.kind} command, not {kind_name}")
        return signed, None
    text = (limits.read_bounded(args.payload_file, what="payload file", max_bytes=limits.MAX_JSON_BYTES)
            .decode("utf-8", "replace") if args.payload_file else (args.payload or "{}"))
    # An unknown kind goes to the agent with no payload: its refusal says unknown_kind.
    body = schema.command_body(
        node_id, kind_name, text if kind_name in catalog.KINDS else b"",
        command_id=args.command_id or f"exec-{os.getpid()}-{int(time.time())}",
        timeout_seconds=math.ceil(args.timeout) if args.timeout else 0,
    )
    signed = session_pb2.SignedCommand(body=body.SerializeToString())
    return signed, partial(_confirmed, args.confirm, node_id)


def _confirmed(confirmed: list[str], node_id: str, kind: catalog.Kind, payload: Message) -> None:
    """A person at the console authorises a destructive kind by naming each of its targets."""
    if not kind.destructive:
        return
    targets = sorted(set(targets_of(payload))) or [node_id]
    if missing := [t for t in targets if t not in confirmed]:
        raise InvalidParameters(
            f"{kind.name} is destructive: confirm by naming every target with --confirm "
            f"({', '.join(repr(t) for t in targets)}), or run a signed command (--signed-command)",
            targets=",".join(targets), missing=",".join(missing),
        )


class _ConsoleRun:
    """One command submitted to an in-process Agent, followed to its result."""

    def __init__(self, bar: ProgressBar) -> None:
        self.bar = bar
        self.command_id = ""
        self.result: session_pb2.ResultBody | None = None
        self.done = threading.Event()

    def on_frame(self, frame: session_pb2.Frame) -> None:
        what = frame.WhichOneof("msg")
        if what == "progress" and frame.progress.command_id == self.command_id:
            self.bar.update(frame.progress)
        elif what == "result":
            body = session_pb2.ResultBody.FromString(frame.result.body)
            if body.command_id == self.command_id:
                self.result = body
                self.done.set()


_EXIT_OF_STATUS = {
    session_pb2.SUCCEEDED: EXIT_OK, session_pb2.TIMED_OUT: EXIT_TIMEOUT,
    session_pb2.CANCELLED: EXIT_INTERRUPTED,
}


def _exit_code(body: session_pb2.ResultBody) -> int:
    if body.reason == Reason.TOOL_MISSING:
        return EXIT_UNAVAILABLE
    return _EXIT_OF_STATUS.get(body.status, EXIT_FAILED)


@command("exec", "run one command here without a gateway (recovery at the console)", _exec_args)
def cmd_exec(args: argparse.Namespace) -> int:
    from agent.progressbar import ProgressBar
    from agent.runtime.core import Agent

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bc-agent-exec-", dir=_exec_state_root()) as state:
        try:
            loaded = settings.load_from_args(args)
            signed, console = _signed_command(args, args.kind, loaded.config.node_id)
            agent = Agent(replace(loaded.config, state_dir=Path(state)), cmdline="",
                          state_id=CONSOLE_STATE_ID)
        except (AgentError, OSError) as exc:
            return _print_refusal(args.kind, exc, EXIT_USAGE)
        run = _ConsoleRun(ProgressBar(sys.stderr, label=args.kind))
        run.command_id = decode_command_body(signed.body).command_id
        agent.subscribe(run.on_frame)
        def print_before_the_end() -> None:
            _print_result(run, agent, started, proof=True)

        # A self-terminating command prints its outcome before its action ends this process.
        agent.add_exit_hook(print_before_the_end)
        agent.start()
        try:
            reply = agent.submit(signed, console=console)
            if isinstance(reply, session_pb2.Reject):
                code = EXIT_UNAVAILABLE if reply.reason == Reason.TOOL_MISSING else EXIT_USAGE
                return _print_refusal(args.kind, AgentError(reply.message, reason=Reason(reply.reason)),
                                      code)
            while not run.done.wait(0.1):
                pass
            if agent.state_of(run.command_id) == session_pb2.AWAITING_REJOIN:
                agent.wait_idle()  # its action ends this process: getting past it means it returned
                raise AgentError(f"{args.kind}: the self-terminating action returned")
        except KeyboardInterrupt:
            agent.cancel(run.command_id, "interrupted at the console")
            run.done.wait(10)
        finally:
            agent.stop(10.0)
            run.bar.finish()
        if run.result is None:
            return _print_refusal(args.kind, Cancelled("interrupted at the console"), EXIT_INTERRUPTED)
        return _print_result(run, agent, started)


def _exec_state_root() -> str | None:
    """Where `agent exec` keeps its journal and key for the one command: on tmpfs, as the
    daemon's journal is (/dev/shm), where there is one, so that its fsyncs never wait behind
    what else a disk's file system has to write (a deploy's target may be a file there)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _print_refusal(kind: str, exc: BaseException, code: int) -> int:
    reason, message, details = (exc.to_wire() if isinstance(exc, AgentError)
                                else (str(Reason.INVALID_PARAMETERS), str(exc), {}))
    json.dump({"kind": kind, "status": "REFUSED", "reason": reason, "message": message,
               "details": details}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    print(f"agent: refused: {reason}: {message}", file=sys.stderr)
    return code


def _print_result(run: _ConsoleRun, agent: Agent, started: float, *, proof: bool = False) -> int:
    """Print the command's result as JSON on stdout; its exit code."""
    body = run.result
    if body is None:
        return EXIT_INTERNAL
    out: dict[str, Any] = {"kind": body.kind, "command_id": body.command_id,
                           "status": session_pb2.Status.Name(body.status)}
    if body.reason:
        out.update(reason=body.reason, message=body.message, details=dict(body.details))
    out["seconds"] = round(time.time() - started, 3)
    if body.payload:
        from google.protobuf import json_format

        result = schema.message_class(body.payload_type).FromString(body.payload)
        out["result"] = json_format.MessageToDict(result, preserving_proto_field_name=True)
    entry = agent.journal.entries.get(body.command_id)
    if proof and entry is not None:
        out["proof"] = dict(entry.proof)
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return _exit_code(body)


# -- agent gateway -----------------------------------------------------------------------------


def _gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("gateway_args", nargs=argparse.REMAINDER, help="keys, send, serve or sign and its options")


@command("gateway", "the reference gateway (`agent gateway COMMAND --help` for each)", _gateway_args)
def cmd_gateway(args: argparse.Namespace) -> int:
    try:
        from agent.gateway.cli import main
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("agent.gateway"):
            raise
        # The ramdisk's agent is built without it (build/zipapp.py --without-gateway).
        raise MissingDependency("the reference gateway is not in this build of the agent; run it "
                                "from dist/agent.pyz or a source tree (python -m agent.gateway)",
                                module="agent.gateway") from None
    return main(args.gateway_args)
