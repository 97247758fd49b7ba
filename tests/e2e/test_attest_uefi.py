"""Attestation on real (emulated) firmware: the ramdisk as a UKI under OVMF with a TPM 2.0
(swtpm) joins an attesting gateway, and its disk.wipe certificate counts as verified; the same
ramdisk under SeaBIOS is reported unattested, with why.

The gateway's policy holds what initramfs/uki.py says of the UKI (PCR 4's Authenticode
digest, PCRs 11 and 12) and learns the machine's firmware profile (PCRs 0, 2, 7) on the
first join. Marked qemu and slow: a boot under TCG takes a minute or more.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.gateway.verifier.attest import Status, Verdict, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Build, Policy
from agent.hw import efivars
from agent.policy.release.golden import Capture, Rules, diff
from agent.proto import session_pb2
from agent.site.bmc.client import Credentials
from agent.site.bmc.secrets import SecretStore
from initramfs import uki
from qemu import attestdemo
from qemu import tpm as qemu_tpm
from qemu.harness import PLATFORMS, Machine
from qemu.lab import Lab
from qemu.nodeimage import SYSTEMD_BOOT
from tests.conftest import free_port
from tests.e2e.conftest import JOIN_TIMEOUT, run_command, skip_reason
from tests.runtime.harness import AgentProcess
from tests.site.bmc.redfish_emulator import RedfishEmulator

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

AGENT = "/usr/lib/bettercompute/agent.pyz"


@pytest.fixture(scope="module")
def tpm_lab(lab: Lab) -> Lab:
    reason = skip_reason(uefi=True) or qemu_tpm.missing()
    if reason:
        pytest.skip(reason)
    return lab


@pytest.fixture
def swtpm(tmp_path: Path) -> Iterator[qemu_tpm.Swtpm]:
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")
    with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as running:
        yield running


def attest(lab: Lab, ca: Path, builds: list[Build]) -> JoinAttestation:
    verifier = Verifier(Policy(builds=builds, learn="first"),
                        ek_roots=load_certificates([ca / qemu_tpm.CA_ROOT, ca / qemu_tpm.CA_ISSUER]))
    joins = JoinAttestation(verifier)
    lab.gateway.attestation = joins  # the lab's gateway attests from its next session on
    return joins


def verdict(joins: JoinAttestation, node: str) -> Verdict:
    found = joins.wait_verdict(node, 120)
    assert found is not None, "no attestation verdict"
    return found


def test_a_uki_under_ovmf_attests_and_its_wipe_is_verified(tpm_lab: Lab, swtpm: qemu_tpm.Swtpm,
                                                           tmp_path: Path) -> None:
    node = "attest-uefi"
    esp, values = tpm_lab.uki(node)
    joins = attest(tpm_lab, tmp_path / "ca", [Build.from_values(values)])
    disks = tpm_lab.standard_disks(node, size=64 * 1024 * 1024)
    machine = tpm_lab.boot(node, uefi=True, tpm=swtpm.socket, esp=esp, disks=disks[:1])
    try:
        tpm_lab.wait_joined(machine, node, JOIN_TIMEOUT)
        found = verdict(joins, node)
        assert found.status is Status.ATTESTED, f"{found}\n{machine.console_tail()}"
        assert found.matched["build"] == values["build_id"] and found.matched["pcr4"] == values["pcr4"][0]
        cid, _, _ = run_command(tpm_lab, machine, node, "disk.wipe",
                                {"disks": [{"serial": disks[0].serial}], "method": "BEST_AVAILABLE",
                                 "verify": "FULL"})
        ok, why = tpm_lab.gateway.verified(cid)
        assert ok, why
    finally:
        machine.stop()
        tpm_lab.gateway.attestation = None


def test_a_seabios_boot_is_unattested(tpm_lab: Lab, swtpm: qemu_tpm.Swtpm, tmp_path: Path) -> None:
    node = "attest-bios"
    joins = attest(tpm_lab, tmp_path / "ca", [])
    machine = tpm_lab.boot(node, tpm=swtpm.socket)  # SeaBIOS, the kernel given by QEMU
    try:
        tpm_lab.wait_joined(machine, node, JOIN_TIMEOUT)
        found = verdict(joins, node)
        assert found.status is Status.UNATTESTED, f"{found}\n{machine.console_tail()}"
        assert "BIOS boot" in found.reason, found  # SeaBIOS logs its own measurements, no EFI image
    finally:
        machine.stop()
        tpm_lab.gateway.attestation = None


def test_one_byte_changed_in_the_initramfs(tpm_lab: Lab, tmp_path: Path) -> None:
    """``./dev demo --uefi``'s attestation (qemu/attestdemo.py): a node boots the UKI the policy
    accepts and attests; another boots it with one byte changed in the initramfs: refused."""
    said: list[str] = []
    verdicts = attestdemo.run(tpm_lab, tmp_path, said.append, JOIN_TIMEOUT)
    assert [v.status for v in verdicts] == [Status.ATTESTED, Status.REFUSED], verdicts
    assert verdicts[1].check == "policy_pcr4", verdicts[1]
    assert any(line.startswith("UKI built:") and "PCR 9 empty" in line for line in said), said
    assert any(line.startswith("ATTESTED: PCR 4 matched build") for line in said), said
    assert any(line.startswith("REFUSED (policy_pcr4)") for line in said), said
    assert tpm_lab.gateway.attestation is None


class HostFirmware:
    """The UEFI build a QEMU node starts with at its next power-on, as its BMC's update left it:
    the emulator's hook (``State.on_update``) swaps it when an update of the host firmware
    component takes with the image of a build the lab knows (by its sha256: the node boots the
    very file the site pushed). None: OVMF.fd as -bios, the lab's default."""

    def __init__(self, component: str, builds: dict[str, tuple[Path, Path] | None]) -> None:
        self.component, self.builds = component, builds
        self.pflash: tuple[Path, Path] | None = None
        self.swaps: list[str] = []

    def updated(self, image: str, updates: list[tuple[str, str]]) -> None:
        if any(path == self.component for path, _ in updates) and image in self.builds:
            self.pflash = self.builds[image]
            self.swaps.append(image)


