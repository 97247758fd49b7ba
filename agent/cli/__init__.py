"""The agent's command line: argparse, logging, dispatch, exit code.

A traceback only with --debug; otherwise one line that says what went wrong. Exit codes
(sysexits.h where one fits): 0 success, 1 the command ran and failed, 2 usage error,
69 a dependency or tool is unavailable, 70 internal error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent import catalog
from agent.errors import AgentError, InvalidParameters, MissingDependency, ToolMissing
from agent.version import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERNAL = 0, 1, 2, 69, 70

# Subcommands: name -> (help, add_arguments, run). Later modules add theirs through ``command``.
Subcommand = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
SUBCOMMANDS: dict[str, Subcommand] = {}


def command(
    name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    def register(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        SUBCOMMANDS[name] = (help, add_arguments or (lambda p: None), fn)
        return fn

    return register


def _kinds_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")
    p.add_argument("--role", choices=[str(r) for r in catalog.Role], help="only kinds this role serves")


@command("kinds", "print the command catalog: every kind, its lane, roles, flags and timeout", _kinds_args)
def cmd_kinds(args: argparse.Namespace) -> int:
    kinds = sorted(catalog.KINDS.values(), key=lambda k: k.name)
    if args.role:
        kinds = [k for k in kinds if k.serves(catalog.Role(args.role))]
    if args.json:
        json.dump([k.as_dict() for k in kinds], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    header = ("KIND", "LANE", "ROLES", "RETRY", "SELF-TERM", "ATTESTED", "DESTRUCTIVE", "TIMEOUT", "PAYLOAD")
    rows = [header] + [
        (
            k.name, str(k.lane), ",".join(sorted(str(r) for r in k.roles)),
            *("yes" if f else "-" for f in (k.retry_safe, k.self_terminating, k.attested, k.destructive)),
            _duration(k.timeout_seconds), k.payload,
        )
        for k in kinds
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    return EXIT_OK


def _duration(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds // 60}m"


def _version_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deps", action="store_true", help="also import and list the runtime dependencies")


def _protobuf_implementation() -> str:
    """Which of protobuf's implementations runs: "upb" (native: the zipapp's wheel for this
    machine) or "python" (pure: descriptors built in Python at every start)."""
    from google.protobuf.internal import api_implementation

    return f"implementation {api_implementation.Type()}"


@command("version", "print the agent version", _version_args)
def cmd_version(args: argparse.Namespace) -> int:
    print(__version__)
    if not args.deps:
        return EXIT_OK
    from agent.deps import need

    missing = 0
    for module in ("google.protobuf", "cryptography", "pynvml"):
        try:
            mod = need(module)
            print(f"{module} {getattr(mod, '__version__', '?')} ({mod.__file__})"
                  + (f", {_protobuf_implementation()}" if module == "google.protobuf" else ""))
        except MissingDependency as exc:
            print(f"{module}: {exc}")
            missing += 1
    if missing == 0:
        need("cryptography.hazmat.primitives.ciphers")  # the native part loads
    from agent.security import ed25519

    try:
        ed25519.PrivateKey.generate().sign(b"")  # signatures go through libcrypto (agent/security/ed25519.py)
        print(f"libcrypto Ed25519 ({ed25519.library_path()})")
    except MissingDependency as exc:
        print(f"libcrypto: {exc}")
        missing += 1
    return EXIT_UNAVAILABLE if missing else EXIT_OK


# Modules that add subcommands (``command``), by the subcommand. Only the one asked for is
# imported: ``agent run`` starts the ramdisk's agent, where every import is slow (emulation,
# a cold cache) and ``agent install`` has no use; ``kinds`` and ``version`` (defined here)
# import none, so they work where protobuf and the rest are missing. Help and usage errors
# load them all.
SUBCOMMAND_MODULES: dict[str, str] = {
    "run": "agent.cli.app", "exec": "agent.cli.app", "gateway": "agent.cli.app",
    "install": "agent.cli.install",
    "manifest": "agent.cli.manifest",
    "image": "agent.cli.image",
    "golden": "agent.cli.golden",
    "uefi-payload": "agent.cli.uefi_payload",
}


def _load_subcommands(argv: Sequence[str]) -> dict[str, MissingDependency]:
    """Import the modules of the subcommand in ``argv`` (all of them for help or a usage
    error). Returns the subcommands that cannot be had here, each with the dependency its
    module lacks; they are listed in the help as unavailable."""
    import importlib

    name = next((a for a in argv if not a.startswith("-")), "")
    wanted: list[str]
    if name in SUBCOMMANDS:
        wanted = []
    elif name in SUBCOMMAND_MODULES:
        wanted = [SUBCOMMAND_MODULES[name]]
    else:
        wanted = sorted(set(SUBCOMMAND_MODULES.values()))
    unavailable: dict[str, MissingDependency] = {}
    for module in wanted:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            from agent.deps import missing_from

            missing = missing_from(exc)
            if missing is None:
                raise
            for sub, mod in SUBCOMMAND_MODULES.items():
                if mod == module and sub not in SUBCOMMANDS:
                    unavailable[sub] = missing
    return unavailable


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, given its width from os.get_terminal_size: argparse's own default imports
    shutil for it (and shutil bz2, lzma and more), at the first add_argument of every start."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        if kwargs.get("width") is None:
            kwargs["width"] = max(_terminal_columns() - 2, 40)
        super().__init__(prog, **kwargs)


def _terminal_columns() -> int:
    """What shutil.get_terminal_size would say: $COLUMNS, the terminal's width, or 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]  # None: caught below
    except (OSError, AttributeError, ValueError):
        return 80


