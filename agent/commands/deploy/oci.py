"""deploy.image from an OCI reference (agent/images/oci.py; docs/oci.md): the reference
resolved once, at the start, to the disk layer of the node's platform, and the request turned
into the one the pipelines already know: the blob's URL, its sha256 (the registry's content
address) as the published file's digest, its format by media type, the chunk manifest layer
(fetched, checked by its digest) as the manifest (not for a qcow2 layer, which streams by its
digest through its tables), and the registry's authorization for the
blob's origin only (renewed from the registry's challenge when a token expires mid-deploy).
Every connection of the deploy, a redirect's included, dials only the registry's host or one
of the request's ``registry_hosts``.

    params, resolved = oci.locate(ctx, params)   # resolved: the manifest digest ("" if not oci)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from agent.commands.base import Context
from agent.errors import InvalidParameters, Unsupported
from agent.images import image, oci, ocilayout
from agent.images.deploy import DeployParams
from agent.images.readers import QCOW2_NEEDS_FILE
from agent.net import http
from agent.proto import agent_pb2

Fmt = agent_pb2.ImageFormat
MAX_HOSTS = 16
_HOST = oci.HOST


def hosts(names: Iterable[str], ref: oci.Reference | None) -> frozenset[str]:
    """The request's ``registry_hosts``, checked: host names only, at most MAX_HOSTS."""
    out = frozenset(n.lower() for n in names)
    if out and ref is None:
        raise InvalidParameters("registry_hosts is for an oci:// source only")
    if len(out) > MAX_HOSTS:
        raise InvalidParameters(f"at most {MAX_HOSTS} registry_hosts")
    for name in out:
        if not name or ":" in name or not _HOST.fullmatch(name):
            raise InvalidParameters(f"registry_hosts: {name!r} is not a host name")
    return out


def plain_http(allowed: bool, ref: oci.Reference | None) -> bool:
    """The request's ``allow_plain_http_redirect``: for an oci:// source only; other URLs keep
    following a redirect to http:// as they always have."""
    if allowed and ref is None:
        raise InvalidParameters("allow_plain_http_redirect is for an oci:// source only")
    return allowed or ref is None


def _said(ctx: Context) -> Callable[[str], None]:
    def said(words: str) -> None:
        ctx.log.warning("deploy.image: %s", words)
        ctx.progress(message=words)
    return said


def locate(ctx: Context, params: DeployParams) -> tuple[DeployParams, str]:
    """``params`` with an oci:// source (or an OCI image layout as ``local_path``) resolved to
    its disk blob (see the module docstring), and the manifest digest it resolved to; other
    params as they are, and ""."""
    ref = params.oci
    if params.local_path is not None and params.local_path.is_dir():
        art, path, chunks = ocilayout.resolve(params.local_path, arch=oci.node_arch())
        ctx.log.info("deploy.image: layout %s: %s, disk layer %s", params.local_path, art.manifest_digest,
                     art.disk.digest)
        return _located(params, art, chunks, local_path=path), art.manifest_digest
    if ref is None:
        return params, ""
    opts = http.HttpOptions(ca_pem=params.ca_pem, ca_file=ctx.config.ca_bundle, headers=params.headers,
                            max_retries=params.max_retries, cancel=ctx.cancel_event,
                            deadline=ctx.deadline, on_wait=_said(ctx))
    reg = oci.Registry(ref, opts, policy=oci.Policy(other_hosts=params.registry_hosts,
                                                    plain_http_redirect=params.plain_http_redirect))
    art = reg.resolve(arch=oci.node_arch())
    ctx.log.info("deploy.image: %s is %s, disk layer %s (%d bytes)", ref, art.manifest_digest,
                 art.disk.digest, art.disk.size)
    # A qcow2 layer streams by its digest (agent/images/qcow2stream.py): its chunk manifest,
    # made for the guest's bytes in their order, needs a local file.
    fetch = art.chunk_manifest is not None and not params.has_manifest and art.format != Fmt.QCOW2
    chunks = reg.blob_bytes(art.chunk_manifest) if fetch and art.chunk_manifest else None
    located = _located(params, art, chunks, url=reg.blob_url(art.disk),
                       headers=params.headers, auth=reg.authorizer, resolve=reg.opts.resolve)
    return located, art.manifest_digest


def _located(params: DeployParams, art: oci.Artifact, chunks: bytes | None, **source: Any) -> DeployParams:
    """The request for the artifact's disk layer at ``source``: the layer's digest (the
    request's, when given, must be it), its format by media type, its chunk manifest."""
    layer = image.Digest("sha256", art.disk.hex)
    if params.digest is not None and params.digest != layer:
        raise InvalidParameters(f"the request's digest is not the registry's digest of the disk layer"
                                f" ({art.disk.digest})", layer=art.disk.digest)
    fmt = params.format
    if art.format != Fmt.IMAGE_FORMAT_AUTO:
        if fmt not in (Fmt.IMAGE_FORMAT_AUTO, art.format):
            raise InvalidParameters(f"declared format {image.format_name(fmt)} but the disk layer is"
                                    f" {art.disk.media_type}")
        fmt = art.format
    if fmt == Fmt.QCOW2 and "url" in source and params.has_manifest:
        raise Unsupported(QCOW2_NEEDS_FILE)
    manifest_inline = params.manifest_inline if params.has_manifest or chunks is None else chunks
    return dataclasses.replace(params, digest=layer, format=fmt, manifest_inline=manifest_inline, **source)
