"""``agent run`` (serve the gateway) and ``agent exec`` (one command at the console).

Settings for both come from agent/settings.py: flags, then a JSON config file, then the
kernel command line's ``bc.*`` parameters, then the defaults.

``agent exec KIND --payload JSON`` runs one command here, without a gateway, for a person
doing a recovery at the console. It shows a progress bar on a terminal (plain lines when
stderr is not one) and prints the result as JSON on stdout. A destructive kind runs only
with ``--signed-command FILE`` (a SignedCommand verified against the trusted keys, bound to
this node) or ``--confirm TARGET`` naming every target of the payload (disk serial, WWN or
name; GPU index or UUID; for kinds without a target, the node id). Exit codes: 0 succeeded,
1 ran and failed, 2 refused before running (bad payload, no confirmation, untrusted),
69 a tool or dependency is missing, 124 timed out, 130 interrupted.

TEST ONLY: ``BC_AGENT_TEST_HANDLERS=<module or file.py>`` is imported at start, before the
handlers are collected, so tests can serve real kind names with test handlers. It is logged
loudly and must never be set on a real machine.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError, Message

from agent import catalog, schema, settings
from agent.cli import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, command
from agent.errors import (
    AgentError,
    Cancelled,
    CommandTimeout,
    InvalidParameters,
    MissingDependency,
    Reason,
    ToolMissing,
    Untrusted,
)
from agent.proto import session_pb2

log = logging.getLogger(__name__)

TEST_HANDLERS_ENV = "BC_AGENT_TEST_HANDLERS"
EXIT_TIMEOUT, EXIT_INTERRUPTED = 124, 130
SWITCH_INTERVAL_SECONDS = 0.0005


def load_test_handlers() -> str | None:
    """Import the module named by BC_AGENT_TEST_HANDLERS (tests only); its name or None."""
    spec = os.environ.get(TEST_HANDLERS_ENV, "")
    if not spec:
        return None
    log.warning("%s=%s: loading TEST-ONLY handlers; never set this on a real machine",
                TEST_HANDLERS_ENV, spec)
    if spec.endswith(".py") or os.sep in spec:
        module_spec = importlib.util.spec_from_file_location("agent_test_handlers", spec)
        if module_spec is None or module_spec.loader is None:
            raise InvalidParameters(f"{TEST_HANDLERS_ENV}: cannot load {spec}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)
    return spec


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
    from agent.session import Session, SessionOptions

    loaded = settings.load_from_args(args)
    Session.check_config(loaded.config)  # before anything is created on disk
    _setup_file_log(loaded.config.log_file)
    load_test_handlers()
    from agent.core import Agent

    # A handler that computes in Python holds the GIL; hand it over more often than the default
    # 5 ms so the control lane and the session stay responsive (bench/lane_latency.py).
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    agent = Agent(loaded.config, cmdline=loaded.cmdline)
    session = Session(agent, loaded.config, SessionOptions(**loaded.session))
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stopping.set()
        # Not in the handler itself: the interrupted main thread may hold the session's lock.
        threading.Thread(target=session.stop, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # -- site role: its boot service and proxy routes (agent/site/services.py) --
    site = loaded.config.role == catalog.Role.SITE
    if site:
        from agent.site import services as site_services

        site_services.start(loaded.config)
    # -- end site role --
    agent.start()
    log.info("agent %s serving as %s in role %s, gateway %s", _version(), loaded.config.node_id,
             loaded.config.role, loaded.config.gateway)
    try:
        session.run()
    finally:
        agent.stop(10.0)
        if site:
            site_services.stop()
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
    """What a destructive payload acts on: disks (serial, WWN, name, path), GPUs."""
    found: list[str] = []
    if msg.DESCRIPTOR.full_name == "bettercompute.agent.v1.DiskHints":
        for field in ("serial", "wwn", "name", "by_path", "model"):
            value = getattr(msg, field)
            if value:
                return [value]
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

    data = path.read_bytes()
    signed = session_pb2.SignedCommand()
    try:
        json_format.Parse(data.decode("utf-8"), signed)
        return signed
    except (UnicodeDecodeError, json_format.ParseError):
        pass
    try:
        signed.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidParameters(f"{path}: neither a SignedCommand in JSON nor in binary protobuf") from exc
    return signed


def _authorize(args: argparse.Namespace, kind: catalog.Kind, config: Any) -> tuple[Message, str]:
    """The payload to run and the command id; raises when the command may not run."""
    from agent.trust import TrustStore

    if args.signed_command is not None:
        signed = _read_signed(args.signed_command)
        if not config.trusted_keys:
            raise Untrusted("no trusted control-plane keys configured (--trusted-key)",
                            reason=Reason.SIGNATURE_UNKNOWN_KEY)
        store = TrustStore.load(config.trusted_keys)
        if kind.destructive and not signed.signature:
            raise Untrusted(f"{kind.name} is destructive: the command file is not signed",
                            reason=Reason.SIGNATURE_MISSING)
        body = store.verify_command(signed, node_id=config.node_id, now_ms=int(time.time() * 1000), kind=kind)
        return schema.decode_payload(kind.name, body.payload), body.command_id
    text = args.payload_file.read_text() if args.payload_file else (args.payload or "{}")
    payload = schema.payload_from_json(kind.name, text)
    if kind.destructive:
        targets = sorted(set(targets_of(payload))) or [config.node_id]
        missing = [t for t in targets if t not in args.confirm]
        if missing:
            raise InvalidParameters(
                f"{kind.name} is destructive: confirm by naming every target with --confirm "
                f"({', '.join(repr(t) for t in targets)}), or run a signed command (--signed-command)",
                targets=",".join(targets),
            )
    return payload, args.command_id or f"exec-{os.getpid()}-{int(time.time())}"


@command("exec", "run one command here without a gateway (recovery at the console)", _exec_args)
def cmd_exec(args: argparse.Namespace) -> int:
    from agent.commands.base import Context, SelfTermination
    from agent.progressbar import ProgressBar

    loaded = settings.load_from_args(args)
    config = loaded.config
    load_test_handlers()
    from agent.commands import handler_class

    kind = catalog.KINDS.get(args.kind)
    try:
        if kind is None:
            raise InvalidParameters(f"unknown kind {args.kind!r}; see `agent kinds`",
                                    reason=Reason.UNKNOWN_KIND)
        if not kind.serves(config.role):
            reason = Reason.NOT_THIS_DAEMON if kind.site_only else Reason.WRONG_ROLE
            raise InvalidParameters(f"{kind.name} does not run in role {config.role}", reason=reason)
        cls = handler_class(kind.name)
        if cls is None:
            raise ToolMissing(f"no handler for {kind.name} in this build", reason=Reason.UNSUPPORTED)
        handler = cls()
        payload, command_id = _authorize(args, kind, config)
        params = handler.parse(payload)
    except (MissingDependency, ToolMissing) as exc:
        return _print_refusal(args.kind, exc, EXIT_UNAVAILABLE)
    except (AgentError, OSError) as exc:
        return _print_refusal(args.kind, exc, EXIT_USAGE)

    bar = ProgressBar(sys.stderr, label=kind.name)
    ctx = Context.local(kind.name, config, timeout=args.timeout, progress_sink=bar.update,
                        command_id=command_id)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = handler.run(ctx, params)
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=work, name=f"exec-{kind.name}", daemon=True)
    started = time.time()
    worker.start()
    try:
        while worker.is_alive() and time.monotonic() < ctx.deadline:
            worker.join(0.1)
    except KeyboardInterrupt:
        ctx.cancel_event.set()
        ctx.kill_children()
        worker.join(5)
        bar.finish()
        return _print_outcome(kind, command_id, started, Cancelled("interrupted at the console"),
                              None, EXIT_INTERRUPTED)
    if worker.is_alive():
        ctx.timed_out.set()
        ctx.cancel_event.set()
        ctx.kill_children()
        worker.join(5)
        bar.finish()
        return _print_outcome(kind, command_id, started,
                              CommandTimeout(f"{kind.name}: deadline reached"), None, EXIT_TIMEOUT)
    ctx.kill_children()  # whatever the handler left behind ends with it
    bar.finish()
    error = outcome.get("error")
    if error is not None:
        if isinstance(error, AgentError):
            code = {Reason.TIMEOUT: EXIT_TIMEOUT, Reason.CANCELLED: EXIT_INTERRUPTED,
                    Reason.TOOL_MISSING: EXIT_UNAVAILABLE}.get(error.reason, EXIT_FAILED)
            return _print_outcome(kind, command_id, started, error, None, code)
        raise error
    result = outcome.get("result")
    if isinstance(result, SelfTermination):
        _print_outcome(kind, command_id, started, None, result.result, EXIT_OK, proof=result.proof)
        sys.stdout.flush()
        result.action()  # does not return when it works
        raise AgentError(f"{kind.name}: the self-terminating action returned")
    return _print_outcome(kind, command_id, started, None, result, EXIT_OK)


def _print_refusal(kind: str, exc: BaseException, code: int) -> int:
    reason, message, details = (exc.to_wire() if isinstance(exc, AgentError)
                                else (str(Reason.INVALID_PARAMETERS), str(exc), {}))
    json.dump({"kind": kind, "status": "REFUSED", "reason": reason, "message": message,
               "details": details}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    print(f"agent: refused: {reason}: {message}", file=sys.stderr)
    return code


def _print_outcome(
    kind: catalog.Kind,
    command_id: str,
    started: float,
    error: AgentError | None,
    result: Message | None,
    code: int,
    proof: dict[str, str] | None = None,
) -> int:
    out: dict[str, Any] = {"kind": kind.name, "command_id": command_id}
    if error is None:
        out["status"] = "SUCCEEDED"
    else:
        reason, message, details = error.to_wire()
        statuses = {Reason.TIMEOUT: "TIMED_OUT", Reason.CANCELLED: "CANCELLED"}
        out["status"] = statuses.get(error.reason, "FAILED")
        out.update(reason=reason, message=message, details=details)
    out["seconds"] = round(time.time() - started, 3)
    if result is not None:
        from google.protobuf import json_format

        out["result"] = json_format.MessageToDict(result, preserving_proto_field_name=True)
    if proof is not None:
        out["proof"] = proof
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return code


# -- agent gateway -----------------------------------------------------------------------------


def _gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("gateway_args", nargs=argparse.REMAINDER, help="see `python -m agent.gateway --help`")


@command("gateway", "the reference gateway (same as python -m agent.gateway)", _gateway_args)
def cmd_gateway(args: argparse.Namespace) -> int:
    from agent.gateway.cli import main

    return main(args.gateway_args)
