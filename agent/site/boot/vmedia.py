"""Virtual-media boots (DHCP-less): the node's config medium, and the media the site serves.

boot.prepareRamdisk with ``boot_method: "virtual_media"`` makes no PXE entry. Instead the site

- caches the shared ramdisk ISO (``iso_url``, built by ``python -m initramfs.build --iso``,
  with its sha256 ``iso_digest``): downloaded once, verified before it is kept, and kept in
  the site's content store (agent/site/chunkstore.py) by that digest, one copy for every node
  whose request names that content, whatever its URL; the store never evicts the ISO of a
  live set;
- builds the node's config medium: a small ISO 9660 image labelled BC_CONFIG (written here,
  in memory, in well under a millisecond) holding what the ramdisk would otherwise learn from
  DHCP and the kernel command line (initramfs/init.sh reads it at boot):

      network   mac=, address=, prefix=, gateway=, dns= (one NIC, named by its MAC)
      cmdline   bc.node=, bc.gateway=, bc.ca=<the medium's ca.pem>, and the request's
                kernel_cmdline (bc.token=, bc.trust=, ...)
      ca.pem    the CA of the gateway the ramdisk dials

- serves both over its HTTP service at ``/vm/<token>/ramdisk.iso`` and
  ``/vm/<token>/config.iso``: the token is random (unguessable, 192 bits), the paths die
  with the set's TTL (the rules of a PXE entry: 1 h by default, at most 7 days), and a later
  request for the same MAC replaces the set (and its token).

The BMC is then told to insert both (bmc.storage insert_media, CD and USBStick) and to boot
the CD once (bmc.boot cdrom); boot.cleanUp removes the set. On disk, under the service's
directory, every file written whole (agent.launcher.write_atomic)::

    sets/<mac hex>.json        the set (the source of truth, reconciled at start)
    config/<mac hex>.iso       its config medium

and the shared ISO in the site's store, under its sha256. (The cache by URL of earlier
versions, ``cache/``, is removed at start; a set written without the ISO's digest is dropped.)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.atomicfile import write_atomic
from agent.errors import InvalidParameters, NotFound, Unsupported
from agent.net import http
from agent.proto import site_pb2
from agent.site.boot.fields import (
    MAX_CMDLINE,
    parse_file_digest,
    parse_mac,
    parse_node_id,
    parse_ttl,
    script_safe_url,
)
from agent.site.chunkstore import DIGEST, ChunkStore
from agent.site.ttltable import MacRecord, TtlTable

log = logging.getLogger(__name__)

VIRTUAL_MEDIA = "virtual_media"
PXE = "pxe"
LABEL = "BC_CONFIG"              # what initramfs/init.sh looks for
MEDIA_MOUNT = "/run/bettercompute/media"   # where /init mounts it (bc.ca points into it)
MAX_CA_BYTES = 64 * 1024
MAX_FILE_BYTES = 4096            # network and cmdline: /init refuses more
MEDIA_PREFIX = "/vm/"
NAMES = ("ramdisk.iso", "config.iso")
_CMDLINE_CHARS = re.compile(r"^[A-Za-z0-9 ._,:=/+@%~\-]*$")
_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}$")
_PEM = re.compile(rb"^(-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----\s*)+$")


def boot_method(msg: site_pb2.ProxyDhcpEntry) -> str:
    method = msg.boot_method.strip() or PXE
    if method not in (PXE, VIRTUAL_MEDIA):
        raise InvalidParameters(f"boot_method {msg.boot_method[:40]!r}: one of {PXE}, {VIRTUAL_MEDIA}")
    return method


# -- the request -------------------------------------------------------------------------


@dataclass(frozen=True)
class StaticNetwork:
    """One NIC's static IPv4 settings."""

    mac: str
    address: str          # 10.0.2.50
    prefix: int           # 24
    default_route: str    # "" for none
    dns: tuple[str, ...]

    @classmethod
    def from_proto(cls, mac: str, msg: site_pb2.StaticNetwork) -> StaticNetwork:
        address = _ipv4(msg.address, "static_network.address")
        if not 1 <= msg.prefix_length <= 32:
            raise InvalidParameters("static_network.prefix_length: 1-32")
        route = _ipv4(msg.default_route, "static_network.default_route") if msg.default_route else ""
        if route and ipaddress.IPv4Address(route) not in ipaddress.IPv4Interface(
                f"{address}/{msg.prefix_length}").network:
            raise InvalidParameters(f"static_network.default_route {route} is not on "
                                    f"{address}/{msg.prefix_length}'s network")
        if len(msg.dns) > 3:
            raise InvalidParameters("static_network.dns: at most 3 servers")
        dns = tuple(_ipv4(d, "static_network.dns") for d in msg.dns)
        return cls(mac, address, msg.prefix_length, route, dns)

    def file(self) -> bytes:
        lines = [f"mac={self.mac}", f"address={self.address}", f"prefix={self.prefix}"]
        if self.default_route:
            lines.append(f"gateway={self.default_route}")
        if self.dns:
            lines.append("dns=" + " ".join(self.dns))
        return ("\n".join(lines) + "\n").encode()


