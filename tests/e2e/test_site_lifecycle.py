"""The site-driven lifecycle in QEMU, over IPMI: nothing reaches the node but its BMC
(OpenIPMI's ipmi_sim driving a qemu/powered.py node), the site daemon's boot service on the
provisioning network, and its gateway session. qemu/sitelab.py builds the network (namespaces,
a bridge, a plain DHCP server, the site daemon, the node on a tap device); qemu/sitelife.py
runs and checks each step:

    bmc.query -> boot.prepareRamdisk -> bmc.boot pxe -> bmc.power on -> PXE boot through the
    proxy DHCP (iPXE) into the ramdisk, which joins -> site.httpProxy -> deploy.image through
    the route -> disk.wipe of the second disk -> boot.cleanUp -> boot.kexec -> the ramdisk
    kexecs into the deployed kernel, which joins in role node -> bmc.boot disk -> bmc.power
    cycle -> the node boots its deployed disk and joins in role node

Every step is a command through the reference gateway, to the site daemon or to the node;
bmc.boot, deploy.image and disk.wipe are destructive and go signed. The site keeps the node's
console throughout (SOL): across the boot.cleanUp, the kexec and the power cycle, checked line
for line against QEMU's own log of the serial line, and its timeline has an attempt for each
boot: pxe, kexec (begun from the console: the site never sees boot.kexec), disk.

The same sequence, without the kexec, runs once more over Redfish: sushy-tools' emulator (fake
driver, HTTPS with a self-signed certificate, so ``verify_tls: false``) whose notification hook
powers a second QEMU node (tests/site/bmc/sushy.py). Its System lists the node's NIC, so there
bmc.query finds the MAC the boot entry is made for. That run is in UEFI mode where Debian's
ovmf is installed (OVMF firmware, an ipxe.efi entry, boot mode uefi; the ramdisk checks
/sys/firmware/efi), keeps its power cycle to the deployed disk, and is attested
(qemu/siteattest.py, docs/attestation.md): the node has a TPM 2.0 (swtpm) and no NIC ROM, so
OVMF's own PXE gets ipxe.efi from the site's TFTP and starts it (PCR 4); iPXE chains the site's
UKI (the entry is a UKI entry, the node's settings at /pxe/<mac>.cmdline). The gateway's policy
lists the UKI build and, as its one loader, the Authenticode digest of the ipxe.efi the site's
TFTP serves: the ramdisk's join attests with PCR 4 matched, ipxe.efi before the UKI in the
event log; its disk.wipe certificate counts as verified; the same evidence judged without that
loader is refused (policy_pcr4); the installed system's join after the disk boot (no UKI: its
kernel from the disk) is unattested, a node boot that is no ramdisk build.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.gateway.verifier.attest import Status
from agent.gateway.verifier.refused import PolicyFailed
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from agent.site.observe.console import clean
from initramfs import build as ramdisk
from qemu import tpm as qemu_tpm
from qemu.ipmisim import IpmiSim, start_ipmi_sim
from qemu.siteattest import SiteAttestation, pcr4_applications
from qemu.sitelab import OVMF, SiteLab
from qemu.sitelife import Bmc, Lifecycle, NodeRoleSteps, SiteNode, Step, make_node
from tests.loopback_http import self_signed_cert
from tests.site.bmc.sushy import NODE_MAC, USER, NodeHook, SushyEmulator
from tests.site.conftest import PASSWORD, REF, USERNAME

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "site-n1"
RF_NODE = "site-n2"
NEW_VERSION = "0.2.0"
RF_PASSWORD = "Redfish-Emu-Pass-7731"
RF_REF = "rack1-rf02"
STEPS = ["bmc.query", "boot.prepareRamdisk", "bmc.boot pxe", "bmc.power on", "PXE boot + join",
         "site.httpProxy", "deploy.image", "disk.wipe", "boot.cleanUp", "bmc.boot disk",
         "bmc.power cycle", "disk boot + join"]
KEXEC_STEPS = [*STEPS[:9], "boot.kexec", "kexec + join", *STEPS[9:]]   # the IPMI run's


@pytest.fixture(scope="module")
def node(site_lab: SiteLab) -> SiteNode:
    return make_node(site_lab, NODE)


@pytest.fixture(scope="module")
def ipmi(site_lab: SiteLab, node: SiteNode) -> Iterator[IpmiSim]:
    """The node's BMC: ipmi_sim in the lab's namespace (the site daemon reaches it on the
    namespace's loopback), its credentials in the site daemon's secret store."""
    SecretStore(site_lab.secrets_dir).put(REF, Credentials(USERNAME, PASSWORD))
    sim = site_lab.in_lan(start_ipmi_sim, site_lab.workdir / "ipmi", node.power, USERNAME, PASSWORD,
                          sol=site_lab.sol(node.power))
    yield sim
    sim.stop()


def run_and_show(life: Lifecycle, then: Callable[[], object] | None = None) -> list[Step]:
    shown: list[Step] = []
    life.on_step = shown.append
    try:
        life.run_all()
        if then is not None:
            then()
    finally:
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:22} {s.evidence}")
        life.node.power.stop(force=True)   # one QEMU at a time on a shared machine
    return shown


def check_common(lab: SiteLab, node: SiteNode, shown: list[Step], steps: list[str] = STEPS) -> None:
    assert [s.name for s in shown][:len(steps)] == steps
    # The destructive kinds went signed (the agent refuses them unsigned).
    for kind in ("bmc.boot", "deploy.image", "disk.wipe"):
        recs = [r for r in lab.gateway.commands.values() if r.kind == kind]
        assert recs and all(r.signed.signature for r in recs), kind
    # The site's dnsmasq ran through it all (entries added and removed by SIGHUP) without dying:
    # an earlier configuration of it segfaulted at boot.cleanUp and was restarted.
    assert " exited " not in "".join(line for line in lab.site_log_text().splitlines()
                                     if "agent.site.boot.dnsmasq" in line)
    # The image came from the upstream to the site daemon (the route relays it).
    assert [line for line in lab.upstream.served if line.startswith(f"GET /{node.name}.img.zst")]


def test_site_driven_lifecycle_over_ipmi(site_lab: SiteLab, node: SiteNode, ipmi: IpmiSim,
                                         tmp_path: Path) -> None:
    """The whole life over IPMI, a kexec into the deployed system and then a power cycle to its
    disk, then in role node on the deployed disk: driver.invoke, logs.collect and
    instance.snapshot uploaded, daemon.upgrade to a newer build."""
    life = Lifecycle(site_lab, node, Bmc("ipmi", ipmi.address, REF), kexec=True)
    new_build = ramdisk.build_agent(tmp_path / "agent-new.pyz", version=NEW_VERSION)
    target = site_lab.start_upload_target()
    shown = run_and_show(life, lambda: NodeRoleSteps(life, target).run_all(new_build, NEW_VERSION))
    check_common(site_lab, node, shown, KEXEC_STEPS)
    assert [s.name for s in shown][len(KEXEC_STEPS):] == ["driver.invoke", "logs.collect",
                                                         "instance.snapshot", "daemon.upgrade"]
    check_kept_console(site_lab, node, life.kexec_console)


def serial_lines(text: str) -> list[str]:
    """QEMU's log of a serial line as the site's ring keeps it: cleaned, no empty lines."""
    return [line for raw in re.split(r"\r\n|\n|\r", text) if (line := clean(raw).rstrip())]


def same_lines(kept: list[str], wrote: list[str]) -> str:
    """Where ``kept`` first differs from ``wrote`` ("" when it holds it whole, in order)."""
    for i, line in enumerate(wrote):
        if i >= len(kept) or kept[i] != line:
            got = kept[i] if i < len(kept) else "(nothing)"
            return f"line {i} of {len(wrote)}: the node wrote {line!r}, the site kept {got!r}"
    return ""


def written_timeline(path: Path, attempts: int, wait: float = 15.0) -> list[dict[str, Any]]:
    """The node's timeline as the site wrote it, once it has ``attempts`` attempts all ended: the
    file follows the site's memory at its flush timer (each second), so a read right after a
    join can see the attempt still booting."""
    deadline = time.monotonic() + wait
    while True:
        found: list[dict[str, Any]] = json.loads(path.read_text())["attempts"] if path.exists() else []
        if (len(found) >= attempts and all(a["outcome"] != "booting" for a in found)) \
                or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def check_kept_console(lab: SiteLab, node: SiteNode, kexec_console: str) -> None:
    """The site kept the node's console from power-on (qemu/sitelab.py wires the node's serial
    line to ipmi_sim's SOL) through three boots. Its timeline has an attempt for each: the PXE
    one (the console attached before the power on, the ramdisk's milestones and join, then
    boot.cleanUp, which let no console go: the ramdisk still ran), the kexec one, begun from the
    console (the site never sees boot.kexec: the agent's ``reboot(LINUX_REBOOT_CMD_KEXEC)``
    line, then the new kernel's init, agent and join, no power event, no firmware), and the
    disk one (bmc.power cycle). Its ring holds, line for line, what QEMU logged of the serial
    line: the first QEMU process's, from its first line through the ramdisk and the kexec to
    the kexec'd system's join (``kexec_console``: that log taken at the join), and the power
    cycle's process, from its firmware to the join: one console from the site's first command
    on the BMC (bmc.query) to the end, never let go (observer.py). A console kept across a
    reboot is test_faults_qemu.py's reset too."""
    ring = lab.site_state / "site" / "observe" / "console" / node.name
    kept = "".join(f.read_text(errors="replace") for f in (ring / "console.log.1", ring / "console.log")
                   if f.exists())
    for wanted in ("SeaBIOS", "bc-init", "starting agent: python3 /usr/lib/bettercompute/agent.pyz run",
                   "reboot(LINUX_REBOOT_CMD_KEXEC)", "node root LABEL=bcroot mounted on /sysroot",
                   "connected to gateway"):
        assert wanted in kept, f"{wanted!r} not in the site's kept console of {node.name}:\n{kept[-3000:]}"
    timeline = lab.site_state / "site" / "observe" / "timeline" / f"{node.name}.json"
    attempts = written_timeline(timeline, 3)
    seen = "\n".join(f"attempt {a['number']} {a['method']} ({a['trigger']}) {a['outcome']}: "
                     + " ".join(e["step"] for e in a["events"]) for a in attempts)
    assert [a["method"] for a in attempts] == ["pxe", "kexec", "disk"], seen
    assert all(a["outcome"] == "joined" and not a["cause"] for a in attempts), seen
    pxe, kexec, disk = ([e["step"] for e in a["events"]] for a in attempts)
    assert pxe.index("console") < pxe.index("power_on") < pxe.index("firmware"), seen
    assert {"boot_loader", "init", "agent_started"} <= set(pxe), seen
    assert pxe.index("joined") < pxe.index("cleaned"), seen
    said = [e["detail"] for a in attempts for e in a["events"] if e["step"] == "console"]
    assert not any(d.startswith("released") for d in said), seen     # kept from bmc.query on
    assert attempts[1]["trigger"] == "kexec seen on the console", seen
    assert next(step for step in kexec if step != "console") == "kexec", seen   # (a SOL reattach first)
    assert kexec.index("init") < kexec.index("agent_started") < kexec.index("joined"), seen
    assert not {"firmware", "boot_loader", "power_on"} & set(kexec), seen
    assert disk.index("firmware") < disk.index("joined"), seen
    lines = [line.partition(" ")[2] for line in kept.splitlines()]
    # the first boot and the kexec: QEMU's log of the serial line up to the kexec'd join
    ring_lines = [line for line in lines if line and not line.startswith("[site: ")]
    wrote = serial_lines(kexec_console)
    handover = next(i for i, line in enumerate(wrote) if "reboot(LINUX_REBOOT_CMD_KEXEC)" in line)
    joined = next(i for i, line in enumerate(wrote) if i > handover and "connected to gateway" in line)
    wrote = wrote[:joined + 1]
    start = ring_lines.index(wrote[0])
    assert not (lost := same_lines(ring_lines[start:], wrote)), f"across the kexec, {lost}"
    # the disk boot: QEMU's log of the serial line (this boot's process) against the ring, from
    # the last time the ring holds its first line (the boots before began with the same one)
    ring_lines = [line for line in lines if line and not line.startswith("[site: ")]
    wrote = serial_lines(lab.console(node.power))
    start = len(ring_lines) - 1 - ring_lines[::-1].index(wrote[0])
    ours = ring_lines[start:]
    assert ours == wrote[:len(ours)], f"the node wrote:\n{wrote}\nthe site kept:\n{ours}"
    assert any("connected to gateway" in line for line in ours), ours


def test_site_driven_lifecycle_over_redfish(site_lab: SiteLab, tmp_path: Path) -> None:
    if shutil.which("sushy-emulator", path=str(Path(sys.executable).parent)) is None \
            and shutil.which("sushy-emulator") is None:
        pytest.skip("sushy-emulator is not installed (pip install sushy-tools: the dev extra)")
    uefi = os.path.exists(OVMF)
    if uefi and qemu_tpm.missing():
        pytest.skip(f"the UEFI run is attested: {qemu_tpm.missing()}")
    # UEFI: the node's TPM and the site's UKI (qemu/siteattest.py); the firmware's own PXE.
    attest = SiteAttestation(site_lab, RF_NODE) if uefi else None
    node = make_node(site_lab, RF_NODE, mac=NODE_MAC, uefi=uefi,
                     tpm_state=attest.tpm_state if attest else None, firmware_pxe=uefi)
    SecretStore(site_lab.secrets_dir).put(RF_REF, Credentials(USER, RF_PASSWORD))
    cert, key = self_signed_cert(str(tmp_path))
    # The emulator and its hook in the lab's namespace: the hook's worker thread (born there)
    # powers the node on, so QEMU finds its tap device.
    hook = site_lab.in_lan(lambda: NodeHook(node.power).__enter__())
    try:
        emu = site_lab.in_lan(lambda: SushyEmulator(tmp_path / "emu", password=RF_PASSWORD,
                                                    tls=(cert, key), notify_url=hook.url).__enter__())
        try:
            life = Lifecycle(site_lab, node, Bmc("redfish", f"127.0.0.1:{emu.port}", RF_REF,
                                                 verify_tls=False), attest=attest)
            if attest is not None:
                attest.start()
            shown = run_and_show(life)
        finally:
            if attest is not None:
                attest.stop()
            emu.__exit__()
    finally:
        hook.__exit__()
    check_common(site_lab, node, shown)
    assert not hook.errors, hook.errors
    assert "MAC" in shown[0].evidence and "found" in shown[0].evidence
    if attest is not None:
        check_attested(attest, life)


def check_attested(attest: SiteAttestation, life: Lifecycle) -> None:
    """Beyond what the lifecycle checked at each step (the ramdisk's join attested with PCR 4
    matched, ipxe.efi before the UKI; disk.wipe verified by the gateway): the same evidence
    without ipxe.efi among the loaders is refused, and the installed system's join is
    unattested, said why."""
    ramdisk = life.joins["ramdisk"]
    assert ramdisk.verdict.status is Status.ATTESTED, ramdisk.verdict
    refused = attest.judge_without_loader(ramdisk)
    assert isinstance(refused, PolicyFailed) and refused.check == "policy_pcr4", refused
    assert attest.loader_digest.hex() in refused.reason and "no accepted loader" in refused.reason, refused
    # The site's TFTP served that ipxe.efi (its dnsmasq's log, in the node's boot timeline).
    timeline = life.lab.site_state / "site" / "observe" / "timeline" / f"{life.node.name}.json"
    pxe = [a for a in json.loads(timeline.read_text())["attempts"] if a["method"] == "pxe"]
    assert any(e["step"] == "tftp_sent" and e["detail"] == "ipxe.efi" for e in pxe[0]["events"]), pxe
    # The installed system, booted from the disk's kernel (QEMU hands it to OVMF; no UKI, no
    # iPXE): one application in PCR 4, no ramdisk build, so unattested, not refused.
    node = life.joins["node"]
    print(f"the installed system's join: {node.verdict}")
    assert node.role == "node" and node.verdict.status is Status.UNATTESTED, node.verdict
    assert "a node boot: its boot chain is no ramdisk build" in node.verdict.reason, node.verdict
    apps = pcr4_applications(node.evidence)
    assert len(apps) == 1 and apps[0] not in (attest.loader_digest, *attest.uki_pcr4), apps
