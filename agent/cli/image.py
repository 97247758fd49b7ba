"""``agent image push IMAGE DEST``: publish a disk image and its chunk manifest as one OCI
artifact (agent/images/oci.py; docs/oci.md), into a registry (DEST ``oci://host/repo:tag``)
or an OCI image layout directory (DEST a directory, ``--tag``): what deploy.image takes back
with ``url: oci://...`` or ``local_path: DIR``.

The chunk manifest is made here (as ``agent manifest`` does) unless ``--manifest FILE`` names
one or ``--no-manifest``. Registry credentials never go on the command line: the user name
from ``--username`` or AGENT_REGISTRY_USER, the password from ``--password-file`` (its first
line) or AGENT_REGISTRY_PASSWORD; without them the push is anonymous (or the token flow's
anonymous token).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from agent.cli import EXIT_OK, command
from agent.errors import InvalidParameters

if TYPE_CHECKING:
    from agent.images import oci


def _args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    push = sub.add_parser("push", help="publish a disk image (and its chunk manifest) as an OCI artifact",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    push.add_argument("image", type=Path, help="the disk image: raw, gzip, xz, bzip2, zstd or qcow2")
    push.add_argument("dest", help="oci://host[:port]/repo:tag (oci+http:// for plain HTTP), or an "
                      "OCI image layout directory")
    which = push.add_mutually_exclusive_group()
    which.add_argument("--manifest", type=Path, help="the image's chunk manifest (default: made here)")
    which.add_argument("--no-manifest", action="store_true", help="publish without a chunk manifest")
    push.add_argument("--arch", default="", help="the platform's architecture, amd64 or arm64 "
                      "(default: this machine's)")
    push.add_argument("--disktype", default="whole", help="the index entry's disktype annotation (whole)")
    push.add_argument("--no-index", action="store_true",
                      help="the tag names the manifest itself, not an image index (registry only)")
    push.add_argument("--tag", default="latest", help="the tag in an image layout (default latest)")
    push.add_argument("--ca", type=Path, help="a CA bundle (PEM) for the registry's TLS certificate")
    push.add_argument("--username", default=os.environ.get("AGENT_REGISTRY_USER", ""),
                      help="registry user (default: $AGENT_REGISTRY_USER)")
    push.add_argument("--password-file", type=Path,
                      help="a file whose first line is the password (default: $AGENT_REGISTRY_PASSWORD)")
    push.add_argument("--other-host", action="append", default=[],
                      help="a host besides the registry's that a token realm or upload may use")


def _credentials(args: argparse.Namespace) -> oci.Credentials | None:
    from agent.images import oci

    password = os.environ.get("AGENT_REGISTRY_PASSWORD", "")
    if args.password_file is not None:
        try:
            lines = args.password_file.read_text().splitlines()
            password = lines[0] if lines else ""
        except OSError as exc:
            raise InvalidParameters(f"--password-file {args.password_file}: {exc.strerror}") from exc
    if not args.username:
        if password:
            raise InvalidParameters("a password without a user name: give --username or AGENT_REGISTRY_USER")
        return None
    return oci.Credentials(args.username, password)


@command("image", "publish disk images as OCI artifacts (agent image push IMAGE DEST)", _args)
def cmd_image(args: argparse.Namespace) -> int:
    from agent.images import manifest, oci, ocilayout
    from agent.net import http

    if not args.image.is_file():
        raise InvalidParameters(f"{args.image} is not a file")
    arch = args.arch or oci.node_arch()
    with tempfile.TemporaryDirectory(prefix="agent-push-") as tmp:
        chunks: Path | None = args.manifest
        if chunks is None and not args.no_manifest:
            chunks = manifest.write(args.image, Path(tmp) / f"{args.image.name}.manifest")[0]
        if oci.is_reference(args.dest):
            ref = oci.parse(args.dest)
            creds = _credentials(args)
            reg = oci.Registry(ref, http.HttpOptions(ca_file=args.ca), credentials=creds,
                               policy=oci.Policy(other_hosts=frozenset(args.other_host)))
            pushed = oci.push(reg, args.image, chunks, arch=arch, disktype=args.disktype,
                              index=not args.no_index)
            where = f"{oci.Reference(ref.scheme, ref.host, ref.repository, digest=pushed.manifest_digest)}"
        else:
            pushed = ocilayout.write(Path(args.dest), args.image, chunks, arch=arch, tag=args.tag,
                                     disktype=args.disktype)
            where = f"{args.dest} (tag {args.tag}, manifest {pushed.manifest_digest})"
    print(where)
    chunk = f"chunk manifest {pushed.chunk_manifest.digest}" if pushed.chunk_manifest else "no chunk manifest"
    print(f"disk layer {pushed.disk.digest} ({pushed.disk.size} bytes, {pushed.disk.media_type}); {chunk}; "
          + (f"index {pushed.index_digest}; " if pushed.index_digest else "")
          + f"{pushed.uploaded} bytes sent", file=sys.stderr)
    return EXIT_OK
