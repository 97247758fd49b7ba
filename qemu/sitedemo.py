"""The demo's main sequence: a node's life driven through the site daemon, as a timeline.

    python -m qemu.demo              # this (./dev demo)
    python -m qemu.demo --user-net   # the former demo: PXE from QEMU's user network, kexec
    python -m qemu.demo --virtual-media   # no PXE, no DHCP: Redfish virtual media (run_virtual_media)
    python -m qemu.demo --secure-boot     # Secure Boot on with the fleet's keys (run_secure_boot)

Nothing reaches the node but its BMC (OpenIPMI's ipmi_sim), the site daemon's boot service on
the provisioning network (network namespaces, a bridge, a plain DHCP server: qemu/sitelab.py)
and its gateway session. Each step is a command through the reference gateway
(qemu/sitelife.py runs and checks it) and is shown with its duration and its evidence:

    bmc.query -> boot.prepareRamdisk -> bmc.boot pxe -> bmc.power on -> PXE boot + join ->
    site.httpProxy -> deploy.image -> disk.wipe -> boot.cleanUp -> bmc.boot disk ->
    bmc.power cycle -> disk boot + join -> driver.invoke -> logs.collect -> instance.snapshot
    -> daemon.upgrade

``run_fleet`` (``./dev demo --nodes 3``) runs N nodes at once through the same site daemon
(qemu/sitefleet.py): each its own BMC and NIC, routes that serve the raw image from the
site's chunk store, the deploys started together; each node's timeline, then the bytes the
site fetched from the upstream and served from its store. ``--break WAY`` breaks the last node
(qemu/sitebreak.py) and shows the cause the site names for it beside the others' success.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

NODE = "demo-node"
REF = "demo-bmc"
BMC_USER = "bcadmin"
NEW_VERSION = "0.2.0"
# Debian packages the site demo needs beyond the user-network demo's, by the tool they give.
TOOLS = {"dnsmasq": "dnsmasq-base", "ipmi_sim": "openipmi", "ipmitool": "ipmitool", "ip": "iproute2"}


def missing_packages() -> list[str]:
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if not Path("/usr/lib/ipxe/undionly.kpxe").is_file():
        missing.append("ipxe")
    return missing


def run(workdir: Path, say: Callable[[str], None]) -> None:
    import secrets

    from agent.site.bmc.client import Credentials
    from agent.site.bmc.secrets import SecretStore
    from initramfs import build as ramdisk
    from qemu.ipmisim import start_ipmi_sim
    from qemu.lab import ensure_ramdisk
    from qemu.sitelab import BRIDGE, DHCP_RANGE, SITE_ADDRESS, SITE_HTTP_PORT, SiteLab
    from qemu.sitelife import Bmc, Lifecycle, NodeRoleSteps, Step, make_node, say_timelines

    say("building the agent zipapp and the ramdisk (cached under initramfs/out/)")
    parts = ensure_ramdisk()
    size = parts.kernel.stat().st_size + parts.base.stat().st_size
    say(f"ramdisk ready: kernel + userland {size / 1e6:.1f} MB compressed")
    with SiteLab(workdir, parts) as lab:
        say(f"provisioning network: namespace {lab.net.lan}, bridge {BRIDGE}; plain DHCP "
            f"{DHCP_RANGE[0]}-{DHCP_RANGE[1]} in {lab.net.dhcp}; gateway on "
            f"{lab.gateway.address}; images' upstream on the namespace's loopback only")
        lab.start_site()
        site = lab.gateway.nodes["site-1"].hello
        say(f"SITE DAEMON joined: site-1 in role {site.role}, agent {site.agent_version}; boot "
            f"service on {BRIDGE} {SITE_ADDRESS} (dnsmasq proxy DHCP + TFTP, HTTP "
            f":{SITE_HTTP_PORT})")
        node = make_node(lab, NODE)
        say(f"node image built: {node.image.raw.stat().st_size // 2**20} MiB GPT disk with the "
            f"node agent; {NODE} is off, NIC {node.mac} on a tap device of {BRIDGE}")
        password = secrets.token_urlsafe(12)
        SecretStore(lab.secrets_dir).put(REF, Credentials(BMC_USER, password))
        sim = lab.in_lan(start_ipmi_sim, workdir / "ipmi", node.power, BMC_USER, password,
                         sol=lab.sol(node.power))
        lab.closers.append(sim.stop)
        say(f"BMC: ipmi_sim at {sim.address}, credentials in the site's secret store as {REF!r}")
        upload = lab.start_upload_target()
        new_build = ramdisk.build_agent(workdir / "agent-new.pyz", version=NEW_VERSION)

        def shown(step: Step) -> None:
            say(f"{step.name.upper()} ({step.seconds:.1f}s): {step.evidence}")

        life = Lifecycle(lab, node, Bmc("ipmi", sim.address, REF), on_step=shown)
        life.run_all()
        NodeRoleSteps(life, upload).run_all(new_build, NEW_VERSION)
        say_timelines(lab, say)
        total = sum(s.seconds for s in node.steps)
        say(f"done: {len(node.steps)} steps in {total:.0f}s; console log "
            f"{node.power.dir / (NODE + '-console.log')}, site daemon log {lab.site_log}")
        node.power.stop(force=True)


def run_fleet(workdir: Path, count: int, say: Callable[[str], None], broken: str = "") -> None:
    """``broken``: a way of qemu/sitebreak.py's BREAKS: the last node is broken so, and its
    cause is shown beside the others' success (the demo does not fail for it)."""
    import secrets

    from qemu.lab import ensure_ramdisk
    from qemu.sitebreak import BREAKS, breaker
    from qemu.sitefleet import fleet_lives
    from qemu.sitefleet import run_fleet as run_all
    from qemu.sitelab import SiteLab
    from qemu.sitelife import say_timelines

    say("building the agent zipapp and the ramdisk (cached under initramfs/out/)")
    parts = ensure_ramdisk()
    with SiteLab(workdir, parts) as lab:
        lab.start_site()
        say(f"SITE DAEMON joined; {count} nodes, each its own ipmi_sim and tap device")
        names = [f"{NODE}-{i + 1}" for i in range(count)]
        macs = [f"52:54:00:5e:01:{i + 1:02x}" for i in range(count)]
        lives = fleet_lives(lab, names, macs, BMC_USER, secrets.token_urlsafe(12), REF)
        try:
            report = run_all(lab, lives, say, breaker(BREAKS[broken], say) if broken else None)
        finally:
            for life in lives:
                life.node.power.stop(force=True)
        say_timelines(lab, say)
        if report.errors:
            raise RuntimeError("\n\n".join(report.errors))
        deployed = count - (1 if broken else 0)
        odd = f"; {report.broken} broken on purpose ({broken}): the site named " \
              f"{report.broken_cause or 'no cause'}" if broken else ""
        say(f"done: {deployed} nodes deployed; from the upstream {report.upstream_bytes} bytes (each of "
            f"the {report.distinct_data_chunks} distinct data chunks once), from the site's store "
            f"{report.store_bytes_served} bytes{odd}; site daemon log {lab.site_log}")


