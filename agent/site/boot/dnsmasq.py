"""dnsmasq as the site's proxy DHCP and TFTP server, supervised by the site daemon.

dnsmasq runs in proxy-DHCP mode (``dhcp-range=<site address>,proxy``): it never hands out an
address (the provisioning network's own DHCP server does), it only tells PXE and iPXE clients
where to boot from, and it does so only for the MACs that have a line in ``hosts/``
(``dhcp-ignore`` of every client not "known"). The PXE ROM gets ``undionly.kpxe`` (BIOS,
client architecture 0) or ``ipxe.efi`` (UEFI x86-64, architecture 7 or 9) over TFTP, from a
folder that holds those files and nothing else; iPXE, once chained (user class "iPXE"),
gets the URL of the site's ``/boot.ipxe``. arm64 UEFI (architecture 11) gets ``grubaa64.efi``
where the iPXE folder holds one: the site's own GRUB build (initramfs/netgrub.py), whose
embedded script fetches the site's ``/boot.grub`` over HTTP (QEMU's and most arm64 firmware
has no iPXE); on a Secure Boot site the folder holds ``bootaa64.efi`` instead, the site's signed
arm64 UKI, which the firmware verifies and starts itself (Debian's GRUB without shim cannot
start an image under Secure Boot); without either, arm64 clients get no boot file.

The supervisor starts dnsmasq in the foreground in its own process group, logs its output,
restarts it when it dies (with a backoff), reloads it with SIGHUP after every change of the
host files (dnsmasq rereads ``dhcp-hostsdir`` then) and stops it with the daemon. The child's
pid is recorded on disk, so a daemon that was killed leaves no stray dnsmasq behind: the next
start kills the recorded one (when it is still our dnsmasq, checked by its command line).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent import proc
from agent.atomicfile import replacing, write_atomic
from agent.config import Config
from agent.errors import ToolFailed, ToolMissing
from agent.retry import Backoff
from agent.site.boot.pxe import BootFile

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX = 30.0
# The digests of the boot files, beside them in the iPXE folder, written by the build that
# signed them (initramfs/signing.py): where it is, every served file must match it.
BOOT_MANIFEST = "boot-files.json"
STABLE_SECONDS = 10.0


@dataclass(frozen=True)
class DnsmasqSettings:
    interface: str              # the provisioning network's interface
    address: str                # the site's address on it (the proxy's subnet, the TFTP server)
    http_base_url: str          # the site's HTTP service, as the nodes reach it
    root: Path                  # the boot service's folder (hosts/ inside it)
    ipxe_dir: Path = Config.site_ipxe_dir    # where undionly.kpxe and ipxe.efi (and the
                                             # site's grubaa64.efi, optional) come from
    binary: str = "dnsmasq"
    argv_prefix: tuple[str, ...] = ()        # e.g. ("ip", "netns", "exec", "site") in tests

    @property
    def conf_path(self) -> Path:
        return self.root / "dnsmasq.conf"

    @property
    def tftp_dir(self) -> Path:
        return self.root / "tftp"

    @property
    def hosts_dir(self) -> Path:
        return self.root / "hosts"

    @property
    def pid_path(self) -> Path:
        return self.root / "dnsmasq.pid"


def arm64_boot_file(s: DnsmasqSettings) -> BootFile | None:
    """What arm64 UEFI clients get: the site's GRUB or its signed UKI where the iPXE folder
    holds one (optional), None where it holds neither; both is a folder the site refuses
    (which one a node would boot would be a guess)."""
    held = [b for b in (BootFile.UEFI_ARM64, BootFile.UEFI_ARM64_UKI) if (s.ipxe_dir / b).is_file()]
    if len(held) > 1:
        raise ToolFailed(f"boot service: {s.ipxe_dir} holds both {' and '.join(held)}: one arm64 "
                         f"boot file per site ({BootFile.UEFI_ARM64_UKI} under Secure Boot)")
    return held[0] if held else None


def served_digest(s: DnsmasqSettings, name: BootFile) -> str | None:
    """The sha256 hex of ``name`` as the TFTP folder holds it (what the nodes get), or None.
    Hashed once per version of the file (its inode, size and mtime): an arm64 UKI is ~44 MB,
    asked at every boot entry for it, and the folder changes only at ``prepare``."""
    path = s.tftp_dir / name
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _file_sha256(str(path), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, _ino: int, _size: int, _mtime_ns: int) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def pinned_digests(folder: Path) -> dict[str, str] | None:
    """name -> sha256 hex of the boot files ``folder``'s BOOT_MANIFEST pins; None without one.
    A manifest that cannot be read is an error, never a folder served unchecked."""
    path = folder / BOOT_MANIFEST
    try:
        doc = json.loads(path.read_text())
        files = doc["files"]
        return {str(name): str(entry["sha256"]) for name, entry in files.items()}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ToolFailed(f"boot service: {path} is not a boot file manifest: {exc}") from None


def render_config(s: DnsmasqSettings) -> str:
    boot = f"{s.http_base_url.rstrip('/')}/boot.ipxe"
    arm64 = arm64_boot_file(s)
    lines = [
        "# Written by the bettercompute site daemon at each start; edits are lost.",
        "port=0",                                   # no DNS
        f"interface={s.interface}",
        "bind-interfaces",
        f"dhcp-range={s.address},proxy",            # proxy DHCP: never an address
        "leasefile-ro",
        f"dhcp-hostsdir={s.hosts_dir}",
        # Only the MACs with a host line ("known") get an answer. The lines carry no tags:
        # dnsmasq 2.90 aborts (a double free) when it reloads dhcp-host lines with set:<tag>
        # after it has answered a PXE client, so the binary follows the client's architecture.
        "dhcp-ignore=tag:!known",
        "dhcp-userclass=set:ipxe,iPXE",
        "dhcp-match=set:ipxe,175",
        "dhcp-match=set:efi64,option:client-arch,7",
        "dhcp-match=set:efi64,option:client-arch,9",
        # BIOS PXE ROMs: a boot menu of one item, answered by the boot server (port 4011).
        'pxe-prompt="bettercompute",0',
        f'pxe-service=tag:!ipxe,x86PC,"bettercompute",{BootFile.BIOS}',
        f'pxe-service=tag:ipxe,x86PC,"bettercompute",{boot}',
        # UEFI PXE: the file in the proxy offer itself (dnsmasq sends no menu to UEFI).
        f"dhcp-boot=tag:!ipxe,tag:efi64,{BootFile.UEFI}",
        # arm64 UEFI: the site's GRUB, which fetches /boot.grub itself (no iPXE after it), or
        # the site's signed UKI, the firmware its only loader (Secure Boot).
        "dhcp-match=set:efiarm64,option:client-arch,11" if arm64 else "",
        f"dhcp-boot=tag:!ipxe,tag:efiarm64,{arm64}" if arm64 else "",
        # iPXE, once chained (either firmware): the site's chain script over HTTP.
        f"dhcp-boot=tag:ipxe,{boot}",
        "enable-tftp",
        f"tftp-root={s.tftp_dir}",
        "log-dhcp",
        "",
    ]
    return "\n".join(line for line in lines if line != "") + "\n"


def prepare(s: DnsmasqSettings) -> None:
    """Write the configuration and the TFTP folder (only the served binaries)."""
    for name in ("interface", "address"):
        value = getattr(s, name)
        if not value or any(c.isspace() or c in ",#\"'" for c in value):
            raise ToolFailed(f"boot service: bad {name} {value!r} for dnsmasq")
    s.tftp_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(s.tftp_dir, 0o755)  # noqa: S103  (the iPXE binaries are public)
    served = {BootFile.BIOS.value, BootFile.UEFI.value}
    arm64 = arm64_boot_file(s)
    if arm64 is not None:
        served.add(arm64.value)
    for path in s.tftp_dir.iterdir():
        if path.name not in served:
            path.unlink()
    pinned = pinned_digests(s.ipxe_dir)
    for name in sorted(served):
        src = s.ipxe_dir / name
        if not src.is_file():
            raise ToolMissing(
                f"{src}: missing; install Debian's ipxe package (apt-get install ipxe)", tool="ipxe"
            )
        data = src.read_bytes()
        if pinned is not None:
            digest = hashlib.sha256(data).hexdigest()
            if pinned.get(name) != digest:
                raise ToolFailed(f"boot service: {src} has sha256 {digest}, its {BOOT_MANIFEST} pins "
                                 f"{pinned.get(name) or 'nothing'}: not served")
        dst = s.tftp_dir / name
        if not dst.is_file() or dst.read_bytes() != data:
            with replacing(dst, 0o644) as f:
                f.write(data)
    write_atomic(s.conf_path, render_config(s).encode())


def ours(pid: int, s: DnsmasqSettings) -> bool:
    """Whether process ``pid`` is a dnsmasq of these settings (its command line names our
    configuration file)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"--conf-file={s.conf_path}".encode() in argv


