"""The site's PXE boot entries: one per registered MAC, state on disk, each with its own TTL.

An entry says how one NIC boots the ramdisk: which boot loader its firmware takes over TFTP
(``undionly.kpxe`` for BIOS, ``ipxe.efi`` for x86 UEFI, ``grubaa64.efi`` for arm64 UEFI, the
site's own GRUB build: dnsmasq serves each by the architecture the client reports, see
agent/site/boot/dnsmasq.py) and what the loader then runs: the entry's own script URL, a kernel
and initrd with a kernel command line, or (UEFI) the ramdisk as a UKI (initramfs/uki.py); an
arm64 entry is a UKI entry (its GRUB runs the node's GRUB script, ``grub_script``). A kernel,
an initrd and a UKI come with their sha256 digests: each is downloaded once, verified, and
kept in the site's content store
(agent/site/chunkstore.py, the one that holds the routes' chunks) under its digest,
shared by every entry with the same content whatever its URL, and served by the site's HTTP
service at /cache/<sha256>. The store's budget bounds them; a file a live entry uses is never
evicted.

On disk, under the boot service's directory (every file written to a temporary sibling and
renamed into place, as Ironic's dnsmasq PXE filter writes its host files)::

    entries/<mac hex>.json    the entry (the source of truth, reconciled at start)
    hosts/<mac hex>           dnsmasq's dhcp-hostsdir line for the MAC: "<mac>" (empty once the
                              entry is gone; removed at the next start)
    scripts/<mac-hyphen>.ipxe the per-node iPXE script, served at /pxe/<mac-hyphen>.ipxe (an
                              arm64 entry's: <mac-hyphen>.grub, GRUB's, at /pxe/<mac>.grub)
    cached.json               the digests of the kernels and initrds entries put in the store
                              (what boot.cleanUp may remove from it)

A UKI is one build for the site's nodes: its embedded command line holds nothing per node
(no node id, no token: what the firmware measures is the same on every node) but names the
site (``bc.site=<this service's base URL>``). iPXE chains it with no command line of its own
(see ``script``; on arm64 the site's GRUB chainloads it, see ``grub_script``), and the
ramdisk's init fetches the node's bc.* settings, the entry's
``kernel_cmdline``, from /pxe/<mac-hyphen>.cmdline: the same words a kernel entry's script
holds, served under the same rule (a live entry of that MAC), so nothing new is exposed.

A node's script and settings hold its join token (``bc.token=``), and a MAC is seen in every
DHCP broadcast: where the site runs its own proxy DHCP (``clients_tied``), they are served only
to that MAC's address: the one the site's neighbour table holds for the MAC (the link layer's
record), or, for a client it holds nothing of (beyond a router or relay), the one the site's
DHCP exchange tied to the MAC (``tie``: the PXE boot server's answer, dnsmasq's ``PXE(eth0)
<address> <mac> <file>``, which every iPXE asks for). Anyone else asking, a client the
neighbour table holds for another NIC above all, is refused (``ClientRefused``, 403) and
logged, and what it asked is no step of the node's timeline.

A MAC without a host line gets no answer from the proxy DHCP (``dhcp-ignore`` of clients not
"known"), so an expired or removed entry means the node falls through to its disk. The
``on_change`` callback (the dnsmasq supervisor's reload) runs after every change.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from agent.atomicfile import write_atomic
from agent.errors import AgentError, InvalidParameters, NotFound, Reason
from agent.net import http
from agent.net.neighbours import read_arp
from agent.proto import site_pb2
from agent.site.boot.fields import (
    CMDLINE_CHARS,
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

MAX_TIES = 4096    # MACs whose address the site's DHCP exchange tied, the least recent forgotten


class ClientRefused(AgentError):
    """A node's script or settings asked by an address the site's DHCP did not tie to its MAC."""

    reason = Reason.UNTRUSTED


class BootFile(enum.StrEnum):
    """The boot loaders the TFTP server serves: Debian's iPXE binaries (package ``ipxe``) and
    for arm64 UEFI either the site's GRUB (initramfs/netgrub.py: its embedded script names the
    site) or, on a Secure Boot site, the site's signed arm64 UKI itself (``bootaa64.efi``,
    started by the firmware: Debian's GRUB 2.06 without shim refuses to start an image under
    Secure Boot, "shim_lock protocol not found"). A site's boot files hold one of the two."""

    BIOS = "undionly.kpxe"
    UEFI = "ipxe.efi"
    UEFI_ARM64 = "grubaa64.efi"
    UEFI_ARM64_UKI = "bootaa64.efi"

    @property
    def grub(self) -> bool:
        return self is BootFile.UEFI_ARM64

    @property
    def firmware_uki(self) -> bool:
        """The site's UKI itself, the firmware's PXE its only loader: no script runs."""
        return self is BootFile.UEFI_ARM64_UKI


