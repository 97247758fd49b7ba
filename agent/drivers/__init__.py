"""Drivers: vendor tools wrapped with typed operations, for driver.invoke.

Each module below registers one driver in ``base.REGISTRY``. They are imported explicitly
(no entry points inside a zipapp). docs/drivers.md says how to add one.
"""

from agent.drivers import efivars, ethtool, ipmitool, mlxconfig, nvidia_smi, nvme, tpm, tpm_ppi  # noqa: F401
from agent.drivers.base import REGISTRY, Arg, ArgType, Driver, Operation, get, register

__all__ = ["REGISTRY", "Arg", "ArgType", "Driver", "Operation", "get", "register"]
