"""Serving the provisioning network: the HTTP service, its connections, the proxy routes,
the upstream side, the chunk routes and the chunk store."""
