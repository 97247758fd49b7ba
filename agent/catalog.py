"""The command catalog: every kind, its lane, roles, flags, timeout, payload, result and handler.

A kind's row here is the one place that names it: the scheduler (lanes, timeouts), the role
check, the trust check (destructive -> signature required; attested -> signed result), the
schema (request and result types) and the handler table (which module serves it) all read it;
docs/adding-a-kind.md walks through adding one. The flags follow docs/command-kinds.md: the
seed table (the export lost which flag column each "yes" stood in) and the project's reading
of it; tests/test_catalog.py checks every row against both.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Lane(enum.StrEnum):
    CONTROL = "control"
    PROVISION = "provision"
    BULK = "bulk"


class Role(enum.StrEnum):
    RAMDISK = "ramdisk"
    NODE = "node"
    SITE = "site"



@dataclass(frozen=True)
class Kind:
    name: str
    lane: Lane
    roles: frozenset[Role]
    retry_safe: bool
    self_terminating: bool
    attested: bool
    destructive: bool
    timeout_seconds: int
    payload: str           # the request's fully qualified protobuf message name
    result: str            # the result's
    handler_module: str    # the module whose Handler serves the kind (imported on first use)

    @property
    def site_only(self) -> bool:
        return self.roles == frozenset({Role.SITE})

    def serves(self, role: Role) -> bool:
        return role in self.roles

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.name,
            "lane": str(self.lane),
            "roles": sorted(str(r) for r in self.roles),
            "retry_safe": self.retry_safe,
            "self_terminating": self.self_terminating,
            "attested": self.attested,
            "destructive": self.destructive,
            "timeout_seconds": self.timeout_seconds,
            "payload": self.payload,
            "result": self.result,
        }


_R, _N, _S = Role.RAMDISK, Role.NODE, Role.SITE
_C, _P, _B = Lane.CONTROL, Lane.PROVISION, Lane.BULK
_M, _H = 60, 3600

# Each kind's one row: everything the agent knows of it. The payload and result are protobuf
# messages of the kind's package (agent/proto: bettercompute.agent.v1, bettercompute.site.v1);
# the handler is the module under agent/commands/ whose Handler serves it.
#        name                  lane roles       retry  selfterm attest destr  timeout  package payload / result / handler module
_ROWS: tuple[tuple[str, Lane, tuple[Role, ...], bool, bool, bool, bool, int, str, str, str, str], ...] = (
    ("bmc.boot",            _C, (_S,),         True,  False, False, True,  2 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    ("bmc.firmware",        _C, (_S,),         True,  False, False, False, 1 * _H,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    ("bmc.power",           _C, (_S,),         True,  False, False, False, 5 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    ("bmc.query",           _C, (_S,),         True,  False, False, False, 2 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    ("bmc.rotate",          _C, (_S,),         True,  False, False, True,  5 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    ("bmc.storage",         _C, (_S,),         True,  False, False, False, 1 * _H,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    ("boot.cleanUp",        _C, (_S,),         True,  False, False, False, 2 * _M,  "site",  "BootCleanUpRequest",      "BootCleanUpResult",      "boot"),
    ("boot.kexec",          _C, (_R,),         False, True,  False, False, 15 * _M, "agent", "KexecRequest",            "KexecResult",            "kexec"),
    ("boot.prepareRamdisk", _C, (_S,),         True,  False, False, False, 2 * _M,  "site",  "ProxyDhcpEntry",          "ProxyDhcpResult",        "boot"),
    ("daemon.upgrade",      _C, (_N, _S),      True,  True,  False, False, 15 * _M, "agent", "DaemonSection",           "DaemonUpgradeResult",    "upgrade"),
    ("deploy.image",        _P, (_R,),         False, False, False, True,  1 * _H,  "agent", "DeployImageRequest",      "DeployImageResult",      "deploy"),
    ("diag.dcgm",           _P, (_R, _N),      True,  False, True,  False, 1 * _H,  "agent", "DiagDcgmRequest",         "DiagDcgmResult",         "dcgm"),
    ("diag.nvml",           _C, (_N, _R),      True,  False, True,  False, 2 * _M,  "agent", "DiagNvmlRequest",         "DiagNvmlResult",         "gpu"),
    ("disk.wipe",           _P, (_R,),         False, False, True,  True,  6 * _H,  "agent", "WipeRequest",             "WipeResult",             "wipe"),
    ("driver.invoke",       _P, (_N, _S, _R),  False, False, False, True,  10 * _M, "agent", "DriverInvokeRequest",     "DriverInvokeResult",     "driver"),
    ("gpu.reset",           _C, (_N,),         True,  False, False, True,  5 * _M,  "agent", "GpuResetRequest",         "GpuResetResult",         "gpu"),
    ("instance.snapshot",   _B, (_N,),         False, False, False, False, 1 * _H,  "agent", "InstanceSnapshotRequest", "InstanceSnapshotResult", "snapshot"),
    ("inventory.refresh",   _C, (_N, _S, _R),  True,  False, False, False, 2 * _M,  "agent", "InventoryRefreshRequest", "InventoryRefreshResult", "inventory"),
    ("logs.collect",        _B, (_N, _S, _R),  True,  False, False, False, 15 * _M, "agent", "LogsCollectRequest",      "LogsCollectResult",      "logs"),
    ("node.reboot",         _C, (_N, _S),      True,  True,  False, True,  15 * _M, "agent", "NodeRebootRequest",       "NodeRebootResult",       "reboot"),
    ("site.httpProxy",      _C, (_S,),         True,  False, False, False, 1 * _M,  "site",  "HttpProxyRequest",        "HttpProxyResult",        "proxy"),
)  # fmt: skip

KINDS: dict[str, Kind] = {
    name: Kind(name, lane, frozenset(roles), rs, st, at, de, timeout,
               f"bettercompute.{package}.v1.{payload}", f"bettercompute.{package}.v1.{result}",
               f"agent.commands.{module}")
    for name, lane, roles, rs, st, at, de, timeout, package, payload, result, module in _ROWS
}


def get(name: str) -> Kind | None:
    """The kind called ``name``, or None for a kind the catalog does not know."""
    return KINDS.get(name)
