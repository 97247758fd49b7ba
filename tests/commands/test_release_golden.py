"""The release gate, round 2, on the node: every source read whole and diffed against the golden
state a clean node's capture made (inventory.refresh with expect.state.golden).

The node is the fake server of test_release.py (efivarfs-format files, the fake NVML, the fake
mstconfig and nvme-cli) with a real TPM (swtpm, its PPI a fake sysfs tree). Each planting of
issue #55's node list is a test: planted with tpm2-tools, the project's TPM client or the fakes'
state, found as `<source>.added|removed|changed` at its path, and put back by its remedies, run
through driver.invoke as the control plane sends them (the firmware's part of a PPI request, and a
NIC's next boot, played by the test); what has no remedy stays named in cannot_restore. A clean
node reports zero findings, and the report counts what each source compared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.commands.inventory import InventoryRefresh, collect
from agent.commands.inventory import golden as node_golden
from agent.hw import efivars
from agent.hw import tpm as tpmwire
from agent.policy.release.golden import Capture, Rules, diff
from agent.proto import agent_pb2
from tests.commands.test_release import Node, plant
from tests.tpmsim import SimTpm, manufactured_tpm, need, sim

__all__ = ["manufactured_tpm", "sim"]

FIXTURES = Path(__file__).resolve().parents[1] / "policy/golden"
AMI_SETUP = "ec87d643-eba4-4bb5-a1e5-3f3e36b20da9"        # AMI's Setup variable's vendor GUID
SETUP = bytes(range(64))
# What varies on a clean node: the firmware's monotonic counter, the TPM's audit counters and
# clock-driven properties. The profile's data, as a control plane would send it.
RULES = {"vary": {"uefi": ["MonotonicCounter-*"],
                  "tpm": ["property/0x0212", "property/0x0213", "property/0x0214"]}}


class GoldenNode(Node):
    """test_release's fake server with a TPM, a PPI, and the UEFI variables a firmware has."""

    def __init__(self, tmp_path: Path, library: str, monkeypatch: pytest.MonkeyPatch, tpm: SimTpm) -> None:
        super().__init__(tmp_path, library, monkeypatch)
        self.sim = tpm
        self.tmp = tmp_path
        self.config = dataclasses.replace(self.config, tpm=f"tcp:127.0.0.1:{tpm.port}")
        plant(self.efivars, "Timeout", struct.pack("<H", 5))
        plant(self.efivars, "Setup", SETUP, AMI_SETUP)
        plant(self.efivars, "Key0000", b"\x00" * 12)
        plant(self.efivars, "MonotonicCounter", struct.pack("<I", 7), "01368881-c4ad-4b1d-b631-d57a8ec8db6b")
        for address in self.nics:
            self.nics[address]["ATS_ENABLED"] = ["False(0)", "False(0)", "False(0)"]
            self.nics[address]["LINK_TYPE_P2"] = ["ETH(2)", "ETH(2)", "ETH(2)"]
            self.nics[address]["nv_prio_tag_en"] = ["False(0)", "False(0)", "False(0)"]   # lower case
        self.nvme["nvme1"]["opal"] = {}                # a self-encrypting drive, locking not enabled
        self.save()
        self.ppi = self.root / "sys/class/tpm/tpm0/ppi"
        self.ppi.mkdir(parents=True)
        (self.ppi / "version").write_text("1.3\n")
        (self.ppi / "request").write_text("0\n")
        (self.ppi / "response").write_text("0 0: Success\n")
        (self.ppi / "tcg_operations").write_text("5 4: User not required\n23 4: User not required\n")
        self.golden = b""

    def capture(self) -> Capture:
        """The golden state of this node as the agent captures it (what `agent golden` prints)."""
        inv = collect(self.root, nvml_library=self.config.nvml_library, kernel_log=lambda: [])
        return node_golden.capture(Context.local("inventory.refresh", self.config), inv, self.root)

    def gate(self) -> agent_pb2.ReleaseReport:
        handler = InventoryRefresh()
        handler.root = self.root
        handler.kernel_log = lambda: []
        payload = agent_pb2.InventoryRefreshRequest()
        payload.expect.state.golden.CopyFrom(agent_pb2.GoldenState(
            profile="h100-sxm-test", capture=self.golden, rules=json.dumps(RULES).encode()))
        result = handler.run(Context.local("inventory.refresh", self.config), handler.parse(payload))
        assert isinstance(result, agent_pb2.InventoryRefreshResult)
        assert result.conformance.passed == result.release.pool_ready
        return result.release

    def send(self, report: agent_pb2.ReleaseReport) -> list[str]:
        """Every remedy once, through driver.invoke; the operations sent."""
        handler = DriverInvoke()
        handler.root = self.root
        sent: dict[bytes, str] = {}
        for m in report.restorable:
            key = m.remedy.SerializeToString(deterministic=True)
            if key in sent:
                continue
            sent[key] = f"{m.remedy.driver}.{m.remedy.operation}"
            result = handler.run(Context.local("driver.invoke", self.config), handler.parse(m.remedy))
            assert isinstance(result, agent_pb2.DriverInvokeResult)
            assert result.exit_code == 0, (m.check, m.where, result.stderr)
        return sorted(set(sent.values()))

    def reboot(self) -> None:
        """The firmware's part of a reboot: a PPI request carried out (Clear: with the platform
        hierarchy, disableClear first; Set PCR Banks: TPM2_PCR_Allocate), the TPM reset, the NICs'
        next-boot values made current."""
        request = (self.ppi / "request").read_text().split()
        if request[:1] == ["5"]:
            self.tpm2("tpm2_clearcontrol", "-C", "p", "c")
            self.tpm2("tpm2_clear", "-c", "p")
        elif request[:1] == ["23"]:
            bits = int(request[1])
            banks = [f"{b}:{'all' if bits & bit else 'none'}" for b, bit in (("sha1", 1), ("sha256", 2),
                                                                             ("sha384", 4), ("sha512", 8))]
            self.tpm2("tpm2_pcrallocate", "+".join(banks))
        (self.ppi / "request").write_text("0\n")
        self.power_cycle()
        self.firmware_boot()

    def power_cycle(self) -> None:
        """The TPM's reset, after the TPM2_Shutdown the kernel sends at a reboot (without it the
        TPM counts an authorization failure)."""
        self.tpm2("tpm2_shutdown", "-c")
        self.sim.restart()
        self.config = dataclasses.replace(self.config, tpm=f"tcp:127.0.0.1:{self.sim.port}")

    def tpm2(self, *argv: str) -> None:
        need(argv[0])
        done = subprocess.run(list(argv), cwd=self.tmp, env=dict(os.environ, TPM2TOOLS_TCTI=self.sim.tcti),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (argv, done.stderr)

    def until_clean(self, report: agent_pb2.ReleaseReport,
                    rounds: int = 3) -> tuple[agent_pb2.ReleaseReport, list[str]]:
        """As the control plane does: send the remedies, reboot, check again, until none is left."""
        sent: list[str] = []
        for _ in range(rounds):
            if not report.restorable:
                break
            sent += self.send(report)
            self.reboot()
            report = self.gate()
        return report, sent


# Every test's node is the same clean node (the same files, the same fakes' state, a copy of the
# session's one manufactured TPM): its golden state is captured once per process, by the agent,
# and kept here; test_the_checked_in_golden_state_is_what_the_tool_captures captures it afresh.
_CAPTURED: list[bytes] = []


@pytest.fixture
def node(tmp_path: Path, nvml_library: str, monkeypatch: pytest.MonkeyPatch,
         sim: SimTpm) -> Iterator[GoldenNode]:
    n = GoldenNode(tmp_path, nvml_library, monkeypatch, sim)
    if not _CAPTURED:
        _CAPTURED.append(n.capture().to_json())
    n.golden = _CAPTURED[0]
    yield n


def found(report: agent_pb2.ReleaseReport) -> set[tuple[str, str]]:
    return {(m.check, m.where) for m in [*report.restorable, *report.cannot_restore]}


def test_a_clean_node_passes_with_zero_findings_and_counts_each_source(node: GoldenNode) -> None:
    report = node.gate()
    assert report.pool_ready and not report.restorable and not report.cannot_restore
    assert "golden" in report.checked
    counts = {c.source: (c.compared, c.varied, c.unreadable) for c in report.compared}
    assert set(counts) == {"uefi", "tpm", "nic", "nvme", "gpu"}
    assert all(n > 0 and not why for n, _, why in counts.values()), counts
    assert counts["uefi"][1] == 1 and counts["nic"][0] == 4 * 6       # MonotonicCounter; 6 per NIC
    golden = Capture.from_json(node.golden)
    assert {p for p in golden.sources["tpm"] if p.startswith("persistent/")} >= {"persistent/0x81010001"}


def test_the_checked_in_golden_state_is_what_the_tool_captures(node: GoldenNode) -> None:
    """tests/policy/golden/node.json was captured by the agent from this clean node; what is the
    node's own (its TPM's EK and certificates: swtpm makes new ones per manufacture) and the
    simulator's build are left out by node-own.json."""
    fresh = node.capture()
    if os.environ.get("BC_WRITE_GOLDEN"):                           # to capture it again
        (FIXTURES / "node.json").write_bytes(fresh.to_json())
    fixture = Capture.from_json((FIXTURES / "node.json").read_bytes())
    own = Rules.from_json((FIXTURES / "node-own.json").read_bytes())
    d = diff(fixture, fresh, own)
    assert fresh == Capture.from_json(node.golden)                  # the one the other tests use
    assert not d.changes and not d.unreadable, d.changes[:5]


def test_an_unreadable_source_is_a_finding_never_a_pass(node: GoldenNode) -> None:
    node.sim.stop()
    report = node.gate()
    assert found(report) == {("tpm.unreadable", "")} and not report.pool_ready
    (tpm,) = [c for c in report.compared if c.source == "tpm"]
    assert tpm.unreadable and tpm.compared == 0


# --------------------------------------------------------------------------- the planting matrix


def driver_and_order(kind: str) -> Callable[[GoldenNode], None]:
    def planting(node: GoldenNode) -> None:
        plant(node.efivars, f"{kind}0001", efivars.load_option(f"tenant {kind.lower()}"))
        plant(node.efivars, f"{kind}Order", struct.pack("<H", 1))
    return planting


def setup_byte(node: GoldenNode) -> None:
    plant(node.efivars, "Setup", SETUP[:10] + b"\xff" + SETUP[11:], AMI_SETUP)


def tenant_key_at_the_ek_handle(node: GoldenNode) -> None:
    with node.sim.tpm() as t:
        t.evict_control(tpmwire.EK_HANDLE, tpmwire.EK_HANDLE)
        key = t.create_primary(tpmwire.RH_OWNER, tpmwire.EK_RSA_TEMPLATE)      # the EK's template
        t.evict_control(key.handle, tpmwire.EK_HANDLE)


def nv_index_in_the_ek_certificate_range(node: GoldenNode) -> None:
    node.tpm2("tpm2_nvdefine", "0x01c00100", "-C", "o", "-s", "32", "-a",
              "ownerwrite|ownerread|authread|authwrite")


def lockout_with_max_tries_0(node: GoldenNode) -> None:
    with node.sim.tpm() as t:                      # tpm2_dictionarylockout refuses --max-tries=0
        t.dictionary_attack_parameters(0, 10, 10)


def disable_clear(node: GoldenNode) -> None:
    node.tpm2("tpm2_clearcontrol", "-C", "l", "s")


def pcr_banks_sha1_only(node: GoldenNode) -> None:
    node.tpm2("tpm2_pcrallocate", "sha1:all+sha256:none+sha384:none+sha512:none")
    node.power_cycle()                             # an allocation takes effect at the TPM's reset


def nic_parameters(node: GoldenNode) -> None:
    nic = node.nics["0000:3b:00.0"]
    nic["LINK_TYPE_P1"][2] = "IB(1)"
    nic["ATS_ENABLED"][2] = "True(1)"
    node.nics["0000:3c:00.1"]["nv_prio_tag_en"][1:] = ["True(1)", "True(1)"]
    node.save()


def nvme_metadata_format(node: GoldenNode) -> None:
    node.nvme["nvme1"]["namespaces"]["1"]["flbas"] = 2                   # 512 + 8
    node.save()


def nvme_opal_locking(node: GoldenNode) -> None:
    node.nvme["nvme1"]["opal"] = {"locking_enabled": True, "locked": False}
    node.save()


@dataclasses.dataclass(frozen=True)
class Planting:
    plant: Callable[[GoldenNode], None]
    found: set[tuple[str, str]]               # (check, where) each planted item is found as, at least
    remedies: set[str]                        # the driver operations that put it back
    stays: set[tuple[str, str]] = dataclasses.field(default_factory=set)   # no remedy: named


GLOBAL = efivars.GLOBAL
MATRIX = {
    "Driver####+DriverOrder": Planting(
        driver_and_order("Driver"),
        {("uefi.added", f"Driver0001-{GLOBAL}"), ("uefi.added", f"DriverOrder-{GLOBAL}")},
        {"efivars.delete_variable"}),
    "SysPrep####+SysPrepOrder": Planting(
        driver_and_order("SysPrep"),
        {("uefi.added", f"SysPrep0001-{GLOBAL}"), ("uefi.added", f"SysPrepOrder-{GLOBAL}")},
        {"efivars.delete_variable"}),
    "Setup byte": Planting(setup_byte, {("uefi.changed", f"Setup-{AMI_SETUP}")}, set(),
                           {("uefi.changed", f"Setup-{AMI_SETUP}")}),
    "EK handle holds a tenant key": Planting(
        tenant_key_at_the_ek_handle, {("tpm.changed", "persistent/0x81010001")}, {"tpm.persist_ek"}),
    "NV index in the EK certificate range": Planting(
        nv_index_in_the_ek_certificate_range, {("tpm.added", "nv/0x01c00100")}, {"tpm.undefine_nv"}),
    "DA lockout, maxTries 0": Planting(
        lockout_with_max_tries_0,
        {("tpm.changed", p) for p in ("da/maxTries", "da/recoveryTime", "da/lockoutRecovery",
                                      "permanent.inLockout")},
        {"tpm.set_da_parameters"}),
    # The Clear takes the endorsement hierarchy's persistent objects too: the RSA EK is persisted
    # again (tpm.persist_ek, from the TCG template); swtpm's ECC P-384 EK at 0x81010016 (the high
    # range) is not a template the agent knows, so it stays named.
    "disableClear": Planting(
        disable_clear, {("tpm.changed", "permanent.disableClear")}, {"tpm-ppi.clear", "tpm.persist_ek"},
        {("tpm.removed", "persistent/0x81010016")}),
    "PCR banks SHA-1 only": Planting(
        pcr_banks_sha1_only, {("tpm.changed", "pcrs/sha1"), ("tpm.changed", "pcrs/sha256")},
        {"tpm-ppi.set_pcr_banks"}),
    "mlxconfig LINK_TYPE, ATS, a lower-case parameter": Planting(
        nic_parameters, {("nic.changed", "0000:3b:00.0/LINK_TYPE_P1"),
                         ("nic.changed", "0000:3b:00.0/ATS_ENABLED"),
                         ("nic.changed", "0000:3c:00.1/nv_prio_tag_en")}, {"mstconfig.set"}),
    "NVMe 512+8 metadata": Planting(nvme_metadata_format, {("nvme.changed", "nvme1/ns1/format")},
                                    {"nvme.factory_layout"}),
    # Not in the planting list, in its list of what nothing looks at: Opal ownership.
    "NVMe Opal locking enabled": Planting(nvme_opal_locking, {("nvme.changed", "nvme1/tcg_locking")}, set(),
                                          {("nvme.changed", "nvme1/tcg_locking")}),
}


@pytest.mark.parametrize("name", list(MATRIX))
def test_each_planting_is_found_and_its_remedy_puts_it_back(node: GoldenNode, name: str) -> None:
    p = MATRIX[name]
    p.plant(node)
    report = node.gate()
    assert not report.pool_ready
    assert found(report) >= p.found, sorted(found(report))
    report, sent = node.until_clean(report)
    assert p.remedies <= set(sent), sent
    assert found(report) == p.stays, sorted(found(report))
    assert report.pool_ready == (not p.stays)


def test_a_setup_byte_names_its_digests(node: GoldenNode) -> None:
    setup_byte(node)
    (m,) = node.gate().cannot_restore
    assert m.expected.endswith(hashlib.sha256(SETUP).hexdigest()) and "attrs=0x00000007" in m.found


def test_agent_golden_captures_what_the_gate_reads(node: GoldenNode, tmp_path: Path) -> None:
    """`agent golden` on the node's TPM: the same items as the capture the gate's tests take."""
    out = tmp_path / "golden.json"
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "agent", "golden", "--sources", "tpm", "-o", str(out), "--tpm",
         node.config.tpm, "--cmdline-file", "/dev/null", "--state-dir", str(tmp_path / "cli-state")],
        cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    captured = Capture.from_json(out.read_bytes())
    assert captured.sources["tpm"] == Capture.from_json(node.golden).sources["tpm"]
    assert "tpm" in done.stderr and not captured.unreadable
    refused = subprocess.run([sys.executable, "-m", "agent", "golden", "--sources", "bmc"],
                             cwd=repo, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "unknown sources ['bmc']" in refused.stderr


def test_gpu_modes_are_found_and_put_back_where_they_can_be(node: GoldenNode) -> None:
    """Not in the issue's planting list, but the gpu source's: persistence mode off, a compute mode
    a tenant set, confidential computing turned on. Persistence and compute mode have remedies;
    the CC mode is named for a person."""
    node.gpus.set(3, persistence_mode=False, compute_mode=3)
    node.gpus.update(cc_supported=True, cc_environment=1, cc_feature=1)
    report = node.gate()
    assert found(report) == {("gpu.changed", "0000:48:00.0/persistence_mode"),
                             ("gpu.changed", "0000:48:00.0/compute_mode"), ("gpu.changed", "cc")}
    assert {m.where for m in report.cannot_restore} == {"cc"}
    assert node.send(report) == ["nvidia-smi.set_compute_mode", "nvidia-smi.set_persistence_mode"]
    assert found(node.gate()) == {("gpu.changed", "cc")}