class SiteDaemon(AgentProcess):
    """`agent run --role site` with its real handlers."""

    entry = ("-m", "agent")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_another_firmware_for_an_enrolled_profile(tpm_lab: Lab, tmp_path: Path) -> None:
    """The OVMF swap (issue 54, item 5), three boots of one node. It attests under OVMF.fd (its
    profile, QEMU's q35 and its SMBIOS firmware version, learned); then boots OVMF's 4 MiB build
    on pflash behind the site's back: its PCR 0 moved, refused ``firmware_changed``. Then the
    site updates it for real: a bmc.firmware apply of the profile's firmware set, sent through
    the gateway to a site daemon (`agent run --role site`), which fetches the image (that 4 MiB
    build) into its content store and pushes it (multipart) to the project's Redfish emulator
    (the Supermicro recording); the BMC's update of its BIOS component swaps the build the node
    starts with at its next power-on (the emulator's hook, ``HostFirmware``), and the site's
    result reaches the gateway's verifier by the normal path (the site session's result,
    ``site_report``). The next boot attests, accepted by the site's word, and learns its values.
    The way back: the site applies the set again with the old build (a downgrade): the BMC
    swaps the node back and the gateway opens its window again, without a fourth boot; that
    such a boot is then accepted, and one behind the site's back refused, is proven with real
    swtpm quotes at the verifier (tests/gateway/test_attest_binding.py).

    The same boots carry the node's golden state (issue 55): on the second (the first on its
    OVMF variable store) `agent golden` on the node captures its UEFI variables and TPM, which
    match the checked-in tests/policy/golden/qemu-ovmf-swtpm.json but for what the profile's rules
    and the node's own items leave alone; the node powers off through its OS; on the third the
    release gate against that capture and the rules passes with zero findings. Then, on that
    running node, a root tenant's plantings in its real OVMF variable store and swtpm (PLANT) are
    each found by name with its remedy, the remedies go through the gateway, and the gate passes
    again with zero findings (plant_and_put_back)."""
    code, variables = Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
    if not code.is_file() or not variables.is_file():
        pytest.skip("no OVMF_CODE_4M.fd / OVMF_VARS_4M.fd (Debian's ovmf)")
    old = Path(PLATFORMS["amd64"].uefi_firmware)
    qemu_tpm.manufacture(tmp_path / "state", tmp_path / "ca")  # one node, one TPM, three boots
    shutil.copyfile(variables, tmp_path / "vars.fd")
    swapped = (code, tmp_path / "vars.fd")
    node, site_id, ref = "attest-fw-1", "attest-fw-site", "attest-fw-bmc"
    names = {f"{node}-ovmf-4m.fd": code, f"{node}-ovmf.fd": old}
    for name, source in names.items():  # the images' upstream: the lab's file server
        shutil.copyfile(source, tpm_lab.www / name)
    new_image, old_image = sha256_of(code), sha256_of(old)
    host = HostFirmware("/redfish/v1/UpdateService/FirmwareInventory/BIOS",
                        {new_image: swapped, old_image: None})
    sets = tmp_path / "firmware-sets.json"

    def firmware_set(name: str, version: str, image: str) -> None:
        sets.write_text(json.dumps({"profiles": {"qemu-q35": [{
            "match": {"id": "BIOS"}, "version": version, "method": "multipart",
            "image": {"sha256": image, "url": f"http://127.0.0.1:{tpm_lab.files.port}/{name}"}}]}}))

    secrets = SecretStore(tmp_path / "secrets")
    esp, values = tpm_lab.uki(node)
    joins = attest(tpm_lab, tmp_path / "ca", [Build.from_values(values)])
    with RedfishEmulator.of("supermicro_sys821", tmp_path / "bmc", task_polls=1) as bmc:
        bmc.state.images = {new_image: [(host.component, "OVMF 4M")], old_image: [(host.component, "OVMF")]}
        bmc.state.on_update = host.updated
        secrets.put(ref, Credentials(bmc.user, bmc.password))
        site = SiteDaemon(tpm_lab.pki, tpm_lab.gateway, tmp_path / "site", node_id=site_id, role="site",
                          token=tpm_lab.token_for(site_id), cmdline="bc.tpm=none",
                          extra_args=("--secrets-dir", str(secrets.root), "--site-firmware-sets", str(sets),
                                      "--site-address", "127.0.0.1", "--site-http-port", str(free_port()),
                                      "--site-upstream", "127.0.0.1",
                                      # polled as the site tests do: an update's settle wait is three
                                      # answers spaced twice the cap (90 s each at the defaults)
                                      "--bmc-poll-seconds", "0.05", "--bmc-poll-max-seconds", "0.1"))
        tpm_lab.gateway.site_node = site_id
        site.start()

        def apply() -> tuple[session_pb2.ResultBody, str]:
            cid = tpm_lab.gateway.send(site_id, "bmc.firmware", {
                "node_id": node, "bmc_address": bmc.address, "protocol": "redfish", "operation": "apply",
                "credentials_ref": ref, "verify_tls": False, "parameters": {"profile": "qemu-q35"}})
            body, _ = tpm_lab.gateway.wait_result(cid, 120)
            told = [e.detail for e in tpm_lab.gateway.events_for(cid) if e.what == "attest_site_report"]
            return body, told[0] if told else ""

        verdicts = []
        try:
            tpm_lab.gateway.wait_node(site_id, JOIN_TIMEOUT)
            for boot in ("first", "behind", "updated"):
                if boot == "updated":  # the site's update, from the set, through the BMC
                    assert host.pflash is None and not host.swaps
                    firmware_set(f"{node}-ovmf-4m.fd", "OVMF 4M", new_image)
                    body, told = apply()
                    assert body.status == session_pb2.SUCCEEDED, f"{body}\n{site.logs()[-3000:]}"
                    assert told == f"{node}: site updated its firmware to set qemu-q35 (BIOS OVMF 4M)", told
                    assert host.swaps == [new_image] and host.pflash == swapped
                pflash = swapped if boot == "behind" else host.pflash
                known = tpm_lab.gateway.nodes.get(node)
                with qemu_tpm.Swtpm(tmp_path / "state", tmp_path / "swtpm.sock") as swtpm:
                    machine = tpm_lab.boot(node, uefi=True, tpm=swtpm.socket, esp=esp, pflash=pflash)
                    try:
                        sessions = known.sessions + 1 if known is not None else 1
                        tpm_lab.wait_joined(machine, node, JOIN_TIMEOUT, sessions=sessions)
                        verdicts.append(verdict(joins, node))
                        if boot == "behind":        # the node known clean: its golden state
                            captured = capture_golden(machine)
                            power_off(machine)      # as its OS does: TPM2_Shutdown sent
                        elif boot == "updated":     # the same node's next boot: its gate
                            gated = gate_golden(tpm_lab, machine, node, captured)
                            plant_and_put_back(tpm_lab, machine, node, captured)
                    finally:
                        machine.stop()
            # The way back: the operator puts the old build in the set, the site applies it.
            firmware_set(f"{node}-ovmf.fd", "OVMF", old_image)
            body, told = apply()
            assert body.status == session_pb2.SUCCEEDED, body
            assert told == f"{node}: site updated its firmware to set qemu-q35 (BIOS OVMF)", told
            assert host.swaps == [new_image, old_image] and host.pflash is None
            state = joins.verifier.states.get(node)
            assert state is not None and state.accept, state
            assert state.accept_by == "site: firmware set qemu-q35 (BIOS OVMF)", state
            body, told = apply()  # again, with nothing to do: the node is at the set, nothing told
            assert body.status == session_pb2.SUCCEEDED and not told, (body, told)
            assert len(bmc.writes("POST", "/redfish/v1/UpdateService/upload")) == 2   # one push per update
        finally:
            tpm_lab.gateway.site_node = ""
            tpm_lab.gateway.attestation = None
            site.terminate()
    first, behind, updated = verdicts
    assert first.status is Status.ATTESTED and first.matched.get("learned"), first
    assert behind.status is Status.REFUSED and behind.check == "firmware_changed", behind
    assert updated.status is Status.ATTESTED, updated
    assert updated.matched["accepted_by"] == "site: firmware set qemu-q35 (BIOS OVMF 4M)", updated
    assert updated.matched.get("learned") and " -> " in updated.matched["firmware"], updated
    check_golden_fixture(captured)
    report = gated.release
    assert report.pool_ready and not report.restorable and not report.cannot_restore, gated.conformance
    counts = {c.source: (c.compared, c.varied, c.unreadable) for c in report.compared}
    assert set(counts) == {"uefi", "tpm"} and all(n > 0 and not why for n, _, why in counts.values()), counts
    assert counts["uefi"][1] == 1 and counts["tpm"][1] == 1, counts     # MTC; startup_clear.orderly