def run_virtual_media(workdir: Path, say: Callable[[str], None], *, uefi: bool = False) -> None:
    """The node's life over Redfish virtual media (qemu/sitemedia.py): sushy-tools' emulator
    as the BMC, the ramdisk ISO and the node's config medium in its virtual drives, no DHCP
    server on the network and no dnsmasq at the site."""
    import secrets
    import tempfile

    from agent.site.bmc.client import Credentials
    from agent.site.bmc.secrets import SecretStore
    from qemu.lab import ensure_ramdisk
    from qemu.sitelab import BRIDGE, SITE_ADDRESS, SITE_HTTP_PORT, SiteLab
    from qemu.sitelife import Bmc, Step
    from qemu.sitemedia import NODE_ADDRESS, PREFIX, MediaLifecycle, build_lab_iso, make_media_node
    from tests.loopback_http import self_signed_cert
    from tests.site.bmc.sushy import USER, NodeHook, SushyEmulator

    say("building the agent zipapp and the ramdisk (cached under initramfs/out/)")
    parts = ensure_ramdisk()
    mac = "52:54:00:5e:00:21"
    with SiteLab(workdir, parts, dhcp=False) as lab:
        say(f"provisioning network: namespace {lab.net.lan}, bridge {BRIDGE}; NO DHCP server on it")
        lab.start_site(proxy_dhcp=False)
        say(f"SITE DAEMON joined: HTTP service on {SITE_ADDRESS}:{SITE_HTTP_PORT}, no dnsmasq "
            "(no proxy DHCP, no TFTP)")
        iso = build_lab_iso(lab)
        say(f"ramdisk ISO built: {iso.stat().st_size / 1e6:.1f} MB (BIOS and UEFI, GRUB), in the "
            "images' upstream")
        node = make_media_node(lab, NODE, mac=mac, uefi=uefi)
        say(f"node image built, with its own static network {NODE_ADDRESS}/{PREFIX}; {NODE} is off, "
            f"NIC {mac}")
        password = secrets.token_urlsafe(12)
        SecretStore(lab.secrets_dir).put(REF, Credentials(USER, password))
        cert, key = self_signed_cert(tempfile.mkdtemp(prefix="demo-tls-", dir=workdir))
        hook = lab.in_lan(lambda: NodeHook(node.power).__enter__())
        lab.closers.append(hook.__exit__)
        emu = lab.in_lan(lambda: SushyEmulator(workdir / "emu", password=password, tls=(cert, key),
                                               notify_url=hook.url, mac=mac).__enter__())
        lab.closers.append(emu.__exit__)
        say(f"BMC: sushy-tools' Redfish emulator at 127.0.0.1:{emu.port} (VirtualMedia: Cd, "
            f"Floppy/USBStick), credentials in the site's secret store as {REF!r}")

        def shown(step: Step) -> None:
            say(f"{step.name.upper()} ({step.seconds:.1f}s): {step.evidence}")

        life = MediaLifecycle(lab, node, Bmc("redfish", f"127.0.0.1:{emu.port}", REF, verify_tls=False))
        life.on_step = shown
        life.run_all()
        total = sum(s.seconds for s in node.steps)
        say(f"done: {len(node.steps)} steps in {total:.0f}s (power on to joined over virtual media: "
            f"{life.join_seconds:.1f}s); console log {node.power.dir / (NODE + '-console.log')}")
        node.power.stop(force=True)


