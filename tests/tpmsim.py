"""A real TPM 2.0 for tests: swtpm, manufactured by swtpm_setup with an EK certificate from a
local CA made in a temp dir (swtpm_localca pointed at a config of our own), serving raw TPM
commands on 127.0.0.1.

    with SimTpm.manufacture(tmp_path / "tpm") as sim:
        with sim.tpm() as tpm: ...        # agent.hw.tpm.Tpm over the simulator's socket
        sim.tcti                          # "swtpm:host=127.0.0.1,port=P" for tpm2-tools
        sim.ca_root, sim.ca_issuer        # the local CA's root and issuing certificates (PEM)

Skips the test where swtpm or swtpm_setup is absent.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Self

import pytest

from agent import proc
from agent.gateway.verifier import eventlog
from agent.hw import tpm as tpmwire
from qemu import tpm as qemu_tpm
from tests.conftest import free_port


def need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")



def manufacture(state: Path, ca: Path) -> None:
    """A new TPM state with EKs and their certificates from a local CA (qemu/tpm.py); skips
    the test where swtpm is absent."""
    reason = qemu_tpm.missing()
    if reason:
        pytest.skip(reason)
    qemu_tpm.manufacture(state, ca)


class SimTpm:
    def __init__(self, state: Path, ca: Path) -> None:
        self.state = state
        self.ca = ca
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def manufacture(cls, root: Path) -> Self:
        manufacture(root / "state", root / "ca")
        return cls(root / "state", root / "ca")

    @property
    def ca_root(self) -> Path:
        return self.ca / qemu_tpm.CA_ROOT

    @property
    def ca_issuer(self) -> Path:
        return self.ca / qemu_tpm.CA_ISSUER

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    def start(self) -> None:
        for _ in range(5):
            self.port = free_port()
            self._proc = proc.spawn(
                ["swtpm", "socket", "--tpm2", "--tpmstate", f"dir={self.state}",
                 "--server", f"type=tcp,port={self.port},bindaddr=127.0.0.1",
                 "--ctrl", f"type=tcp,port={self.port + 1},bindaddr=127.0.0.1",
                 "--flags", "not-need-init,startup-clear"],
                stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._proc.poll() is None:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                    return
                time.sleep(0.05)
            self.stop()
        raise RuntimeError("swtpm did not start")

    def stop(self) -> None:
        if self._proc is not None:
            proc.kill_group(self._proc)
            self._proc.wait()
            self._proc = None

    def restart(self, *, orderly: bool = False) -> None:
        """The TPM's reset: power cycle, a new boot (resetCount up, PCRs zero). ``orderly``: a
        reboot, the OS sending TPM2_Shutdown(CLEAR) first; a power cut is not orderly, and each
        one after a dictionary-attack-protected use counts towards the TPM's lockout."""
        if orderly:
            transport = self.transport()
            try:  # TPM2_Shutdown (0x145), TPM_SU_CLEAR
                transport.transact(struct.pack(">HII", 0x8001, 12, 0x145) + b"\0\0")
            finally:
                transport.close()
        self.stop()
        self.start()

    def transport(self) -> tpmwire.SocketTransport:
        return tpmwire.SocketTransport(("127.0.0.1", self.port))

    @contextlib.contextmanager
    def tpm(self) -> Iterator[tpmwire.Tpm]:
        with tpmwire.opened(self.transport()) as t:
            yield t

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def manufactured_tpm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One manufactured TPM state and its CA per test session (swtpm_setup takes about a second)."""
    root = tmp_path_factory.mktemp("tpm-manufactured")
    manufacture(root / "state", root / "ca")
    return root


@pytest.fixture
def sim(manufactured_tpm: Path, tmp_path: Path) -> Iterator[SimTpm]:
    """A running swtpm on a copy of the session's TPM state: every test its own TPM, the same EK."""
    shutil.copytree(manufactured_tpm / "state", tmp_path / "tpm-state")
    with SimTpm(tmp_path / "tpm-state", manufactured_tpm / "ca") as running:
        yield running


@pytest.fixture
def other_sim(tmp_path: Path) -> Iterator[SimTpm]:
    """A second TPM with its own EK, certified by a CA of its own."""
    with SimTpm.manufacture(tmp_path / "other-tpm") as running:
        yield running


# A firmware's measured boot, played into a TPM --------------------------------------------

