"""A TPM 2.0 for a QEMU machine, and for the tests: swtpm (Debian's swtpm, swtpm-tools).

``manufacture`` makes a TPM's state as a maker would: RSA and ECC endorsement keys and their
certificates, signed by a local CA that swtpm_localca makes in ``ca`` (pointed there by a
config of our own, never /etc/swtpm-localca.conf). ``Swtpm`` serves that state to QEMU on a
unix control socket (``-tpmdev emulator``); it ends when QEMU closes the socket.

    manufacture(d / "state", d / "ca")
    with Swtpm(d / "state", d / "swtpm.sock") as tpm:
        MachineSpec(..., tpm=tpm.socket)
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Self

from agent import proc

CA_ROOT = "swtpm-localca-rootca-cert.pem"
CA_ISSUER = "issuercert.pem"


def missing() -> str | None:
    """Why swtpm cannot be used here, or None."""
    for tool in ("swtpm", "swtpm_setup", "swtpm_localca"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install swtpm swtpm-tools)"
    return None


def manufacture(state: Path, ca: Path) -> None:
    """A new TPM state in ``state``: EKs and their certificates from the CA in ``ca``."""
    state.mkdir(parents=True, exist_ok=True)
    ca.mkdir(parents=True, exist_ok=True)
    (ca / "localca.conf").write_text(
        f"statedir = {ca}\nsigningkey = {ca}/signkey.pem\nissuercert = {ca}/{CA_ISSUER}\n"
        f"certserial = {ca}/certserial\n")
    (ca / "localca.options").write_text(
        "--platform-manufacturer Test\n--platform-version 2.1\n--platform-model QEMU\n")
    (ca / "setup.conf").write_text(
        f"create_certs_tool = {shutil.which('swtpm_localca')}\n"
        f"create_certs_tool_config = {ca}/localca.conf\n"
        f"create_certs_tool_options = {ca}/localca.options\nactive_pcr_banks = sha256\n")
    proc.run(["swtpm_setup", "--tpm2", "--tpmstate", str(state), "--create-ek-cert",
              "--config", str(ca / "setup.conf"), "--overwrite"], timeout=60)


class Swtpm:
    """swtpm serving ``state`` on the unix control socket ``socket`` for one QEMU run."""

    def __init__(self, state: Path, socket: Path) -> None:
        self.state = state
        self.socket = socket
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.socket.unlink(missing_ok=True)
        self._proc = proc.spawn(["swtpm", "socket", "--tpm2", "--tpmstate", f"dir={self.state}",
                                 "--ctrl", f"type=unixio,path={self.socket}", "--terminate"],
                                stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("swtpm did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill_group(self._proc)
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
