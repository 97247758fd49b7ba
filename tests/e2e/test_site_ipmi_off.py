"""A node's whole life through the site with its BMC's IPMI off (issue 53, item 5), in QEMU.

The BMC is the project's Redfish emulator serving HPE's recorded iLO 5 (../shared/vendor-trees
hpe_dl385: IPMI ProtocolEnabled false in Managers/1/NetworkProtocol, no SerialConsole.SSH), its
System driving a UEFI QEMU node (tests/site/bmc/redfish_emulator/machine.py: each Reset and
Boot override done to the node, the PowerState read from it); its SSH console is Debian's sshd
with the iLO personality (``vsp`` at its CLI) bridging to the node's serial line
(tests/site/observe/sshbmc.py, qemu/serialrelay.py), on the port the recorded NetworkProtocol
names for SSH (set to the lab sshd's). All of it in the site lab's namespace, where the site
daemon reaches it on loopback. The site daemon's PATH starts with an ``ipmitool`` that only
records that it ran and fails: nothing of IPMI may run.

One node, one life, every step a command through the reference gateway:

    bmc.query (the posture: IPMI off; the console kept over SSH from here on) -> bmc.boot disk
    -> bmc.power on: the factory-empty disk does not boot (OVMF: "failed to load ... Not Found"),
    named disk_not_bootable from the SSH console's line -> boot.prepareRamdisk -> bmc.boot pxe
    -> bmc.power cycle (iLO has no PowerCycle: ForceOff, On) -> the ramdisk by PXE, joined ->
    site.httpProxy -> deploy.image (an image with an EFI system partition) -> boot.cleanUp ->
    bmc.boot disk -> bmc.power cycle -> OVMF boots the deployed disk (systemd-boot), joined in
    role node

Then: no ipmitool ran; the node's timeline has the three attempts, each with its milestones
from the SSH console; logs.collect in role site returns the broken boot's console lines by
time. The wipe, the kexec and the node-role commands are the IPMI and sushy-tools lifecycles'
(test_site_lifecycle.py): this run does not repeat them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from qemu.lab import Ramdisk
from qemu.sitelab import OVMF, SiteLab, missing_network_prerequisites
from qemu.sitelife import Bmc, Lifecycle, SiteNode, Step, make_node
from tests.site.bmc.redfish_emulator import PASSWORD as EMU_PASSWORD
from tests.site.bmc.redfish_emulator import USER as EMU_USER
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.machine import PoweredMachine
from tests.site.observe.sshbmc import PERSONALITIES, SshBmc, need

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "site-ilo1"
TREE = "hpe_dl385"
REF = "rack1-ilo01"
# An ipmitool that runs nothing: it notes that it was run, and fails as a missing tool would.
IPMITOOL = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/ipmitool.ran"
echo "ipmitool: not on this site (every BMC here has IPMI off)" >&2
exit 127
"""


@pytest.fixture(scope="module")
def no_ipmi_lab(ramdisk_parts: Ramdisk, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteLab]:
    """A site lab of its own: its daemon's PATH holds the recording ipmitool first."""
    reason = missing_network_prerequisites()
    if reason:
        pytest.skip(reason)
    if not os.path.exists(OVMF):
        pytest.skip(f"no UEFI firmware {OVMF} (apt-get install ovmf)")
    need()
    work = tmp_path_factory.mktemp("ipmioff")
    shim = work / "no-ipmi-bin"
    shim.mkdir()
    (shim / "ipmitool").write_text(IPMITOOL)
    (shim / "ipmitool").chmod(0o755)
    with SiteLab(work / "lab", ramdisk_parts) as lab:
        lab.start_site(path_first=shim)
        yield lab


