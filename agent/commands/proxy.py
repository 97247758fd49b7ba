"""site.httpProxy: a scoped route through the site for one node to one upstream URL
(agent/site/routes.py says what a route allows; agent/site/web.py serves it)."""

from __future__ import annotations

from agent.commands.base import Context, Handler
from agent.proto import site_pb2
from agent.site.routes import RouteRequest


class HttpProxyHandler(Handler[site_pb2.HttpProxyRequest, RouteRequest], kind="site.httpProxy"):
    def parse(self, payload: site_pb2.HttpProxyRequest) -> RouteRequest:
        return RouteRequest.from_proto(payload)

    def run(self, ctx: Context, params: RouteRequest) -> site_pb2.HttpProxyResult:
        site = ctx.site()
        _route, url = site.routes.add(params)
        return site_pb2.HttpProxyResult(proxy_url=url)
