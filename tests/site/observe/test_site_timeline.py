"""The timelines fed by the running site's own parts: boot.prepareRamdisk and boot.cleanUp
through their handlers, the HTTP service serving the scripts, kernel and initrd (bytes and
times), a digest refused; late boots named by the site's timer; and /metrics (attempts,
failures by cause, phase durations, command durations through an Agent)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.catalog import Role
from agent.commands import handler_for
from agent.errors import ChecksumMismatch
from agent.proto import session_pb2, site_pb2
from agent.site.observe.timeline import Step
from agent.site.services import ServiceSettings, SiteServices
from tests.loopback_http import LoopbackServer
from tests.runtime.core_harness import World, accepted
from tests.site.boot.test_pxe import cleanup, entry, fetch, prepare, sha256

MAC = "52:54:00:12:34:56"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteServices]:
    services = SiteServices(ServiceSettings(
        address="127.0.0.1", port=0, root=tmp_path / "site", upstreams=("127.0.0.1",),
        secrets_dir=tmp_path / "secrets", cause_waits=(("no_initrd", 1.0),)))
    services.start()
    yield services
    services.stop()


def kernel_entry(upstream: LoopbackServer, *, initrd_digest: str = "") -> site_pb2.ProxyDhcpEntry:
    return entry(ipxe_script_url="", kernel_url=upstream.url("/vmlinuz"),
                 initrd_url=upstream.url("/initrd"), kernel_cmdline="console=ttyS0",
                 kernel_digest={"hex": sha256(b"K" * 1000)},
                 initrd_digest={"hex": initrd_digest or sha256(b"I" * 3000)})


def test_a_pxe_boot_seen_by_the_site_and_a_late_initrd_named(site: SiteServices) -> None:
    with LoopbackServer() as upstream:
        upstream.add("/vmlinuz", b"K" * 1000)
        upstream.add("/initrd", b"I" * 3000)
        prepare(site, kernel_entry(upstream))
    k = sha256(b"K" * 1000)
    assert fetch(f"{site.base_url}/boot.ipxe")[0] == 200
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")[0] == 200
    assert fetch(f"{site.base_url}/cache/{k}") == (200, b"K" * 1000)
    # each fetch is told after its answer went out: wait for the last
    deadline = time.monotonic() + 10
    while len(getattr(site.observe.timelines.last("n1"), "events", ())) < 4:
        assert time.monotonic() < deadline, site.observe.timelines.last("n1")
        time.sleep(0.05)
    a = site.observe.timelines.last("n1")
    assert a is not None
    assert [e.step for e in a.events] == ["prepared", "chain_script", "node_script", "kernel"]
    kernel = a.events[-1]
    assert (kernel.status, kernel.bytes) == (200, 1000) and kernel.seconds >= 0
    # no initrd: the site's timer names it once the rule's wait (1 s here) has passed
    deadline = time.monotonic() + 10
    while site.observe.timelines.last("n1").cause != "no_initrd":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no cause named"
        time.sleep(0.2)
    assert site.metrics.value("boot_failures_total", cause="no_initrd") == 1
    assert 'bettercompute_site_boot_failures_total{cause="no_initrd"} 1' in site.metrics.render()
    # clean-up ends it, and the next prepare is a new attempt
    cleanup(site, "n1")
    with LoopbackServer() as upstream:
        upstream.add("/vmlinuz", b"K" * 1000)
        upstream.add("/initrd", b"I" * 3000)
        prepare(site, kernel_entry(upstream))
    attempts = site.observe.timelines.attempts("n1")
    assert [a.number for a in attempts] == [1, 2] and attempts[0].events[-1].step == "cleaned"


def test_a_digest_refused_is_the_attempts_cause(site: SiteServices) -> None:
    with LoopbackServer() as upstream:
        upstream.add("/vmlinuz", b"K" * 1000)
        upstream.add("/initrd", b"corrupt")
        with pytest.raises(ChecksumMismatch):
            prepare(site, kernel_entry(upstream))
    a = site.observe.timelines.last("n1")
    assert a is not None and a.cause == "digest_refused"
    assert [e.step for e in a.events] == ["digest_refused"]


def test_a_joined_boot_gives_its_phase_durations(site: SiteServices) -> None:
    obs = site.observe
    tl = obs.timelines
    tl.power("n9", "on")
    tl.console("n9", Step.KERNEL_STARTED, "Linux version 6.1")
    tl.console("n9", Step.JOINED, "connected to gateway")
    text = site.metrics.render()
    assert 'bettercompute_site_boot_phase_seconds_count{phase="power_to_join"} 1' in text
    assert 'bettercompute_site_boot_phase_seconds_bucket{le="+Inf",phase="kernel_to_join"} 1' in text
    assert "bettercompute_site_boot_attempts_total 1" in text


def test_command_durations_by_kind_and_result(tmp_path: Path, site: SiteServices) -> None:
    """Every command the site's Agent finishes is one observation of its kind and result."""
    (tmp_path / "world").mkdir()
    world = World(tmp_path / "world")
    handler = handler_for("boot.cleanUp")
    assert handler is not None
    agent, frames = world.agent({"boot.cleanUp": handler}, role=Role.SITE, site=site)
    try:
        accepted(agent.submit(world.command("c1", "boot.cleanUp",
                                            site_pb2.BootCleanUpRequest(node_id="n1"))))
        assert frames.result("c1").status == session_pb2.SUCCEEDED
    finally:
        agent.stop(timeout=5)
    name = "bettercompute_command_duration_seconds"
    assert site.metrics.count(name, kind="boot.cleanUp", result="succeeded") == 1
    text = site.metrics.render()
    assert f"# TYPE {name} histogram" in text
    assert f'{name}_count{{kind="boot.cleanUp",result="succeeded"}} 1' in text


