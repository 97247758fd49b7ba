"""``agent manifest IMAGE``: the chunk manifest of an image, written beside it (agent/images/manifest.py
builds it); prints its sha256 for deploy.image's "manifest"."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.cli import EXIT_OK, command
from agent.images.manifest import DEFAULT_CHUNK, from_proto, image_format_name, write


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", type=Path, help="the published image: raw, gzip, xz, bzip2, zstd or qcow2")
    p.add_argument("-o", "--output", type=Path, help="where to write it (default: IMAGE.manifest)")
    p.add_argument("--chunk-size", type=_size, default=DEFAULT_CHUNK,
                   help="bytes per chunk, a power of two from 64K to 16M (default 4M)")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    mult = units.get(text[-1:].upper(), 1)
    digits = text[:-1] if mult > 1 else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4M)")
    return int(digits) * mult


@command("manifest", "make the chunk manifest of an image (prints its sha256 for the deploy payload)", _args)
def cmd_manifest(args: argparse.Namespace) -> int:
    out, digest, m = write(args.image, args.output, chunk_size=args.chunk_size)
    zeros = sum(1 for s in from_proto(m).segments if s.digest is None)
    print(f"sha256:{digest}  {out}")
    print(f"{m.image_size} bytes raw, {m.chunk_count} chunks of {m.chunk_size}, {zeros} of them zeros;"
          f" published {image_format_name(m.published_format)} sha256:{m.published.hex}", file=sys.stderr)
    return EXIT_OK