def test_a_nodes_whole_life_with_its_bmcs_ipmi_off(no_ipmi_lab: SiteLab) -> None:
    lab = no_ipmi_lab
    emu = lab.in_lan(lambda: RedfishEmulator.of(TREE, lab.workdir / "trees").__enter__())
    sshd: SshBmc | None = None
    shown: list[Step] = []
    try:
        # The node is the recorded server: its first NIC's MAC, as the BMC lists it.
        nics = emu.doc("/redfish/v1/Systems/1/EthernetInterfaces/1")
        node = make_node(lab, NODE, mac=str(nics["MACAddress"]).lower(), uefi=True, disk_firmware=True)
        machine = PoweredMachine(node.power)
        emu.attach(machine)
        # The BMC's SSH console: iLO's CLI (``vsp``), its login the BMC account's, on the
        # serial line QEMU dials at each start.
        personality = dataclasses.replace(PERSONALITIES["hpe"], user=EMU_USER)
        sshd = SshBmc(lab.workdir / "ilo-ssh", personality, lab.sol(node.power), EMU_PASSWORD)
        lab.in_lan(sshd.start)
        with emu.state.lock:
            protocol = emu.state.docs["/redfish/v1/Managers/1/NetworkProtocol"]
            assert protocol["IPMI"]["ProtocolEnabled"] is False       # as recorded
            protocol["SSH"]["Port"] = sshd.port                       # the lab's sshd, never 22
        SecretStore(lab.secrets_dir).put(REF, Credentials(EMU_USER, EMU_PASSWORD))
        life = Lifecycle(lab, node, Bmc("redfish", emu.address, REF, verify_tls=False),
                         on_step=shown.append)
        attempts = live(life, node)
    finally:
        for s in shown:
            print(f"{s.seconds:7.1f}s  {s.name:26} {s.evidence}")
        with_node = [n for n in lab.nodes if n.spec().name == NODE]
        for power in with_node:
            power.stop(force=True)
        if sshd is not None:
            sshd.stop()
        emu.__exit__()
    check_no_ipmi(lab, emu)
    print("the BMC did to the node:", ", ".join(machine.events))
    assert machine.events[:2] == ["start", "boot pxe"], machine.events   # the broken boot, then PXE
    check_timeline(lab, node, attempts)


def live(life: Lifecycle, node: SiteNode) -> list[dict[str, Any]]:
    """The node's life (the module's docstring); the site's timeline of it at the end."""
    query_posture(life)
    life.boot_device("disk")
    life.power_on()
    broken = broken_boot(life)
    life.prepare_ramdisk()
    life.boot_device("pxe")
    t = time.monotonic()
    life.boots_before = len(node.power.boots())
    result = life.bmc_op("bmc.power", "cycle")
    if result.power_state != "on" or node.power.status() != "on":
        raise life.fail(f"bmc.power cycle: the BMC says {result.power_state!r}, the node is "
                        f"{node.power.status()}")
    life.step("bmc.power cycle", t, "ForceOff, On (iLO offers no PowerCycle); power read back: on")
    life.pxe_join()
    life.http_proxy()
    life.deploy()
    life.clean_up()
    life.boot_device("disk")
    life.power_cycle()
    life.disk_join()
    site_saw_the_join(life)
    return console_by_time(life, broken)


def query_posture(life: Lifecycle) -> None:
    """bmc.query as Lifecycle.query, and the BMC's posture it reports: IPMI off, SSH on."""
    life.query()
    result = life.bmc_op("bmc.query", "query")
    posture = {m.protocol: m for m in result.management}
    assert posture["IPMI"].listed and not posture["IPMI"].enabled, posture
    assert posture["SSH"].enabled, posture
    shown = ", ".join(f"{p} {'on' if m.enabled else 'off'}" for p, m in sorted(posture.items()) if m.listed)
    life.step("posture", time.monotonic(), f"ManagerNetworkProtocol: {shown}")


def site_boot(life: Lifecycle) -> Any:
    """The node's last boot attempt as the site reports it (inventory.refresh's node_boots)."""
    result = life.site("inventory.refresh", {"skip_gpus": True})
    return next((b for b in result.node_boots if b.node_id == life.node.name), None)


def broken_boot(life: Lifecycle, timeout: float = 180.0) -> tuple[int, int]:
    """The empty disk's boot, named by the site from its SSH console: (its start, the moment it
    was named), in unix ms."""
    t = time.monotonic()
    deadline = t + timeout
    while True:
        boot = site_boot(life)
        if boot is not None and boot.cause:
            break
        if time.monotonic() > deadline:
            raise life.fail(f"the empty disk's boot: no cause named in {timeout:g}s: {boot}")
        time.sleep(1.0)
    named = int(time.time() * 1000)
    seen = "\n".join([f"{boot.method} ({boot.trigger}) {boot.outcome} {boot.cause}: {boot.cause_detail}",
                      *boot.steps, *boot.last_lines])
    assert (boot.method, boot.trigger, boot.outcome, boot.cause) == \
        ("disk", "bmc.power on", "failed", "disk_not_bootable"), seen
    assert "no boot entry on the disk: BdsDxe: failed to load" in boot.cause_detail, seen
    assert boot.console == "attached", seen
    assert any("over SSH" in s and "vendor row hpe" in s for s in boot.steps), seen   # the console's way
    assert any("Not Found" in line for line in boot.last_lines), seen
    life.step("empty disk: cause named", t, f"{boot.cause}: {boot.cause_detail[:90]}")
    return int(boot.started_unix_ms), named


