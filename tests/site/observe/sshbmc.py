"""BMCs' SSH consoles for the site's tests: Debian's OpenSSH server, one per BMC, on loopback,
with a personality as data (what the vendor's SSH CLI shows and takes) and a ForceCommand
(bmc_console.py) bridging to the node's serial port, a UNIX socket.

sshd runs in a mount namespace of its own (unshare), where /etc/passwd and /etc/shadow are the
lab's (the vendor's default login, e.g. ADMIN, root, Administrator, USERID, with the test's
password, uid 0) and /run a tmpfs holding its privilege-separation folder: nothing of the
host's accounts or services is touched, and it never listens on port 22.

    bmc = SshBmc(tmp_path / "bmc", PERSONALITIES["openbmc"], serial_socket, password)
    bmc.start(); ...; bmc.stop()
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from agent import proc

SSHD = "/usr/sbin/sshd"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Personality:
    name: str
    user: str            # the vendor's default login
    banner: str          # what its CLI prints on login (the lab's words)
    prompt: str          # its CLI's prompt ("": the port is the console itself)
    entry: str           # the command that starts the console ("": none)
    started: str         # what it prints once the console is entered
    exit: str            # the keys that leave the console
    sessions: int        # how many sessions may hold the console at once
    busy: str            # what it says to one more
    source: str          # where this is documented


PERSONALITIES: dict[str, Personality] = {p.name: p for p in (
    # OpenBMC (bmcweb + obmc-console): the host console on its own SSH port, 2200, "Press ~. to
    # exit console", 15 sessions (the GH200, GB200 and BlueField-3 recordings' SerialConsole;
    # openbmc/obmc-console's client leaves on ~.). obmc-console serves every client at once.
    Personality("openbmc", "root", "", "", "", "", "\r~.", 15, "",
                "recordings nvidia_gh200/gb200/bluefield3 SerialConsole.SSH; openbmc/obmc-console"),
    # Supermicro: SMASH-CLP on port 22, ConsoleEntryCommand "cd system1/sol1; start", left with
    # <Enter>, <Esc>, <T>, one session (the sys821 recording's SerialConsole). The refusal's
    # wording is the lab's own: the recording does not show it.
    Personality("supermicro", "ADMIN", "SMASH-CLP shell (site lab)", "-> ", "cd system1/sol1; start",
                "[press <Enter>, <Esc>, and then <T> to terminate session]", "\r\x1bT", 1,
                "(site lab) the SOL console is in use", "recording supermicro_sys821 SerialConsole.SSH"),
    # iDRAC: ``console com2``, left with Ctrl+\ (a public iDRAC6 transcript; DRAC 4/5 guides'
    # ``connect com2``; the iDRAC9 guide not found: vendors.py's dell row). The refusal's words
    # are the lab's own: none found.
    Personality("dell", "root", "racadm shell (site lab)", "racadm>>", "console com2", "", "\x1c", 1,
                "(site lab) console com2 is in use",
                "public iDRAC6 transcript; DRAC 4/5 user guides (connect com2)"),
    # iLO 5: ``vsp`` at its CLI, left with ESC ( (HPE's ProLiant Gen10 UEFI guide's iLO 5
    # transcript), one VSP session, the second refused with "Virtual Serial Port is currently in
    # use by another session." (a public iLO 3 transcript; unsourced for iLO 5: vendors.py).
    Personality("hpe", "Administrator", "iLO CLI (site lab)", "</>hpiLO-> ", "vsp",
                "Starting virtual serial port.\r\nPress 'ESC (' to return to the CLI Session.",
                "\x1b(", 1, "Virtual Serial Port is currently in use by another session.",
                "HPE ProLiant Gen10 UEFI guide (iLO 5 vsp transcript)"),
    # Lenovo XCC: ``console 1`` at its CLI, left with ESC ( : UNSOURCED (from memory of the XCC
    # User Guide; not found in public sources). The refusal's words are the lab's own.
    Personality("lenovo", "USERID", "XCC CLI (site lab)", "system> ", "console 1", "", "\x1b(", 1,
                "(site lab) the console is in use", "unsourced (XCC User Guide, from memory)"),
)}


def need() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (sshd in a mount namespace of its own)")
    for tool in (SSHD, "ssh", "ssh-keygen", "unshare", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openssh-server openssh-client)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """The node's serial port: a UNIX socket server (what QEMU's ``-serial unix:...,server``
    is); ``say`` writes lines to every BMC session connected, and what none was connected to
    hear is what the BMC never sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(16)
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
            self.connected.set()

    def say(self, *lines: str) -> int:
        """Write ``lines``; how many sessions heard them."""
        with self.lock:
            heard = []
            for conn in self.conns:
                try:
                    for line in lines:
                        conn.sendall(line.encode() + b"\r\n")
                    heard.append(conn)
                except OSError:
                    conn.close()
            self.conns = heard
            return len(heard)

    def close(self) -> None:
        self.server.close()
        with self.lock:
            for conn in self.conns:
                conn.close()