def run_secure_boot(workdir: Path, say: Callable[[str], None], broken: str = "") -> None:
    """``./dev demo --secure-boot``: the node under OVMF's Secure Boot build with the fleet's own
    keys enrolled (qemu/sitesecure.py) PXE-boots the site's signed iPXE, which chains the site's
    signed UKI; the gateway attests the join and names the authority that verified each image
    (PCR 7). ``broken``: one of qemu/sitesecure.py's BREAKS, booted after it: the firmware
    refuses that UKI and the site names the cause (the demo does not fail for it)."""
    import secrets

    from agent.site.bmc.client import Credentials
    from agent.site.bmc.secrets import SecretStore
    from agent.site.boot.pxe import BootFile
    from initramfs import signing
    from qemu import secureboot, sitesecure
    from qemu.lab import ensure_ramdisk
    from qemu.sitelab import IPXE_DIR, SiteLab
    from qemu.sitelife import Step, guest_shell

    reason = sitesecure.missing()
    if reason:
        raise RuntimeError(f"demo --secure-boot: {reason}")
    say("building the agent zipapp and the ramdisk (cached under initramfs/out/)")
    parts = ensure_ramdisk()

    def shown(step: Step) -> None:
        say(f"{step.name.upper()} ({step.seconds:.1f}s): {step.evidence}")

    with SiteLab(workdir, parts) as lab:
        password = secrets.token_urlsafe(12)
        SecretStore(lab.secrets_dir).put(REF, Credentials(BMC_USER, password))
        with sitesecure.secure_rig(lab, NODE, BMC_USER, password, REF, on_step=shown) as rig:
            keys, life = rig.keys, rig.life
            say(f"fleet keys made (PK, KEK, db; openssl): enrolled into {NODE}'s OVMF variable store "
                f"by virt-fw-vars, Secure Boot on, dbx holding one revoked build's digest; firmware "
                f"{secureboot.OVMF_SECBOOT_CODE.name} with SMM")
            served = lab.site_state / "site" / "boot" / "tftp" / BootFile.UEFI.value
            fleet_db = keys.cert("fleet-db")
            ours, debians = (signing.verify(f, fleet_db) for f in (served, IPXE_DIR / BootFile.UEFI))
            say(f"SITE DAEMON serves ipxe.efi signed by the fleet's db key (sbverify: "
                f"{'verified' if ours else 'NOT verified'}; Debian's own: "
                f"{'verified' if debians else 'not signed by it'}), pinned in boot-files.json; the "
                f"site's UKI signed by the same key")
            life.query()
            life.prepare_ramdisk()
            life.boot_device("pxe")
            life.power_on()
            try:
                life.pxe_join()
                _, out = guest_shell(rig.node, "dmesg | grep -i -m1 'secure boot enabled'")
                said = next((line.split("] ", 1)[-1] for line in out.splitlines()
                             if "Secure boot enabled" in line and "grep" not in line), "nothing about it")
            finally:
                sitesecure.power_off(rig)
            matched = life.joins["ramdisk"].verdict.matched
            say(f"SECURE BOOT: the ramdisk's kernel says {said!r}; the gateway's verdict from PCR "
                f"7: secure_boot {matched.get('secure_boot')}, each image verified by authority "
                f"{matched.get('authorities', '?')[:16]}... (the fleet's db certificate: "
                f"{keys.cert_sha256('fleet-db')[:16]}...)")
            if broken:
                say(f"BROKEN on purpose ({broken}): {NODE} is served a UKI "
                    + {"unsigned": "that nobody signed",
                       "other-key": "signed by a key the fleet never enrolled",
                       "revoked": "the fleet signed, whose digest is in dbx"}[broken])
                t0 = time.monotonic()
                cause, detail, _ = sitesecure.boot_refused(rig, sitesecure.broken_entry(rig, broken))
                say(f"CAUSE named by the site {time.monotonic() - t0:.0f}s after power on: {cause}: "
                    f"{detail}; powered off")
        total = sum(s.seconds for s in rig.node.steps)
        say(f"done: {len(rig.node.steps)} steps in {total:.0f}s; console log "
            f"{rig.node.power.dir / (NODE + '-console.log')}, site daemon log {lab.site_log}")
