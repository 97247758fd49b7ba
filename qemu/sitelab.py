"""A lab for the site-driven lifecycle: a provisioning network in network namespaces made
here, the reference gateway and the site daemon on it, and a QEMU node on a tap device that is
powered and booted from outside (qemu/powered.py).

    lan namespace (bcl-PID)                                  dhcp namespace (bcd-PID)
      br0  10.0.2.100  the reference gateway (:443, TLS)     eth0 10.0.2.1  plain dnsmasq:
           10.0.2.2    the site daemon: its HTTP service          addresses 10.0.2.150-199,
                       (:8088) and dnsmasq (proxy DHCP, TFTP)     nothing else
      tap-node         the QEMU node's NIC  ────────────── br0 ── p-dhcp
      lo   127.0.0.1   the images' upstream (an HTTP server): the site daemon reaches it,
                       the node cannot (no route to another namespace's loopback)
                       ipmi_sim (the node's BMC, tests/site/conftest.py) where a test starts one;
                       each node's serial line (qemu/serialrelay.py), which its BMC serves as SOL

    with SiteLab(workdir) as lab:
        lab.start_site()                      # `agent run --role site` inside the namespace
        node = lab.powered_node("site-n1", kernel=..., initrd=..., append=..., disks=[...])
        lab.in_lan(start_ipmi_sim, workdir, node, user, password, sol=lab.sol(node))
        # anything that must live in the namespace; sol: the BMC serves the node's serial line

A node whose BMC serves SOL (``lab.sol(node)``) has its first serial port on a line QEMU dials
at start (qemu/serialrelay.py), held until the BMC's SOL connects, so the site daemon keeps the
node's console from power-on (its firmware's first lines included) as it would a server's; the
console log in the node's directory is written as before.

The gateway is the test's (the same in-process reference gateway as qemu/lab.py), bound on
the bridge from a thread that entered the namespace (``NetnsThread``): a socket stays in the
namespace it was made in, so the test drives it as usual. The node dials it at GUEST_HOST:443,
the address the user-network labs use, so the development certificate and qemu/nodeimage.py
serve unchanged. Processes started through ``in_lan`` (the site daemon, dnsmasq, ipmi_sim and
the QEMU it powers on) inherit the namespace. Nothing is routed out of the namespaces; they
are deleted on close, with every process started here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agent import proc
from agent.site.boot.pxe import BootFile
from qemu.harness import AAVMF_CODE, AAVMF_VARS, PLATFORMS, BootFileServer, kvm_wanted
from qemu.lab import GATEWAY_PORT, Lab, Ramdisk
from qemu.powered import NodeSpec, PoweredNode
from qemu.serialrelay import SerialRelay

if TYPE_CHECKING:
    from initramfs.signing import DbKey

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
GATEWAY_ADDRESS = "10.0.2.100"        # = qemu.harness.GUEST_HOST, on br0
SITE_ADDRESS = "10.0.2.2"             # the site daemon's address on br0
DHCP_ADDRESS = "10.0.2.1"             # the plain DHCP server (its own namespace)
DHCP_RANGE = ("10.0.2.150", "10.0.2.199")
SITE_HTTP_PORT = 8088
SITE_NODE_ID = "site-1"
BRIDGE = "br0"
CLONE_NEWNET = 0x40000000
OVMF = PLATFORMS["amd64"].uefi_firmware   # Debian's ovmf: a UEFI node's firmware
IPXE_DIR = Path("/usr/lib/ipxe")          # Debian's ipxe: what the site's TFTP serves x86 nodes


def missing_network_prerequisites() -> str | None:
    """Why the site lab cannot run here, or None."""
    import shutil

    if os.geteuid() != 0:
        return "needs root (network namespaces, a bridge, a tap device)"
    for tool in ("ip", "dnsmasq"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 dnsmasq-base)"
    if not (IPXE_DIR / BootFile.BIOS).is_file():
        return "Debian's ipxe package is not installed (the site's TFTP serves its binaries)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (tap devices)"
    return None


def _setns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsThread:
    """One thread that lives in network namespace ``name`` and runs what it is given there.
    Sockets it makes stay in the namespace; processes it starts are born in it. It lives as
    long as the lab, so a child tied to its starting thread's death is not killed early."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"netns-{name}", initializer=_setns, initargs=(name,))

    def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class ProvisioningNet:
    """The namespaces, the bridge, the plain DHCP server and the node's tap device."""

    def __init__(self, workdir: Path, *, dhcp: bool = True) -> None:
        tag = f"{os.getpid() % 100000}"
        self.dhcp_server = dhcp       # False: no DHCP server on the network at all (virtual media)
        self.lan, self.dhcp = f"bcl-{tag}", f"bcd-{tag}"
        self.workdir = workdir
        self.made: list[str] = []
        self.plain_dhcp: subprocess.Popen[bytes] | None = None

    @staticmethod
    def ip(*args: str) -> None:
        proc.run(["ip", *args], timeout=10)

    def exec_prefix(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def up(self) -> ProvisioningNet:
        for ns in (self.lan, self.dhcp):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
            self.ip("netns", "add", ns)
            self.made.append(ns)
        lan = ("-n", self.lan)
        self.ip(*lan, "link", "set", "lo", "up")
        self.ip(*lan, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        for addr in (GATEWAY_ADDRESS, SITE_ADDRESS):
            self.ip(*lan, "addr", "add", f"{addr}/24", "dev", BRIDGE)
        self.ip(*lan, "link", "set", BRIDGE, "up")
        self.ip(*lan, "link", "add", "p-dhcp", "type", "veth", "peer", "name", "eth0", "netns", self.dhcp)
        self.ip(*lan, "link", "set", "p-dhcp", "master", BRIDGE, "up")
        self.ip("-n", self.dhcp, "link", "set", "lo", "up")
        self.ip("-n", self.dhcp, "addr", "add", f"{DHCP_ADDRESS}/24", "dev", "eth0")
        self.ip("-n", self.dhcp, "link", "set", "eth0", "up")
        if not self.dhcp_server:
            return self
        # The plain DHCP server: addresses only (--no-ping: no 3 s probe before an offer).
        log = (self.workdir / "dhcp.log").open("wb")
        self.plain_dhcp = proc.spawn(
            [*self.exec_prefix(self.dhcp), "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
             "--port=0", "--interface=eth0", "--bind-interfaces", "--pid-file=", "--no-ping",
             "--user=root", "--log-dhcp", "--log-facility=-",
             f"--dhcp-range={DHCP_RANGE[0]},{DHCP_RANGE[1]},1h",
             f"--dhcp-leasefile={self.workdir / 'dhcp.leases'}"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def add_tap(self, name: str) -> str:
        self.ip("-n", self.lan, "tuntap", "add", "dev", name, "mode", "tap")
        self.ip("-n", self.lan, "link", "set", name, "master", BRIDGE, "up")
        return name

    def down(self) -> None:
        if self.plain_dhcp is not None:
            proc.kill_group(self.plain_dhcp)
            self.plain_dhcp = None
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        self.made.clear()


class SiteLab(Lab):
    """qemu/lab.py's Lab (gateway, PKI, ramdisk overlays, tokens) on a provisioning network."""

    def __init__(self, workdir: Path, ramdisk_parts: Ramdisk | None = None, *,
                 dhcp: bool = True) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.net = ProvisioningNet(workdir, dhcp=dhcp).up()
        self.lan = NetnsThread(self.net.lan)
        self.site: subprocess.Popen[bytes] | None = None
        self.nodes: list[PoweredNode] = []
        self.relays: dict[str, SerialRelay] = {}   # node name -> its serial line
        self.closers: list[Callable[[], object]] = []
        try:
            # The gateway listens on the bridge; the file server (the images' upstream) on
            # the namespace's loopback, where only the site daemon reaches it.
            self.lan.call(Lab.__init__, self, workdir, ramdisk_parts,
                          gateway_host=GATEWAY_ADDRESS, gateway_port=GATEWAY_PORT)
        except BaseException:
            self.lan.close()
            self.net.down()
            raise

    def __enter__(self) -> SiteLab:
        return self

    # -- the images' upstream -----------------------------------------------------------

    @property
    def upstream(self) -> BootFileServer:
        return self.files

    def upstream_url(self, name: str) -> str:
        """``self.www / name`` as the site daemon reaches it (never the node)."""
        return f"http://127.0.0.1:{self.files.port}/{name}"

    def start_upload_target(self) -> UploadTarget:
        target = self.lan.call(UploadTarget)
        self.closers.append(target.stop)
        return target

    # -- the site daemon ----------------------------------------------------------------

    @property
    def site_log(self) -> Path:
        return self.workdir / "site-daemon.log"

    @property
    def site_state(self) -> Path:
        return self.workdir / "site-state"

    @property
    def secrets_dir(self) -> Path:
        return self.workdir / "site-secrets"

    def start_site(self, timeout: float = 60.0, *, proxy_dhcp: bool = True,
                   boot_files: Path | None = None, path_first: Path | None = None) -> None:
        """`agent run --role site` in the namespace, joined to the gateway as SITE_NODE_ID,
        its boot service on br0 (proxy DHCP, TFTP, HTTP at SITE_ADDRESS:SITE_HTTP_PORT);
        without ``proxy_dhcp`` its HTTP service alone (no dnsmasq: virtual media).
        ``boot_files``: its ``site_ipxe_dir`` (default Debian's iPXE folder), e.g.
        ``site_boot_files()``'s, where the site's GRUB makes it serve arm64 UEFI too.
        ``path_first``: a folder put first on the daemon's PATH (tools standing in for others:
        tests/e2e/test_site_ipmi_off.py's ipmitool that only says it ran)."""
        self.site_state.mkdir(parents=True, exist_ok=True)
        self.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        empty = self.workdir / "site-cmdline"
        empty.write_text("")
        argv = [sys.executable, "-m", "agent", "run", "--role", "site", "--cmdline-file", str(empty),
                "--gateway", f"{GATEWAY_ADDRESS}:{GATEWAY_PORT}", "--node", SITE_NODE_ID,
                f"--token={self.token_for(SITE_NODE_ID)}", "--ca", str(self.pki.ca),
                "--trusted-key", str(self.pki.signing_pub), "--state-dir", str(self.site_state),
                "--secrets-dir", str(self.secrets_dir), "--site-address", SITE_ADDRESS,
                *(["--site-interface", BRIDGE] if proxy_dhcp else []),
                "--site-http-port", str(SITE_HTTP_PORT),
                "--site-upstream", "127.0.0.1",  # upstream_url(): the namespace's loopback
                *(["--site-ipxe-dir", str(boot_files)] if boot_files is not None else []),
                "--reconnect-min", "0.5", "--reconnect-max", "3"]
        log = self.site_log.open("ab")
        env = proc.clean_env({"PYTHONPATH": str(REPO)})
        if path_first is not None:
            env["PATH"] = os.pathsep.join((str(path_first), env.get("PATH", os.defpath)))
        self.site = self.lan.call(proc.spawn, argv, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=str(REPO), env=env)
        log.close()
        try:
            self.gateway.wait_node(SITE_NODE_ID, timeout)
        except TimeoutError:
            raise RuntimeError(f"the site daemon did not join within {timeout:g}s; "
                               f"{self.site_log}:\n{self.site_log_text()[-3000:]}") from None

    def site_boot_files(self, db_key: DbKey | None = None, *, grub: bool = True,
                        uki: Path | None = None) -> Path:
        """A folder of boot files for ``start_site(boot_files=...)``: Debian's undionly.kpxe and
        ipxe.efi, and the site's GRUB for arm64 UEFI (initramfs/netgrub.py, built for this
        site's HTTP service, its Authenticode digest in grubaa64.efi.json beside it; not
        with ``grub`` False). ``uki``: the site's arm64 UKI served as bootaa64.efi instead of
        the GRUB (Secure Boot). ``db_key``: the EFI ones signed with it, their digests pinned in
        boot-files.json, as the build makes them (initramfs/signing.py)."""
        from initramfs import build as ramdisk
        from initramfs import netgrub

        folder = self.workdir / "site-boot-files"
        folder.mkdir(parents=True, exist_ok=True)
        for name in (BootFile.BIOS, BootFile.UEFI):
            shutil.copyfile(IPXE_DIR / name, folder / name)
        loader = None
        if grub and uki is None:
            loader = folder / netgrub.NAME
            netgrub.build(f"http://{SITE_ADDRESS}:{SITE_HTTP_PORT}", loader,
                          ramdisk.out_dir(ramdisk.ARCHES["arm64"]))
        if db_key is not None:
            from initramfs import signing

            signing.site_boot_files(folder, db_key, ipxe_dir=folder, grub=loader, uki=uki)
        elif uki is not None:
            shutil.copyfile(uki, folder / BootFile.UEFI_ARM64_UKI)
        return folder

    def site_log_text(self) -> str:
        try:
            return self.site_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop_site(self) -> None:
        if self.site is not None:
            proc.kill_group(self.site, grace=10.0)
            self.site = None

    # -- the node -----------------------------------------------------------------------

    def powered_node(self, name: str, *, kernel: Path, initrd: Path, append: str,
                     disks: Sequence[Path] = (), mac: str = "52:54:00:12:34:56",
                     memory_mb: int = 1024, uefi: bool = False, tpm_state: Path | None = None,
                     firmware_pxe: bool = False, secure_boot_vars: Path | None = None,
                     disk_firmware: bool = False) -> PoweredNode:
        """A node on a new tap device on br0, off, its next boot from disk: ``kernel``,
        ``initrd``, ``append`` are what a "disk" boot runs (the installed OS); a "pxe" boot
        runs what the site's boot service offers. ``tpm_state``: the node's TPM 2.0 (a state
        folder qemu/tpm.py manufactured); ``firmware_pxe``: UEFI's own PXE, no NIC ROM, so
        the site's TFTP serves it ipxe.efi (qemu/powered.py's NodeSpec). An arm64 node with a
        TPM runs AAVMF on pflash, with its own copy of the variables (AAVMF's PXE then gets the
        site's GRUB from the site's TFTP: every arm64 PXE boot is the firmware's own).
        ``secure_boot_vars``: a UEFI node under Secure Boot with its own copy of these variables
        (a fleet's keys enrolled: qemu/secureboot.py): on amd64 OVMF's Secure Boot build on
        pflash (SMM), on arm64 AAVMF (with a TPM: its variables are these instead of AAVMF's).
        ``disk_firmware``: a "disk" boot is the firmware's boot of the first disk (an empty disk
        fails as a server's does; a deployed one needs its own boot loader: an ESP image)."""
        tap = self.net.add_tap(f"tap{len(self.nodes)}")
        pflash = ("", "")
        if self.ramdisk.arch == "arm64" and tpm_state is not None:
            variables = self.workdir / name / "AAVMF_VARS.fd"
            variables.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(AAVMF_VARS, variables)
            pflash = (str(AAVMF_CODE), str(variables))
        if secure_boot_vars is not None:
            from qemu.secureboot import FIRMWARE

            if not uefi:
                raise ValueError("secure_boot_vars: a UEFI node (a Secure Boot firmware)")
            code = FIRMWARE[self.ramdisk.arch][0]
            variables = self.workdir / name / ("OVMF_VARS_4M.fd" if self.ramdisk.arch == "amd64"
                                               else AAVMF_VARS.name)
            variables.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(secure_boot_vars, variables)
            pflash = (str(code), str(variables))
        node = PoweredNode(self.workdir / name).configure(NodeSpec(
            kernel=str(kernel), initrd=str(initrd), append=append, memory_mb=memory_mb, cpus=1,
            kvm=kvm_wanted() and self.ramdisk.arch == "amd64", disks=[str(d) for d in disks],
            owner_pid=os.getpid(), name=name,
            tap=tap, mac=mac, uefi=uefi, arch=self.ramdisk.arch,
            tpm_state=str(tpm_state or ""), firmware_pxe=firmware_pxe,
            pflash_code=pflash[0], pflash_vars=pflash[1], secure_boot=secure_boot_vars is not None,
            disk_firmware=disk_firmware))
        self.nodes.append(node)
        return node

    def sol(self, node: PoweredNode) -> str:
        """ipmi_sim's ``sol`` for ``node`` (start_ipmi_sim(..., sol=...)): the node's serial
        line, made on first call (the node off) in the namespace, where QEMU and ipmi_sim run.
        Only the nodes whose BMC serves SOL get one: the others log their console as before."""
        spec = node.spec()
        relay = self.relays.get(spec.name)
        if relay is None:
            relay = self.relays[spec.name] = self.lan.call(lambda: SerialRelay().start())
            node.configure(dataclasses.replace(spec, serial_port=relay.node_port))
        return relay.sol

    def in_lan(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Run ``fn`` in the lan namespace (its sockets and children are made there)."""
        return self.lan.call(fn, *args, **kwargs)

    def console(self, node: PoweredNode) -> str:
        path = node.dir / f"{node.spec().name}-console.log"
        try:
            return path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def leases(self) -> dict[str, str]:
        """MAC -> address handed out by the plain DHCP server."""
        out: dict[str, str] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in (self.workdir / "dhcp.leases").read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3:
                    out[parts[1].lower()] = parts[2]
        return out

    # -- teardown -----------------------------------------------------------------------

    def close(self) -> None:
        for closer in reversed(self.closers):
            with contextlib.suppress(Exception):
                closer()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop(force=True)
        for relay in self.relays.values():
            relay.stop()
        self.stop_site()
        try:
            super().close()
        finally:
            self.lan.close()
            self.net.down()


class UploadTarget:
    """An HTTP PUT target beside the gateway (logs.collect, instance.snapshot upload there):
    on GATEWAY_ADDRESS, bound from inside the lab's namespace, so the node reaches it. Keeps
    each upload's bytes by path (small in the lab: logs, a snapshot of zeros)."""

    def __init__(self, host: str = GATEWAY_ADDRESS) -> None:
        import http.server
        import threading

        received: dict[str, bytes] = {}
        self.received = received

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    body = b"".join(chunks)
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received[self.path.split("?", 1)[0]] = body
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.host = host
        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="uploads")
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def uploads(self) -> dict[str, bytes]:
        return dict(self.received)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
