"""OpenIPMI's ipmi_sim as a node's BMC: IPMI 2.0 lanplus on 127.0.0.1 (a free UDP port), one
admin user, its state (users, passwords) in a directory, and a ``chassis_control`` program
that powers, resets and sets the boot device of a qemu/powered.py node.

    sim = start_ipmi_sim(workdir, PoweredNode(node_dir), username, password)
    sim.address            # "127.0.0.1:PORT", what a BmcOperationRequest names
    sim.logs_in(password)  # the emulator's own word on a login (asked until it answers)
    sim.stop()

By hand (README: "The site daemon against an emulator")::

    python -m qemu.ipmisim --dir /tmp/bmc --secrets-dir /tmp/secrets --ref rack1-n01 [--boot]

generates the BMC's password, writes it only to the emulator's config (0600) and to the
site's secret store entry ``--ref`` (0600), prints the address and runs until interrupted.
With ``--boot`` the node boots the project's ramdisk (or the host's cloud kernel); without,
power-on fails cleanly (no kernel) and everything else works.

Debian packages: openipmi (ipmi_sim), ipmitool.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent import proc
from qemu.powered import NodeSpec, PoweredNode, default_boot_files


def free_udp_port() -> int:
    return free_udp_ports(1)[0]


def free_udp_ports(count: int) -> list[int]:
    """``count`` distinct free UDP ports on 127.0.0.1, held together while chosen (emulators
    started at once, before any has bound its own, must not be handed the same one)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


