"""What every byte of a raw image must be: a ``Plan`` of ``Segment``s, each a digest or zeros.

agent/images/manifest.py parses one from an ImageManifest or a .bmap; a deploy verified by a
manifest (agent/images/deploy.py), its chunk readers (agent/images/readers.py) and the site's
chunk routes (agent/site/serve/chunkroute.py) follow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.images import image


@dataclass(frozen=True)
class Segment:
    """A stretch of the raw image: its digest, or None for zeros."""

    index: int          # the chunk's index (a .bmap: the range's, counting unmapped ones too)
    offset: int
    length: int
    digest: bytes | None

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Plan:
    """A parsed manifest: what every byte of the raw image must be."""

    kind: str                       # "manifest" or "bmap"
    algorithm: str
    image_size: int
    chunk_size: int                 # the largest segment a deploy holds in one buffer
    segments: tuple[Segment, ...]
    published: image.Digest | None = None
    published_size: int = 0
    published_format: int = -1       # of the file the manifest was made from (-1: not said)
