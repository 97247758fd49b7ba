"""The command catalog: all 21 kinds, their lane, roles, flags, timeout and payload.

This table is the single source of truth that the scheduler (lanes, timeouts), the role
check and the trust check (destructive -> signature required; attested -> signed result)
read. It follows docs/command-kinds.md: the seed table (the export lost which flag column
each "yes" stood in) and the project's reading of it; tests/test_catalog.py checks every row
against both.
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
    payload: str  # fully qualified protobuf message name

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
        }


_R, _N, _S = Role.RAMDISK, Role.NODE, Role.SITE
_C, _P, _B = Lane.CONTROL, Lane.PROVISION, Lane.BULK
_M, _H = 60, 3600
_SITE = "bettercompute.site.v1."
_AGENT = "bettercompute.agent.v1."

#        name                  lane roles       retry  selfterm attest destr  timeout  payload
_ROWS: tuple[tuple[str, Lane, tuple[Role, ...], bool, bool, bool, bool, int, str], ...] = (
    ("bmc.boot",            _C, (_S,),         True,  False, False, True,  2 * _M,  _SITE + "BmcOperationRequest"),
    ("bmc.firmware",        _C, (_S,),         True,  False, False, False, 1 * _H,  _SITE + "BmcOperationRequest"),
    ("bmc.power",           _C, (_S,),         True,  False, False, False, 5 * _M,  _SITE + "BmcOperationRequest"),
    ("bmc.query",           _C, (_S,),         True,  False, False, False, 2 * _M,  _SITE + "BmcOperationRequest"),
    ("bmc.rotate",          _C, (_S,),         True,  False, False, True,  5 * _M,  _SITE + "BmcOperationRequest"),
    ("bmc.storage",         _C, (_S,),         True,  False, False, False, 1 * _H,  _SITE + "BmcOperationRequest"),
    ("boot.cleanUp",        _C, (_S,),         True,  False, False, False, 2 * _M,  _SITE + "BootCleanUpRequest"),
    ("boot.kexec",          _C, (_R,),         False, True,  False, False, 15 * _M, _AGENT + "KexecRequest"),
    ("boot.prepareRamdisk", _C, (_S,),         True,  False, False, False, 2 * _M,  _SITE + "ProxyDhcpEntry"),
    ("daemon.upgrade",      _C, (_N, _S),      True,  True,  False, False, 15 * _M, _AGENT + "DaemonSection"),
    ("deploy.image",        _P, (_R,),         False, False, False, True,  1 * _H,  _AGENT + "DeployImageRequest"),
    ("diag.dcgm",           _P, (_R, _N),      True,  False, True,  False, 1 * _H,  _AGENT + "DiagDcgmRequest"),
    ("diag.nvml",           _C, (_N, _R),      True,  False, True,  False, 2 * _M,  _AGENT + "DiagNvmlRequest"),
    ("disk.wipe",           _P, (_R,),         False, False, True,  True,  6 * _H,  _AGENT + "WipeRequest"),
    ("driver.invoke",       _P, (_N, _S, _R),  False, False, False, True,  10 * _M, _AGENT + "DriverInvokeRequest"),
    ("gpu.reset",           _C, (_N,),         True,  False, False, True,  5 * _M,  _AGENT + "GpuResetRequest"),
    ("instance.snapshot",   _B, (_N,),         False, False, False, False, 1 * _H,  _AGENT + "InstanceSnapshotRequest"),
    ("inventory.refresh",   _C, (_N, _S, _R),  True,  False, False, False, 2 * _M,  _AGENT + "InventoryRefreshRequest"),
    ("logs.collect",        _B, (_N, _S, _R),  True,  False, False, False, 15 * _M, _AGENT + "LogsCollectRequest"),
    ("node.reboot",         _C, (_N, _S),      True,  True,  False, True,  15 * _M, _AGENT + "NodeRebootRequest"),
    ("site.httpProxy",      _C, (_S,),         True,  False, False, False, 1 * _M,  _SITE + "HttpProxyRequest"),
)  # fmt: skip

KINDS: dict[str, Kind] = {
    name: Kind(name, lane, frozenset(roles), rs, st, at, de, timeout, payload)
    for name, lane, roles, rs, st, at, de, timeout, payload in _ROWS
}


def get(name: str) -> Kind | None:
    """The kind called ``name``, or None for a kind the catalog does not know."""
    return KINDS.get(name)
