"""Images for deploy.image, as the reference gateway publishes them: the image and its chunk
manifest (``agent manifest``) side by side, and the payload that names both.

    payload = deploy_payload(Path("node.img.zst"), "http://host/node.img.zst", target={"serial": "S1"})
    gw.send("node-1", "deploy.image", payload)

The manifest is written beside the image (IMAGE.manifest) and served from the URL beside the
image's (URL.manifest); its sha256 goes into the signed payload, so the agent verifies each
chunk of the image against digests the control plane vouched for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.images import manifest


def deploy_payload(image: Path, url: str, **fields: Any) -> dict[str, Any]:
    """A deploy.image payload (JSON form) for ``image`` served at ``url``, with its manifest."""
    _path, digest, m = manifest.write(image)
    return {
        "url": url,
        "digest": {"algorithm": m.published.algorithm, "hex": m.published.hex},
        "manifest": {"url": url + ".manifest", "digest": {"algorithm": "sha256", "hex": digest}},
        **fields,
    }