def event_log(events: Iterable[tuple[int, int, bytes, bytes]], *, locality: int | None = None) -> bytes:
    """A crypto-agile SHA-256 event log of (PCR, type, SHA-256 digest, data) events, as firmware
    writes one (TCG PC Client PFP)."""
    sha256 = eventlog.SHA256
    spec = eventlog.SPEC_ID + struct.pack("<IBBBBIHH", 0, 0, 2, 0, 2, 1, sha256, 32) + b"\0"
    out = bytearray(struct.pack("<II", 0, Ev.NO_ACTION) + bytes(20) + struct.pack("<I", len(spec)) + spec)

    def record(pcr: int, kind: int, digest: bytes, data: bytes) -> bytes:
        return struct.pack("<IIIH", pcr, kind, 1, sha256) + digest + struct.pack("<I", len(data)) + data

    if locality is not None:
        out += record(0, Ev.NO_ACTION, bytes(32), eventlog.STARTUP_LOCALITY + bytes([locality]))
    for pcr, kind, digest, data in events:
        out += record(pcr, kind, digest, data)
    return bytes(out)


def h(text: bytes) -> bytes:
    return hashlib.sha256(text).digest()


Ev = eventlog.Ev


def variable(name: str, value: bytes) -> bytes:
    """UEFI_VARIABLE_DATA: the EFI global variable GUID, the name's length, the value's, both."""
    guid = bytes.fromhex("61dfe48bca93d211aa0d00e098032b8c")
    return guid + struct.pack("<QQ", len(name), len(value)) + name.encode("utf-16-le") + value


def image() -> bytes:
    """UEFI_IMAGE_LOAD_EVENT of an image at no address, with an empty device path."""
    return struct.pack("<QQQQ", 0, 0, 0, 0)


def ev(pcr: int, kind: int, data: bytes, digest: bytes | None = None) -> tuple[int, int, bytes, bytes]:
    """One event; its digest is of its data unless given (an image's is its Authenticode hash)."""
    return pcr, kind, h(data) if digest is None else digest, data


# A UEFI boot as OVMF measures one, shortened: firmware (0), its configuration (1), option ROMs
# (2), Secure Boot state (7), separators, the boot attempt, then the loaded image (4), and what
# the kernel's EFI stub measures (9). Digests of made-up content; tests change them to tamper.
UEFI_BOOT: list[tuple[int, int, bytes, bytes]] = [
    ev(0, Ev.S_CRTM_VERSION, "1.0".encode("utf-16-le") + b"\0\0"),
    ev(0, Ev.EFI_PLATFORM_FIRMWARE_BLOB, struct.pack("<QQ", 0x820000, 0xE0000), h(b"firmware volume")),
    ev(1, Ev.EFI_VARIABLE_BOOT, variable("BootOrder", b"\0\0")),
    ev(2, Ev.EFI_BOOT_SERVICES_DRIVER, image(), h(b"nic option rom")),
    ev(7, Ev.EFI_VARIABLE_DRIVER_CONFIG, variable("SecureBoot", b"\0")),
    *[ev(pcr, Ev.SEPARATOR, bytes(4)) for pcr in range(8)],
    ev(4, Ev.EFI_ACTION, b"Calling EFI Application from Boot Option"),
    ev(4, Ev.EFI_BOOT_SERVICES_APPLICATION, image(), h(b"ramdisk uki")),
    ev(9, Ev.EVENT_TAG, struct.pack("<II", 0x8F3B22EC, 7) + b"initrd\0", h(b"initrd")),
]
# A BIOS boot (SeaBIOS): firmware measured, the loader handed an IPL event, nothing in PCR 4
# that is an EFI application.
BIOS_BOOT: list[tuple[int, int, bytes, bytes]] = [
    ev(0, Ev.S_CRTM_VERSION, b"SeaBIOS\0"),
    *[ev(pcr, Ev.SEPARATOR, bytes(4)) for pcr in range(8)],
    ev(4, Ev.ACTION, b"Calling INT 19h"),
    ev(4, Ev.IPL, bytes(16), h(b"boot sector")),
]


def measure(tpm: tpmwire.Tpm, events: Iterable[tuple[int, int, bytes, bytes]],
            *, locality: int | None = None) -> bytes:
    """Extend ``events`` into the TPM as firmware would; the event log that records them."""
    events = list(events)
    for pcr, kind, digest, _ in events:
        if kind != Ev.NO_ACTION:
            tpm.pcr_extend(pcr, digest)
    return event_log(events, locality=locality)