@dataclass
class IpmiSim:
    port: int
    node: PoweredNode
    workdir: Path
    username: str
    password: str
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ipmitool(self, *args: str, password: str | None = None) -> proc.Completed:
        """ipmitool straight at the emulator (a check of its own, not the agent's client)."""
        return proc.run(["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(self.port),
                         "-U", self.username, "-E", "-C", "3", "-N", "1", "-R", "1", *args],
                        check=False, timeout=20,
                        env=proc.clean_env({"IPMI_PASSWORD": password or self.password}))

    def logs_in(self, password: str | None = None, timeout: float = 60.0) -> bool:
        """Whether the emulator takes a login with ``password`` (the configured one by default),
        as ipmitool straight at it says: True once ``chassis power status`` is answered, False
        once the login is refused by name (AUTH_PATTERNS, ipmitool's -v words the site's client
        reads too). A try that got no answer (one second, ipmitool's -N 1, is short for a
        loaded 2-core machine) says neither and is tried again, ``timeout`` s at most, then
        raises: no answer is never taken for a refusal nor for a login."""
        from agent.site.bmc.ipmi import AUTH_PATTERNS

        deadline = time.monotonic() + timeout
        while True:
            answer = self.ipmitool("-v", "chassis", "power", "status", password=password)
            if answer.returncode == 0:
                return True
            said = (answer.stderr + b"\n" + answer.stdout).decode(errors="replace").lower()
            if any(p in said for p in AUTH_PATTERNS):
                return False
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ipmi_sim neither took nor refused a login in {timeout:.0f} s "
                                   f"(exit status {self.process.poll()}, ipmitool: {said[-300:]!r})")
            time.sleep(0.3)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once the emulator's LAN answers a Get Device ID (ipmi_sim's own answer, no
        chassis_control run); stop it and raise if it exits or stays silent ``timeout`` s (a
        loaded 2-core machine: a fault matrix's nodes booting)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.ipmitool("mc", "info")
            if answer.returncode == 0:
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                said = answer.stderr.decode(errors="replace")[-300:]
                log = self.workdir / "ipmi_sim.log"
                raise RuntimeError(f"ipmi_sim did not answer (exit status {self.process.poll()}, "
                                   f"ipmitool: {said!r}); see {log}:\n"
                                   + log.read_text(errors="replace")[-2000:])
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process.poll() is None:
            proc.kill_group(self.process, grace=2.0)
        self.node.stop(force=True)


@dataclass(frozen=True)
class SimUser:
    """One more IPMI user of the emulated BMC (ipmi_sim's ``user`` line)."""

    id: int                  # 3..15 (1 is the anonymous user, 2 the admin)
    name: str
    password: str
    privilege: str = "user"  # callback | user | operator | admin
    enabled: bool = True


# (sensor number, name, IPMI sensor type, base unit code, M, raw value): what the emulated
# BMC reports in its SDR, read back by bmc.query as typed sensors.
SENSORS = (
    (1, "CPU Temp", 0x01, 1, 1, 45),        # temperature, degrees C, 45
    (2, "FAN1", 0x04, 18, 100, 54),         # fan, RPM, 5400
    (3, "PSU1 Power", 0x08, 6, 2, 160),     # power supply, Watts, 320
)


def full_sensor_record(record_id: int, number: int, name: str, sensor_type: int, unit: int,
                       m: int) -> bytes:
    """An IPMI 2.0 Full Sensor Record (SDR type 0x01): a linear threshold sensor whose
    reading is ``m * raw``."""
    body = bytes([
        0x20, 0x00, number,          # owner (the BMC), LUN, sensor number
        0x07, 0x01,                  # entity: system board, instance 1
        0x7f, 0x68,                  # initialization, capabilities
        sensor_type, 0x01,           # type; event/reading type: threshold
        0x00, 0x00, 0x00, 0x00, 0x3f, 0x3f,   # assertion, deassertion, readable thresholds masks
        0x00, unit, 0x00,            # units 1 (unsigned), base unit, modifier
        0x00,                        # linear
        m & 0xff, (m >> 8) << 6,     # M (10 bits), tolerance
        0x00, 0x00, 0x00, 0x00,      # B, accuracy, exponents
        0x00, 0x00, 0xff, 0x00,      # flags, nominal, normal max, normal min
        0xff, 0x00,                  # sensor max, min reading
        0xff, 0xff, 0xff, 0x00, 0x00, 0x00,   # thresholds (upper nr/c/nc, lower nr/c/nc)
        0x00, 0x00, 0x00, 0x00, 0x00,         # hysteresis +/-, reserved x2, OEM
        0xc0 | len(name),            # ID string: 8-bit ASCII
    ]) + name.encode()
    return bytes([record_id & 0xff, record_id >> 8, 0x51, 0x01, len(body)]) + body


# The product the emulated BMC's FRU 0 describes.
PRODUCT = {"manufacturer": "Better Compute", "model": "BC-QEMU-1", "serial": "BCQ0001"}


def _checksum(data: bytes) -> int:
    return (-sum(data)) & 0xff


def fru_data() -> bytes:
    """An IPMI Platform Management FRU image: the common header and a product info area."""
    fields = [PRODUCT["manufacturer"], PRODUCT["model"], "", "1.0", PRODUCT["serial"], "", ""]
    area = bytes([0x01, 0x00, 0x00])                    # version, length (set below), English
    for text in fields:
        area += bytes([0xc0 | len(text)]) + text.encode()
    area += b"\xc1"                                     # end of fields
    area += bytes(-(len(area) + 1) % 8)                 # pad to a multiple of 8 with the checksum
    area = area[:1] + bytes([(len(area) + 1) // 8]) + area[2:]
    area += bytes([_checksum(area)])
    header = bytes([0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00])   # product area at offset 8
    return header + bytes([_checksum(header)]) + area


def emu_commands() -> str:
    """ipmi_sim's command file: the BMC at 0x20 with SENSORS."""
    lines = ["mc_setbmc 0x20",
             "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr",
             "sel_enable 0x20 1000 0x0a"]
    for i, (number, name, sensor_type, unit, m, raw) in enumerate(SENSORS, start=1):
        record = full_sensor_record(i, number, name, sensor_type, unit, m)
        lines += [f"sensor_add 0x20 0 {number} {sensor_type:#04x} 0x01",
                  "main_sdr_add 0x20 " + " ".join(f"{b:#04x}" for b in record),
                  f"sensor_set_value 0x20 0 {number} {raw:#04x} 0",
                  f"sensor_set_event_support 0x20 0 {number} enable scanning per-state "
                  + " ".join(["000000000000000"] * 4)]
    fru = fru_data()
    lines.append(f"mc_add_fru_data 0x20 0 {len(fru):#x} data " + " ".join(f"{b:#04x}" for b in fru))
    lines.append("mc_enable 0x20")
    return "\n".join(lines) + "\n"


def _lan(channel: int, port: int) -> str:
    if not 1 <= channel <= 11:
        raise ValueError(f"an ipmi_sim LAN channel is 1 to 11 here, not {channel}")
    return f"""\
  startlan {channel}
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback md5 straight
    allowed_auths_user md5 straight
    allowed_auths_operator md5 straight
    allowed_auths_admin md5 straight
    guid a6c1e0d0b2c34f8e9d7a1b2c3d4e5f{channel:02x}
  endlan
"""


def start_ipmi_sim(workdir: Path, node: PoweredNode, username: str, password: str, *,
                   sol: str = "", users: Sequence[SimUser] = (), port: int = 0,
                   wait: bool = True, more_lans: Sequence[int] = ()) -> IpmiSim:
    """``sol``: the node's serial port that the BMC serves as Serial-over-LAN, ``tcp:HOST:PORT``
    (ipmi_sim connects to it: a QEMU ``-serial tcp:...,server`` or a test's scripted port);
    "" gives the BMC no SOL. ``users``: accounts besides the admin (user 2), e.g. the one a
    tenant left behind, for the release's account check. ``port``: the UDP port to serve (0: a
    free one). ``wait=False`` returns once the process is started: a fleet starts them all (on
    ports from one ``free_udp_ports``), then calls ``wait_ready`` on each. ``more_lans``: LAN
    channels besides 1 (2 to 11), each on a free port of its own (a BMC with a second NIC)."""
    if 1 in more_lans:
        raise ValueError("more_lans: channel 1 is the BMC's first LAN already")
    workdir.mkdir(parents=True, exist_ok=True)
    control = node.write_chassis_control(workdir / "chassis-control")
    port = port or free_udp_port()
    conf = workdir / "lan.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"""\
name "bcsim"
set_working_mc 0x20
{_lan(1, port)}{"".join(_lan(n, free_udp_port()) for n in more_lans)}\
  chassis_control "{control} 0x20"
{f'  sol "{sol}" 115200' if sol else ""}
  user 2 true "{username}" "{password}" admin 10 md5 straight
""")
        for u in users:
            f.write(f'  user {u.id} {"true" if u.enabled else "false"} "{u.name}" "{u.password}" '
                    f'{u.privilege} 10 md5 straight\n')
    (workdir / "sim.emu").write_text(emu_commands())
    state = workdir / "state"
    state.mkdir(exist_ok=True, mode=0o700)
    log = (workdir / "ipmi_sim.log").open("wb")
    process = proc.spawn(["ipmi_sim", "-n", "-c", str(conf), "-f", str(workdir / "sim.emu"),
                          "-s", str(state)], stdout=log.fileno(), stderr=subprocess.STDOUT)
    log.close()
    sim = IpmiSim(port, node, workdir, username, password, process)
    if wait:
        sim.wait_ready()
    return sim


def main(argv: list[str] | None = None) -> int:
    from agent.site.bmc.client import Credentials
    from agent.site.bmc.secrets import PasswordPolicy, SecretStore

    p = argparse.ArgumentParser(prog="python -m qemu.ipmisim", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="work directory (emulator and node state)")
    p.add_argument("--secrets-dir", type=Path, required=True, help="the site's secret store")
    p.add_argument("--ref", default="rack1-n01", help="the entry to write (credentials_ref)")
    p.add_argument("--username", default="bcadmin")
    p.add_argument("--boot", action="store_true", help="power-on boots a real guest")
    args = p.parse_args(argv)
    files = default_boot_files() if args.boot else None
    if args.boot and files is None:
        p.error("no kernel and initrd to boot (initramfs/out/ or /boot/vmlinuz-*-cloud-amd64)")
    kernel, initrd = files if files else (Path("/nonexistent/vmlinuz"), Path("/nonexistent/initrd"))
    node = PoweredNode(args.dir / "node").configure(NodeSpec(
        kernel=str(kernel), initrd=str(initrd), append="console=ttyS0 panic=-1", owner_pid=os.getpid()))
    password = PasswordPolicy(min_length=12, max_length=20).generate()
    SecretStore(args.secrets_dir).put(args.ref, Credentials(args.username, password))
    sim = start_ipmi_sim(args.dir / "ipmi", node, args.username, password)
    print(f"ipmi_sim: {sim.address} (user {args.username}, password in {args.secrets_dir}/{args.ref}); "
          f"node {node.dir}; Ctrl-C stops both", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
