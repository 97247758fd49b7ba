"""The kept console over SSH, against a real SSH server: Debian's OpenSSH sshd per BMC on
loopback, in a mount namespace of its own, with each vendor's personality as data
(tests/site/observe/sshbmc.py) and a ForceCommand bridging to the node's serial port (a UNIX
socket the test writes a scripted boot to). The site's side is the real one: agent/site/observe
(Consoles, SshSession) running OpenSSH's ssh through agent/proc.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.errors import InvalidParameters
from agent.site.bmc.client import Credentials
from agent.site.bmc.redfish.vendors import GENERIC, VENDORS
from agent.site.bmc.secrets import SecretStore
from agent.site.observe import sshconsole
from agent.site.observe.console import Bmc
from agent.site.observe.observer import Observer, ObserverSettings
from agent.site.observe.sshconsole import SshConsole, choose, exit_keys
from agent.site.observe.timeline import Prepared
from tests.site.observe.observing import consoles_of, kept, power_on, steps, wait_for
from tests.site.observe.sshbmc import PERSONALITIES, Node, SshBmc, need
from tests.site.test_site_agent import ArgvWatcher

PASSWORD, REF, MAC = "Ssh-Pass-4kR9vQ2z", "rack1-n01", "52:54:00:00:00:01"
ROWS = {"openbmc": GENERIC, "supermicro": VENDORS["supermicro"], "dell": VENDORS["dell"],
        "hpe": VENDORS["hpe"], "lenovo": VENDORS["lenovo"]}
# What the recordings publish (../shared/vendor-trees, each System's SerialConsole).
OPENBMC_SYSTEM = {"SerialConsole": {"IPMI": {"ServiceEnabled": True}, "MaxConcurrentSessions": 15,
                                    "SSH": {"HotKeySequenceDisplay": "Press ~. to exit console",
                                            "Port": 2200, "ServiceEnabled": True}}}
SUPERMICRO_SYSTEM = {"SerialConsole": {"MaxConcurrentSessions": 1, "SSH": {
    "ServiceEnabled": True, "Port": 22, "SharedWithManagerCLI": True,
    "ConsoleEntryCommand": "cd system1/sol1; start",
    "HotKeySequenceDisplay": "press <Enter>, <Esc>, and then <T> to terminate session"}}}
SYSTEMS = {"openbmc": OPENBMC_SYSTEM, "supermicro": SUPERMICRO_SYSTEM}
BOOT = ("SeaBIOS (version 1.16.2)", "iPXE initialising devices...",
        "[    0.000000] Linux version 6.1.0-28-cloud-amd64",
        "[    2.1] Kernel panic - not syncing: VFS: Unable to mount root fs")


# -- where the console is, from what the BMC says -------------------------------------------------


def test_the_console_is_chosen_from_serial_console_then_the_vendor_row() -> None:
    gh = choose(OPENBMC_SYSTEM, VENDORS["bmcweb"])
    assert gh == SshConsole(port=2200, entry="", exit="\r~.", sessions=15, source="SerialConsole.SSH")
    smc = choose(SUPERMICRO_SYSTEM, VENDORS["supermicro"])
    assert smc is not None and (smc.port, smc.entry, smc.exit, smc.sessions) == \
        (22, "cd system1/sol1; start", "\r\x1bT", 1)
    # no SerialConsole.SSH (iDRAC, iLO, XCC): the row's entry command on the manager's SSH port
    ilo = choose({"SerialConsole": {"SSH": {"ServiceEnabled": False}}}, VENDORS["hpe"],
                 {"SSH": {"Port": 2222, "ProtocolEnabled": True}, "IPMI": {"ProtocolEnabled": False}})
    assert ilo is not None and (ilo.port, ilo.entry, ilo.exit) == (2222, "vsp", "\x1b(")
    assert ilo.source == "vendor row hpe" and ilo.busy
    assert choose({}, VENDORS["dell"]) == SshConsole(22, "console com2", "\x1c", 1, (), "vendor row dell")
    # SSH off at the manager, or a vendor with no row and nothing published: no SSH console
    assert choose({}, VENDORS["lenovo"], {"SSH": {"ProtocolEnabled": False}}) is None
    assert choose({}, GENERIC) is None and choose({}, VENDORS["ami"]) is None
    assert exit_keys("Press ~.  - terminate connection") == "\r~." and exit_keys("anything") == ""
    # the plan travels in the Bmc record (sessions.json, bmcs.json) and comes back the same
    assert SshConsole.decode(ilo.encode()) == ilo
    assert json.loads(json.dumps(dataclasses.asdict(Bmc("h", "redfish", REF, ilo.encode())))) \
        ["console"] == ilo.encode()
    # what the site types must be one printable line: a BMC publishing more gets no SSH console
    sneaky = {"SerialConsole": {"SSH": {"ServiceEnabled": True, "Port": 22,
                                        "ConsoleEntryCommand": "start\rdelete user 2"}}}
    assert choose(sneaky, VENDORS["supermicro"]) is None
    with pytest.raises(InvalidParameters):
        SshConsole.decode(json.dumps({"port": 22, "entry": "a\x1bb"}))
    with pytest.raises(InvalidParameters):
        SshConsole.decode(json.dumps({"port": 0}))


def test_a_damaged_console_record_is_said_not_fatal(tmp_path: Path) -> None:
    """sessions.json with an SSH console's plan that no longer reads: the daemon starts, the
    node's console is said ``no console`` with why, nothing is tried."""
    root = tmp_path / "observe" / "console"
    root.mkdir(parents=True)
    (root / "sessions.json").write_text(json.dumps({"n1": {
        "address": "127.0.0.1", "protocol": "redfish", "credentials_ref": REF, "console": "{not json"}}))
    obs = observer(tmp_path, tmp_path / "secrets")
    try:
        wait_for("the word", lambda: obs.consoles.state("n1") == "no console")
        assert kept(obs)[-1].startswith("[site: console no console: an SSH console's plan is unreadable")
    finally:
        obs.stop()