def _ipv4(text: str, field: str) -> str:
    try:
        addr = ipaddress.IPv4Address(text.strip())
    except ValueError:
        raise InvalidParameters(f"{field} {text[:40]!r}: not an IPv4 address") from None
    if addr.is_multicast or addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise InvalidParameters(f"{field} {addr}: not a host's address")
    return str(addr)


@dataclass(frozen=True)
class MediaRequest:
    """A validated boot.prepareRamdisk payload of boot_method virtual_media."""

    node_id: str
    mac: str
    iso_url: str
    iso_digest: str       # the ISO's sha256 (what names it in the store)
    network: StaticNetwork
    agent_gateway: str
    ca_pem: bytes
    cmdline: str
    ttl_seconds: int

    @classmethod
    def from_proto(cls, msg: site_pb2.ProxyDhcpEntry) -> MediaRequest:
        """The request; its ca_pem empty when the payload gives none (``with_ca`` then)."""
        node_id = parse_node_id(msg.node_id)
        mac = parse_mac(msg.mac_address)
        for name in ("ipxe_script_url", "kernel_url", "initrd_url", "uki_url", "boot_file"):
            if getattr(msg, name):
                raise InvalidParameters(f"{name}: not used by boot_method {VIRTUAL_MEDIA} "
                                        "(the ISO at iso_url carries the kernel and initrd)")
        if not msg.iso_url.strip():
            raise InvalidParameters(f"boot_method {VIRTUAL_MEDIA} needs iso_url (the ramdisk ISO)")
        iso_url = script_safe_url(msg.iso_url.strip(), "iso_url")
        iso_digest = parse_file_digest(msg.iso_digest, "iso_digest")
        if not msg.HasField("static_network"):
            raise InvalidParameters(f"boot_method {VIRTUAL_MEDIA} needs static_network "
                                    "(there is no DHCP: the node's address, prefix, route, DNS)")
        network = StaticNetwork.from_proto(mac, msg.static_network)
        gateway = msg.agent_gateway.strip()
        if not _HOST_PORT.match(gateway) or not 0 < int(gateway.rsplit(":", 1)[1]) < 65536:
            raise InvalidParameters(f"agent_gateway {gateway[:60]!r}: host:port of the gateway "
                                    "the ramdisk dials")
        ca = check_ca(msg.ca_pem.encode()) if msg.ca_pem else b""
        cmdline = msg.kernel_cmdline.strip()
        if len(cmdline) > MAX_CMDLINE or not _CMDLINE_CHARS.match(cmdline):
            raise InvalidParameters(
                "kernel_cmdline: only letters, digits, spaces and . _ , : = / + @ % ~ - "
                f"(at most {MAX_CMDLINE} characters)")
        if any(not w.startswith("bc.") or "=" not in w for w in cmdline.split()):
            raise InvalidParameters("kernel_cmdline: with virtual media only bc.NAME=VALUE settings "
                                    "(the shared ISO's own command line is fixed)")
        return cls(node_id, mac, iso_url, iso_digest, network, gateway, ca, cmdline,
                   parse_ttl(msg.ttl_seconds))

    def with_ca(self, default: Path | None) -> MediaRequest:
        """This request, with the site's own CA bundle when the payload gave none."""
        if self.ca_pem:
            return self
        if default is None:
            raise InvalidParameters("ca_pem: the gateway's CA (PEM) is needed; the site has none "
                                    "of its own to give (--ca)")
        try:
            data = default.read_bytes()[:MAX_CA_BYTES + 1]
        except OSError as exc:
            raise InvalidParameters(f"ca_pem: none given, and the site's {default} is unreadable: "
                                    f"{exc.strerror}") from None
        return dataclasses.replace(self, ca_pem=check_ca(data))

    def medium_files(self) -> dict[str, bytes]:
        """The config medium's files (what initramfs/init.sh reads)."""
        words = [f"bc.node={self.node_id}", f"bc.gateway={self.agent_gateway}",
                 f"bc.ca={MEDIA_MOUNT}/ca.pem", *self.cmdline.split()]
        files = {"network": self.network.file(), "cmdline": (" ".join(words) + "\n").encode(),
                 "ca.pem": self.ca_pem}
        for name in ("network", "cmdline"):
            if len(files[name]) > MAX_FILE_BYTES:
                raise InvalidParameters(f"the config medium's {name} would be over {MAX_FILE_BYTES} bytes")
        return files


