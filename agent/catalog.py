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



class Flag(enum.Flag):
    """What the runtime must know of a kind beyond its lane (docs/command-kinds.md, "What each
    flag means for the agent")."""

    RETRY_SAFE = enum.auto()          # may run again after the agent died while it ran
    SELF_TERMINATING = enum.auto()    # its action ends the agent (kexec, reboot, upgrade)
    ATTESTED = enum.auto()            # its result is signed with the node key
    DESTRUCTIVE = enum.auto()         # a signature is required to run it


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


@dataclass(frozen=True)
class Row:
    """A kind's row as the table below writes it: one per line, the flags by name (a flag
    put in another's column cannot happen: there are no columns of booleans)."""

    name: str
    lane: Lane
    roles: tuple[Role, ...]
    flags: Flag
    timeout_seconds: int
    package: str           # "agent" (bettercompute.agent.v1) or "site" (bettercompute.site.v1)
    payload: str           # the request's message name in the package
    result: str            # the result's
    handler: str           # the module under agent/commands/ whose Handler serves the kind

    def kind(self) -> Kind:
        return Kind(
            self.name, self.lane, frozenset(self.roles),
            retry_safe=Flag.RETRY_SAFE in self.flags,
            self_terminating=Flag.SELF_TERMINATING in self.flags,
            attested=Flag.ATTESTED in self.flags,
            destructive=Flag.DESTRUCTIVE in self.flags,
            timeout_seconds=self.timeout_seconds,
            payload=f"bettercompute.{self.package}.v1.{self.payload}",
            result=f"bettercompute.{self.package}.v1.{self.result}",
            handler_module=f"agent.commands.{self.handler}",
        )


_R, _N, _S = Role.RAMDISK, Role.NODE, Role.SITE
_C, _P, _B = Lane.CONTROL, Lane.PROVISION, Lane.BULK
_RS, _ST, _AT, _DE = Flag.RETRY_SAFE, Flag.SELF_TERMINATING, Flag.ATTESTED, Flag.DESTRUCTIVE
_NONE = Flag(0)
_M, _H = 60, 3600

# Each kind's one row: everything the agent knows of it. The flags by name (retry-safe,
# self-terminating, attested, destructive: docs/command-kinds.md). The payload and result are
# protobuf messages of the kind's package (agent/proto: bettercompute.agent.v1,
# bettercompute.site.v1); the handler is the module under agent/commands/ whose Handler serves it.
#       name                   lane roles         flags           timeout  package  payload                    result                    handler
_ROWS: tuple[Row, ...] = (
    Row("bmc.boot",            _C, (_S,),         _RS | _DE,      2 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    Row("bmc.firmware",        _C, (_S,),         _RS,            1 * _H,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    Row("bmc.power",           _C, (_S,),         _RS,            5 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    Row("bmc.query",           _C, (_S,),         _RS,            2 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    Row("bmc.rotate",          _C, (_S,),         _RS | _DE,      5 * _M,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    Row("bmc.storage",         _C, (_S,),         _RS,            1 * _H,  "site",  "BmcOperationRequest",     "BmcOperationResult",     "bmc"),
    Row("boot.cleanUp",        _C, (_S,),         _RS,            2 * _M,  "site",  "BootCleanUpRequest",      "BootCleanUpResult",      "boot"),
    Row("boot.kexec",          _C, (_R,),         _ST,            15 * _M, "agent", "KexecRequest",            "KexecResult",            "kexec"),
    Row("boot.prepareRamdisk", _C, (_S,),         _RS,            2 * _M,  "site",  "ProxyDhcpEntry",          "ProxyDhcpResult",        "boot"),
    Row("daemon.upgrade",      _C, (_N, _S),      _RS | _ST,      15 * _M, "agent", "DaemonSection",           "DaemonUpgradeResult",    "upgrade"),
    Row("deploy.image",        _P, (_R,),         _DE,            1 * _H,  "agent", "DeployImageRequest",      "DeployImageResult",      "deploy"),
    Row("diag.dcgm",           _P, (_R, _N),      _RS | _AT,      1 * _H,  "agent", "DiagDcgmRequest",         "DiagDcgmResult",         "dcgm"),
    Row("diag.nvml",           _C, (_N, _R),      _RS | _AT,      2 * _M,  "agent", "DiagNvmlRequest",         "DiagNvmlResult",         "gpu"),
    Row("disk.wipe",           _P, (_R,),         _AT | _DE,      6 * _H,  "agent", "WipeRequest",             "WipeResult",             "wipe"),
    Row("driver.invoke",       _P, (_N, _S, _R),  _DE,            10 * _M, "agent", "DriverInvokeRequest",     "DriverInvokeResult",     "driver"),
    Row("gpu.reset",           _C, (_N,),         _RS | _DE,      5 * _M,  "agent", "GpuResetRequest",         "GpuResetResult",         "gpu"),
    Row("instance.snapshot",   _B, (_N,),         _NONE,          1 * _H,  "agent", "InstanceSnapshotRequest", "InstanceSnapshotResult", "bulk.snapshot"),
    Row("inventory.refresh",   _C, (_N, _S, _R),  _RS,            2 * _M,  "agent", "InventoryRefreshRequest", "InventoryRefreshResult", "inventory"),
    Row("logs.collect",        _B, (_N, _S, _R),  _RS,            15 * _M, "agent", "LogsCollectRequest",      "LogsCollectResult",      "bulk.logs"),
    Row("node.reboot",         _C, (_N, _S),      _RS | _ST | _DE, 15 * _M, "agent", "NodeRebootRequest",       "NodeRebootResult",       "reboot"),
    Row("site.httpProxy",      _C, (_S,),         _RS,            1 * _M,  "site",  "HttpProxyRequest",        "HttpProxyResult",        "proxy"),
)  # fmt: skip

KINDS: dict[str, Kind] = {row.name: row.kind() for row in _ROWS}


def get(name: str) -> Kind | None:
    """The kind called ``name``, or None for a kind the catalog does not know."""
    return KINDS.get(name)