UEFI_BOOT_FILES = (BootFile.UEFI, BootFile.UEFI_ARM64, BootFile.UEFI_ARM64_UKI)


@dataclass(frozen=True)
class BootSpec:
    """How one NIC boots: what a request asks for and what an entry keeps."""

    node_id: str
    mac: str
    boot_file: BootFile
    script_url: str
    kernel_url: str
    initrd_url: str
    cmdline: str
    kernel_digest: str         # sha256 hex of the kernel ("" with a script URL)
    initrd_digest: str         # of the initrd ("" without one)
    uki_url: str               # the ramdisk as a UKI (UEFI): iPXE chains it, kernel_url is ""
    uki_digest: str            # its sha256 hex ("" without a UKI)


@dataclass(frozen=True)
class EntryRequest(BootSpec):
    """A validated boot.prepareRamdisk payload."""

    ttl_seconds: int

    @classmethod
    def from_proto(cls, msg: site_pb2.ProxyDhcpEntry) -> EntryRequest:
        node_id = parse_node_id(msg.node_id)
        mac = parse_mac(msg.mac_address)
        try:
            boot_file = BootFile(msg.boot_file)
        except ValueError:
            served = ", ".join(b.value for b in BootFile)
            raise InvalidParameters(
                f"boot_file {msg.boot_file[:40]!r} is not served; one of: {served}"
            ) from None
        script = msg.ipxe_script_url.strip()
        kernel = msg.kernel_url.strip()
        initrd = msg.initrd_url.strip()
        uki = msg.uki_url.strip()
        cmdline = msg.kernel_cmdline.strip()
        kernel_digest = initrd_digest = uki_digest = ""
        if uki:
            script_safe_url(uki, "uki_url")
            uki_digest = parse_file_digest(msg.uki_digest, "uki_digest")
            if script or kernel or initrd or msg.kernel_digest.hex or msg.initrd_digest.hex:
                raise InvalidParameters("give uki_url alone, or ipxe_script_url, or kernel_url "
                                        "(with initrd_url): not two of them")
            if boot_file not in UEFI_BOOT_FILES:
                raise InvalidParameters(f"uki_url boots UEFI firmware only: boot_file one of "
                                        f"{', '.join(b.value for b in UEFI_BOOT_FILES)}, "
                                        f"not {boot_file.value}")
        elif msg.uki_digest.hex:
            raise InvalidParameters("uki_digest without a uki_url")
        elif boot_file.grub or boot_file.firmware_uki:
            what = "the site's GRUB" if boot_file.grub else "the site's UKI"
            raise InvalidParameters(f"boot_file {boot_file.value} (arm64 UEFI, {what}) "
                                    "boots a uki_url: script and kernel entries are iPXE's")
        elif script:
            script_safe_url(script, "ipxe_script_url")
            if kernel or initrd or cmdline or msg.kernel_digest.hex or msg.initrd_digest.hex:
                raise InvalidParameters(
                    "give either ipxe_script_url or kernel_url (with initrd_url, kernel_cmdline)"
                )
        elif kernel:
            script_safe_url(kernel, "kernel_url")
            kernel_digest = parse_file_digest(msg.kernel_digest, "kernel_digest")
            if initrd:
                script_safe_url(initrd, "initrd_url")
                initrd_digest = parse_file_digest(msg.initrd_digest, "initrd_digest")
            elif msg.initrd_digest.hex:
                raise InvalidParameters("initrd_digest without an initrd_url")
        else:
            raise InvalidParameters("an entry needs ipxe_script_url, kernel_url or uki_url")
        if len(cmdline) > MAX_CMDLINE or not CMDLINE_CHARS.fullmatch(cmdline):
            raise InvalidParameters(
                "kernel_cmdline: only letters, digits, spaces and . _ , : = / + @ % ~ - "
                f"(at most {MAX_CMDLINE} characters): anything else could change the iPXE script"
            )
        return cls(node_id, mac, boot_file, script, kernel, initrd, cmdline, kernel_digest,
                   initrd_digest, uki, uki_digest, parse_ttl(msg.ttl_seconds))


