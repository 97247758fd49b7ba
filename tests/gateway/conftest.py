"""The runtime tests' fixtures (an in-process gateway, the agent as a
subprocess), shared with this folder: they are defined once, in tests/runtime/conftest.py."""

from tests.runtime.conftest import agent_proc, gateway

__all__ = ["agent_proc", "gateway"]