def kill_stray(s: DnsmasqSettings) -> bool:
    """Kill a dnsmasq left by an earlier daemon (its pid recorded, its command line ours)."""
    try:
        pid = int(s.pid_path.read_text().strip() or "0")
    except (OSError, ValueError):
        return False
    with contextlib.suppress(FileNotFoundError):
        s.pid_path.unlink()
    if pid <= 1 or not ours(pid, s):
        return False
    log.warning("killing dnsmasq %d left behind by an earlier site daemon", pid)
    proc.kill_pid_group(pid, grace=2.5, gone=lambda: not ours(pid, s))
    return True


# What dnsmasq logs (--log-dhcp) for a proxy offer, "<xid> PXE(eth0) 52:54:00:12:34:56 proxy",
# and for a file sent by TFTP, "sent /srv/tftp/ipxe.efi to 10.0.0.50".
_PROXY_OFFER = re.compile(r"\bPXE\([^)]*\) (?:\S+ )?(?:[0-9a-fA-F]{2}[:-]){5}[0-9a-fA-F]{2} proxy$")
_TFTP_SENT = re.compile(r"\bsent \S+ to \S+$")


@dataclass
class DnsmasqCounters:
    """Counted from dnsmasq's log, plain attributes for a scrape (SiteServices.dnsmasq.counters)."""

    pxe_offers: int = 0          # proxy-DHCP offers to registered PXE and iPXE clients
    tftp_files: int = 0          # boot files sent in full by TFTP


