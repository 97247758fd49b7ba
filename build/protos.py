"""Regenerate agent/proto/*_pb2.py(i) from the .proto files (dev-only: needs grpcio-tools).

    python3 build/protos.py            # write the generated modules in place
    python3 build/protos.py --out DIR  # write them under DIR instead (the no-diff test)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "agent" / "proto").glob("*.proto"))


def generate(out: Path) -> None:
    try:
        from grpc_tools import protoc
    except ImportError:
        sys.exit("build/protos.py: grpcio-tools is needed: pip install grpcio-tools")
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}", *PROTOS]
    if protoc.main(args) != 0:
        sys.exit("build/protos.py: protoc failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: the tree)")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
