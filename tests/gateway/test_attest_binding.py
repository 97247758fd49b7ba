"""One TPM, one node, and what the verifier keeps across its restarts (agent/gateway/verifier/state.py),
against real TPMs (swtpm): an EK bound to a node at its first attestation, another EK for that
node refused (ek_changed) until an operator re-enrolls it, an EK bound to another node refused
(ek_in_use), the bindings and the TPM counters surviving a restart, a bound node that says it has
no TPM refused (tpm_missing), and the table bounded (capacity)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import InvalidParameters
from agent.gateway.verifier.attest import Status, Verdict, Verifier, load_certificates
from agent.gateway.verifier.join import JoinAttestation
from agent.gateway.verifier.policy import Policy
from agent.gateway.verifier.state import NodeStates
from agent.proto import session_pb2
from tests.gateway.test_attest import PROFILE, Node, policy_doc, refused
from tests.runtime.harness import ROOT
from tests.tpmsim import UEFI_BOOT, Ev, SimTpm, ev, manufactured_tpm, other_sim, sim

__all__ = ["manufactured_tpm", "other_sim", "sim"]


def verifier_for(tmp_path: Path, *sims: SimTpm, states: NodeStates | None = None) -> Verifier:
    if not (tmp_path / "policy.json").exists():  # a restart reads the policy it learned into
        (tmp_path / "policy.json").write_text(json.dumps(policy_doc()))
    roots = load_certificates([p for s in sims for p in (s.ca_root, s.ca_issuer)])
    return Verifier(Policy.load(tmp_path / "policy.json"), ek_roots=roots, states=states)


def at_challenge(verifier: Verifier, node: Node) -> Verdict:
    out = verifier.try_challenge(node.node_id, node.identity())
    assert isinstance(out, Verdict), f"challenged: {out}"
    return out


def two_tpms(sim: SimTpm, other_sim: SimTpm, tmp_path: Path) -> tuple[Node, Node]:
    """TPM A (sim) and TPM B (other_sim), each measured as firmware would; node ids set per use."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Node(sim, tmp_path / "a"), Node(other_sim, tmp_path / "b", node_key=bytes(32))
    a.boot()
    b.boot()
    return a, b


def as_node(node: Node, node_id: str) -> Node:
    return Node(node.sim, node.root, node_id=node_id, boot_id=node.boot_id, node_key=node.node_key)


def test_one_tpm_vouches_for_one_node(sim: SimTpm, other_sim: SimTpm, tmp_path: Path) -> None:
    """node-1 attested with TPM A attested again with TPM B of the same maker, and one TPM could
    answer for two nodes. Now the first attestation binds the EK to the node."""
    verifier = verifier_for(tmp_path, sim, other_sim)
    a, b = two_tpms(sim, other_sim, tmp_path)
    assert as_node(a, "node-1").join(verifier).attested
    assert as_node(b, "node-2").join(verifier).attested
    refused(at_challenge(verifier, as_node(b, "node-1")), "ek_changed")  # node-1 with another TPM
    refused(at_challenge(verifier, as_node(a, "node-3")), "ek_in_use")   # node-1's TPM for another node
    refused(at_challenge(verifier, as_node(b, "node-3")), "ek_in_use")
    # The race: both challenged before either attested; the second to attest is refused.
    verifier.reenroll("node-1")  # A is free, and node-4 and node-5 both want it
    n4, n5 = as_node(a, "node-4"), as_node(a, "node-5")
    ch4 = verifier.challenge("node-4", n4.identity())
    ch5 = verifier.challenge("node-5", n5.identity())
    assert verifier.verify(ch4, n4.answer(ch4), boot_id=n4.boot_id, node_public=n4.node_key).attested
    refused(verifier.verify(ch5, n5.answer(ch5), boot_id=n5.boot_id, node_public=n5.node_key), "ek_in_use")
    assert verifier.bound("node-4") and not verifier.bound("node-5")


