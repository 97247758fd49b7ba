"""boot.prepareRamdisk and boot.cleanUp: the site's PXE boot entries for a node.

prepareRamdisk registers (or replaces) the entry of one MAC with the site's boot service
(agent/site/pxe.py): from then until its TTL the proxy DHCP answers that NIC's PXE ROM, TFTP
gives it iPXE, and iPXE runs the node's script. cleanUp removes a node's entries, scripts and
host files (and its proxy routes), and the cached kernels and initrds no entry uses any more
unless keep_ramdisk_cache; it is idempotent: removing what is not there is no error.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.commands.base import Context, Handler
from agent.proto import site_pb2
from agent.site.pxe import EntryRequest, parse_mac, parse_node_id


class PrepareRamdiskHandler(Handler[site_pb2.ProxyDhcpEntry, EntryRequest], kind="boot.prepareRamdisk"):
    def parse(self, payload: site_pb2.ProxyDhcpEntry) -> EntryRequest:
        return EntryRequest.from_proto(payload)

    def run(self, ctx: Context, params: EntryRequest) -> site_pb2.ProxyDhcpResult:
        site = ctx.site()
        with ctx.hold(f"boot:{params.mac}"):
            entry = site.entries.register(params, cancel=ctx.cancel_event)
        ctx.progress(message=f"boot entry {entry.entry_id} for {entry.mac} until "
                             f"{entry.expires_at:.0f}")
        return site_pb2.ProxyDhcpResult(entry_id=entry.entry_id)


@dataclass(frozen=True)
class CleanUpParams:
    node_id: str
    macs: tuple[str, ...]
    keep_ramdisk_cache: bool


class CleanUpHandler(Handler[site_pb2.BootCleanUpRequest, CleanUpParams], kind="boot.cleanUp"):
    def parse(self, payload: site_pb2.BootCleanUpRequest) -> CleanUpParams:
        return CleanUpParams(parse_node_id(payload.node_id),
                             tuple(parse_mac(m) for m in payload.mac_addresses),
                             payload.keep_ramdisk_cache)

    def run(self, ctx: Context, params: CleanUpParams) -> site_pb2.BootCleanUpResult:
        site = ctx.site()
        removed = site.entries.remove(params.node_id, params.macs, params.keep_ramdisk_cache)
        if not params.macs:
            removed += [f"route {r}" for r in site.routes.remove_node(params.node_id)]
        return site_pb2.BootCleanUpResult(removed=removed)