class DnsmasqSupervisor:
    """Start, watch, reload and stop one dnsmasq."""

    def __init__(self, settings: DnsmasqSettings, *,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.on_line = on_line           # each log line, for the boot timelines (site/observe/)
        self.restarts = 0
        self.counters = DnsmasqCounters()
        self._child: proc.Child | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._first = threading.Event()      # the first start went (or failed: _first_error)
        self._first_error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def argv(self) -> list[str]:
        s = self.settings
        argv = [*s.argv_prefix, s.binary, "--keep-in-foreground", f"--conf-file={s.conf_path}",
                "--log-facility=-", "--pid-file="]
        if os.geteuid() == 0:
            # Its files live in the daemon's private state folder: it keeps the daemon's user.
            argv.append("--user=root")
        return argv

    @property
    def pid(self) -> int | None:
        with self._lock:
            child = self._child
            return child.pid if child is not None and child.poll() is None else None

    def start(self) -> None:
        """Start dnsmasq under the watcher; raises what its first start raised."""
        kill_stray(self.settings)
        prepare(self.settings)
        self._thread = threading.Thread(target=self._watch, name="dnsmasq", daemon=True)
        self._thread.start()
        self._first.wait()
        if self._first_error is not None:
            self._thread.join(5)
            raise self._first_error

    def _watch(self) -> None:
        """Run dnsmasq, and again when it dies (with a backoff, started over after a run that
        lasted STABLE_SECONDS), until ``stop``."""
        waits = Backoff(first=0.5, cap=RESTART_BACKOFF_MAX).start(cancel=self._stopping)
        restart = False
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._run_once(restart)
            except Exception as exc:
                if not restart:
                    self._first_error = exc
                    self._first.set()
                    return
                log.exception("dnsmasq: restart failed")
            if self._stopping.is_set():
                return
            if time.monotonic() - started > STABLE_SECONDS:
                waits.reset()
            delay = waits.next() or 0.0      # never None: no bound on tries nor a deadline
            with self._lock:
                child = self._child
            if child is not None:
                log.error("dnsmasq %d exited (%s); restarting in %.1fs", child.pid,
                          proc.describe_exit(child.returncode or 0), delay)
            if not waits.sleep(delay):
                return
            restart = True

    def _log_line(self, line: str) -> None:
        """One line of dnsmasq's log: logged, and counted where it is a PXE offer or a file sent."""
        log.debug("dnsmasq: %s", line)
        if _PROXY_OFFER.search(line):
            self.counters.pxe_offers += 1
        elif _TFTP_SENT.search(line):
            self.counters.tftp_files += 1
        if self.on_line is not None:
            try:
                self.on_line(line)
            except Exception:  # the timelines are worth less than reading dnsmasq's log on
                log.exception("dnsmasq: a log line's observer failed")

    def _run_once(self, restart: bool) -> None:
        """One dnsmasq, from its start to its exit (``stop`` ends it)."""
        with proc.running(self.argv(), stdout=subprocess.DEVNULL, check=False,
                          on_stderr_line=self._log_line) as child:
            with self._lock:
                self._child = child
                self.restarts += restart
                if self._stopping.is_set():  # ``stop`` came while it started: it missed this one
                    child.stop()
            write_atomic(self.settings.pid_path, f"{child.pid}\n".encode(), 0o600)
            log.info("dnsmasq %d started: proxy DHCP on %s, TFTP from %s", child.pid,
                     self.settings.interface, self.settings.tftp_dir)
            self._first.set()
            while child.poll() is None and not self._stopping.wait(0.2):
                pass
            # Leaving waits for its exit: when stopping, ``stop`` ends it.

    def reload(self) -> None:
        """SIGHUP: dnsmasq rereads the host files (added, changed and removed ones)."""
        with self._lock:
            child = self._child
        if child is not None:
            child.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.stop()
            log.info("dnsmasq %d stopped", child.pid)
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(FileNotFoundError):
            self.settings.pid_path.unlink()