def test_a_power_on_that_fails_ends_its_attempt(sim: object, site_config: object, site: SiteServices) -> None:
    """bmc.power on through the real handler against ipmi_sim whose node cannot start (no
    kernel): the attempt began when the command was sent, and ends with why it failed."""
    from agent.commands.base import Context
    from agent.config import Config
    from agent.errors import AgentError
    from qemu.ipmisim import IpmiSim
    from tests.site.conftest import REF

    assert isinstance(sim, IpmiSim) and isinstance(site_config, Config)
    handler = handler_for("bmc.power")
    assert handler is not None
    params = handler.parse(site_pb2.BmcOperationRequest(
        node_id="n1", bmc_address=sim.address, protocol="ipmi", operation="on", credentials_ref=REF))
    with pytest.raises(AgentError):
        handler.run(Context.local("bmc.power", site_config, site=site, timeout=8), params)
    a = site.observe.timelines.last("n1")
    assert a is not None and a.trigger == "bmc.power on"
    steps = [e.step for e in a.events]
    assert "power_on" in steps and steps[-1] == "power_off", steps
    assert a.events[-1].detail.startswith("bmc.power on failed"), a.events[-1]
    assert a.outcome == "ended"


def test_a_missing_kernel_is_named_at_its_404(site: SiteServices) -> None:
    """The kernel the node's script names is gone from the site's store: its fetch is answered
    404, and the attempt is named no_kernel at once, with the status."""
    with LoopbackServer() as upstream:
        upstream.add("/vmlinuz", b"K" * 1000)
        upstream.add("/initrd", b"I" * 3000)
        prepare(site, kernel_entry(upstream))
    k = sha256(b"K" * 1000)
    (site.store.root / k).unlink()
    assert fetch(f"{site.base_url}/pxe/52-54-00-12-34-56.ipxe")[0] == 200
    assert fetch(f"{site.base_url}/cache/{k}")[0] == 404
    deadline = time.monotonic() + 10
    while getattr(site.observe.timelines.last("n1"), "cause", "") != "no_kernel":
        assert time.monotonic() < deadline, site.observe.timelines.last("n1")
        time.sleep(0.05)
    a = site.observe.timelines.last("n1")
    assert a is not None and "404" in a.cause_detail