# -- against sshd ----------------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    need()
    n = Node(tmp_path / "serial.sock")
    yield n
    n.close()


def store_with(tmp_path: Path, user: str, password: str = PASSWORD) -> Path:
    store = SecretStore(tmp_path / "secrets")
    store.put(REF, Credentials(user, password))
    return store.root


def lab(tmp_path: Path, name: str, node: Node, *, idle: float = 0.0) -> SshBmc:
    bmc = SshBmc(tmp_path / f"bmc-{name}", PERSONALITIES[name], node.path, PASSWORD, idle=idle)
    bmc.start()
    return bmc


def plan_for(name: str, bmc: SshBmc) -> Bmc:
    """The site's record of the BMC: the plan ``choose`` makes from what it publishes (the
    recordings' SerialConsole) or its vendor row, on the lab's port."""
    plan = choose(SYSTEMS.get(name, {}), ROWS[name], {"SSH": {"Port": bmc.port, "ProtocolEnabled": True}})
    assert plan is not None
    return Bmc("127.0.0.1:443", "redfish", REF, dataclasses.replace(plan, port=bmc.port).encode())


def observer(tmp_path: Path, secrets: Path) -> Observer:
    obs = Observer(ObserverSettings(tmp_path / "observe", secrets))
    obs.start()
    return obs


