"""``python -m agent.gateway`` / ``agent gateway``: the reference gateway from a shell.

    keys  --out DIR [--host H]... [--node N]...   dev CA, gateway cert, client certs, signing key
    send  --pki DIR --node N --kind K --payload JSON     wait for the node, send one command,
                                                  show its progress, print the result as JSON
    serve --pki DIR [--listen HOST:PORT]          a gateway with a line console on stdin:
                                                  nodes | send NODE KIND JSON | cancel ID |
                                                  drain NODE | wait ID | reenroll NODE |
                                                  accept NODE | events | quit
    reenroll --attest-state DIR NODE              a node's TPM replaced: forget the EK bound to it
                                                  and its counters (docs/attestation.md)
    accept --attest-state DIR NODE                a node's firmware changed: its next attested join
                                                  may learn its PCRs 0, 2, 7 (docs/attestation.md)
    sign  --signing-key F --node N --kind K --payload JSON [--boot-id ID] --out FILE
                                                  a signed command file for `agent exec`
                                                  (destructive kinds: the node's boot id)

Exit codes of ``send``: 0 succeeded, 1 failed, 2 rejected or usage, 124 no node or no
result within the time given.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format

from agent.errors import AgentError, InvalidParameters
from agent.gateway.certs import DevPki, make_dev_pki
from agent.gateway.records import CommandRecord, CommandRejected, GatewayEvent, build_command
from agent.gateway.server import Gateway
from agent.gateway.verifier.attest import Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Policy
from agent.gateway.verifier.state import NodeState, NodeStates
from agent.progressbar import ProgressBar
from agent.proto import session_pb2
from agent.security.trust import CONSOLE_STATE_ID, SigningKey

log = logging.getLogger(__name__)


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _gateway_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pki", type=Path, metavar="DIR",
                   help="directory made by `keys`: gives the four below unless they are given")
    p.add_argument("--cert", type=Path, metavar="PEM", help="server certificate (default: DIR/gateway.pem)")
    p.add_argument("--key", type=Path, metavar="PEM", help="its private key (default: DIR/gateway.key)")
    p.add_argument("--client-ca", type=Path, metavar="PEM",
                   help="CA that signs agents' client certificates (default: DIR/ca.pem)")
    p.add_argument("--signing-key", type=Path, metavar="PEM",
                   help="control-plane Ed25519 private key that signs commands "
                   "(default: DIR/signing.key where it exists; without one, commands go unsigned "
                   "and destructive kinds cannot be sent)")
    p.add_argument("--token", action="append", default=[], metavar="TOKEN[=NODE]",
                   help="accept this enrollment token, for NODE only when given (repeatable; default: none)")
    p.add_argument("--listen", default="127.0.0.1:7443", metavar="HOST:PORT",
                   help="address to listen on (default: %(default)s)")
    p.add_argument("--heartbeat", type=float, default=5.0, metavar="SECONDS",
                   help="heartbeat interval asked of agents; a session silent for 3 intervals is "
                   "dropped (default: %(default)g)")
    p.add_argument("--attest-policy", type=Path, metavar="JSON",
                   help="attest every join against this policy file (docs/attestation.md); "
                   "without it the gateway does not challenge TPMs")
    p.add_argument("--ek-ca", action="append", default=[], type=Path, metavar="PEM",
                   help="a TPM vendor's EK CA (root or intermediate) the EK certificates chain to "
                   "(repeatable)")
    p.add_argument("--pin-ek", action="append", default=[], metavar="NODE=SHA256",
                   help="the SHA-256 of a node's EK public area, trusted without a certificate (repeatable)")
    p.add_argument("--attest-state", type=Path, metavar="DIR",
                   help="keep each node's bound EK and TPM counters here across restarts (a folder, "
                   "made 0700; docs/attestation.md); without it the gateway forgets them when it stops")
    p.add_argument("--site-node", default="", metavar="NODE",
                   help="the site daemon that boots the nodes: a join refused by attestation is told "
                   "to it as boot.cleanUp with join_refused (its timeline names the cause; docs/site.md)")


def _make_gateway(args: argparse.Namespace) -> Gateway:
    pki = DevPki(args.pki) if args.pki else None
    cert = args.cert or (pki.gateway_cert if pki else None)
    key = args.key or (pki.gateway_key if pki else None)
    if cert is None or key is None:
        raise SystemExit("gateway: give --pki DIR or --cert and --key")
    client_ca = args.client_ca or (pki.ca if pki else None)
    signing = args.signing_key or (pki.signing_key if pki and pki.signing_key.exists() else None)
    tokens = dict(t.partition("=")[::2] for t in args.token)
    host, port = _listen(args.listen)
    if args.site_node and args.attest_policy is None:
        raise InvalidParameters("--site-node needs --attest-policy (it is told of refused joins)")
    return Gateway(cert=cert, key=key, client_ca=client_ca, signing_key=signing, tokens=tokens,
                   host=host, port=port, heartbeat_seconds=args.heartbeat, attestation=_attestation(args),
                   site_node=args.site_node)


def _attestation(args: argparse.Namespace) -> JoinAttestation | None:
    if args.attest_policy is None:
        if args.ek_ca or args.pin_ek or args.attest_state:
            raise InvalidParameters("--ek-ca, --pin-ek and --attest-state need --attest-policy")
        return None
    pinned = {}
    for item in args.pin_ek:
        node, _, digest = item.partition("=")
        try:
            pinned[node] = bytes.fromhex(digest)
        except ValueError:
            pinned[node] = b""
        if not node or len(pinned[node]) != 32:
            raise InvalidParameters(f"--pin-ek {item!r}: expected NODE=<64 hex digits>")
    states = NodeStates(args.attest_state) if args.attest_state else None
    verifier = Verifier(Policy.load(args.attest_policy), ek_roots=load_certificates(args.ek_ca),
                        pinned_ek=pinned, states=states)
    return JoinAttestation(verifier)


def _record_json(rec: CommandRecord, gw: Gateway) -> dict[str, object]:
    out: dict[str, object] = {"command_id": rec.command_id, "node_id": rec.node_id, "kind": rec.kind,
                              "state": str(rec.state)}
    if rec.reject_reason:
        out.update(reason=rec.reject_reason, message=rec.reject_message)
    if rec.state.final and rec.state != "rejected":
        body, msg = gw.wait_result(rec.command_id, 0.1)
        out["status"] = session_pb2.Status.Name(body.status)
        if body.reason:
            out.update(reason=body.reason, message=body.message)
        if body.details:
            out["details"] = dict(body.details)
        if msg is not None:
            out["result"] = json_format.MessageToDict(msg, preserving_proto_field_name=True)
        if rec.catalog_kind is not None and rec.catalog_kind.attested and gw.attestation is not None:
            gw.attestation.wait_verdict(rec.node_id, 30.0)
            out["verified"], out["verified_why"] = gw.verified(rec.command_id)
    return out


def boots_summary(msg: object) -> list[str]:
    """A site's inventory.refresh result in a line per node: its last boot attempt and cause
    (docs/site.md, "Why a node did not come up"); none for any other result."""
    boots = getattr(msg, "node_boots", None)
    if not boots:
        return []
    lines = []
    for b in boots:
        line = f"{b.node_id}: attempt {b.attempt} ({b.method}, {b.trigger}): {b.outcome}"
        if b.cause:
            line += f": {b.cause}: {b.cause_detail}"
        lines.append(line + f" [console: {b.console}]")
        lines.extend(f"    | {text}" for text in b.last_lines)
    return lines


def _print_boots(rec: CommandRecord, gw: Gateway) -> None:
    if rec.state.final and rec.state != "rejected" and rec.kind == "inventory.refresh":
        _, msg = gw.wait_result(rec.command_id, 0.1)
        for line in boots_summary(msg):
            print(line, file=sys.stderr)


# -- keys ------------------------------------------------------------------------------------


def cmd_keys(args: argparse.Namespace) -> int:
    hosts = tuple(args.host) or ("localhost", "127.0.0.1", "::1")
    pki = make_dev_pki(args.out, hosts=hosts, nodes=tuple(args.node))
    for path in sorted(pki.dir.iterdir()):
        print(path)
    return 0


# -- sign ------------------------------------------------------------------------------------


def cmd_sign(args: argparse.Namespace) -> int:
    key = SigningKey.load(args.signing_key)
    body = build_command(args.node, args.kind, args.payload, command_id=args.command_id,
                         expires_in=args.expires_in, boot_id=args.boot_id, state_id=args.state_id)
    signed = key.sign_command(body)
    args.out.write_text(json_format.MessageToJson(signed) + "\n")
    print(f"{args.out}: {args.kind} {body.command_id} for {args.node}, signed by {key.key_id}")
    return 0


# -- send ------------------------------------------------------------------------------------


def cmd_send(args: argparse.Namespace) -> int:
    gw = _make_gateway(args)
    bar = ProgressBar(sys.stderr, label=args.kind)

    def show(ev: GatewayEvent, rec: CommandRecord | None) -> None:
        if ev.what == "progress" and rec is not None and rec.progress is not None:
            bar.update(rec.progress)
        elif ev.what == "log" and not bar.tty:
            print(f"  log {ev.detail}", file=sys.stderr)

    gw.listeners.append(show)
    with gw:
        print(f"gateway listening on {gw.address}; waiting for {args.node}", file=sys.stderr)
        try:
            gw.wait_node(args.node, args.wait_node)
            cid = gw.send(args.node, args.kind, args.payload, timeout_seconds=args.timeout or 0,
                          command_id=args.command_id)
            rec = gw.wait(cid, args.wait_result)
        except TimeoutError as exc:
            bar.finish()
            print(f"gateway: {exc}", file=sys.stderr)
            return 124
        except AgentError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
        bar.finish()
        print(json.dumps(_record_json(rec, gw), indent=2))
        _print_boots(rec, gw)
        if rec.state == "rejected":
            return 2
        return 0 if rec.succeeded else 1


# -- serve -----------------------------------------------------------------------------------

HELP = ("commands: nodes | send NODE KIND JSON [TIMEOUT] | cancel ID | drain NODE | wait ID | "
        "reenroll NODE | accept NODE | events | quit")


def cmd_serve(args: argparse.Namespace) -> int:
    gw = _make_gateway(args)

    def show(ev: GatewayEvent, rec: CommandRecord | None) -> None:
        if ev.what in ("progress", "log"):
            if ev.what == "log" or (rec is not None and rec.progress is not None):
                print(f"  [{ev.command_id}] {ev.what} {ev.detail}", flush=True)
            return
        print(f"* {ev}", flush=True)

    gw.listeners.append(show)
    with gw:
        print(f"gateway listening on {gw.address}. {HELP}", flush=True)
        for line in sys.stdin:
            try:
                words = shlex.split(line)
            except ValueError as exc:
                print(f"? {exc}")
                continue
            if not words:
                continue
            try:
                if not _console(gw, words):
                    break
            except (AgentError, KeyError, TimeoutError, ValueError) as exc:
                print(f"? {type(exc).__name__}: {exc}", flush=True)
    return 0


def _console(gw: Gateway, words: list[str]) -> bool:
    cmd, rest = words[0], words[1:]
    if cmd == "quit":
        return False
    if cmd == "nodes":
        for n in gw.node_list():
            h = n.hello
            state = "connected" if n.connected else "gone"
            verdict = gw.attestation.verdict(n.node_id) if gw.attestation is not None else None
            print(f"{n.node_id} {state} {h.role} {h.agent_version} boot={h.boot_id} state={h.state_id} "
                  f"key={n.public_key.hex()[:16]} kinds={','.join(h.kinds)}"
                  + (f" boot {verdict}" if verdict is not None else ""))
    elif cmd == "send" and len(rest) in (3, 4):
        timeout = int(rest[3]) if len(rest) == 4 else 0
        print(gw.send(rest[0], rest[1], rest[2], timeout_seconds=timeout))
    elif cmd == "cancel" and len(rest) == 1:
        gw.cancel(rest[0])
    elif cmd == "drain" and len(rest) == 1:
        gw.drain(rest[0])
    elif cmd == "wait" and len(rest) in (1, 2):
        rec = gw.wait(rest[0], float(rest[1]) if len(rest) == 2 else 3600)
        print(json.dumps(_record_json(rec, gw), indent=2))
        _print_boots(rec, gw)
    elif cmd == "reenroll" and len(rest) == 1 and gw.attestation is not None:
        print(_reenrolled(rest[0], gw.attestation.verifier.reenroll(rest[0])))
    elif cmd == "accept" and len(rest) == 1 and gw.attestation is not None:
        gw.attestation.verifier.accept(rest[0])
        print(ACCEPTED.format(node=rest[0]))
    elif cmd == "events":
        for ev in gw.events:
            print(ev)
    else:
        print(HELP)
    sys.stdout.flush()
    return True


def _reenrolled(node: str, kept: NodeState | None) -> str:
    if kept is None or not kept.ek:
        return f"{node}: no EK was bound; its next attested join binds one"
    return (f"{node}: EK {kept.ek.hex()} and its TPM's counters forgotten; its next attested join "
            "binds the new EK")


ACCEPTED = ("{node}: its next attested join may learn what its firmware measured (PCRs 0, 2, 7, under "
            "the profile it reports); the window closes with that join")


def _state_folder(args: argparse.Namespace) -> NodeStates:
    if not args.attest_state.is_dir():
        raise InvalidParameters(f"--attest-state {args.attest_state}: no such folder")
    return NodeStates(args.attest_state)


def cmd_reenroll(args: argparse.Namespace) -> int:
    """A TPM replaced: the node's bound EK and counters go (the gateway running or not)."""
    print(_reenrolled(args.node, _state_folder(args).release(args.node)))
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    """A firmware update or a new board: the node's next attested join may learn its PCRs."""
    _state_folder(args).accept(args.node)
    print(ACCEPTED.format(node=args.node))
    return 0