GOLDEN = Path(__file__).resolve().parents[1] / "policy/golden"
QEMU_GOLDEN = GOLDEN / "qemu-ovmf-swtpm.json"            # the capture, by `agent golden` on the node
QEMU_RULES = GOLDEN / "qemu-ovmf-swtpm.rules.json"        # what varies from boot to boot: the profile's
QEMU_OWN = GOLDEN / "qemu-ovmf-swtpm.own.json"            # what is this node's own (its TPM, this run's)


def capture_golden(machine: Machine) -> Capture:
    """The node's golden state as the tool captures it: `agent golden` run on the node."""
    status, out = machine.shell(f"python3 {AGENT} golden --sources uefi,tpm -o /tmp/golden.json "
                                "2>/tmp/golden.err; echo rc=$?; cat /tmp/golden.err", timeout=300)
    assert status == 0 and "rc=0" in out, out
    status, out = machine.shell("echo '<<<'; base64 /tmp/golden.json; echo '>>>'", timeout=120)
    assert status == 0 and "<<<\n" in out and "\n>>>" in out, out
    return Capture.from_json(base64.b64decode(out.split("<<<\n", 1)[1].split("\n>>>", 1)[0]))


def power_off(machine: Machine) -> None:
    """The guest's own poweroff (SysRq o: the kernel's device shutdown sends the TPM its
    TPM2_Shutdown, as a node's reboot does); QEMU exits with it."""
    status, out = machine.shell("(sleep 1; echo o > /proc/sysrq-trigger) >/dev/null 2>&1 & true")
    assert status == 0, out
    deadline = time.monotonic() + 120
    while machine.alive and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not machine.alive, "the guest did not power off within 120 s"