def every_process() -> list[tuple[bytes, bytes]]:
    """Each process's command line and environment, read now."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found.append((Path(f"/proc/{pid}/cmdline").read_bytes(),
                              Path(f"/proc/{pid}/environ").read_bytes()))
            except OSError:
                continue
    return found


def heard_by(node: Node, n: int = 1) -> Callable[[], bool]:
    return lambda: len(node.conns) >= n


@pytest.mark.parametrize("name", sorted(PERSONALITIES))
def test_each_vendors_console_over_ssh_gives_the_milestones_and_the_cause(
        tmp_path: Path, node: Node, name: str) -> None:
    """Each personality's console, entered as its BMC documents, carries a boot to the
    timeline: the milestones and the cause (the boot-diagnosis rules) as over SOL; the password
    in no process's argv or environment; the host key pinned; leaving frees the console."""
    bmc = lab(tmp_path, name, node)
    secrets = store_with(tmp_path, PERSONALITIES[name].user)
    obs = observer(tmp_path, secrets)
    record = plan_for(name, bmc)
    try:
        with ArgvWatcher() as argv:
            obs.prepared("n1", Prepared("pxe", MAC, time.time() + 3600))
            power_on(obs, "n1", record)
            wait_for("the SSH console", lambda: obs.consoles.state("n1") == "attached")
            wait_for("the console entered", heard_by(node))
            live = every_process()         # ssh, sshd's children, the bridge: as they run now
            node.say(*BOOT)
            wait_for("the panic", lambda: "panic" in steps(obs))
        assert steps(obs) == ["prepared", "console", "power_on", "firmware", "boot_loader",
                              "kernel_started", "panic"]
        obs.tick()
        a = obs.timelines.last("n1")
        assert a is not None and a.cause == "kernel_panic"
        assert BOOT[-1] in kept(obs) and kept(obs)[0].startswith("[site: console attached: over SSH")
        assert any(c.startswith(b"ssh\x00-F\x00/dev/null") for c, _ in live)
        for seen in [*argv.seen.values(), *(c for c, _ in live), *(e for _, e in live)]:
            assert PASSWORD.encode() not in seen
        pinned = SecretStore(secrets).known_hosts(record.address)
        assert stat.S_IMODE(pinned.parent.stat().st_mode) == 0o700
        assert bmc.host_key.with_suffix(".pub").read_text().split()[1] in pinned.read_text()
        # boot.cleanUp keeps it; letting it go, the exit keys leave the console, its slot is
        # free again
        obs.cleaned("n1")
        assert obs.consoles.state("n1") == "attached"
        obs.consoles.detach("n1")
        assert obs.consoles.state("n1") == "not kept" and "released" in consoles_of(obs)
        wait_for("the BMC's session to end", lambda: not node.say("after"))
    finally:
        obs.stop()
        bmc.stop()


def test_a_console_is_kept_from_the_first_contact_across_boots_and_power_cycles(
        tmp_path: Path, node: Node) -> None:
    """The site's first command on the BMC (a bmc.query naming the node) attaches the node's
    console over SSH, with no boot under way; one session then keeps it across a power on, a
    boot.cleanUp, a power off and on: everything the node wrote since is in its history, in
    order, and the milestones of each boot reach the timeline."""
    bmc = lab(tmp_path, "openbmc", node)
    obs = observer(tmp_path, store_with(tmp_path, "root"))
    record = plan_for("openbmc", bmc)
    try:
        obs.bmc_done("n1", record, "bmc.query", "inventory")
        wait_for("the console, at first contact", heard_by(node))
        assert obs.consoles.state("n1") == "attached"
        session = obs.consoles._sessions["n1"]
        node.say("a node already running")
        power_on(obs, "n1", record)
        node.say(*BOOT[:3])
        obs.cleaned("n1")
        obs.bmc_done("n1", record, "bmc.power", "off")
        node.say("while powered off, the BMC still listening")
        power_on(obs, "n1", record)
        node.say(*BOOT)
        wait_for("the second boot's panic", lambda: "panic" in steps(obs))
        assert obs.consoles._sessions["n1"] is session and session.connects == 1
        assert len(node.conns) == 1 and obs.consoles.state("n1") == "attached"
        said = ["a node already running", *BOOT[:3], "while powered off, the BMC still listening", *BOOT]
        history = obs.consoles.history
        assert history is not None
        stored = [t for _, t in history.read("n1") if not t.startswith("[site:")]
        assert stored == said and [t for t in kept(obs) if not t.startswith("[site:")] == said
        states = [e.detail for a in obs.timelines.attempts("n1") for e in a.events if e.step == "console"]
        assert len(states) == 1 and states[0].startswith("attached: over SSH"), states
    finally:
        obs.stop()
        bmc.stop()


def test_a_wrong_password_is_said_and_not_retried(tmp_path: Path, node: Node) -> None:
    bmc = lab(tmp_path, "openbmc", node)
    obs = observer(tmp_path, store_with(tmp_path, "root", "Not-The-Password-1"))
    try:
        obs.consoles.attach("n1", plan_for("openbmc", bmc))
        wait_for("the refusal", lambda: obs.consoles.state("n1") == "auth failed")
        time.sleep(2.0)
        log = (bmc.folder / "sshd.log").read_text()
        assert log.count("Failed password for root") == 1      # one try: a BMC locks accounts
        assert obs.consoles.alive() == 0 and not node.conns
    finally:
        obs.stop()
        bmc.stop()