def build_parser(unavailable: Mapping[str, MissingDependency] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent", formatter_class=HelpFormatter,
        description="Better Compute machine agent: serves provisioning commands from its gateway "
        "in the ramdisk and node roles.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="debug logging and tracebacks")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name, (help_text, add_arguments, fn) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        add_arguments(p)
        p.set_defaults(func=fn)
    for name, missing in (unavailable or {}).items():
        dependency = missing.details.get("module", "?")
        sub.add_parser(name, help=f"unavailable here: missing Python dependency {dependency!r}")
    return parser


def setup_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    debug = "--debug" in argv
    try:
        unavailable = _load_subcommands(argv)
    except ModuleNotFoundError as exc:  # the agent's own module is missing: a broken build
        if debug:
            raise
        print(f"agent: internal error: {exc} (run with --debug for details)", file=sys.stderr)
        return EXIT_INTERNAL
    name = next((a for a in argv if not a.startswith("-")), "")
    if name in unavailable:
        if debug:
            raise unavailable[name]
        print(f"agent {name}: {unavailable[name]}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    parser = build_parser(unavailable)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    setup_logging(args.debug)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``agent kinds | head``): not an error worth a message.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (MissingDependency, ToolMissing) as exc:
        if args.debug:
            raise
        print(f"agent: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ModuleNotFoundError as exc:  # a lazy import inside the subcommand
        if args.debug:
            raise
        from agent.deps import missing_from

        missing = missing_from(exc)
        if missing is None:
            print(f"agent: internal error: {exc} (run with --debug for details)", file=sys.stderr)
            return EXIT_INTERNAL
        print(f"agent: {missing}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except InvalidParameters as exc:
        if args.debug:
            raise
        print(f"agent: {exc.reason}: {exc}", file=sys.stderr)
        return EXIT_USAGE  # bad input (a config file, the kernel command line): a usage error
    except AgentError as exc:
        if args.debug:
            raise
        print(f"agent: {exc.reason}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        if args.debug:
            raise
        print(f"agent: internal error: {type(exc).__name__}: {exc} (run with --debug for details)",
              file=sys.stderr)
        return EXIT_INTERNAL
