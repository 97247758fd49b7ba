"""The bmc.* handlers over IPMI, against OpenIPMI's ipmi_sim through the real ipmitool.

Without QEMU: query, boot device, rotation, bad credentials, an unreachable BMC, refusals.
With QEMU (marked ``qemu``): power on/reset/off of a real guest, seen from the node itself.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.commands import handler_for
from agent.commands.base import Context
from agent.commands.bmc_params import BmcArgs
from agent.config import Config
from agent.errors import (
    AuthFailed,
    BmcUnreachable,
    CommandTimeout,
    InvalidParameters,
    NotFound,
    Unsupported,
)
from agent.proto import site_pb2
from agent.site.bmc.client import (
    BootDevice,
    BootMode,
    CallContext,
    Credentials,
    Pacing,
    PowerAction,
    PowerState,
    Target,
    Unconfirmed,
)
from agent.site.bmc.ipmi import IpmiClient
from agent.site.bmc.secrets import SecretStore
from qemu.ipmisim import start_ipmi_sim
from qemu.powered import NodeSpec, PoweredNode
from tests.runtime.harness import wait_until
from tests.site.conftest import PASSWORD, REF, USERNAME, IpmiSim, free_udp_port


def request(address: str, operation: str, *, protocol: str = "ipmi", ref: str = REF,
            **parameters: str) -> site_pb2.BmcOperationRequest:
    return site_pb2.BmcOperationRequest(node_id="n01", bmc_address=address, protocol=protocol,
                                        operation=operation, credentials_ref=ref,
                                        parameters=parameters)


def run_kind(kind: str, config: Config, payload: site_pb2.BmcOperationRequest,
             timeout: float | None = None) -> site_pb2.BmcOperationResult:
    handler = handler_for(kind)
    assert handler is not None
    params = handler.parse(payload)
    result = handler.run(Context.local(kind, config, timeout=timeout), params)
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


def store_of(config: Config) -> SecretStore:
    return SecretStore(config.secrets_dir)


# -- refused before anything runs ---------------------------------------------------------


@pytest.mark.parametrize(("kind", "fields", "message"), [
    ("bmc.power", {"operation": "explode"}, "operation 'explode': one of on, off"),
    ("bmc.power", {"protocol": "snmp"}, "protocol 'snmp': one of redfish, ipmi"),
    ("bmc.power", {"bmc_address": ""}, "bmc_address is required"),
    ("bmc.power", {"bmc_address": "10.0.0.1:99999"}, "port must be 1-65535"),
    ("bmc.power", {"bmc_address": "-oProxyCommand=x"}, "not a host name"),
    ("bmc.power", {"bmc_address": "a b"}, "not a host name"),
    ("bmc.power", {"credentials_ref": ""}, "credentials_ref is required"),
    ("bmc.power", {"credentials_ref": "../../etc/shadow"}, "credentials_ref"),
    ("bmc.power", {"parameters": {"colour": "red"}}, "unknown parameter(s) colour"),
    ("bmc.power", {"operation": "off", "parameters": {"graceful_timeout_seconds": "-3"}}, "between 0"),
    ("bmc.boot", {"operation": "set_boot_device"}, "missing parameter(s) device"),
    ("bmc.boot", {"operation": "set_boot_device", "parameters": {"device": "floppy"}}, "device: one of"),
    ("bmc.boot", {"operation": "set_boot_device", "parameters": {"device": "pxe", "persistent": "maybe"}},
     "true or false"),
    ("bmc.rotate", {"operation": "rotate", "parameters": {"new_password_ref": "a/b"}}, "credentials_ref"),
    ("bmc.firmware", {"operation": "push", "parameters": {"file": "/x", "sha256": "abc"}}, "64 hexadecimal"),
    ("bmc.firmware", {"operation": "simple_update", "parameters": {"image_uri": "file:///etc/passwd"}},
     "a URL"),
])
def test_bad_requests_are_refused_in_parse(kind: str, fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"bmc_address": "10.0.0.1", "protocol": "ipmi", "operation": "status",
                            "credentials_ref": REF}
    if kind != "bmc.power":
        base["operation"] = "rotate"
    base.update(fields)
    handler = handler_for(kind)
    assert handler is not None
    with pytest.raises(InvalidParameters) as info:
        handler.parse(site_pb2.BmcOperationRequest(**base))
    assert message in str(info.value)


@pytest.mark.parametrize(("kind", "operation", "parameters", "args"), [
    ("bmc.power", "off", {}, BmcArgs(graceful_timeout_seconds=60.0)),
    ("bmc.power", "off", {"graceful_timeout_seconds": "2.5"}, BmcArgs(graceful_timeout_seconds=2.5)),
    ("bmc.boot", "set_boot_device", {"device": "pxe", "persistent": "yes", "mode": "uefi"},
     BmcArgs(device=BootDevice.PXE, persistent=True, mode=BootMode.UEFI)),
    ("bmc.boot", "set_boot_device", {"device": "disk", "persistent": "false", "mode": ""},
     BmcArgs(device=BootDevice.DISK)),
    ("bmc.rotate", "rotate", {"length": "16.0"}, BmcArgs(length=16)),
    ("bmc.firmware", "push", {"file": "/srv/fw.bin", "sha256": "AB" * 32},
     BmcArgs(file=Path("/srv/fw.bin"), sha256="ab" * 32)),
    ("bmc.storage", "create_volume", {"controller_id": "RAID.1", "name": "v", "raid_type": "RAID1",
                                      "drives": "d1,,d2", "capacity_bytes": "1024"},
     BmcArgs(controller_id="RAID.1", name="v", raid_type="RAID1", drives=("d1", "d2"), capacity_bytes=1024)),
    ("bmc.storage", "insert_media", {"image_url": "https://x/y.iso", "media_type": ""},
     BmcArgs(image_url="https://x/y.iso", media_type="CD")),
])
def test_parse_gives_typed_parameters(kind: str, operation: str, parameters: dict[str, str],
                                      args: BmcArgs) -> None:
    handler = handler_for(kind)
    assert handler is not None
    params = handler.parse(site_pb2.BmcOperationRequest(
        bmc_address="10.0.0.1", protocol="redfish", operation=operation, credentials_ref=REF,
        parameters=parameters))
    assert params.args == args


def test_unknown_credentials_ref_is_not_found_before_any_bmc_call(site_config: Config) -> None:
    # The address answers nothing: reaching it would take retries; the refusal is at once.
    started = time.monotonic()
    with pytest.raises(NotFound, match="'rack9-n99': no such entry"):
        run_kind("bmc.power", site_config, request(f"127.0.0.1:{free_udp_port()}", "status", ref="rack9-n99"))
    assert time.monotonic() - started < 2


# -- against ipmi_sim, no QEMU --------------------------------------------------------------


def test_query_gives_typed_system_and_power(sim: IpmiSim, site_config: Config) -> None:
    result = run_kind("bmc.query", site_config, request(sim.address, "query"))
    assert result.power_state == "off" and result.state == "off"
    # FRU 0 and the SDR sensors as qemu/ipmisim.py configures the emulated BMC.
    assert (result.system.manufacturer, result.system.model, result.system.serial) == \
        ("Better Compute", "BC-QEMU-1", "BCQ0001")
    assert result.system.bmc_firmware_version == "9.08"
    assert result.values["ipmi_version"] == "2.0"
    sensors = {s.name: (s.kind, s.reading, s.units, s.health, s.has_reading) for s in result.sensors}
    assert sensors == {"CPU Temp": ("temperature", 45.0, "Cel", "OK", True),
                       "FAN1": ("fan", 5400.0, "RPM", "OK", True),
                       "PSU1 Power": ("power", 320.0, "W", "OK", True)}
    assert result.attempts >= 5


def test_status_of_a_node_that_is_off(sim: IpmiSim, site_config: Config) -> None:
    result = run_kind("bmc.power", site_config, request(sim.address, "status"))
    assert result.power_state == "off"
    # "off" of a node that is off succeeds without touching it.
    result = run_kind("bmc.power", site_config, request(sim.address, "off"))
    assert result.power_state == "off" and result.changed is False
    assert sim.node.boots() == []


def test_boot_device_is_set_and_read_back(sim: IpmiSim, site_config: Config) -> None:
    got = run_kind("bmc.boot", site_config, request(sim.address, "get_boot_device"))
    assert got.boot.device == "disk"     # ipmi_sim's "default": force boot from hard drive
    result = run_kind("bmc.boot", site_config, request(sim.address, "set_boot_device", device="pxe",
                                                     persistent="true"))
    assert result.boot.device == "pxe" and result.state == "pxe"
    # ipmi_sim keeps no persistent bit: the result says what the BMC read back, not what was asked.
    assert not result.boot.persistent and list(result.not_kept) == ["persistent"]
    # The node itself will boot by PXE next (what chassis_control was told by the BMC).
    assert sim.node.boot_device() == "pxe"
    assert run_kind("bmc.boot", site_config, request(sim.address, "get_boot_device")).boot.device == "pxe"
    result = run_kind("bmc.boot", site_config, request(sim.address, "set_boot_device", device="disk"))
    assert result.boot.device == "disk" and sim.node.boot_device() == "disk"


def test_http_boot_firmware_and_storage_are_not_ipmi(sim: IpmiSim, site_config: Config) -> None:
    with pytest.raises(Unsupported, match="HTTP boot is not over IPMI; use redfish"):
        run_kind("bmc.boot", site_config, request(sim.address, "set_boot_device", device="http"))
    with pytest.raises(Unsupported, match="firmware update is not over IPMI"):
        run_kind("bmc.firmware", site_config,
                 request(sim.address, "simple_update", image_uri="https://fw.example/bmc.bin"))
    with pytest.raises(Unsupported, match="not over IPMI"):
        run_kind("bmc.storage", site_config, request(sim.address, "list"))
    with pytest.raises(Unsupported, match="virtual media is not over IPMI"):
        run_kind("bmc.storage", site_config, request(sim.address, "insert_media",
                                                     image_url="http://10.0.0.2/boot.iso"))


def test_wrong_credentials_fail_at_once_without_retries(sim: IpmiSim, site_config: Config) -> None:
    store_of(site_config).put("wrong", Credentials(USERNAME, "Not-The-Password-1"))
    started = time.monotonic()
    with pytest.raises(AuthFailed, match=r"refused \(wrong username or password\); not retried") as info:
        run_kind("bmc.power", site_config, request(sim.address, "status", ref="wrong"))
    assert time.monotonic() - started < 10
    assert info.value.to_wire()[0] == "auth_failed"
    assert "Not-The-Password-1" not in str(info.value.to_wire())
    client = IpmiClient(Target(sim.address, Credentials(USERNAME, "Not-The-Password-1")),
                        CallContext(threading.Event(), time.monotonic() + 60))
    with pytest.raises(AuthFailed):
        client.power_state()
    assert client.attempts == 1


@pytest.mark.slow
def test_unreachable_bmc_is_retried_a_few_times_then_reported(site_config: Config) -> None:
    address = f"127.0.0.1:{free_udp_port()}"   # nothing answers there
    client = IpmiClient(Target(address, Credentials(USERNAME, PASSWORD)),
                        CallContext(threading.Event(), time.monotonic() + 120, Pacing(min_interval=1.0)))
    started = time.monotonic()
    with pytest.raises(BmcUnreachable, match="no answer over IPMI lanplus after 3 attempts"):
        client.power_state()
    assert client.attempts == 3
    assert time.monotonic() - started < 60


def test_unreachable_bmc_within_a_short_deadline_is_a_timeout(site_config: Config) -> None:
    address = f"127.0.0.1:{free_udp_port()}"
    started = time.monotonic()
    with pytest.raises((CommandTimeout, BmcUnreachable)) as info:
        run_kind("bmc.power", site_config, request(address, "status"), timeout=3)
    assert time.monotonic() - started < 8
    assert info.value.to_wire()[0] in ("timeout", "unreachable")


def test_rotate_proves_the_new_password_and_that_the_old_one_fails(sim: IpmiSim, site_config: Config) -> None:
    store = store_of(site_config)
    result = run_kind("bmc.rotate", site_config, request(sim.address, "rotate"))
    assert result.state == "rotated"
    assert result.values["new_login"] == "accepted" and result.values["old_login"] == "refused"
    new = store.get(REF)
    assert new.username == USERNAME and new.password != PASSWORD and store.pending(REF) is None
    assert 12 <= len(new.password) <= 20
    assert new.password not in str(result)
    # The emulator itself agrees: the new one logs in, the old one is refused by name (each
    # asked until the emulator answers: no answer on a loaded machine is neither).
    assert sim.logs_in(new.password)
    assert not sim.logs_in(PASSWORD)
    # And the site keeps working with the store's entry.
    assert run_kind("bmc.power", site_config, request(sim.address, "status")).power_state == "off"


def test_the_emulators_own_login_check_waits_out_a_pause_and_never_takes_silence_for_an_answer(
        sim: IpmiSim) -> None:
    """The check the tests above make straight at ipmi_sim (IpmiSim.logs_in), on a loaded
    machine as ipmi_sim paused (SIGSTOP, resumed by a timer): one ipmitool try gets no answer
    (what failed the rotation tests once under load, or passed a "refused" that was silence);
    logs_in asks until the emulator answers, and says True for the password, False for a wrong
    one only once it is refused by name."""
    import signal

    pid = sim.process.pid
    try:
        os.kill(pid, signal.SIGSTOP)
        assert sim.ipmitool("chassis", "power", "status").returncode != 0   # the right password
        for password, takes in ((None, True), ("Wrong-Pass-9z", False)):
            os.kill(pid, signal.SIGSTOP)
            resume = threading.Timer(0.5, os.kill, (pid, signal.SIGCONT))
            resume.start()
            assert sim.logs_in(password) is takes
            resume.join()
    finally:
        os.kill(pid, signal.SIGCONT)


def test_rotate_to_a_given_password_by_reference(sim: IpmiSim, site_config: Config) -> None:
    store = store_of(site_config)
    store.put("given-pw", Credentials("unused", "Given-Pass-77x"))
    run_kind("bmc.rotate", site_config, request(sim.address, "rotate", new_password_ref="given-pw"))
    assert store.get(REF) == Credentials(USERNAME, "Given-Pass-77x")
    store.put("bad-pw", Credentials("unused", "has a space"))
    with pytest.raises(InvalidParameters, match="cannot hold spaces"):
        run_kind("bmc.rotate", site_config, request(sim.address, "rotate", new_password_ref="bad-pw"))
    assert store.get(REF) == Credentials(USERNAME, "Given-Pass-77x") and store.pending(REF) is None


@pytest.mark.parametrize("bmc_changed", [True, False])
def test_a_rotation_cut_halfway_is_settled_on_next_use(sim: IpmiSim, site_config: Config,
                                                      bmc_changed: bool) -> None:
    """A crash after staging (and perhaps after the BMC took the new password): the next
    command reconciles the entry with what the BMC accepts; the site is never locked out."""
    store = store_of(site_config)
    new = Credentials(USERNAME, "Halfway-Pass-3k")
    store.stage(REF, new)
    if bmc_changed:
        client = IpmiClient(Target(sim.address, Credentials(USERNAME, PASSWORD)),
                            CallContext(threading.Event(), time.monotonic() + 60))
        client.set_password(USERNAME, new.password)
    result = run_kind("bmc.power", site_config, request(sim.address, "status"))
    assert result.power_state == "off"
    assert store.pending(REF) is None
    assert store.get(REF) == (new if bmc_changed else Credentials(USERNAME, PASSWORD))


# -- with a real QEMU node -------------------------------------------------------------------


@pytest.mark.qemu
def test_power_and_pxe_boot_drive_a_real_guest(powered_sim: IpmiSim, site_config: Config,
                                               tmp_path: Path) -> None:
    sim, node = powered_sim, powered_sim.node
    run_kind("bmc.boot", site_config, request(sim.address, "set_boot_device", device="pxe"))
    on = run_kind("bmc.power", site_config, request(sim.address, "on"))
    assert on.power_state == "on" and on.changed is True and on.power_state_before == "off"
    assert on.settle_seconds >= 0
    assert node.status() == "on"
    # The guest really booted from the network: iPXE fetched its kernel.
    wait_until(lambda: any(b.how == "pxe-fetch" for b in node.boots()), 120, "the guest's PXE fetch")
    again = run_kind("bmc.power", site_config, request(sim.address, "on"))
    assert again.HasField("changed") and again.changed is False
    run_kind("bmc.power", site_config, request(sim.address, "reset"))
    wait_until(lambda: sum(b.how == "pxe-fetch" for b in node.boots()) >= 2, 120, "the PXE fetch after reset")
    assert [b.how for b in node.boots()][:2] == ["start", "pxe-fetch"]
    # A power cycle is off then on: a new QEMU (a second "start"), booting by PXE again.
    cycle = run_kind("bmc.power", site_config, request(sim.address, "cycle"))
    assert cycle.power_state == "on"
    assert [b.how for b in node.boots()].count("start") == 2
    wait_until(lambda: sum(b.how == "pxe-fetch" for b in node.boots()) >= 3, 120, "the PXE fetch after cycle")
    # Graceful first: this guest ignores the power button, so it is forced at the deadline.
    started = time.monotonic()
    off = run_kind("bmc.power", site_config,
                   request(sim.address, "off", graceful_timeout_seconds="3"))
    assert off.power_state == "off" and node.status() == "off"
    assert time.monotonic() - started >= 3
    assert off.settle_seconds >= 3


@pytest.mark.parametrize(("protocol", "address"), [
    ("ipmi", "admin:Addr-Secret-8kL@10.0.0.1"),
    ("ipmi", "admin:Addr-Secret-8kL@[::1]:623"),
    ("redfish", "https://admin:Addr-Secret-8kL@10.0.0.1"),
    ("redfish", "admin:Addr-Secret-8kL@10.0.0.1:8443"),
])
def test_an_address_with_credentials_is_refused_without_echoing_them(
    site_config: Config, protocol: str, address: str
) -> None:
    """`agent exec` of such a request: the refusal, on stdout (the result) and stderr (the
    log), names the address without its user part."""
    payload = json.dumps({"bmc_address": address, "protocol": protocol, "operation": "status",
                          "credentials_ref": "rack1-n01"})
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--debug", "exec", "bmc.power", "--role", "site",
         "--secrets-dir", str(site_config.secrets_dir), "--payload", payload],
        cwd=Path(__file__).parents[3], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "no user or password in the address" in said and "<user>@" in said, said
    assert "Addr-Secret" not in said and "admin:" not in said, said


# -- a write is sent once: no answer after it could have gone out is read back, never resent --


def _losing_ipmitool(tmp_path: Path, command: str, *, acts: bool) -> tuple[str, Path]:
    """An ipmitool in front of the real one that, for ``command``, gives no answer as a lost
    reply would ("no response from remote controller"), having passed it to the BMC first
    where ``acts``; every run's arguments logged."""
    real = shutil.which("ipmitool")
    assert real is not None
    log = tmp_path / "ipmitool.log"
    wrapper = tmp_path / "ipmitool"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(log))}\n'
        f'case "$*" in *"{command}"*)\n'
        + (f'  {shlex.quote(real)} "$@" >/dev/null 2>&1\n' if acts else "")
        + '  echo "Error: no response from remote controller" >&2; exit 1;;\n'
        "esac\n"
        f'exec {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