def test_a_replaced_tpm_is_enrolled_again_by_an_operator(sim: SimTpm, other_sim: SimTpm,
                                                         tmp_path: Path) -> None:
    verifier = verifier_for(tmp_path, sim, other_sim)
    a, b = two_tpms(sim, other_sim, tmp_path)
    assert as_node(a, "node-1").join(verifier).attested
    refused(at_challenge(verifier, as_node(b, "node-1")), "ek_changed")
    kept = verifier.reenroll("node-1")
    assert kept is not None and kept.counters is not None
    verdict = as_node(b, "node-1").join(verifier)  # TPM B: its counters are its own, not A's
    assert verdict.attested, verdict
    refused(at_challenge(verifier, as_node(a, "node-1")), "ek_changed")  # and A is no longer node-1's
    assert as_node(a, "node-2").join(verifier).attested


def test_an_ek_pinned_to_a_node_is_no_other_node_s(sim: SimTpm, tmp_path: Path) -> None:
    node = Node(sim, tmp_path)
    node.boot()
    verifier = verifier_for(tmp_path, sim)
    verifier.pinned_ek["node-1"] = hashlib.sha256(node.identity().ek_public).digest()  # enrolled
    refused(at_challenge(verifier, as_node(node, "node-2")), "ek_in_use")
    assert node.join(verifier).attested


