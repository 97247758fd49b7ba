"""sushy-tools' Redfish emulator (sushy-emulator) on 127.0.0.1, for the Redfish client's tests.

    with SushyEmulator(tmp_path, password="pw", tls=None, notify_url="") as emu:
        emu.target()          # a Target for RedfishClient (http:// or https:// address)

Backend: the emulator's *fake* driver (``SUSHY_EMULATOR_FAKE_DRIVER``), not its libvirt one.
Why: the libvirt backend needs a libvirtd running as root, the libvirt-python binding built
against libvirt's headers, and libvirt launching its own QEMU: a second way of starting a
node beside the project's harness (qemu/), on a machine where tests must not need root. The
fake driver keeps the System's power and boot state itself and, with ``external_notifier``,
PUTs the whole System (as JSON) to ``EXTERNAL_NOTIFICATION_URL`` whenever it changes: the
test's hook (tests/site/bmc/test_redfish_qemu.py) turns that into a real start, stop or re-boot of
a QEMU node (qemu/powered.py). The fake driver applies a power change 1 to 11 s after the
request (like a real BMC, not at once), when the System is next read.

What the fake driver lacks (so tested only against documented responses, see
tests/site/bmc/redfish_documented.py): SessionService (the emulator has basic auth only),
AccountService, a working SimpleUpdate (it needs the libvirt driver's BIOS versions), a
multipart push, volume creation, the PowerCycle ResetType, and a one-time (Once) boot override
(it reports every override as Continuous).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent.site.bmc.client import CallContext, Credentials, Pacing, Target
from tests.conftest import free_port

VMEDIA_SLOTS = {"Cd": "cd", "Floppy": "usb"}   # the emulator's virtual media -> the node's drives
SYSTEM_UUID = "8c7f4b36-3c52-4d2a-9f30-1b4f1d0e9a11"
NODE_MAC = "52:54:00:12:34:56"
USER = "admin"


def emulator_binary() -> str:
    found = shutil.which("sushy-emulator", path=str(Path(sys.executable).parent)) or shutil.which(
        "sushy-emulator"
    )
    if not found:
        pytest.skip("sushy-emulator is not installed (pip install sushy-tools: the dev extra)")
    return found



def fast_call(seconds: float = 60.0) -> CallContext:
    import threading

    return CallContext(threading.Event(), time.monotonic() + seconds,
                       Pacing(min_interval=0.3, max_interval=1.0, factor=1.5))


class SushyEmulator:
    def __init__(
        self,
        workdir: Path,
        *,
        password: str,
        tls: tuple[str, str] | None = None,
        notify_url: str = "",
        power_state: str = "Off",
        mac: str = NODE_MAC,
    ) -> None:
        import bcrypt  # sushy-tools' own dependency, there when the emulator is

        self.workdir = workdir
        self.password = password
        self.tls = tls
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        htpasswd = workdir / "htpasswd"
        digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
        htpasswd.write_text(f"{USER}:{digest}\n")
        system: dict[str, Any] = {
            "uuid": SYSTEM_UUID, "name": "node0", "power_state": power_state,
            "external_notifier": bool(notify_url), "nics": [{"mac": mac, "ip": "10.0.2.15"}],
        }
        config = {
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_AUTH_FILE": str(htpasswd),
            "SUSHY_EMULATOR_STATE_DIR": str(workdir / "state"),
            "SUSHY_EMULATOR_FAKE_SYSTEMS": [system],
            "SUSHY_EMULATOR_STORAGE": {SYSTEM_UUID: [{
                "Id": "1", "Name": "Local Storage Controller",
                "StorageControllers": [{"MemberId": "0", "Name": "Contoso RAID", "SpeedGbps": 12}],
                "Drives": ["32ADF365C6C1B7BD"],
            }]},
        }
        drive = {"Id": "32ADF365C6C1B7BD", "Name": "Drive Sample", "CapacityBytes": 899527000000,
                 "Protocol": "SAS"}
        config["SUSHY_EMULATOR_DRIVES"] = {(SYSTEM_UUID, "1"): [drive]}  # keyed by tuples: Python
        config["SUSHY_EMULATOR_VOLUMES"] = {(SYSTEM_UUID, "1"): []}
        lines = [f"{key} = {value!r}" for key, value in config.items()]
        if notify_url:
            lines.append(f"EXTERNAL_NOTIFICATION_URL = {notify_url!r}")
        self.config = workdir / "emulator.conf"
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def target(self, password: str | None = None, *, verify_tls: bool = True, ca_file: str = "") -> Target:
        creds = Credentials(USER, self.password if password is None else password)
        return Target(f"{self.scheme}://127.0.0.1:{self.port}", creds, verify_tls, ca_file)

    def __enter__(self) -> SushyEmulator:
        argv = [emulator_binary(), "--config", str(self.config), "-i", "127.0.0.1", "-p", str(self.port)]
        if self.tls:
            argv += ["--ssl-certificate", self.tls[0], "--ssl-key", self.tls[1]]
        root = f"{self.scheme}://127.0.0.1:{self.port}/redfish/v1/"
        self.proc = serve(argv, self.workdir / "emulator.log", root, "sushy-emulator")
        return self

    def log(self) -> str:
        return (self.workdir / "emulator.log").read_text(errors="replace")

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


def serve(argv: list[str], log_path: Path, url: str, what: str, *, cwd: Path | None = None
          ) -> subprocess.Popen[bytes]:
    """A server child (sushy-emulator, DMTF's mockup server) in its own process group, its
    output in ``log_path``; returned once ``url`` answers (TLS unverified), pytest.fail with
    the log's tail when it exits or does not answer within 30 s."""
    import ssl

    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=cwd)
    ctx = ssl._create_unverified_context()
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                pytest.fail(f"{what} did not start: " + log_path.read_text(errors="replace")[-2000:])
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a child of ``serve`` and its whole process group: SIGTERM, SIGKILL after 10 s."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class NodeHook:
    """The emulator's external-notification hook, turned into power and boot changes of a real
    QEMU node (qemu/powered.py). sushy's fake driver PUTs the whole System, as JSON, at each
    change: once when a reset is asked for (``pending_power`` set) and once when it applies
    (``power_state`` changed, ``pending_power`` null). This hook, as a BMC would:

    - a pending restart (ForceRestart, GracefulRestart) re-boots the running guest (QMP
      system_reset);
    - a pending Off presses the power button (graceful); Off applied pulls the power (forced);
    - On applied starts QEMU;
    - BootSourceOverrideTarget Pxe makes the next start boot by PXE, Cd from the virtual CD,
      anything else from disk (the node's disk boot: the kernel and initrd given directly);
    - an image inserted into the emulator's virtual media (its Cd or its Floppy/USBStick
      drive, ``boot_image`` in the System) goes into the node's drive "cd" or "usb"
      (qemu/powered.py, through QMP while it runs); an eject empties it.

    The emulator calls the hook inside its request and waits for it: the hook answers at once
    and a worker thread drives the node, in order. ``events`` keeps what it did.
    """

    def __init__(self, node: Any) -> None:
        import queue
        import threading

        from tests.loopback_http import ScriptedServer

        self.node = node
        self.events: list[str] = []
        self.inserted: dict[str, str] = {}   # slot -> the emulator's file in it
        self.errors: list[str] = []
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.server = ScriptedServer()
        self.server.route("PUT", "/notify", self._notified)
        self.worker = threading.Thread(target=self._work, daemon=True)

    @property
    def url(self) -> str:
        return self.server.url("/notify")

    def _notified(self, seen: Any) -> tuple[int, dict[str, str], bytes]:
        import json

        self.queue.put(json.loads(seen.body))
        return 200, {"Content-Type": "application/json"}, b"{}"

    def _work(self) -> None:
        while (system := self.queue.get()) is not None:
            try:
                self._apply(system)
            except Exception as exc:  # reported by the test, never lost in a thread
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self.queue.task_done()

    def _apply(self, system: dict[str, Any]) -> None:
        boot = {"Pxe": "pxe", "Cd": "cdrom"}.get(system.get("boot_device", ""), "disk")
        if boot != self.node.boot_device():
            self.node.set_boot(boot)
            self.events.append(f"boot {boot}")
        # Virtual media: the emulator downloads an inserted image itself (as a BMC does) and
        # names the file it holds; the node puts a copy in its drive.
        for device, slot in VMEDIA_SLOTS.items():
            info = (system.get("boot_image") or {}).get(device)
            if info is None:
                continue
            path, _write_protected, inserted = info
            if inserted and path and self.inserted.get(slot) != path:
                self.node.insert_media(slot, path)
                self.inserted[slot] = path
                self.events.append(f"insert {slot}")
            elif not inserted and slot in self.inserted:
                self.node.eject_media(slot)
                del self.inserted[slot]
                self.events.append(f"eject {slot}")
        pending = (system.get("pending_power") or {}).get("power_state", "")
        state = system.get("power_state")
        on = self.node.status() == "on"
        if "Restart" in pending:
            if on:
                self.node.reset()
                self.events.append("reset")
            else:
                self.node.start()
                self.events.append("start")
        elif pending == "Off":
            if on:
                self.node.stop(force=False)
                self.events.append("power button")
        elif not pending and state == "On" and not on:
            self.node.start()
            self.events.append("start")
        elif not pending and state == "Off" and on:
            self.node.stop(force=True)
            self.events.append("power pulled")

    def settle(self) -> None:
        """Wait until every notification so far has been applied."""
        self.queue.join()

    def __enter__(self) -> NodeHook:
        self.server.__enter__()
        self.worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.worker.join(30)
        self.server.__exit__()
