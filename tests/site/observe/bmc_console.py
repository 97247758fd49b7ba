"""A BMC's SSH console, as the site lab's sshd runs it (its ForceCommand): the personality's CLI
(banner, prompt, the entry command), then the node's serial port (a UNIX socket the test's
scripted node serves, or ``tcp:HOST:PORT``: the BMC side of a QEMU node's serial line,
qemu/serialrelay.py) until the exit keys, an idle timeout or
the port's end. Sessions beyond the personality's count are refused with its message.

    python bmc_console.py <session.json>     # written by tests/site/observe/sshbmc.py

What it sends to the client is appended to ``<sent_dir>/<pid>.log``: the lines the BMC sent,
against which the site's ring is checked (nothing lost but what the BMC never sent).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import socket
import sys
import termios
import time
import tty
from pathlib import Path


def write(data: bytes, log: Path | None = None) -> None:
    os.write(1, data)
    if log is not None:
        with log.open("ab") as f:
            f.write(data)


def take_slot(lock_dir: Path, sessions: int) -> int | None:
    """An fd holding one of the console's ``sessions`` slots (flock, freed at exit); None when
    every slot is held."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    for i in range(max(sessions, 1)):
        fd = os.open(lock_dir / f"slot-{i}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd
    return None


def read_line(idle: float) -> str | None:
    """One line typed at the CLI; None at the end of input or after ``idle`` seconds."""
    got = b""
    while True:
        ready, _, _ = select.select([0], [], [], idle or None)
        if not ready:
            return None
        data = os.read(0, 1)
        if not data:
            return None
        if data in (b"\n", b"\r"):
            return got.decode(errors="replace")
        got += data


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    p = cfg["personality"]
    idle = float(cfg.get("idle", 0))
    nl = b"\r\n"
    if p["banner"]:
        write(p["banner"].encode() + nl)
    while p["entry"]:
        write(p["prompt"].encode())
        line = read_line(idle)
        if line is None:
            write(nl + b"session timed out" + nl)
            return 0
        if line.strip() == p["entry"]:
            break
        if line.strip():
            write(nl + f"unknown command: {line.strip()[:40]}".encode() + nl)
    slot = take_slot(Path(cfg["lock_dir"]), int(p["sessions"]))
    if slot is None:
        write(p["busy"].encode() + nl)
        if p["entry"]:
            write(p["prompt"].encode())
            read_line(idle or 5.0)
        return 1
    if p["started"]:
        write(p["started"].encode() + nl)
    if os.isatty(0):
        tty.setraw(0, termios.TCSANOW)     # the exit keys come without a newline
    log = Path(cfg["sent_dir"]) / f"{os.getpid()}.log"
    where = str(cfg["serial"])
    serial = socket.socket(socket.AF_INET if where.startswith("tcp:") else socket.AF_UNIX)
    try:
        if where.startswith("tcp:"):      # the BMC side of qemu/serialrelay.py's line
            host, _, port = where[4:].rpartition(":")
            serial.connect((host, int(port)))
        else:
            serial.connect(where)
    except OSError as exc:
        write(f"console unavailable: {exc.strerror}".encode() + nl)
        return 1
    exit_keys = p["exit"].encode()
    typed = b""
    heard = time.monotonic()
    with contextlib.closing(serial):
        while True:
            wait = heard + idle - time.monotonic() if idle else None
            if wait is not None and wait <= 0:
                write(nl + b"session timed out" + nl)
                return 0
            ready, _, _ = select.select([0, serial], [], [], wait)
            if serial in ready:
                data = serial.recv(65536)
                if not data:
                    return 0
                write(data, log)
            if 0 in ready:
                data = os.read(0, 1024)
                if not data:
                    return 0
                heard = time.monotonic()
                typed = (typed + data)[-16:]
                if exit_keys and typed.endswith(exit_keys):
                    return 0
                serial.sendall(data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
