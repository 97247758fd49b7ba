"""deploy.image, the handler: parse and check the request, run the acceptance gate, choose the
disk the hints select and check it is safe, hold it, and run the image pipeline on it
(agent/images/deploy.py: the three pipelines, the order of their checks, what a failure
leaves on the disk). After a crash, ``on_interrupted`` clears the ends of the disk the killed
deploy was writing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.commands import inventory
from agent.commands.base import Context, Handler
from agent.commands.deploy import oci as deploy_oci
from agent.errors import AgentError, InvalidParameters, Unsupported
from agent.hw import block, system
from agent.images import deploy, filesource, image, oci, ocilayout
from agent.images.readers import QCOW2_NEEDS_FILE
from agent.net import http
from agent.policy import conformance
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat
MAX_INLINE_MANIFEST = 1 << 20  # 128 GiB of image in 4 MiB chunks; larger ones travel as a file


@dataclass(frozen=True)
class DeployImageParams:
    image: deploy.DeployParams                   # what to write and how it is checked
    hints: block.Hints                           # which disk
    gate: conformance.Expected | None = None     # the acceptance gate, run before the disk is opened


def _local_path(raw: str) -> Path:
    p = Path(raw)
    if not p.is_absolute() or ".." in p.parts:
        raise InvalidParameters(f"local_path must be an absolute path without '..': {raw!r}")
    if not p.is_file() and not ocilayout.is_layout(p):
        raise InvalidParameters(f"local_path {raw!r} is neither a regular file nor an OCI image layout")
    return p


class DeployImage(Handler[agent_pb2.DeployImageRequest, DeployImageParams], kind="deploy.image"):
    root: Path = system.ROOT                 # where the gate reads the machine (tests: a fake tree)

    def __init__(self, disks: Callable[[], list[block.Disk]] | None = None) -> None:
        self.disks = disks or block.list_disks

    def parse(self, payload: agent_pb2.DeployImageRequest) -> DeployImageParams:
        which = payload.WhichOneof("source")
        if which is None:
            raise InvalidParameters("deploy.image needs a source: url or local_path")
        url = payload.url if which == "url" else ""
        ref = oci.parse(url) if oci.is_reference(url) else None
        if url and ref is None:
            http.check_url(url)
        local = _local_path(payload.local_path) if which == "local_path" else None
        manifest = None
        if payload.HasField("manifest"):
            manifest = filesource.parse_source(payload.manifest, "manifest")
        if payload.format == Fmt.QCOW2 and url and (manifest is not None or payload.manifest_inline):
            raise Unsupported(QCOW2_NEEDS_FILE)
        if manifest is not None and payload.manifest_inline:
            raise InvalidParameters("give the manifest as a file or inline, not both")
        if len(payload.manifest_inline) > MAX_INLINE_MANIFEST:
            raise InvalidParameters(f"an inline manifest is at most {MAX_INLINE_MANIFEST} bytes (this one"
                                    f" {len(payload.manifest_inline)}): give it as a file, `manifest`")
        digest = None
        if payload.HasField("digest"):
            digest = image.Digest.parse(payload.digest.algorithm, payload.digest.hex)
        elif manifest is None and not payload.manifest_inline and ref is None and \
                not (local is not None and local.is_dir()):
            raise InvalidParameters("deploy.image needs the image's digest (sha256 or sha512) or a manifest")
        if not payload.HasField("target"):
            raise InvalidParameters("deploy.image needs target disk hints")
        if payload.max_retries > 100:
            raise InvalidParameters("max_retries is at most 100")
        for name in payload.http_headers:
            if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", name) or name.lower() in ("range", "if-range", "host"):
                raise InvalidParameters(f"HTTP header name {name!r} is not allowed")
        return DeployImageParams(
            image=deploy.DeployParams(
                url=url,
                local_path=local,
                format=payload.format,
                digest=digest,
                verify_readback=payload.verify_readback,
                zero_skip=not payload.disable_zero_skip,
                ca_pem=payload.ca_bundle_pem,
                headers=dict(payload.http_headers),
                max_retries=payload.max_retries or 5,
                manifest=manifest,
                manifest_inline=payload.manifest_inline,
                oci=ref,
                registry_hosts=deploy_oci.hosts(payload.registry_hosts, ref),
                plain_http_redirect=deploy_oci.plain_http(payload.allow_plain_http_redirect, ref),
            ),
            hints=block.Hints.from_proto(payload.target),
            gate=conformance.Expected.from_proto(payload.gate) if payload.HasField("gate") else None,
        )

    def run(self, ctx: Context, params: DeployImageParams) -> agent_pb2.DeployImageResult:
        if params.gate is not None:
            inventory.gate(ctx, params.gate, self.root)
            ctx.log.info("deploy.image: the node passed its acceptance gate")
        disk = block.select(self.disks(), params.hints)
        block.check_safe(disk)
        local = params.image.local_path
        if local is not None and not disk.is_file and local.resolve() == disk.path:
            raise InvalidParameters("local_path is the target disk itself")
        hooks = deploy.Hooks(check=ctx.check, cancel=ctx.cancel_event, meter=ctx.meter(subject=disk.name),
                             running=ctx.running, run=ctx.run, ca_file=ctx.config.ca_bundle)
        with ctx.hold(f"disk:{disk.name}"):
            image_params, resolved = deploy_oci.locate(ctx, params.image)  # an oci:// source: to its blob
            image_params = dataclasses.replace(image_params, deadline=ctx.deadline)
            result = deploy.run(hooks, image_params, disk)
            result.resolved_manifest = resolved
            return result

    def on_interrupted(self, params: DeployImageParams) -> None:
        """After a crash (the journal replayed, the deploy reported interrupted): clear the start
        and end of its target, so that nothing the killed deploy wrote can boot. The deploy
        writes the partition tables last, so a kill before that leaves none; this covers a kill
        between its last write and its result. (For core's replay to call: see the report.)"""
        try:
            disk = block.select(self.disks(), params.hints)
            block.check_safe(disk)
        except AgentError as exc:
            log.warning("interrupted deploy: its target cannot be cleared: %s", exc.message)
            return
        fd = block.open_disk(disk, write=True)
        try:
            block.clear_ends(fd, disk.size)
            os.fsync(fd)
            block.reread_partitions(fd)
            log.warning("%s: start and end cleared after the interrupted deploy", disk.name)
        finally:
            os.close(fd)