@pytest.fixture
def machineless(tmp_path: Path) -> Iterator[IpmiSim]:
    """ipmi_sim whose node powers on and off without a QEMU machine (its state in files)."""
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openipmi ipmitool)")
    node = PoweredNode(tmp_path / "node").configure(NodeSpec(
        kernel="/nonexistent/vmlinuz", initrd="/nonexistent/initrd", owner_pid=os.getpid(), machine=False))
    s = start_ipmi_sim(tmp_path / "ipmi", node, USERNAME, PASSWORD)
    yield s
    s.stop()


def _sent(log: Path, command: str) -> int:
    return sum(command in line for line in log.read_text().splitlines())


def _client(sim: IpmiSim, ipmitool: str) -> IpmiClient:
    return IpmiClient(Target(sim.address, Credentials(USERNAME, PASSWORD)),
                      CallContext(threading.Event(), time.monotonic() + 120, Pacing(min_interval=0.1)),
                      ipmitool=ipmitool)


def test_a_power_on_whose_answer_is_lost_is_read_back_not_sent_again(machineless: IpmiSim,
                                                                     tmp_path: Path) -> None:
    sim = machineless
    ipmitool, log = _losing_ipmitool(tmp_path, "chassis power on", acts=True)
    client = _client(sim, ipmitool)
    client.set_power(PowerAction.ON, graceful_timeout=0)
    assert client.power_state() is PowerState.ON
    assert _sent(log, "chassis power on") == 1