@dataclass(frozen=True)
class BootEntry(BootSpec, MacRecord):
    """A registered entry, as kept in entries/<mac hex>.json."""

    entry_id: str
    expires_at: float          # time.time()

    @property
    def mac_hyphen(self) -> str:
        return self.mac.replace(":", "-")

    @property
    def script_name(self) -> str:
        """Its script's file under scripts/: GRUB's for an arm64 entry, else iPXE's."""
        return f"{self.mac_hyphen}.{'grub' if self.boot_file.grub else 'ipxe'}"

    @classmethod
    def from_json(cls, text: str) -> BootEntry:
        data = json.loads(text)
        data["boot_file"] = BootFile(data["boot_file"])
        data["mac"] = parse_mac(data["mac"])
        # Entries written before kernels carried digests: a script entry reads as it was; a
        # kernel entry cannot be served by content and is dropped (ValueError).
        data.setdefault("kernel_digest", "")
        data.setdefault("initrd_digest", "")
        data.setdefault("uki_url", "")
        data.setdefault("uki_digest", "")
        entry = cls(**data)
        if (entry.kernel_url and not entry.kernel_digest) or \
                (entry.initrd_url and not entry.initrd_digest) or (entry.uki_url and not entry.uki_digest):
            raise ValueError("a kernel entry without the digests of its files (written by an "
                             "earlier version): register it again")
        return entry


def grub_http_device(base_url: str) -> str:
    """``http://HOST[:PORT]`` as GRUB's device for it, ``(http,HOST:PORT)``; InvalidParameters
    for a URL GRUB cannot fetch from (https, a path, characters its parser would take)."""
    host = base_url.removeprefix("http://").rstrip("/")
    if host == base_url or not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", host):
        raise InvalidParameters(f"the site's GRUB fetches from http://host[:port] only, and the "
                                f"site's HTTP service is {base_url[:80]!r}")
    return f"(http,{host})"


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


