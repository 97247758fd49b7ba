"""The Better Compute machine agent (ramdisk and node roles)."""

from agent.version import __version__

__all__ = ["__version__"]