def test_a_changed_host_key_is_refused_by_name(tmp_path: Path, node: Node) -> None:
    bmc = lab(tmp_path, "openbmc", node)
    secrets = store_with(tmp_path, "root")
    obs = observer(tmp_path, secrets)
    record = plan_for("openbmc", bmc)
    try:
        obs.consoles.attach("n1", record)
        wait_for("the console", lambda: obs.consoles.state("n1") == "attached")
        pinned = SecretStore(secrets).known_hosts(record.address)
        before = pinned.read_text()
        # the "BMC" comes back with another host key (replaced, or someone between)
        bmc.stop()
        bmc.new_host_key()
        bmc.start()
        wait_for("the refusal", lambda: obs.consoles.state("n1") == "host_key_changed")
        assert pinned.read_text() == before                   # never silently accepted
        assert obs.consoles.alive() == 0
        last = kept(obs)[-1]
        assert last.startswith("[site: console host_key_changed") and str(pinned) in last
    finally:
        obs.stop()
        bmc.stop()


def test_a_dropped_connection_is_reconnected(tmp_path: Path, node: Node) -> None:
    bmc = lab(tmp_path, "supermicro", node)
    obs = observer(tmp_path, store_with(tmp_path, "ADMIN"))
    try:
        obs.consoles.attach("n1", plan_for("supermicro", bmc))
        wait_for("the console", heard_by(node))
        node.say("before the drop")
        wait_for("the first line", lambda: "before the drop" in kept(obs))
        bmc.stop()                     # the BMC's SSH server and every session gone at once
        wait_for("the drop", lambda: obs.consoles.state("n1") == "dropped")
        time.sleep(1.5)                # it cannot connect meanwhile: tried again, backing off
        bmc.start()
        wait_for("the reconnection", lambda: obs.consoles.state("n1") == "attached", timeout=45)
        wait_for("the console entered again", lambda: node.say("after the drop") > 0)
        wait_for("the next line", lambda: "after the drop" in kept(obs))
        said = [t for t in kept(obs) if t.startswith("[site: console")]
        assert said[0].startswith("[site: console attached") and "dropped" in said[1]
        assert said[-1].startswith("[site: console attached")
    finally:
        obs.stop()
        bmc.stop()


def test_a_bmc_closing_idle_sessions_is_reconnected_with_nothing_lost(tmp_path: Path, node: Node) -> None:
    """The BMC closes a session with no input after 2 s (the site never types into a node's
    console): reconnected each time; every line the BMC sent is in the ring, in order; what
    the node wrote while no session was up is all that is missing."""
    bmc = lab(tmp_path, "dell", node, idle=2.0)
    obs = observer(tmp_path, store_with(tmp_path, "root"))
    try:
        obs.consoles.attach("n1", plan_for("dell", bmc))
        wait_for("the console", heard_by(node))
        deadline = time.monotonic() + 60
        i = 0
        while time.monotonic() < deadline and len(list(bmc.sent_dir.glob("*.log"))) < 4:
            node.say(f"line {i:05d}")
            i += 1
            time.sleep(0.02)
        last = [t for t in bmc.sent() if t.startswith("line ")][-1]
        wait_for("the last line the BMC sent", lambda: last in kept(obs))
        obs.consoles.detach("n1")
        ring = [t for t in kept(obs) if t.startswith("line ")]
        sent = [t for t in bmc.sent() if t.startswith("line ")]
        missing = [t for t in sent if t not in ring]
        assert sent and ring == sent, missing
        assert len(list(bmc.sent_dir.glob("*.log"))) >= 4         # closed and reconnected
        said = [t for t in kept(obs) if t.startswith("[site: console")]
        assert sum(t.startswith("[site: console dropped") for t in said) >= 3
        assert len(sent) < i                                      # the node's words no session heard
    finally:
        obs.stop()
        bmc.stop()