# -- main ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent gateway", description="The reference gateway for agents.")
    parser.add_argument("--debug", action="store_true", help="debug logging and tracebacks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("keys", help="make a dev CA, gateway and client certificates, a signing key")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="directory to write them to (created); give it to --pki later")
    p.add_argument("--host", action="append", default=[],
                   help="a name or IP the gateway certificate is valid for (repeatable; "
                   "default: localhost, 127.0.0.1, ::1)")
    p.add_argument("--node", action="append", default=[],
                   help="make a client certificate for NODE (repeatable; default: none)")
    p.set_defaults(func=cmd_keys)
    p = sub.add_parser("send", help="wait for a node, send one command, print its result")
    _gateway_options(p)
    _command_options(p)
    p.add_argument("--wait-node", type=float, default=300.0, metavar="SECONDS",
                   help="how long to wait for the node to connect; exit 124 after (default: %(default)g)")
    p.add_argument("--wait-result", type=float, default=6 * 3600.0, metavar="SECONDS",
                   help="how long to wait for the result; exit 124 after (default: %(default)g, 6 h)")
    p.add_argument("--timeout", type=int, metavar="SECONDS",
                   help="ask for less than the kind's timeout (default: the kind's, `agent kinds`)")
    p.set_defaults(func=cmd_send)
    p = sub.add_parser("serve", help="run a gateway with a line console on stdin")
    _gateway_options(p)
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("reenroll",
                       help="forget the EK bound to a node and its TPM's counters (a TPM replaced)")
    p.add_argument("--attest-state", type=Path, required=True, metavar="DIR",
                   help="the gateway's --attest-state folder")
    p.add_argument("node", help="the node whose TPM was replaced")
    p.set_defaults(func=cmd_reenroll)
    p = sub.add_parser("accept", help="let a node's next attested join learn its firmware's PCRs "
                       "(a firmware update, a changed profile)")
    p.add_argument("--attest-state", type=Path, required=True, metavar="DIR",
                   help="the gateway's --attest-state folder")
    p.add_argument("node", help="the node whose firmware changed")
    p.set_defaults(func=cmd_accept)
    p = sub.add_parser("sign", help="write a signed command file (for agent exec --signed-command)")
    p.add_argument("--signing-key", type=Path, required=True, metavar="PEM",
                   help="control-plane Ed25519 private key (`keys` writes DIR/signing.key)")
    _command_options(p)
    p.add_argument("--expires-in", type=float, default=600.0, metavar="SECONDS",
                   help="the agent refuses the command after this long (default: %(default)g; "
                        "it refuses more than its max_signature_lifetime_seconds, 900 by default)")
    p.add_argument("--boot-id", default="", metavar="ID",
                   help="the node's /proc/sys/kernel/random/boot_id (destructive kinds need it)")
    p.add_argument("--state-id", default="", metavar="ID",
                   help="the agent state the command is for (destructive kinds need it): "
                        f"{CONSOLE_STATE_ID!r} for agent exec --signed-command, else the state id of "
                        "the node's Hello (`nodes` shows it)")
    p.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="where to write the signed command (JSON)")
    p.set_defaults(func=cmd_sign)
    return parser


def _command_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", required=True, help="node id (as in its client certificate)")
    p.add_argument("--kind", required=True, help="command kind (`agent kinds` lists them)")
    p.add_argument("--payload", default="{}", metavar="JSON",
                   help="the kind's request as JSON (default: %(default)s)")
    p.add_argument("--command-id", metavar="ID", help="(default: KIND-<12 random hex digits>)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except CommandRejected as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    except AgentError as exc:
        if args.debug:
            raise
        print(f"gateway: {exc.reason}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
