"""site.httpProxy: a scoped route through the site for one node to one upstream URL
(agent/site/serve/routes.py says what a route allows; agent/site/serve/web.py serves it). With a
``manifest`` the route serves the image from the site's chunk store
(agent/site/serve/chunkroute.py): the manifest is fetched here, checked against its digest and
parsed before the route exists."""

from __future__ import annotations

import dataclasses
import secrets

from agent.commands.base import Context, Handler
from agent.errors import InvalidParameters
from agent.images import filesource, oci
from agent.images.image import Digest
from agent.images.manifest import MAX_MANIFEST
from agent.proto import agent_pb2, site_pb2
from agent.site.registries import RegistryAuth
from agent.site.serve.routes import RouteRequest, load_plan

Fmt = agent_pb2.ImageFormat


class HttpProxyHandler(Handler[site_pb2.HttpProxyRequest, RouteRequest], kind="site.httpProxy"):
    def parse(self, payload: site_pb2.HttpProxyRequest) -> RouteRequest:
        return RouteRequest.from_proto(payload)

    def run(self, ctx: Context, params: RouteRequest) -> site_pb2.HttpProxyResult:
        site = ctx.site()
        if params.registry:
            return _registry_route(ctx, params)
        if params.manifest is None:
            _route, url = site.routes.add(params)
            return site_pb2.HttpProxyResult(proxy_url=url)
        site.routes.root.mkdir(parents=True, exist_ok=True)
        work = site.routes.root / f".manifest.{secrets.token_hex(4)}.tmp"
        try:
            # The manifest's URL is the command's: dialled under the routes' upstream policy.
            filesource.fetch(params.manifest, work, cancel=ctx.cancel_event,
                             ca_file=site.settings.ca_file, resolve=site.upstream_addresses)
            if work.stat().st_size > MAX_MANIFEST:
                raise InvalidParameters(f"manifest: more than {MAX_MANIFEST} bytes")
            data = work.read_bytes()
        finally:
            work.unlink(missing_ok=True)
        plan = load_plan(data, "manifest")
        _route, url = site.routes.add(params, data, plan)
        ctx.progress(message=f"route serves {plan.image_size} bytes from the site's chunk store")
        return site_pb2.HttpProxyResult(proxy_url=url)


def _registry_route(ctx: Context, params: RouteRequest) -> site_pb2.HttpProxyResult:
    """A route to an OCI registry (docs/oci.md): the reference resolved here, once, with the
    secret store's credentials, to the disk layer's blob; the route serves that blob from the
    site's store, chunk by chunk when the artifact carries a chunk manifest of the raw image,
    else whole by its digest (agent/site/serve/blobroute.py; a qcow2 layer always: the ramdisk
    streams it by its digest), and adds the authorization itself."""
    site = ctx.site()
    ref = oci.parse(params.registry)
    reg, art, chunks = site.registries.resolve(ref, params.credentials_ref, arch=params.architecture,
                                               other_hosts=frozenset(params.registry_hosts))
    if art.format == Fmt.QCOW2:  # streamed by its digest (agent/images/qcow2stream.py): a chunk
        chunks = None            # manifest of its guest bytes needs a local file on the node
    blob = dataclasses.replace(params, upstream_url=reg.blob_url(art.disk))
    plan = None
    if chunks is not None and art.format == Fmt.RAW:   # chunk by chunk from the chunk store
        plan = load_plan(chunks, "the chunk manifest layer")
    else:                                              # the whole blob, stored by its digest
        blob = dataclasses.replace(blob, blob=art.disk.hex)
    _route, url = site.routes.add(blob, chunks or b"", plan, auth=RegistryAuth(reg))
    ctx.progress(message=f"route serves {ref} ({art.manifest_digest}): {art.disk.digest} from the "
                 + ("site's chunk store, chunk by chunk" if plan is not None else "store, by its digest"))
    result = site_pb2.HttpProxyResult(proxy_url=url, resolved_manifest=art.manifest_digest,
                                      chunk_manifest=chunks or b"")
    result.disk_digest.CopyFrom(Digest("sha256", art.disk.hex).to_proto())
    return result
