"""boot.prepareRamdisk and boot.cleanUp: the site's PXE boot entries for a node.

prepareRamdisk registers (or replaces) the entry of one MAC with the site's boot service
(agent/site/boot/pxe.py): from then until its TTL the proxy DHCP answers that NIC's PXE ROM, TFTP
gives it iPXE, and iPXE runs the node's script. cleanUp removes a node's entries, scripts and
host files (and its proxy routes), and the cached kernels and initrds no entry uses any more
unless keep_ramdisk_cache; it is idempotent: removing what is not there is no error. With
``join_refused`` (the control plane refused the node's join, e.g. its attestation: the
reference gateway sends it so, agent/gateway/server.py) the node's boot timeline names the
cause ``refused`` with that reason first (docs/site.md, "Why a node did not come up").

With ``boot_method: "virtual_media"`` prepareRamdisk makes no PXE entry but the node's virtual
media (agent/site/boot/vmedia.py): its config medium (static network, gateway, CA, settings) and
the shared ramdisk ISO, served under an unguessable, expiring path whose URLs it returns for
bmc.storage insert_media; cleanUp removes them too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from agent.commands.base import Context, Handler
from agent.errors import ChecksumMismatch, InvalidParameters
from agent.proto import site_pb2
from agent.site.boot import vmedia
from agent.site.boot.fields import parse_mac, parse_node_id
from agent.site.boot.pxe import EntryRequest
from agent.site.boot.vmedia import MediaRequest
from agent.site.observe.timeline import Prepared
from agent.site.services import SiteServices


class PrepareRamdiskHandler(Handler[site_pb2.ProxyDhcpEntry, EntryRequest | MediaRequest],
                            kind="boot.prepareRamdisk"):
    def parse(self, payload: site_pb2.ProxyDhcpEntry) -> EntryRequest | MediaRequest:
        if vmedia.boot_method(payload) == vmedia.VIRTUAL_MEDIA:
            return MediaRequest.from_proto(payload)
        return EntryRequest.from_proto(payload)

    def run(self, ctx: Context, params: EntryRequest | MediaRequest) -> site_pb2.ProxyDhcpResult:
        site = ctx.site()
        if isinstance(params, MediaRequest):
            return self.virtual_media(ctx, site, params)
        with ctx.hold(f"boot:{params.mac}"), _digests_said(site, params.node_id):
            entry = site.entries.register(params, cancel=ctx.cancel_event)
        site.observe.prepared(entry.node_id, Prepared(
            "pxe", entry.mac, entry.expires_at, entry.kernel_digest, entry.initrd_digest,
            script_url=bool(entry.script_url)))
        ctx.progress(message=f"boot entry {entry.entry_id} for {entry.mac} until "
                             f"{entry.expires_at:.0f}")
        return site_pb2.ProxyDhcpResult(entry_id=entry.entry_id)

    def virtual_media(self, ctx: Context, site: SiteServices,
                      params: MediaRequest) -> site_pb2.ProxyDhcpResult:
        """No PXE entry: the node's config medium and the shared ISO, served for the BMC."""
        params = params.with_ca(site.settings.ca_file)
        with ctx.hold(f"boot:{params.mac}"), _digests_said(site, params.node_id):
            media = site.media.register(params, cancel=ctx.cancel_event)
        site.observe.prepared(media.node_id, Prepared("virtual_media", media.mac, media.expires_at))
        iso, config = site.media.urls(media)
        ctx.progress(message=f"virtual media for {media.mac} until {media.expires_at:.0f}")
        return site_pb2.ProxyDhcpResult(entry_id=f"media-{media.mac_hex}", ramdisk_media_url=iso,
                                        config_media_url=config, expires_at=media.expires_at)


@contextlib.contextmanager
def _digests_said(site: SiteServices, node_id: str) -> Iterator[None]:
    """A kernel, initrd or ISO refused for its digest goes into the node's timeline too."""
    try:
        yield
    except ChecksumMismatch as exc:
        site.observe.digest_refused(node_id, exc.message)
        raise


MAX_REFUSAL = 300   # characters of a join_refused kept in the timeline


@dataclass(frozen=True)
class CleanUpParams:
    node_id: str
    macs: tuple[str, ...]
    keep_ramdisk_cache: bool
    join_refused: str = ""


def parse_refusal(text: str) -> str:
    """A join_refused as the timeline keeps it: one line of printable text, bounded."""
    if len(text) > 4 * MAX_REFUSAL:
        raise InvalidParameters(f"join_refused: {len(text)} characters, at most {4 * MAX_REFUSAL}")
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line[:MAX_REFUSAL]


class CleanUpHandler(Handler[site_pb2.BootCleanUpRequest, CleanUpParams], kind="boot.cleanUp"):
    def parse(self, payload: site_pb2.BootCleanUpRequest) -> CleanUpParams:
        return CleanUpParams(parse_node_id(payload.node_id),
                             tuple(parse_mac(m) for m in payload.mac_addresses),
                             payload.keep_ramdisk_cache, parse_refusal(payload.join_refused))

    def run(self, ctx: Context, params: CleanUpParams) -> site_pb2.BootCleanUpResult:
        site = ctx.site()
        if params.join_refused:   # said before the attempt is cleaned up: its cause is named
            site.observe.verdict(params.node_id, joined=False, detail=params.join_refused)
        removed = site.entries.remove(params.node_id, params.macs, params.keep_ramdisk_cache)
        removed += site.media.remove(params.node_id, params.macs, params.keep_ramdisk_cache)
        if not params.macs:
            removed += [f"route {r}" for r in site.routes.remove_node(params.node_id)]
            site.observe.cleaned(params.node_id)     # its timeline says so; its console is let go
        return site_pb2.BootCleanUpResult(removed=removed)
