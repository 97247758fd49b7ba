"""The image pipeline: HTTP fetches, image formats and sources, chunk manifests."""