def test_a_console_taken_by_another_session_is_busy_then_kept(
        tmp_path: Path, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """iLO's one VSP session: a second site's console is refused with iLO's message, said
    busy, never taken over, and kept once the first lets it go."""
    monkeypatch.setattr(sshconsole, "BUSY_RETRY", 1.0)
    bmc = lab(tmp_path, "hpe", node)
    secrets = store_with(tmp_path, "Administrator")
    first = observer(tmp_path / "first", secrets)
    second = observer(tmp_path / "second", secrets)
    record = plan_for("hpe", bmc)
    try:
        first.consoles.attach("n1", record)
        wait_for("the first console", heard_by(node))
        second.consoles.attach("n1", record)
        wait_for("busy", lambda: second.consoles.state("n1") == "busy")
        time.sleep(2.5)                                   # tried again, still busy, never taken
        assert second.consoles.state("n1") == "busy" and first.consoles.state("n1") == "attached"
        assert len(node.conns) == 1
        first.consoles.detach("n1")
        wait_for("the second console", lambda: second.consoles.state("n1") == "attached"
                 and len(node.conns) >= 1 and node.say("for the second") > 0)
        wait_for("its line", lambda: "for the second" in kept(second))
        assert "for the second" not in kept(first)
    finally:
        first.stop()
        second.stop()
        bmc.stop()


def test_the_ssh_console_survives_a_daemon_restart(tmp_path: Path, node: Node) -> None:
    bmc = lab(tmp_path, "lenovo", node)
    secrets = store_with(tmp_path, "USERID")
    obs = observer(tmp_path, secrets)
    try:
        obs.consoles.attach("n1", plan_for("lenovo", bmc))
        wait_for("the console", heard_by(node))
        node.say("before the restart")
        wait_for("the line", lambda: "before the restart" in kept(obs))
        obs.stop()
        wait_for("its session to end", lambda: not node.say("between"))
        obs = observer(tmp_path, secrets)                 # resumes sessions.json
        wait_for("the console again", lambda: node.say("after the restart") > 0)
        wait_for("the line", lambda: "after the restart" in kept(obs))
        assert kept(obs).index("before the restart") < kept(obs).index("after the restart")
        assert os.path.exists(tmp_path / "observe" / "console" / "sessions.json")
    finally:
        obs.stop()
        bmc.stop()


# -- the transport from what each recorded BMC says (../shared/vendor-trees, the emulator) ----------

# tree -> (protocol, port, entry) of the console the site keeps: SSH where the BMC publishes one
# or its row documents one, SOL where IPMI is on and SSH is not, none with neither.
OFFERS = {
    "nvidia_gh200": ("ssh", 2200, ""), "nvidia_gb200": ("ssh", 2200, ""),
    "nvidia_bluefield3": ("ssh", 2200, ""),
    "supermicro_sys821": ("ssh", 22, "cd system1/sol1; start"),
    "dell_r750": ("ssh", 22, "console com2"),
    "hpe_dl385": ("ssh", 22, "vsp"),            # its IPMI is off: SSH is its only console
    "lenovo_sr670": ("ssh", 22, "console 1"),
    "nvidia_dgxh100": ("ipmi", 0, ""),          # AMI: no SerialConsole.SSH, no row: SOL
    "dmtf_public_rackmount1": ("ipmi", 0, ""),
}


@pytest.mark.parametrize("tree", sorted(OFFERS))
def test_the_console_transport_is_read_from_each_recorded_bmc(tmp_path: Path, tree: str) -> None:
    from agent.site.bmc.client import CallContext
    from agent.site.bmc.redfish.session import RedfishSession
    from tests.site.bmc.redfish_emulator import RedfishEmulator

    obs = observer(tmp_path, tmp_path / "secrets")
    with RedfishEmulator.of(tree, tmp_path / "trees") as emulator:
        target = emulator.target()
        session = RedfishSession(target, CallContext(cancel=threading.Event(),
                                                     deadline=time.monotonic() + 60))
        try:
            record = obs.console_for("n1", Bmc(target.address, "redfish", REF), session)
        finally:
            session.close()
    protocol, port, entry = OFFERS[tree]
    if protocol == "ssh":
        assert record.protocol == "redfish" and record.console
        plan = SshConsole.decode(record.console)
        assert (plan.port, plan.entry) == (port, entry)
        assert plan.exit                      # each knows how to leave its console
    else:
        assert (record.protocol, record.address, record.console) == ("ipmi", "127.0.0.1", "")
    # learned once: a bmc.* command that names the BMC plainly does not forget it
    obs.bmc_done("n1", record, "bmc.power", "status")
    obs.bmc_done("n1", Bmc(target.address, "redfish", REF), "bmc.query", "inventory")
    assert obs.bmc_of("n1") == record
    obs.stop()


# -- a real node: QEMU's serial line behind the BMC's SSH console --------------------------------------


@pytest.mark.qemu
@pytest.mark.slow
def test_a_qemu_nodes_kernel_panic_is_named_over_the_ssh_console(tmp_path: Path) -> None:
    """QEMU's first serial port on a line to the BMC (qemu/serialrelay.py), the OpenBMC
    personality's sshd bridging to it, the site's console over SSH from before power on: the
    host's kernel with a command line that names no init panics, and the attempt is named
    ``kernel_panic`` from the lines that came over SSH, with no IPMI anywhere."""
    import shutil

    from qemu.powered import NodeSpec, PoweredNode
    from qemu.serialrelay import SerialRelay
    from tests.site.observe.test_console_qemu import _host_kernel

    need()
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    kernel, initrd = _host_kernel()
    relay = SerialRelay().start()
    node = PoweredNode(tmp_path / "node").configure(NodeSpec(
        kernel=str(kernel), initrd=str(initrd), owner_pid=os.getpid(), serial_port=relay.node_port,
        append="console=ttyS0,115200 rdinit=/bc-nonexistent"))
    node.set_boot("disk")
    bmc = SshBmc(tmp_path / "bmc", PERSONALITIES["openbmc"], relay.sol, PASSWORD)
    bmc.start()
    obs = observer(tmp_path, store_with(tmp_path, "root"))
    record = plan_for("openbmc", bmc)
    try:
        obs.before_power("n1", record)
        assert obs.consoles.state("n1") == "attached"
        obs.power_requested("n1", "on")
        node.start()
        obs.bmc_done("n1", record, "bmc.power", "on")
        deadline = time.monotonic() + 240
        while True:
            obs.tick()
            a = obs.timelines.last("n1")
            if a is not None and a.cause:
                break
            assert time.monotonic() < deadline, (a, kept(obs)[-10:])
            time.sleep(1)
        assert a.cause == "kernel_panic", a
        got = steps(obs)
        assert got[:2] == ["console", "power_on"], got
        assert got.index("kernel_started") < got.index("panic"), got
        assert any("Kernel panic - not syncing" in line for line in kept(obs))
    finally:
        obs.stop()
        bmc.stop()
        with contextlib.suppress(Exception):
            node.stop(force=True)
        relay.stop()


def test_bmc_power_on_an_ilo_with_ipmi_off_keeps_the_console_over_ssh(tmp_path: Path, node: Node) -> None:
    """The real bmc.power handler on the recorded iLO 5 (IPMI off) through the Redfish
    emulator: the site reads the console's place from the BMC (no SerialConsole.SSH: the hpe
    row's ``vsp`` on the manager's SSH port, here the lab sshd's), keeps it over SSH before the
    power on, and the boot's milestones come through it. The same credentials_ref logs in to
    Redfish and to the SSH CLI, as one BMC account does."""
    from agent.catalog import Role
    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.config import Config
    from agent.proto import site_pb2
    from agent.site.services import ServiceSettings, SiteServices
    from tests.site.bmc.redfish_emulator import PASSWORD as EMU_PASSWORD
    from tests.site.bmc.redfish_emulator import USER as EMU_USER
    from tests.site.bmc.redfish_emulator import RedfishEmulator

    personality = dataclasses.replace(PERSONALITIES["hpe"], user=EMU_USER)
    bmc = SshBmc(tmp_path / "bmc-hpe", personality, node.path, EMU_PASSWORD)
    bmc.start()
    secrets = store_with(tmp_path, EMU_USER, EMU_PASSWORD)
    config = Config(role=Role.SITE, node_id="site-1", state_dir=tmp_path / "state", secrets_dir=secrets)
    site = SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                        secrets_dir=secrets))
    site.start()
    try:
        with RedfishEmulator.of("hpe_dl385", tmp_path / "trees") as emulator:
            with emulator.state.lock:
                protocol = next(d for d in emulator.state.docs.values()
                                if str(d.get("@odata.type", "")).startswith("#ManagerNetworkProtocol"))
                assert protocol["IPMI"]["ProtocolEnabled"] is False
                protocol["SSH"]["Port"] = bmc.port          # the lab's sshd, never port 22
            handler = handler_for("bmc.power")
            assert handler is not None
            params = handler.parse(site_pb2.BmcOperationRequest(
                node_id="n1", bmc_address=emulator.address, protocol="redfish", operation="on",
                credentials_ref=REF, verify_tls=False))
            handler.run(Context.local("bmc.power", config, site=site, timeout=60), params)
            obs = site.observe
            record = obs.bmc_of("n1")
            assert record is not None and record.protocol == "redfish"
            plan = SshConsole.decode(record.console)
            assert (plan.port, plan.entry, plan.source) == (bmc.port, "vsp", "vendor row hpe")
            wait_for("the console", heard_by(node))
            assert obs.consoles.state("n1") == "attached"
            node.say(*BOOT)
            wait_for("the panic", lambda: "panic" in steps(obs))
            assert steps(obs)[:2] == ["console", "power_on"], steps(obs)
            assert "Starting virtual serial port." in kept(obs)
    finally:
        site.stop()
        bmc.stop()