class BootEntries:
    """The registered entries, their dnsmasq host files, scripts and the shared cache.

    ``base_url`` is the site's HTTP service as the nodes reach it ("http://10.0.0.2:8088").
    Thread-safe; ``on_change`` (e.g. the dnsmasq reload) runs after each change, outside the lock.
    """

    def __init__(self, root: Path, base_url: str,
                 on_change: Callable[[], None] | None = None,
                 http_options: http.HttpOptions | None = None,
                 store: ChunkStore | None = None) -> None:
        self.root = root
        self.base_url = base_url.rstrip("/")
        self.on_change = on_change
        self.http_options = http_options or http.HttpOptions(timeout=30.0, max_retries=3)
        self.entries_dir = root / "entries"
        self.table: TtlTable[BootEntry] = TtlTable(self.entries_dir, "boot entry",
                                                    name=lambda e: e.mac_hex,
                                                    parse=BootEntry.from_json, dump=BootEntry.to_json)
        self.hosts_dir = root / "hosts"
        self.scripts_dir = root / "scripts"
        # The content store the kernels and initrds are kept in: the site's, shared with the
        # routes' chunks; a store of its own (root/store) when none is given.
        self.store = store or ChunkStore(root / "store", protected=self.digests_in_use)
        self._lock = threading.RLock()
        self._entries: dict[str, BootEntry] = {}   # by MAC
        self._in_use: frozenset[str] = frozenset()
        self._cached: set[str] = set()   # the kernels and initrds entries put in the store
        # Where the site runs its own proxy DHCP: a node's script only to its MAC's address.
        self.clients_tied = False
        # The sha256 of the arm64 UKI the site's TFTP serves as bootaa64.efi (None: none); set
        # by the site's services where its dnsmasq runs (agent/site/boot/dnsmasq.py).
        self.served_uki: Callable[[], str | None] = lambda: None
        self._ties: OrderedDict[str, str] = OrderedDict()   # MAC -> the address DHCP tied to it
        self.arp: Callable[[str], str] = read_arp

    # -- start -------------------------------------------------------------------------

    def reconcile(self) -> list[str]:
        """Load the entries on disk, drop the expired and malformed, and rewrite the host
        files and scripts from the entries (anything else in those folders is removed).
        Returns the MACs dropped."""
        for d, mode in ((self.root, 0o700), (self.hosts_dir, 0o755), (self.scripts_dir, 0o755)):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, mode)
        with self._lock:
            loaded = self.table.load()
            self._entries.clear()
            self._entries.update((entry.mac, entry) for entry in loaded.live)
            dropped = [entry.mac for entry in loaded.dropped]
            self._entries_changed()
            for leftover in self.root.glob(".*.tmp"):   # the host files' temporaries
                _unlink(leftover)
            wanted_hosts = {e.mac_hex for e in self._entries.values()}
            wanted_scripts = {e.script_name for e in self._entries.values()}
            for path in self.hosts_dir.iterdir():
                if path.name not in wanted_hosts:
                    _unlink(path)
            for path in self.scripts_dir.iterdir():
                if path.name not in wanted_scripts:
                    _unlink(path)
            for entry in self._entries.values():
                self._write_files(entry)
        with self._lock:
            self._load_cached()
        # The cache by URL of earlier versions: its files are fetched again, by digest.
        shutil.rmtree(self.root / "cache", ignore_errors=True)
        if self.store.root.parent == self.root:
            self.store.reconcile()  # its own store; the site's is reconciled by the services
        missing = {d for d in self.digests_in_use() if not self.store.has(d)}
        if missing:
            log.warning("boot entries use %d kernels or initrds the store does not hold; they "
                        "are fetched again at their next registration", len(missing))
        return dropped

    # -- what the handlers do ----------------------------------------------------------

    def register(self, req: EntryRequest, cancel: threading.Event | None = None) -> BootEntry:
        """Add the entry for ``req.mac``, replacing any earlier one of that MAC."""
        if req.boot_file.grub:
            self.grub_server()  # refused before anything when GRUB cannot reach the service
        if req.boot_file.firmware_uki:
            self._check_served_uki(req)
        self._cache_files(req, cancel)
        spec = {f.name: getattr(req, f.name) for f in fields(BootSpec)}
        entry = BootEntry(**spec, entry_id=f"{req.mac.replace(':', '')}-{secrets.token_hex(4)}",
                          expires_at=time.time() + req.ttl_seconds)
        with self._lock:
            previous = self._entries.get(entry.mac)
            if previous is not None and previous.node_id != entry.node_id:
                log.warning("MAC %s moves from node %s to node %s", entry.mac, previous.node_id,
                            entry.node_id)
            self.table.save(entry)
            if previous is not None and previous.script_name != entry.script_name:
                _unlink(self.scripts_dir / previous.script_name)  # its other loader's script
            self._write_files(entry)
            self._entries[entry.mac] = entry
            self._entries_changed()
        self._cache_files(req, cancel)  # evicted before the entry protected them (a store near its budget)
        log.info("boot entry %s: node %s, MAC %s, %s, for %ds", entry.entry_id, entry.node_id,
                 entry.mac, entry.boot_file, req.ttl_seconds)
        self._changed()
        return entry

    def remove(self, node_id: str, macs: Iterable[str] = (), keep_cache: bool = False) -> list[str]:
        """Remove the node's entries (all of them, or those of ``macs``) and their files;
        the cached kernels and initrds no entry uses any more unless ``keep_cache``. Returns
        what was removed ("entry <mac>", "cache <key>"); nothing to remove is no error."""
        wanted = {parse_mac(m) for m in macs}
        removed: list[str] = []
        with self._lock:
            for entry in list(self._entries.values()):
                if entry.node_id != node_id or (wanted and entry.mac not in wanted):
                    continue
                self._drop(entry)
                removed.append(f"entry {entry.mac}")
            # A MAC asked for by name whose entry is on disk but not loaded (or of another
            # node id after a re-registration) is left alone: it belongs to that node now.
        if not keep_cache:
            removed += [f"cache {k}" for k in self._prune_cache()]
        if removed:
            self._changed()
        return removed

    def expire(self, now: float | None = None) -> list[BootEntry]:
        """Drop the expired entries; called by the service's timer."""
        now = time.time() if now is None else now
        with self._lock:
            gone = self.table.due(self._entries.values(), now)
            for entry in gone:
                log.info("boot entry %s (node %s, MAC %s) expired", entry.entry_id,
                         entry.node_id, entry.mac)
                self._drop(entry)
        if gone:
            self._changed()
        return gone

    def get(self, mac: str) -> BootEntry | None:
        with self._lock:
            entry = self._entries.get(mac)
        return entry if entry is not None and not entry.expired() else None

    def all(self) -> list[BootEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.mac)

    # -- what the HTTP service serves --------------------------------------------------

    def chain_script(self) -> bytes:
        """/boot.ipxe: what every chained iPXE runs first; fetches its node's own script by
        MAC, and when there is none (expired, removed) leaves iPXE so the firmware boots
        the next device (the disk)."""
        return (
            "#!ipxe\n"
            f"chain {self.base_url}/pxe/${{mac:hexhyp}}.ipxe || goto none\n"
            ":none\n"
            "echo bettercompute: no boot entry for ${mac}; booting the next device\n"
            "exit 1\n"
        ).encode()

    def chain_grub(self) -> bytes:
        """/boot.grub: what the site's GRUB (arm64 UEFI) runs first, as iPXE runs /boot.ipxe:
        the node's own GRUB script by the MAC GRUB booted from, and when there is none, back
        to the firmware, which boots the next device. No ";" in an echo: GRUB's parser splits
        commands there. NotFound where GRUB cannot reach this service (https)."""
        try:
            server = self.grub_server()
        except InvalidParameters as exc:
            raise NotFound(exc.message) from None
        return (
            "echo bc-pxe: GRUB asking the site for the boot entry of ${net_default_mac}\n"
            f"configfile {server}/pxe/${{net_default_mac}}.grub\n"
            "echo bettercompute: no boot entry for ${net_default_mac}, booting the next device\n"
            "exit\n"
        ).encode()

    def grub_server(self) -> str:
        """The site's HTTP service as a GRUB device, "(http,HOST:PORT)" (Debian's GRUB 2.06
        takes a port there)."""
        return grub_http_device(self.base_url)

    # -- who may fetch a node's script -------------------------------------------------

    def tie(self, mac: str, address: str) -> None:
        """The site's DHCP exchange saw ``mac`` boot from ``address`` (the PXE boot server's
        answer): its script and settings go to that address only."""
        with self._lock:
            self._ties[mac.lower()] = address
            self._ties.move_to_end(mac.lower())
            while len(self._ties) > MAX_TIES:
                self._ties.popitem(last=False)

    def tied_address(self, mac: str) -> str:
        with self._lock:
            return self._ties.get(mac, "")

    def check_client(self, mac: str, client: str) -> None:
        """ClientRefused unless ``client`` may fetch ``mac``'s script, where the site runs its
        proxy DHCP: the site's neighbour table holds ``client`` for that MAC (the link layer's
        record of the NIC it talks to: a node whose ramdisk got another lease than its iPXE, the
        site's GRUB on arm64, which never asks the boot server), or it holds nothing for
        ``client`` (a client beyond a router or relay) and ``client`` is the address the site's
        DHCP exchange tied to the MAC. Anything else, a neighbour table naming another NIC
        above all (a boot server request carries the MAC and address its sender wrote), is
        refused."""
        if not self.clients_tied:
            return
        tied = self.tied_address(mac)
        seen = self.arp(client) if client else ""
        if seen == mac or (not seen and tied and client == tied):
            return
        why = (f"the site's neighbour table holds {client} for {seen}" if seen else
               f"the site's DHCP tied it to {tied}" if tied else
               "the site's DHCP tied no address to it and the neighbour table does not hold it there")
        log.warning("the script of %s asked by %s, refused: %s", mac, client or "an unknown address", why)
        raise ClientRefused(f"the boot script of {mac} is served to that node's address only ({why})")

    def _client_mac(self, name: str, exts: tuple[str, ...], client: str) -> tuple[str, str]:
        """(MAC, extension) of /pxe/<name>, the client checked (``check_client``); NotFound for
        a name that is no such file."""
        stem, dot, ext = name.partition(".")
        if ext not in exts or not dot:
            raise NotFound(f"no such file {name[:40]!r}")
        try:
            mac = parse_mac(stem)
        except InvalidParameters:
            raise NotFound(f"no such file {name[:40]!r}") from None
        self.check_client(mac, client)
        return mac, ext

    def script_path(self, name: str, client: str = "") -> Path:
        """The per-node script served as /pxe/<name> (<mac>.ipxe, or <mac>.grub for an arm64
        entry) to ``client`` (its address); NotFound unless its entry is live and of that kind,
        ClientRefused for another address than the MAC's (``check_client``)."""
        mac, ext = self._client_mac(name, ("ipxe", "grub"), client)
        entry = self.get(mac)
        if entry is None:
            raise NotFound(f"no live boot entry for {mac}")
        if entry.script_name != f"{entry.mac_hyphen}.{ext}":
            raise NotFound(f"the boot entry for {mac} has no {ext} script")
        return self.scripts_dir / entry.script_name

    def node_settings(self, name: str, client: str = "") -> bytes:
        """/pxe/<mac-hyphen>.cmdline: the bc.* settings of a live UKI entry, for the ramdisk's
        init (the UKI's own command line holds none), to ``client`` as a script
        (``check_client``); NotFound for any other name or entry."""
        mac, _ = self._client_mac(name, ("cmdline",), client)
        entry = self.get(mac)
        if entry is None or not entry.uki_url:
            raise NotFound(f"no live UKI boot entry for {mac}")
        return f"{entry.cmdline}\n".encode()

    def digests_in_use(self) -> set[str]:
        """The kernels and initrds live entries boot: the store never evicts them. A snapshot
        taken at each change, read without the entries' lock (the store asks for it under its
        own lock, and the entries write to the store: one lock order)."""
        return set(self._in_use)

    def _entries_changed(self) -> None:
        """Lock held: refresh the snapshot of the digests in use."""
        self._in_use = frozenset(d for e in self._entries.values()
                                 for d in (e.kernel_digest, e.initrd_digest, e.uki_digest) if d)

    # -- inside ------------------------------------------------------------------------

    def _check_served_uki(self, req: EntryRequest) -> None:
        """An entry whose boot file is the site's UKI boots the one the TFTP serves, whatever
        its uki_url says: refused unless its uki_digest is that file's sha256 (the control
        plane's choice is never silently replaced by another build)."""
        served = self.served_uki()
        if served is None:
            raise InvalidParameters(f"boot_file {req.boot_file.value}: this site serves no "
                                    "arm64 UKI (its boot files hold none: initramfs/signing.py)")
        if served != req.uki_digest:
            raise InvalidParameters(f"boot_file {req.boot_file.value}: the site's TFTP serves the "
                                    f"UKI with sha256 {served}, not the entry's {req.uki_digest}")

    def script(self, entry: BootEntry) -> str:
        if entry.boot_file.grub:
            return self.grub_script(entry)
        if entry.boot_file.firmware_uki:   # nothing fetches it: the firmware started the UKI
            return (f"#!ipxe\n# bettercompute: node {entry.node_id}, entry {entry.entry_id}: the "
                    f"firmware starts the site's {entry.boot_file.value} itself\nexit 1\n")
        lines = ["#!ipxe", f"# bettercompute: node {entry.node_id}, entry {entry.entry_id}"]
        if entry.script_url:
            lines.append(f"chain {entry.script_url} || goto failed")
        elif entry.uki_url:
            # iPXE hands an EFI image its name (and any arguments) as LoadOptions, and
            # systemd-stub takes LoadOptions that start with a printable character as the
            # kernel's command line instead of its embedded one, measured into PCR 12 (seen
            # with Debian's iPXE and systemd 252 under OVMF: the kernel got "ramdisk.efi").
            # The stub ignores LoadOptions whose first character is a control character: the
            # image is named U+0001, so the UKI boots with its own command line, PCR 12 empty.
            lines += ["set bc-name:hex 01",
                      f"chain --name ${{bc-name:string}} {self.base_url}/cache/{entry.uki_digest} "
                      "|| goto failed"]
        else:
            kernel = f"{self.base_url}/cache/{entry.kernel_digest}"
            args = entry.cmdline
            if entry.initrd_url:
                args = f"{args} initrd=initrd.img".strip()
            lines.append(f"kernel --name vmlinuz {kernel} {args}".rstrip() + " || goto failed")
            if entry.initrd_url:
                initrd = f"{self.base_url}/cache/{entry.initrd_digest}"
                lines.append(f"initrd --name initrd.img {initrd} || goto failed")
            lines.append("boot || goto failed")
        lines += [":failed", "echo bettercompute: the ramdisk did not boot; next device",
                  "exit 1", ""]
        return "\n".join(lines)

    def grub_script(self, entry: BootEntry) -> str:
        """An arm64 entry's GRUB script (/pxe/<mac>.grub): the UKI chainloaded from the store
        with no arguments, so GRUB hands it no LoadOptions: systemd-stub keeps the UKI's own
        command line and PCR 12 stays empty (docs/attestation.md). The firmware's LoadImage
        measures the UKI into PCR 4 after the site's GRUB (a loader the policy lists)."""
        return "\n".join([
            f"# bettercompute: node {entry.node_id}, entry {entry.entry_id}",
            "echo bc-pxe: GRUB starting the ramdisk UKI",
            # chainloader opens $root for the image's device path: the PXE boot left it at
            # (tftp,<DHCP server>), which GRUB cannot open without its tftp module ("disk
            # `tftp,10.0.2.2' not found", seen under AAVMF); the site's device is the one used.
            f"set root={self.grub_server()}",
            f"chainloader {self.grub_server()}/cache/{entry.uki_digest}",
            "boot",
            "echo bettercompute: the ramdisk did not boot, booting the next device",
            "exit", ""])

    def _write_files(self, entry: BootEntry) -> None:
        write_atomic(self.hosts_dir / entry.mac_hex,
                     f"{entry.mac}\n".encode(), tmp_dir=self.root)
        write_atomic(self.scripts_dir / entry.script_name, self.script(entry).encode())

    def _drop(self, entry: BootEntry) -> None:
        # The host file is emptied, not removed (a precaution: dnsmasq 2.90 has crashed on
        # reloads of dhcp-hostsdir, see agent/site/boot/dnsmasq.py); the empty files are removed at
        # the next start, before dnsmasq runs.
        write_atomic(self.hosts_dir / entry.mac_hex, b"", tmp_dir=self.root)
        _unlink(self.scripts_dir / entry.script_name)
        self.table.remove(entry)
        self._entries.pop(entry.mac, None)
        self._entries_changed()

    def _prune_cache(self) -> list[str]:
        """Remove from the store the kernels and initrds entries cached that no live entry
        uses any more (the store's other files, the routes' chunks, are not the entries')."""
        used = self.digests_in_use()
        with self._lock:
            gone = sorted(self._cached - used)
            for digest in gone:
                self.store.remove(digest)
            self._cached -= set(gone)
            if gone:
                self._save_cached()
        return gone

    def _save_cached(self) -> None:
        write_atomic(self.root / "cached.json", json.dumps(sorted(self._cached)).encode(), 0o600)

    def _load_cached(self) -> None:
        try:
            names = json.loads((self.root / "cached.json").read_text())
            self._cached = {n for n in names if isinstance(n, str) and DIGEST.fullmatch(n)}
        except (OSError, ValueError, TypeError):
            self._cached = set()

    def _cache_files(self, req: EntryRequest, cancel: threading.Event | None) -> None:
        if req.kernel_url:
            self._cache(req.kernel_url, req.kernel_digest, "kernel", cancel)
        if req.initrd_url:
            self._cache(req.initrd_url, req.initrd_digest, "initrd", cancel)
        if req.uki_url:
            self._cache(req.uki_url, req.uki_digest, "UKI", cancel)

    def _cache(self, url: str, digest: str, what: str, cancel: threading.Event | None) -> None:
        """Download ``url`` into the store under ``digest`` unless it holds it already; the
        bytes are verified before they get the name (ChecksumMismatch: nothing kept)."""
        with self._lock:
            if digest not in self._cached:
                self._cached.add(digest)
                self._save_cached()
        self.store.fetch(url, digest, dataclasses.replace(self.http_options, cancel=cancel), what)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
