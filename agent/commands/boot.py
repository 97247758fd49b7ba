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
bmc.storage insert_media (over https where ``media_bmc``, asked first, mounts https:// images
only); cleanUp removes them too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from agent.commands import bmc
from agent.commands.base import Context, Handler
from agent.commands.bmc_params import BmcParams, parse_request
from agent.errors import ChecksumMismatch, InvalidParameters
from agent.proto import site_pb2
from agent.site.boot import vmedia
from agent.site.boot.fields import parse_mac, parse_node_id
from agent.site.boot.pxe import EntryRequest
from agent.site.boot.vmedia import MediaRequest
from agent.site.observe.timeline import Prepared
from agent.site.services import SiteServices


@dataclass(frozen=True)
class MediaPlan:
    """A virtual-media prepareRamdisk: the request, and the BMC to ask which transports its
    virtual media mounts (None: the http URLs)."""

    request: MediaRequest
    bmc: BmcParams | None


def _media_bmc(msg: site_pb2.ProxyDhcpEntry) -> BmcParams | None:
    """``media_bmc`` checked as a bmc.* request's fields are (agent/commands/bmc.py)."""
    if not msg.HasField("media_bmc"):
        return None
    given = msg.media_bmc
    try:
        return parse_request("bmc.storage", site_pb2.BmcOperationRequest(
            node_id=msg.node_id, bmc_address=given.bmc_address, protocol="redfish", operation="list",
            credentials_ref=given.credentials_ref, verify_tls=given.verify_tls,
            parameters={"vendor": given.vendor} if given.vendor else {}))
    except InvalidParameters as exc:
        raise InvalidParameters(f"media_bmc: {exc.message}") from None


class PrepareRamdiskHandler(Handler[site_pb2.ProxyDhcpEntry, EntryRequest | MediaPlan],
                            kind="boot.prepareRamdisk"):
    def parse(self, payload: site_pb2.ProxyDhcpEntry) -> EntryRequest | MediaPlan:
        if vmedia.boot_method(payload) == vmedia.VIRTUAL_MEDIA:
            return MediaPlan(MediaRequest.from_proto(payload), _media_bmc(payload))
        if payload.HasField("media_bmc"):
            raise InvalidParameters(f"media_bmc: for boot_method {vmedia.VIRTUAL_MEDIA} only")
        return EntryRequest.from_proto(payload)

    def serial_key(self, params: EntryRequest | MediaPlan) -> str:
        # Asking the node's BMC: in turn with the bmc.* commands on it.
        return params.bmc.lock_name if isinstance(params, MediaPlan) and params.bmc is not None else ""

    def run(self, ctx: Context, params: EntryRequest | MediaPlan) -> site_pb2.ProxyDhcpResult:
        site = ctx.site()
        if isinstance(params, MediaPlan):
            return self.virtual_media(ctx, site, params)
        with ctx.hold(f"boot:{params.mac}"), _digests_said(site, params.node_id):
            entry = site.entries.register(params, cancel=ctx.cancel_event)
        site.observe.prepared(entry.node_id, Prepared(
            "pxe", entry.mac, entry.expires_at, entry.kernel_digest, entry.initrd_digest,
            script_url=bool(entry.script_url)))
        ctx.progress(message=f"boot entry {entry.entry_id} for {entry.mac} until "
                             f"{entry.expires_at:.0f}")
        return site_pb2.ProxyDhcpResult(entry_id=entry.entry_id)

    def virtual_media(self, ctx: Context, site: SiteServices, plan: MediaPlan) -> site_pb2.ProxyDhcpResult:
        """No PXE entry: the node's config medium and the shared ISO, served for the BMC over
        the transport it mounts (asked first, so that nothing is made for a BMC that cannot
        take the site's media)."""
        params = plan.request.with_ca(site.settings.ca_file)
        scheme = "http"
        if plan.bmc is not None:
            accepted = bmc.media_schemes(ctx, plan.bmc)
            scheme = site.media.scheme_for(accepted, f"BMC {plan.bmc.address}")
        with ctx.hold(f"boot:{params.mac}"), _digests_said(site, params.node_id):
            media = site.media.register(params, cancel=ctx.cancel_event)
        site.observe.prepared(media.node_id, Prepared("virtual_media", media.mac, media.expires_at))
        iso, config = site.media.urls(media, scheme)
        ctx.progress(message=f"virtual media for {media.mac} until {media.expires_at:.0f} ({scheme})")
        return site_pb2.ProxyDhcpResult(entry_id=f"media-{media.mac_hex}", ramdisk_media_url=iso,
                                        config_media_url=config, expires_at=media.expires_at,
                                        media_scheme=scheme)


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
                                                     # (kept for the next boot of a joined ramdisk)
        return site_pb2.BootCleanUpResult(removed=removed)