def test_a_power_on_answered_by_nothing_and_not_taken_is_unconfirmed_and_sent_once(
        machineless: IpmiSim, tmp_path: Path) -> None:
    sim = machineless
    ipmitool, log = _losing_ipmitool(tmp_path, "chassis power on", acts=False)
    client = _client(sim, ipmitool)
    with pytest.raises(Unconfirmed, match="may have acted; not sent again"):
        client.set_power(PowerAction.ON, graceful_timeout=0)
    assert _sent(log, "chassis power on") == 1 and client.power_state() is PowerState.OFF


def test_a_reset_whose_answer_is_lost_is_never_sent_twice(machineless: IpmiSim, tmp_path: Path) -> None:
    sim = machineless
    sim.ipmitool("chassis", "power", "on")
    ipmitool, log = _losing_ipmitool(tmp_path, "chassis power cycle", acts=True)
    with pytest.raises(Unconfirmed):
        _client(sim, ipmitool).set_power(PowerAction.CYCLE, graceful_timeout=0)
    assert _sent(log, "chassis power cycle") == 1


def test_a_write_whose_session_never_opened_is_tried_again(tmp_path: Path) -> None:
    """Nothing listening: the session never opens, so the command was not sent: tried again."""
    address = f"127.0.0.1:{free_udp_port()}"
    client = IpmiClient(Target(address, Credentials(USERNAME, PASSWORD)),
                        CallContext(threading.Event(), time.monotonic() + 120, Pacing(min_interval=0.2)))
    with pytest.raises(BmcUnreachable):
        client.write("chassis", "power", "on")
    assert client.attempts == 3