def gate_golden(lab: Lab, machine: Machine, node: str, golden: Capture) -> Any:
    """The release gate against the golden state: inventory.refresh with expect.state.golden."""
    state = {"golden": {"profile": "qemu-q35-ovmf-swtpm",
                        "capture": base64.b64encode(golden.to_json()).decode(),
                        "rules": base64.b64encode(QEMU_RULES.read_bytes()).decode()}}
    _, _, result = run_command(lab, machine, node, "inventory.refresh", {"expect": {"state": state}})
    return result


TENANT_KEY = 0x81000001            # a persistent key of the tenant's, at the owner's first handle
TENANT_INDEX = 0x01C00100          # an owner's NV index inside the EK certificate range
# A root tenant's residue, written from the node itself: Driver#### and SysPrep#### load options
# with their orders, through efivarfs (attributes and value in one write, efibootmgr's way) into
# OVMF's variable store; a key persisted and an NV index defined in swtpm through /dev/tpmrm0, by
# the agent's own TPM client in the ramdisk (TPM2_NV_DefineSpace, which the client has no call
# for, as its bytes: ownerwrite|authwrite|ownerread|authread, SHA-256, 32 bytes).
PLANT = """
import os, struct, sys
sys.path.insert(0, sys.argv[1])
from agent.hw import efivars, tpm
key, index = int(sys.argv[2], 16), int(sys.argv[3], 16)
for kind in ("Driver", "SysPrep"):
    for name, value in ((kind + "0001", efivars.load_option("tenant " + kind.lower())),
                        (kind + "Order", struct.pack("<H", 1))):
        fd = os.open(str(efivars.EFIVARS / (name + "-" + efivars.GLOBAL)), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, struct.pack("<I", efivars.ATTRS_NV_BS_RT) + value)
        os.close(fd)
with tpm.Tpm(tpm.DeviceTransport()) as t:
    t.evict_control(t.create_primary(tpm.RH_OWNER, tpm.EK_ECC_TEMPLATE).handle, key)
    public = tpm.u32(index) + tpm.u16(0x000B) + tpm.u32(0x00060006) + tpm.u16(0) + tpm.u16(32)
    body = tpm.u32(tpm.RH_OWNER) + tpm.session_area(tpm.PW) + tpm.u16(0) + tpm.u16(len(public)) + public
    answer = t.transport.transact(tpm.u16(tpm.ST_SESSIONS) + tpm.u32(10 + len(body)) + tpm.u32(0x12A) + body)
    if answer[6:10] != bytes(4):
        sys.exit("TPM2_NV_DefineSpace: rc 0x" + answer[6:10].hex())
print("planted")
"""
PLANTED = {("uefi.added", f"{name}-{efivars.GLOBAL}")
           for name in ("Driver0001", "DriverOrder", "SysPrep0001", "SysPrepOrder")} | {
    ("tpm.added", f"persistent/{TENANT_KEY:#010x}"), ("tpm.added", f"nv/{TENANT_INDEX:#010x}")}