def test_two_sites_keep_one_openbmc_console_at_once(tmp_path: Path, node: Node) -> None:
    """OpenBMC's console takes 15 sessions (the recordings' MaxConcurrentSessions): a second
    site's console is attached beside the first, each gets every line."""
    bmc = lab(tmp_path, "openbmc", node)
    secrets = store_with(tmp_path, "root")
    first, second = observer(tmp_path / "first", secrets), observer(tmp_path / "second", secrets)
    record = plan_for("openbmc", bmc)
    assert SshConsole.decode(record.console).sessions == 15
    try:
        first.consoles.attach("n1", record)
        second.consoles.attach("n1", record)
        wait_for("both consoles", heard_by(node, 2))
        node.say(*BOOT)
        for obs in (first, second):
            wait_for("the panic", lambda obs=obs: "panic" in steps(obs) or BOOT[-1] in kept(obs))
            assert [t for t in kept(obs) if not t.startswith("[site:")] == list(BOOT)
            assert obs.consoles.state("n1") == "attached"
    finally:
        first.stop()
        second.stop()
        bmc.stop()


def test_a_bmc_offering_no_console_is_not_asked_again_at_every_command(tmp_path: Path) -> None:
    """A Redfish BMC with no SSH console and its IPMI off (DMTF's mockup, IPMI turned off): the
    real bmc.power handler reads its console offer at the first command that names the node,
    and the next command does not read it again (the emulator's requests counted); once
    ``site_console_recheck_seconds`` has passed (the observer's clock, moved by the test), the
    next command reads it again (SSH or IPMI may have been turned on since)."""
    from agent.catalog import Role
    from agent.commands import handler_for
    from agent.commands.base import Context
    from agent.config import Config
    from agent.proto import site_pb2
    from agent.site.services import ServiceSettings, SiteServices
    from tests.site.bmc.redfish_emulator import PASSWORD as EMU_PASSWORD
    from tests.site.bmc.redfish_emulator import USER as EMU_USER
    from tests.site.bmc.redfish_emulator import RedfishEmulator

    secrets = store_with(tmp_path, EMU_USER, EMU_PASSWORD)
    config = Config(role=Role.SITE, node_id="site-1", state_dir=tmp_path / "state", secrets_dir=secrets)
    site = SiteServices(ServiceSettings(address="127.0.0.1", port=0, root=tmp_path / "site",
                                        secrets_dir=secrets, console_recheck_seconds=300))
    site.start()
    now = [1000.0]
    site.observe.clock = lambda: now[0]
    protocols = "/redfish/v1/Managers/BMC/NetworkProtocol"
    try:
        with RedfishEmulator.of("dmtf_public_rackmount1", tmp_path / "trees") as emulator:
            with emulator.state.lock:
                emulator.state.docs[protocols]["IPMI"]["ProtocolEnabled"] = False
            handler = handler_for("bmc.power")
            assert handler is not None

            def status() -> int:
                """One bmc.power status naming the node; the offer's reads so far."""
                params = handler.parse(site_pb2.BmcOperationRequest(
                    node_id="n1", bmc_address=emulator.address, protocol="redfish", operation="status",
                    credentials_ref=REF, verify_tls=False))
                handler.run(Context.local("bmc.power", config, site=site, timeout=60), params)
                return len(emulator.writes("GET", protocols))

            assert status() == 1                      # read at the first command: none offered
            assert site.observe.bmc_of("n1") == Bmc(emulator.address, "redfish", REF)
            now[0] += 299
            assert status() == 1                      # kept: not read again
            now[0] += 2
            assert status() == 2                      # past the recheck: read again
            assert status() == 2                      # and kept again
    finally:
        site.stop()