def check_ca(data: bytes) -> bytes:
    if len(data) > MAX_CA_BYTES or not _PEM.match(data):
        raise InvalidParameters(f"ca_pem: PEM certificates only, at most {MAX_CA_BYTES} bytes")
    return data


# -- ISO 9660 ----------------------------------------------------------------------------

SECTOR = 2048


def _both16(n: int) -> bytes:
    return struct.pack("<H", n) + struct.pack(">H", n)


def _both32(n: int) -> bytes:
    return struct.pack("<I", n) + struct.pack(">I", n)


def _dir_record(ident: bytes, extent: int, size: int, directory: bool) -> bytes:
    date = bytes([70, 1, 1, 0, 0, 0, 0])  # 1970-01-01 00:00:00 UTC: reproducible
    body = (bytes([0]) + _both32(extent) + _both32(size) + date + bytes([2 if directory else 0, 0, 0])
            + _both16(1) + bytes([len(ident)]) + ident)
    pad = b"\0" if (len(body) + 1) % 2 else b""
    return bytes([len(body) + 1 + len(pad)]) + body + pad


def _iso_name(name: str) -> bytes:
    """``name`` as an ISO 9660 level 1 identifier ("ca.pem" -> "CA.PEM;1"): upper case, 8.3."""
    stem, _, ext = name.upper().partition(".")
    if not re.fullmatch(r"[A-Z0-9_]{1,8}", stem) or not re.fullmatch(r"[A-Z0-9_]{0,3}", ext):
        raise ValueError(f"{name!r} is not an 8.3 name")
    return f"{stem}.{ext};1".encode()


