"""The golden states of tests/site/bmc/golden/, captured by the tool itself: ``bmc.query golden``
through its handler, on each recorded tree through the project's Redfish emulator and on
ipmi_sim, written as the capture's JSON (agent/policy/release/golden.py's ``Capture``).

    python -m tests.site.bmc.golden_capture [TREE ...]     # every tree and both ipmi_sims by default

Run it again only when a recording, the emulator or the collector changes what is read, and
review the diff of the fixtures as an operator reviews a profile's new golden state
(docs/lifecycle.md, "The BMC's golden state"). test_bmc_golden diffs a fresh capture of each
against its file: zero findings.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.commands import handler_for
from agent.commands.base import Context
from agent.config import Config
from agent.policy.release.golden import Capture
from agent.proto import agent_pb2, site_pb2
from tests.site.bmc.redfish_emulator import PASSWORD, USER, RedfishEmulator, tree_names
from tests.site.bmc.test_bmc_redfish import REF, config_with

FIXTURES = Path(__file__).resolve().parent / "golden"
RULES = FIXTURES / "rules.json"
IPMI_SIM = "ipmi_sim"
IPMI_SIM_TWO_LANS = "ipmi_sim_two_lans"     # ipmi_sim with a second LAN channel (2)
SIMS = {IPMI_SIM: (), IPMI_SIM_TWO_LANS: (2,)}


def request(address: str, operation: str, over: str = "redfish", ref: str = REF,
            golden: bytes = b"", **parameters: str) -> site_pb2.BmcOperationRequest:
    """A request of ``operation`` to the BMC at ``address`` over ``over`` (redfish, ipmi); with
    ``golden``, bmc.query baseline's expect.golden (that capture and RULES)."""
    payload = site_pb2.BmcOperationRequest(node_id="n1", bmc_address=address, protocol=over,
                                           operation=operation, credentials_ref=ref, verify_tls=False,
                                           parameters=parameters)
    if golden:
        payload.expect.golden.CopyFrom(agent_pb2.GoldenState(profile="test", capture=golden,
                                                             rules=RULES.read_bytes()))
    return payload


def run(kind: str, config: Config, payload: site_pb2.BmcOperationRequest) -> site_pb2.BmcOperationResult:
    handler = handler_for(kind)
    assert handler is not None
    result = handler.run(Context.local(kind, config, timeout=120), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


def capture(config: Config, address: str, protocol: str = "redfish", ref: str = REF) -> Capture:
    """bmc.query golden through its handler: the capture it answers."""
    result = run("bmc.query", config, request(address, "golden", protocol, ref))
    return Capture.from_json(result.values["capture"])


@contextmanager
def _ipmi_sim(workdir: Path, more_lans: tuple[int, ...] = ()) -> Iterator[tuple[str, Config]]:
    from agent.catalog import Role
    from agent.site.bmc.client import Credentials
    from agent.site.bmc.secrets import SecretStore
    from qemu.ipmisim import start_ipmi_sim
    from qemu.powered import NodeSpec, PoweredNode
    from tests.site.conftest import PASSWORD as SIM_PASSWORD
    from tests.site.conftest import REF as SIM_REF
    from tests.site.conftest import USERNAME

    node = PoweredNode(workdir / "node").configure(
        NodeSpec(kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid()))
    sim = start_ipmi_sim(workdir / "ipmi", node, USERNAME, SIM_PASSWORD, more_lans=more_lans)
    store = SecretStore(workdir / "sim-secrets")
    store.put(SIM_REF, Credentials(USERNAME, SIM_PASSWORD))
    try:
        yield sim.address, Config(role=Role.SITE, node_id="site-1", state_dir=workdir / "sim-state",
                                  secrets_dir=store.root)
    finally:
        sim.stop()


def main(names: list[str]) -> int:
    from tests.site.conftest import REF as SIM_REF

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = config_with(work, USER, PASSWORD)
        for name in names or [*tree_names(), *SIMS]:
            if name in SIMS:
                with _ipmi_sim(work / name, SIMS[name]) as (address, sim_config):
                    got = capture(sim_config, address, "ipmi", SIM_REF)
            else:
                with RedfishEmulator.of(name, work / "trees") as bmc:
                    got = capture(config, bmc.address)
            (FIXTURES / f"{name}.json").write_bytes(got.to_json())
            print(name, {s: len(v) for s, v in got.sources.items()}, dict(got.unreadable))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