def site_saw_the_join(life: Lifecycle, timeout: float = 30.0) -> None:
    """The site's own view of the disk boot: joined, from the SSH console's line of it (which
    comes a moment after the gateway has the agent's hello)."""
    t = time.monotonic()
    while (boot := site_boot(life)) is None or boot.outcome != "joined":
        if time.monotonic() - t > timeout:
            raise life.fail(f"the gateway joined the disk boot, the site's console never showed it: {boot}")
        time.sleep(1.0)
    assert (boot.method, boot.trigger) == ("disk", "bmc.power cycle"), boot
    life.step("the site saw the join", t, f"attempt {boot.attempt} {boot.method}: {boot.outcome}, "
                                          f"from the console over SSH")


def console_by_time(life: Lifecycle, broken: tuple[int, int]) -> list[dict[str, Any]]:
    """logs.collect in role site: the node's console between the broken boot's start and its
    naming, each line with its time, kept over SSH; and its timeline (the attempts as the site
    holds them now: its file on disk is written later)."""
    t = time.monotonic()
    start, named = broken
    result = life.site("logs.collect", {"node_ids": [life.node.name], "from_unix_ms": start,
                                        "until_unix_ms": named})
    with tarfile.open(fileobj=io.BytesIO(bytes(result.inline_archive))) as tar:
        member = tar.extractfile(f"nodes/{life.node.name}/console.txt")
        assert member is not None
        text = member.read().decode(errors="replace")
        member = tar.extractfile(f"nodes/{life.node.name}/timeline.json")
        assert member is not None
        attempts: list[dict[str, Any]] = json.loads(member.read())
    lines = [line for line in text.splitlines() if line.strip()]
    assert any("BdsDxe: failed to load" in line and "Not Found" in line for line in lines), text
    assert "connected to gateway" not in text, text        # nothing of the later boots
    life.step("logs.collect (site)", t, f"{len(lines)} console lines of the broken boot, by time; "
                                        f"the timeline's {len(attempts)} attempts")
    return attempts


def check_no_ipmi(lab: SiteLab, emu: RedfishEmulator) -> None:
    """No ipmitool ran (the site daemon's PATH starts with one that records each run), and the
    BMC's IPMI stayed off."""
    ran = lab.workdir.parent / "no-ipmi-bin" / "ipmitool.ran"
    assert not ran.exists(), f"ipmitool ran: {ran.read_text()}"
    assert "ipmitool" not in lab.site_log_text(), "the site's log names ipmitool"
    assert not emu.writes("PATCH", "/NetworkProtocol"), emu.writes("PATCH", "/NetworkProtocol")


def check_timeline(lab: SiteLab, node: SiteNode, attempts: list[dict[str, Any]]) -> None:
    """Three attempts, each from the SSH console: the empty disk (failed, named), the PXE boot of
    the ramdisk and the deployed disk's boot (both joined); the console kept from bmc.query on,
    over SSH, never let go."""
    seen = "\n".join(f"attempt {a['number']} {a['method']} ({a['trigger']}) {a['outcome']} {a['cause']}: "
                     + " ".join(e["step"] for e in a["events"]) for a in attempts)
    print(seen)
    assert [(a["method"], a["outcome"]) for a in attempts] == \
        [("disk", "failed"), ("pxe", "joined"), ("disk", "joined")], seen
    empty, pxe, disk = ([e["step"] for e in a["events"]] for a in attempts)
    assert empty.index("console") < empty.index("power_on") < empty.index("no_boot_device"), seen
    assert {"firmware", "boot_loader", "init", "agent_started", "joined"} <= set(pxe), seen
    assert pxe.index("power_on") < pxe.index("firmware") < pxe.index("joined"), seen
    assert {"firmware", "init", "agent_started", "joined"} <= set(disk), seen
    assert "no_boot_device" not in disk, seen
    said = [e["detail"] for a in attempts for e in a["events"] if e["step"] == "console"]
    assert said and all("over SSH" in d for d in said if d.startswith("attached")), said
    assert not any(d.startswith("released") for d in said), said
    ring = lab.site_state / "site" / "observe" / "console" / node.name
    kept = "".join(f.read_text(errors="replace") for f in (ring / "console.log.1", ring / "console.log")
                   if f.exists())
    for wanted in ("Starting virtual serial port.", "BdsDxe: failed to load", "iPXE",
                   "starting agent", "node root LABEL=bcroot mounted on /sysroot", "connected to gateway"):
        assert wanted in kept, f"{wanted!r} not in the site's kept console:\n{kept[-3000:]}"