class SshBmc:
    def __init__(self, folder: Path, personality: Personality, serial: Path | str, password: str, *,
                 idle: float = 0.0, port: int = 0) -> None:
        self.folder = folder
        self.p = personality
        self.serial = serial
        self.password = password
        self.idle = idle
        self.port = port or free_port()
        self.sent_dir = folder / "sent"
        self.child: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self.sent_dir.mkdir(exist_ok=True)
        os.chmod(folder, 0o755)
        self.host_key = folder / "host_ed25519"
        self.new_host_key()
        self._accounts()
        self._config()

    def new_host_key(self) -> None:
        for path in (self.host_key, self.host_key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key)], timeout=30)

    def _accounts(self) -> None:
        real = Path("/etc/passwd").read_text().splitlines()
        kept = [ln for ln in real if ln.split(":")[0] in ("root", "sshd", "nobody")]
        home = self.folder / "home"
        home.mkdir(exist_ok=True)
        kept.insert(0, f"{self.p.user}:x:0:0:BMC user:{home}:/bin/sh")
        (self.folder / "passwd").write_text("\n".join(kept) + "\n")
        digest = proc.run(["openssl", "passwd", "-6", "-stdin"], input=self.password.encode(),
                          timeout=30).text.strip()
        shadow = self.folder / "shadow"
        shadow.write_text(f"{self.p.user}:{digest}:19000:0:99999:7:::\n")
        os.chmod(shadow, 0o600)

    def _config(self) -> None:
        session = self.folder / "session.json"
        session.write_text(json.dumps({"personality": asdict(self.p), "serial": str(self.serial),
                                       "lock_dir": str(self.folder / "locks"),
                                       "sent_dir": str(self.sent_dir), "idle": self.idle}))
        (self.folder / "sshd_config").write_text("\n".join((
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {self.host_key}",
            "PidFile none", "UsePAM no", "PasswordAuthentication yes",
            "KbdInteractiveAuthentication no", "PubkeyAuthentication no", "PermitRootLogin yes",
            "AuthorizedKeysFile none", "StrictModes no", "PermitTTY yes", "X11Forwarding no",
            "AllowTcpForwarding no", "AllowAgentForwarding no", "PrintMotd no", "PrintLastLog no",
            "MaxStartups 64", "MaxAuthTries 2", "LogLevel VERBOSE",
            f"ForceCommand {sys.executable} {HERE / 'bmc_console.py'} {session}", "")))

    def start(self) -> None:
        argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
                str(HERE / "sshbmc_ns.py"), str(self.folder), SSHD]
        with open(self.folder / "sshd.log", "ab") as log:     # the child holds its own copy
            self.child = proc.spawn(argv, stdout=log, stderr=log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.child.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"sshd did not start: {(self.folder / 'sshd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        """The BMC's SSH server and every session it holds, gone at once (sshd's sessions are
        in sessions of their own: each process of its mount namespace is killed)."""
        if self.child is None:
            return
        try:
            ns = os.readlink(f"/proc/{self.child.pid}/ns/mnt")
        except OSError:
            ns = ""
        proc.kill_group(self.child, grace=1.0)
        self.child = None
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or not ns:
                continue
            try:
                if os.readlink(f"/proc/{pid}/ns/mnt") == ns:
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                continue

    def sent(self) -> list[str]:
        """Every whole line the BMC sent to a client, in order per session."""
        lines: list[str] = []
        for log in sorted(self.sent_dir.glob("*.log"), key=lambda p: p.stat().st_mtime):
            lines += log.read_bytes().decode(errors="replace").split("\r\n")[:-1]
        return [ln for ln in lines if ln]
