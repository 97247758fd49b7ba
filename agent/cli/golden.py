"""``agent golden``: the golden state of this node, captured by the agent itself.

Run on a node known clean (at enrollment, after a factory reset and the fleet's own settings):
every node source (agent/commands/inventory/golden.py) read whole, printed as the Capture JSON
that ExpectedState.golden.capture carries (docs/lifecycle.md, "The golden state"). A source that
cannot be read is in the capture's ``unreadable`` and makes the exit code 1: a golden state is
taken whole or reviewed by a person before it is used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, command, settings
from agent.errors import AgentError
from agent.policy.release.golden import NODE_SOURCES


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sources", default=",".join(NODE_SOURCES),
                   help=f"the sources to read, comma-separated (default: {','.join(NODE_SOURCES)})")
    p.add_argument("-o", "--output", type=Path, help="write the capture here (default: standard output)")
    settings.add_arguments(p)


@command("golden", "capture this node's golden state (every UEFI variable, the TPM, NICs, NVMe, GPUs)",
         _args)
def cmd_golden(args: argparse.Namespace) -> int:
    from agent import atomicfile
    from agent.commands.base import Context
    from agent.commands.inventory import collect, golden
    from agent.hw import gpu

    sources = tuple(s for s in args.sources.split(",") if s)
    unknown = [s for s in sources if s not in NODE_SOURCES]
    if unknown or not sources:
        print(f"agent golden: unknown sources {unknown}; the node's are {','.join(NODE_SOURCES)}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        config = settings.load_from_args(args).config
        ctx = Context.local("inventory.refresh", config)
        inv = collect(nvml_library=gpu.library_path(config.nvml_library), skip_gpus="gpu" not in sources,
                      kernel_log=lambda: None)
        captured = golden.capture(ctx, inv, sources=sources)
    except AgentError as exc:
        print(f"agent golden: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    data = captured.to_json()
    if args.output is None:
        sys.stdout.buffer.write(data)
    else:
        atomicfile.write_atomic(args.output, data, 0o644)
    for source, why in sorted(captured.unreadable.items()):
        print(f"agent golden: {source} could not be read: {why}", file=sys.stderr)
    counts = ", ".join(f"{s} {len(items)}" for s, items in sorted(captured.sources.items()))
    print(f"agent golden: {counts or 'nothing'} items", file=sys.stderr)
    return EXIT_FAILED if captured.unreadable else EXIT_OK