def iso9660(files: dict[str, bytes], label: str = LABEL) -> bytes:
    """A plain ISO 9660 (level 1, one directory) image of ``files``. Linux mounts it with the
    names in lower case, as given ("network", "ca.pem")."""
    names = sorted(files, key=_iso_name)
    root_extent = 20
    records = [_dir_record(b"\0", root_extent, SECTOR, True), _dir_record(b"\1", root_extent, SECTOR, True)]
    extent = root_extent + 1
    placed: list[tuple[int, bytes]] = []
    for name in names:
        data = files[name]
        records.append(_dir_record(_iso_name(name), extent, len(data), False))
        placed.append((extent, data))
        extent += max(1, -(-len(data) // SECTOR))
    directory = b"".join(records)
    if len(directory) > SECTOR:
        raise ValueError("too many files for one directory sector")
    total = extent
    path_table_l = bytes([1, 0]) + struct.pack("<I", root_extent) + struct.pack("<H", 1) + b"\0\0"
    path_table_m = bytes([1, 0]) + struct.pack(">I", root_extent) + struct.pack(">H", 1) + b"\0\0"
    blank_date = b"0" * 16 + b"\0"
    date = b"1970010100000000\0"
    pvd = (bytes([1]) + b"CD001" + bytes([1, 0]) + b"LINUX".ljust(32) + label.encode().ljust(32)
           + bytes(8) + _both32(total) + bytes(32) + _both16(1) + _both16(1) + _both16(SECTOR)
           + _both32(len(path_table_l)) + struct.pack("<I", 18) + bytes(4) + struct.pack(">I", 19)
           + bytes(4) + _dir_record(b"\0", root_extent, SECTOR, True)
           + b" " * 128 + b"BETTERCOMPUTE".ljust(128) + b"BETTERCOMPUTE SITE".ljust(128)
           + b"BETTERCOMPUTE AGENT".ljust(128) + b" " * 37 * 3 + date + date + blank_date + blank_date
           + bytes([1, 0]))
    terminator = bytes([255]) + b"CD001" + bytes([1])
    image = bytearray(total * SECTOR)
    for sector, data in ((16, pvd), (17, terminator), (18, path_table_l), (19, path_table_m),
                         (root_extent, directory), *placed):
        image[sector * SECTOR:sector * SECTOR + len(data)] = data
    return bytes(image)


# -- the sets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MediaSet(MacRecord):
    """A node's virtual media, as kept in sets/<mac hex>.json."""

    node_id: str
    mac: str
    iso_url: str          # the upstream the shared ISO came from
    iso_digest: str       # its sha256: its name in the store
    token: str
    expires_at: float

    @classmethod
    def from_json(cls, text: str) -> MediaSet:
        data = json.loads(text)
        data["mac"] = parse_mac(data["mac"])
        if not DIGEST.fullmatch(str(data.get("iso_digest", ""))):
            raise ValueError("a set without its ISO's sha256 (written by an earlier version)")
        return cls(**data)


class MediaSets:
    """The nodes' virtual-media sets, their config media and their ISOs in the content store
    (the site's, shared with boot entries and routes; one of its own, root/store, when none
    is given). Thread-safe; ``base_url`` is the site's HTTP service as the BMCs reach it."""

    def __init__(self, root: Path, base_url: str, http_options: http.HttpOptions | None = None,
                 store: ChunkStore | None = None) -> None:
        self.root = root
        self.base_url = base_url.rstrip("/")
        # The service's TLS listener as the BMCs reach it, "" where the site has none (the
        # settings site_https_port, site_tls_cert, site_tls_key: agent/site/services.py).
        self.https_base_url = ""
        self.http_options = http_options or http.HttpOptions(timeout=30.0, max_retries=3)
        self.sets_dir = root / "sets"
        self.table: TtlTable[MediaSet] = TtlTable(self.sets_dir, "media set", name=lambda m: m.mac_hex,
                                                  parse=MediaSet.from_json, dump=MediaSet.to_json)
        self.config_dir = root / "config"
        self.store = store or ChunkStore(root / "store", protected=self.digests_in_use)
        self._lock = threading.RLock()
        self._sets: dict[str, MediaSet] = {}       # by MAC
        self._tokens: dict[str, MediaSet] = {}     # by token
        self._in_use: frozenset[str] = frozenset()  # the live sets' ISOs (digests_in_use)

    def reconcile(self) -> list[str]:
        """Load the sets on disk; drop the expired and malformed and their media. Returns the
        MACs dropped."""
        for d in (self.root, self.config_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
        shutil.rmtree(self.root / "cache", ignore_errors=True)  # by URL: earlier versions'
        if self.store.root.parent == self.root:
            self.store.reconcile()  # its own store; the site's is reconciled by the services
        with self._lock:
            loaded = self.table.load(check=lambda m: (self.config_dir / f"{m.mac_hex}.iso").is_file())
            dropped = [media.mac for media in loaded.dropped]
            self._sets = {media.mac: media for media in loaded.live}
            self._tokens = {media.token: media for media in loaded.live}
            self._changed()
            wanted = {f"{m.mac_hex}.iso" for m in self._sets.values()}
            for path in self.config_dir.iterdir():
                if path.name not in wanted:
                    path.unlink(missing_ok=True)
        return dropped

    def register(self, req: MediaRequest, cancel: threading.Event | None = None) -> MediaSet:
        """The set for ``req.mac`` (replacing an earlier one of that MAC, and its token)."""
        self.store.fetch(req.iso_url, req.iso_digest,
                         dataclasses.replace(self.http_options, cancel=cancel), "ramdisk ISO")
        medium = iso9660(req.medium_files())
        media = MediaSet(req.node_id, req.mac, req.iso_url, req.iso_digest,
                         secrets.token_urlsafe(24), time.time() + req.ttl_seconds)
        with self._lock:
            previous = self._sets.get(media.mac)
            write_atomic(self.config_dir / f"{media.mac_hex}.iso", medium, 0o600)
            self.table.save(media)
            if previous is not None:
                self._tokens.pop(previous.token, None)
            self._sets[media.mac] = media
            self._tokens[media.token] = media
            self._changed()
        if not self.store.has(media.iso_digest):  # evicted before the set protected it
            self.store.fetch(req.iso_url, req.iso_digest,
                             dataclasses.replace(self.http_options, cancel=cancel), "ramdisk ISO")
        log.info("virtual media for node %s, MAC %s: config medium %d bytes, for %ds", media.node_id,
                 media.mac, len(medium), req.ttl_seconds)
        return media

    def urls(self, media: MediaSet, scheme: str = "http") -> tuple[str, str]:
        """(the ramdisk ISO's URL, the config medium's URL) as the BMC fetches them, over
        ``scheme`` (``scheme_for``)."""
        root = self.https_base_url if scheme == "https" else self.base_url
        base = f"{root}{MEDIA_PREFIX}{media.token}/"
        return base + NAMES[0], base + NAMES[1]

    def scheme_for(self, accepted: tuple[str, ...], who: str = "the BMC") -> str:
        """The scheme to hand a BMC whose virtual media mounts ``accepted`` (() for any): http
        where it takes it, else https where the site serves its media over TLS; Unsupported,
        naming the settings, where the BMC needs https and the site has no TLS, or where it
        takes neither."""
        if not accepted or "http" in accepted:
            return "http"
        if "https" not in accepted:
            raise Unsupported(f"{who} mounts {', '.join(accepted)} images only; the site serves its "
                              "media over http and https")
        if not self.https_base_url:
            raise Unsupported(f"{who} mounts {', '.join(accepted)} images only, and the site serves "
                              "its media over http alone: configure its TLS, site_https_port, "
                              "site_tls_cert and site_tls_key (docs/site.md, \"Virtual media over https\")")
        return "https"

    def over_https(self, url: str) -> str:
        """The https URL of ``url`` where it is one of this site's media URLs (as ``urls``
        gives them) and the site serves its media over TLS too; "" otherwise. A BMC that
        mounts https:// images only is handed this one (bmc.storage insert_media)."""
        prefix = f"{self.base_url}{MEDIA_PREFIX}"
        if not self.https_base_url or not self.base_url or not url.startswith(prefix):
            return ""
        rest = url[len(prefix):]
        token, _, name = rest.partition("/")
        if name not in NAMES or not token or "?" in rest or "#" in rest:
            return ""
        return f"{self.https_base_url}{MEDIA_PREFIX}{token}/{name}"

    def remove(self, node_id: str, macs: Iterable[str] = (), keep_cache: bool = False) -> list[str]:
        """Remove the node's sets (all, or those of ``macs``), and from the store the ISOs
        they used that no live set uses, unless ``keep_cache``."""
        wanted = {parse_mac(m) for m in macs}
        removed: list[str] = []
        with self._lock:
            isos = set()
            for media in list(self._sets.values()):
                if media.node_id != node_id or (wanted and media.mac not in wanted):
                    continue
                self._drop(media)
                isos.add(media.iso_digest)
                removed.append(f"media {media.mac}")
            if not keep_cache:
                for digest in sorted(isos - self.digests_in_use()):
                    if self.store.remove(digest):
                        removed.append(f"media cache {digest}")
        return removed

    def digests_in_use(self) -> set[str]:
        """The ISOs of live sets: the store never evicts them. A snapshot taken at each
        change, read without the sets' lock (the store asks for it under its own lock, and
        the sets remove from the store: one lock order)."""
        return set(self._in_use)

    def expire(self, now: float | None = None) -> list[MediaSet]:
        now = time.time() if now is None else now
        with self._lock:
            gone = self.table.due(self._sets.values(), now)
            for media in gone:
                log.info("virtual media of node %s (MAC %s) expired", media.node_id, media.mac)
                self._drop(media)
        return gone

    def all(self) -> list[MediaSet]:
        with self._lock:
            return sorted(self._sets.values(), key=lambda m: m.mac)

    def mac_of(self, rest: str) -> str:
        """The MAC of the set whose medium /vm/<rest> is ("" for none): whose boot fetched it."""
        with self._lock:
            media = self._tokens.get(rest.partition("/")[0])
        return media.mac if media is not None else ""

    def path(self, rest: str) -> Path:
        """The file served at /vm/<rest>; NotFound unless its set is live."""
        token, _, name = rest.partition("/")
        with self._lock:
            media = self._tokens.get(token)
        if media is None or media.expired() or name not in NAMES:
            raise NotFound("no such medium")
        if name == NAMES[0]:
            return self.store.root / media.iso_digest
        return self.config_dir / f"{media.mac_hex}.iso"

    def _drop(self, media: MediaSet) -> None:
        self.table.remove(media)
        (self.config_dir / f"{media.mac_hex}.iso").unlink(missing_ok=True)
        self._sets.pop(media.mac, None)
        self._tokens.pop(media.token, None)
        self._changed()

    def _changed(self) -> None:
        """Lock held: refresh the snapshot of the ISOs in use."""
        self._in_use = frozenset(m.iso_digest for m in self._sets.values())