def test_bindings_and_counters_survive_a_restart_and_a_bound_node_cannot_say_it_has_no_tpm(
        sim: SimTpm, other_sim: SimTpm, tmp_path: Path) -> None:
    """A restart of the gateway forgot every binding and counter: TPM rollback reopened, any EK
    taken. Now they are kept in the state folder, written atomically."""
    folder = tmp_path / "state"
    a, b = two_tpms(sim, other_sim, tmp_path)
    node = as_node(a, "node-1")
    sim.stop()
    shutil.copytree(sim.state, tmp_path / "snapshot")  # TPM A as it is now
    for _ in range(2):  # two boots: the TPM's reset count goes up twice
        sim.stop()
        sim.start()
        node.boot()
        assert node.join(verifier_for(tmp_path, sim, other_sim, states=NodeStates(folder))).attested
    assert oct((folder).stat().st_mode & 0o777) == "0o700"
    files = list(folder.glob("*.json"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    assert not list(folder.glob(".*.tmp"))

    restarted = verifier_for(tmp_path, sim, other_sim, states=NodeStates(folder))  # the gateway restarted
    refused(at_challenge(restarted, as_node(b, "node-1")), "ek_changed")
    refused(at_challenge(restarted, as_node(a, "node-9")), "ek_in_use")
    joins = JoinAttestation(restarted)
    for tpm in (session_pb2.TpmIdentity(absent="no TPM: disabled by the setting bc.tpm=none"),
                session_pb2.TpmIdentity(error="TPM_RC_FAILURE"), None):
        hello = session_pb2.Hello(node_id="node-1", boot_id="b", public_key=bytes(32), tpm=tpm)
        v = joins.on_hello("node-1", hello).attest_verdict
        assert (v.status, v.check) == ("refused", "tpm_missing"), v
    no_tpm = session_pb2.TpmIdentity(absent="no TPM")
    v = joins.on_hello("node-7", session_pb2.Hello(node_id="node-7", boot_id="b", public_key=bytes(32),
                                                   tpm=no_tpm)).attest_verdict
    assert v.status == "unattested"  # no TPM bound to node-7: its word stands

    sim.stop()  # TPM A rolled back to before that quote: one reset fewer
    shutil.rmtree(sim.state)
    shutil.copytree(tmp_path / "snapshot", sim.state)
    sim.start()
    node.boot()
    refused(node.join(restarted), "counters")


def test_agent_gateway_reenroll_forgets_the_node_s_tpm(sim: SimTpm, other_sim: SimTpm,
                                                       tmp_path: Path) -> None:
    folder = tmp_path / "state"
    a, b = two_tpms(sim, other_sim, tmp_path)
    running = verifier_for(tmp_path, sim, other_sim, states=NodeStates(folder))
    assert as_node(a, "node-1").join(running).attested
    out = subprocess.run([sys.executable, "-m", "agent", "gateway", "reenroll", "--attest-state", str(folder),
                          "node-1"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "node-1: EK " in out.stdout and "forgotten" in out.stdout
    assert not list(folder.glob("*.json"))
    verdict = as_node(b, "node-1").join(running)  # the running gateway sees it: the new TPM binds
    assert verdict.attested, verdict
    bad = subprocess.run([sys.executable, "-m", "agent", "gateway", "reenroll", "--attest-state",
                          str(tmp_path / "nowhere"), "node-1"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "no such folder" in bad.stderr


def test_the_table_is_bounded_and_a_state_file_it_cannot_read_fails_closed(sim: SimTpm, other_sim: SimTpm,
                                                                           tmp_path: Path) -> None:
    """The per-node table had no cap (issue 50): past it a new node is refused, named, and no
    node's binding or counters are forgotten to make room."""
    a, b = two_tpms(sim, other_sim, tmp_path)
    verifier = verifier_for(tmp_path, sim, other_sim, states=NodeStates(tmp_path / "state", max_nodes=1))
    assert as_node(a, "node-1").join(verifier).attested
    refused(at_challenge(verifier, as_node(b, "node-2")), "capacity")
    assert as_node(a, "node-1").join(verifier).attested  # the node it holds goes on
    [path] = (tmp_path / "state").glob("*.json")
    path.write_text("{not json")
    v = at_challenge(verifier, as_node(a, "node-1"))
    assert (v.status, v.check) == (Status.REFUSED, "verifier") and "not JSON" in v.reason, v


REFLASHED = [ev(0, Ev.S_CRTM_VERSION, "9.9".encode("utf-16-le") + b"\0\0"), *UEFI_BOOT[1:]]


def test_a_profile_is_not_learned_because_a_dmi_string_changed(sim: SimTpm, other_sim: SimTpm,
                                                              tmp_path: Path) -> None:
    """Profiles were keyed by the DMI strings the node reports: reflashed firmware that reports
    another BIOS version was learned as a new profile and attested (``"learn": "first"``). Now a
    node is held to the profile it attested under, and learns only in a window an operator opens
    for it; a PCR 0 change under its profile is refused until an operator accepts it."""
    folder = tmp_path / "state"
    verifier = verifier_for(tmp_path, sim, other_sim, states=NodeStates(folder))
    a, b = two_tpms(sim, other_sim, tmp_path)
    node = as_node(a, "node-1")
    assert node.join(verifier).matched["learned"] == "pcr0,pcr2,pcr7"
    sim.restart()  # reflashed: another firmware, its DMI saying another BIOS version
    node.boot(REFLASHED)
    node.profile = PROFILE.rsplit("|", 1)[0] + "|9.9"
    verdict = node.join(verifier)
    refused(verdict, "policy_profile")
    assert "DMI string changed" in verdict.reason
    node.profile = PROFILE  # the new firmware under the old DMI strings: the node's PCR 0 changed
    refused(node.join(verifier), "firmware_changed")
    out = subprocess.run([sys.executable, "-m", "agent", "gateway", "accept", "--attest-state", str(folder),
                          "node-1"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "node-1: its next attested join may learn" in out.stdout, out.stderr
    accepted = node.join(verifier)  # the operator accepted the firmware update
    assert accepted.attested and "accepted by an operator" in accepted.matched["learned"], accepted
    again = node.join(verifier)
    assert again.attested and "learned" not in again.matched  # the window closed with that join
    node.profile = PROFILE.rsplit("|", 1)[0] + "|9.9"
    refused(node.join(verifier), "policy_profile")
    newcomer = as_node(b, "node-2")  # a node's first attestation still learns (trust on first use)
    newcomer.profile = "Maker|Board|1.0"
    assert newcomer.join(verifier).matched["learned"] == "pcr0,pcr2,pcr7"


def test_a_profile_is_named_by_the_sites_bmc_inventory_and_the_ek_maker_not_the_dmi(
        sim: SimTpm, other_sim: SimTpm, tmp_path: Path) -> None:
    """A profile was named by the DMI strings the node reports. Where the site reported the
    node's BMC inventory (bmc.query), the profile is the BMC's maker, model and BIOS version and
    the EK certificate's anchor: what the node says of itself changes nothing, and what the BMC
    says changed is refused until a window opens."""
    verifier = verifier_for(tmp_path, sim, other_sim, states=NodeStates(tmp_path / "state"))
    a, _ = two_tpms(sim, other_sim, tmp_path)
    node = as_node(a, "node-1")
    verifier.site_inventory("node-1", "Maker", "Board", "1.0")
    first = node.join(verifier)
    assert first.attested and first.matched["learned"] == "pcr0,pcr2,pcr7", first
    assert first.matched["profile"].startswith("bmc:Maker|Board|1.0|ek:CN=swtpm-localca"), first.matched
    node.profile = "Other|Thing|9.9"  # the node's DMI says something else: it is not the profile
    again = node.join(verifier)
    assert again.attested and again.matched["profile"] == first.matched["profile"], again
    verifier.site_inventory("node-1", "Maker", "Board", "9.9")  # the BMC reads another BIOS version
    verdict = node.join(verifier)
    refused(verdict, "policy_profile")
    assert "the site's BMC inventory" in verdict.reason


def test_a_firmware_update_the_site_made_opens_the_node_s_window_for_its_next_boot(
        sim: SimTpm, other_sim: SimTpm, tmp_path: Path) -> None:
    """A PCR 0 change under a known profile was refused until an operator accepted it. Now the
    site's own firmware update ("site updated node-1's firmware to set S") is recorded with the
    node and opens its window for the boot after it only: a join still before the update does
    not close it, the next boot learns, the one after is held again. Both ways: a change the site
    did not make is refused (``firmware_changed``), back to the original build too (the profile
    knows it, the node moved); the site putting the original set back opens the window again."""
    folder = tmp_path / "state"
    verifier = verifier_for(tmp_path, sim, other_sim, states=NodeStates(folder))
    a, _ = two_tpms(sim, other_sim, tmp_path)
    node = as_node(a, "node-1")
    assert node.join(verifier).attested
    state = verifier.site_updated_firmware("node-1", "fwset-2026-12")
    assert state.accept and state.accept_by == "site: firmware set fwset-2026-12"
    kept = NodeStates(folder).get("node-1")  # recorded on disk, as the bindings are
    assert kept is not None and kept.accept and kept.accept_by == state.accept_by
    before = node.join(verifier)  # the same boot, before the node restarted into the new firmware
    assert before.attested and "learned" not in before.matched, before
    sim.restart(orderly=True)  # a reboot
    node.boot(REFLASHED)
    updated = node.join(verifier)
    assert updated.attested and updated.matched["accepted_by"] == "site: firmware set fwset-2026-12", updated
    assert updated.matched["learned"].startswith("pcr0,pcr2,pcr7")
    kept = NodeStates(folder).get("node-1")
    assert kept is not None and not kept.accept  # the window closed with that boot
    sim.restart(orderly=True)  # a reboot
    node.boot([ev(0, Ev.S_CRTM_VERSION, "7.7".encode("utf-16-le") + b"\0\0"), *UEFI_BOOT[1:]])
    refused(node.join(verifier), "firmware_changed")  # a change the site did not report is refused
    # The other way: back to the original build, which the profile still accepts; behind the
    # site's back it is a change of the node's firmware all the same (a downgrade), refused.
    sim.restart(orderly=True)  # a reboot
    node.boot()
    back = node.join(verifier)
    refused(back, "firmware_changed")
    assert "no window is open" in back.reason
    verifier.site_updated_firmware("node-1", "fwset-2026-11")  # the site puts the old set back
    sim.restart(orderly=True)  # a reboot
    node.boot()
    restored = node.join(verifier)
    assert restored.attested, restored
    assert restored.matched["accepted_by"] == "site: firmware set fwset-2026-11", restored
    assert "learned" not in restored.matched and " -> " in restored.matched["firmware"], restored
    sim.restart(orderly=True)  # a reboot
    node.boot(REFLASHED)  # and the update's build again, now behind the site's back: refused
    refused(node.join(verifier), "firmware_changed")
    with pytest.raises(InvalidParameters):
        verifier.site_updated_firmware("node-1", "")