def findings(report: Any) -> dict[tuple[str, str], str]:
    """(check, where) of every finding: its remedy's driver.operation, "" where it has none."""
    return {(m.check, m.where): f"{m.remedy.driver}.{m.remedy.operation}" if m.remedy.driver else ""
            for m in [*report.restorable, *report.cannot_restore]}


def plant_and_put_back(lab: Lab, machine: Machine, node: str, golden: Capture) -> None:
    """On the node that just passed its gate: a root tenant's plantings in the real OVMF variable
    store and swtpm (PLANT); the gate again finds each by name with its remedy; the remedies sent
    through the gateway as driver.invoke, as the control plane sends them; the gate a third time
    passes with zero findings."""
    script = base64.b64encode(PLANT.encode()).decode()
    # In pieces: the whole script as one line of 1,550 bytes never came back from the guest's debug
    # shell (busybox's line editing keeps 1,024 bytes of a line).
    for at in range(0, len(script), 700):
        status, out = machine.shell(f"printf %s {script[at:at + 700]} >{'>' if at else ''} /tmp/plant.b64")
        assert status == 0, out
    status, out = machine.shell(f"base64 -d /tmp/plant.b64 > /tmp/plant.py && python3 /tmp/plant.py {AGENT} "
                                f"{TENANT_KEY:#x} {TENANT_INDEX:#x} 2>&1", timeout=120)
    assert status == 0 and "planted" in out, out
    report = gate_golden(lab, machine, node, golden).release
    found = findings(report)
    assert set(found) == PLANTED and not report.pool_ready and not report.cannot_restore, found
    assert found == {**{p: "efivars.delete_variable" for p in PLANTED if p[0] == "uefi.added"},
                     ("tpm.added", f"persistent/{TENANT_KEY:#010x}"): "tpm.evict",
                     ("tpm.added", f"nv/{TENANT_INDEX:#010x}"): "tpm.undefine_nv"}, found
    for m in report.restorable:
        run_command(lab, machine, node, "driver.invoke",
                    json_format.MessageToDict(m.remedy, preserving_proto_field_name=True))
    again = gate_golden(lab, machine, node, golden).release
    assert again.pool_ready and not again.restorable and not again.cannot_restore, findings(again)
    status, out = machine.shell(f"ls {efivars.EFIVARS}")
    assert status == 0 and "Driver0001-" not in out and "SysPrep" not in out, out


