"""The agent's version: one place, read by the CLI, the Hello and the zipapp build."""

__version__ = "0.1.0"

# Path of the running zipapp, set by its bootstrap; None when run from a source tree.
ARCHIVE: str | None = None
