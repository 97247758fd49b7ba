"""The link to the gateway: the TLS 1.3 session that dials out, and its framing."""
