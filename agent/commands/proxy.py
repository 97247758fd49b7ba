"""site.httpProxy: a scoped route through the site for one node to one upstream URL
(agent/site/serve/routes.py says what a route allows; agent/site/serve/web.py serves it). With a
``manifest`` the route serves the image from the site's chunk store
(agent/site/serve/chunkroute.py): the manifest is fetched here, checked against its digest and
parsed before the route exists."""

from __future__ import annotations

import secrets

from agent.commands.base import Context, Handler
from agent.errors import InvalidParameters
from agent.images import filesource
from agent.images.manifest import MAX_MANIFEST
from agent.proto import site_pb2
from agent.site.serve.routes import RouteRequest, load_plan


class HttpProxyHandler(Handler[site_pb2.HttpProxyRequest, RouteRequest], kind="site.httpProxy"):
    def parse(self, payload: site_pb2.HttpProxyRequest) -> RouteRequest:
        return RouteRequest.from_proto(payload)

    def run(self, ctx: Context, params: RouteRequest) -> site_pb2.HttpProxyResult:
        site = ctx.site()
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