def check_golden_fixture(captured: Capture) -> None:
    """The checked-in golden state is what the tool captures of this node: nothing changed but
    what is the node's own (its swtpm, manufactured per run) and what varies from boot to boot.
    BC_WRITE_GOLDEN=1 captures it again (docs/lifecycle.md, "A QEMU node's golden state")."""
    if os.environ.get("BC_WRITE_GOLDEN"):
        QEMU_GOLDEN.write_bytes(captured.to_json())
    fixture = Capture.from_json(QEMU_GOLDEN.read_bytes())
    rules = Rules.from_json(QEMU_RULES.read_bytes())
    own = Rules.from_json(QEMU_OWN.read_bytes())
    for r in (rules, own):                          # every rule says why
        assert all(p in r.why.get(s, {}) for s, patterns in r.vary.items() for p in patterns), r
    both = Rules({s: (*rules.vary.get(s, ()), *own.vary.get(s, ())) for s in {*rules.vary, *own.vary}})
    found = diff(fixture, captured, both)
    assert not found.changes and not found.unreadable, found.changes
    assert found.compared["uefi"] > 0 and found.compared["tpm"] > 0, found.compared



def test_a_command_line_added_by_the_boot_loader(tpm_lab: Lab, swtpm: qemu_tpm.Swtpm, tmp_path: Path) -> None:
    """systemd-boot in front of the UKI, its entry adding to the kernel command line: the loader
    is accepted (policy loaders), the UKI is the build, and PCR 12 holds what the loader added."""
    if not SYSTEMD_BOOT.is_file():
        pytest.skip(f"no {SYSTEMD_BOOT} (apt-get install systemd-boot-efi)")
    node = "attest-cmdline"
    esp, values = tpm_lab.uki(node)
    image = esp / "EFI" / "Linux" / "ramdisk.efi"
    image.parent.mkdir(parents=True)
    (esp / "EFI" / "BOOT" / "BOOTX64.EFI").rename(image)
    shutil.copyfile(SYSTEMD_BOOT, esp / "EFI" / "BOOT" / "BOOTX64.EFI")
    cmdline = uki.parse_pe(image.read_bytes()).section(".cmdline").decode()
    (esp / "loader" / "entries").mkdir(parents=True)
    (esp / "loader" / "loader.conf").write_text("timeout 0\ndefault ramdisk.conf\n")
    (esp / "loader" / "entries" / "ramdisk.conf").write_text(
        f"title ramdisk\nefi /EFI/Linux/ramdisk.efi\noptions {cmdline} loglevel=7\n")
    joins = attest(tpm_lab, tmp_path / "ca", [Build.from_values(values)])
    joins.verifier.policy.loaders.add(uki.authenticode_sha256(SYSTEMD_BOOT.read_bytes()))
    machine = tpm_lab.boot(node, uefi=True, tpm=swtpm.socket, esp=esp)
    try:
        tpm_lab.wait_joined(machine, node, JOIN_TIMEOUT)
        found = verdict(joins, node)
        assert found.status is Status.REFUSED and found.check == "policy_pcr12", \
            f"{found}\n{machine.console_tail()}"
    finally:
        machine.stop()
        tpm_lab.gateway.attestation = None
