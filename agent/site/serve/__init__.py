"""Serving the provisioning network: the HTTP service, its connections, the proxy routes,
the upstream side, the chunk routes. The content store they serve from is on site/'s ground
floor (agent/site/chunkstore.py), below both serve/ and boot/."""
