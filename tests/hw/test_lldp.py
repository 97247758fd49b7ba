"""LLDP: the parser against recorded frames, and a live frame over a veth pair."""

from __future__ import annotations

import shutil
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import proc
from agent.errors import AgentError
from agent.hw import lldp

# The Wireshark wiki's minimal LLDPDU (mandatory TLVs only): chassis id as a MAC address,
# port id as an interface name "1/3", TTL 120.
WIRESHARK_MINIMAL = bytes.fromhex("0180c200000e0004961fa72688cc0207040004961fa726040405312f3306020078 0000")

# Captured from a VirtualBox guest running an LLDP agent (S7comm dataset): locally assigned
# chassis and port ids, system name and description, capabilities, an IPv4 management
# address and organisation-specific TLVs.
VIRTUALBOX_HMI = (
    b"\x01\x80\xc2\x00\x00\x0e\x08\x00'.\xcf\xf4\x88\xcc\x02\r\x07windows-7-vm\x04\t\x07port-001"
    b"\x06\x02\x00\x14\n\x0cWINDOWS-7-VM\x0c#innotek GmbH VirtualBox,1.2,0 + HMI\x0e\x04\x00\x80"
    b"\x00\x80\x10\x14\x05\x01\n\n\n\x14\x02\x00\x00\x00\x01\x08+\x06\x01\x04\x01\x81\xc0n\xfe\x08"
    b"\x00\x0e\xcf\x02\x00\x00\x00\x00\xfe\n\x00\x0e\xcf\x05\x08\x00'.\xcf\xf4\xfe\t\x00\x12\x0f"
    b"\x01\x03\xec\x03\x00\x1e\x00\x00"
)


def build_frame(source_mac: bytes, neighbour: lldp.Neighbour) -> bytes:
    """An LLDP frame announcing ``neighbour`` (chassis id as text, port id as ifname)."""

    def tlv(kind: int, value: bytes) -> bytes:
        return struct.pack("!H", (kind << 9) | len(value)) + value

    body = (
        tlv(lldp.CHASSIS_ID, b"\x07" + neighbour.chassis_id.encode())
        + tlv(lldp.PORT_ID, b"\x05" + neighbour.port_id.encode())
        + tlv(lldp.TTL, struct.pack("!H", neighbour.ttl or 120))
        + (tlv(lldp.SYSTEM_NAME, neighbour.system_name.encode()) if neighbour.system_name else b"")
        + tlv(lldp.END, b"")
    )
    return lldp.LLDP_MULTICAST + source_mac + struct.pack("!H", lldp.ETH_P_LLDP) + body


def test_minimal_frame() -> None:
    n = lldp.parse_frame(WIRESHARK_MINIMAL)
    assert n == lldp.Neighbour(chassis_id="00:04:96:1f:a7:26", port_id="1/3", ttl=120)


def test_frame_with_optional_tlvs() -> None:
    n = lldp.parse_frame(VIRTUALBOX_HMI)
    assert n is not None
    assert (n.chassis_id, n.port_id, n.ttl) == ("windows-7-vm", "port-001", 20)
    assert n.system_name == "WINDOWS-7-VM"
    assert n.system_description == "innotek GmbH VirtualBox,1.2,0 + HMI"
    assert n.management_address == "10.10.10.20"


def test_vlan_tagged_frame() -> None:
    tagged = WIRESHARK_MINIMAL[:12] + bytes.fromhex("81000064") + WIRESHARK_MINIMAL[12:]
    assert lldp.parse_frame(tagged) == lldp.parse_frame(WIRESHARK_MINIMAL)


def test_malformed_frames_are_ignored() -> None:
    assert lldp.parse_frame(b"") is None
    assert lldp.parse_frame(WIRESHARK_MINIMAL[:20]) is None  # chassis TLV cut short
    ipv4 = WIRESHARK_MINIMAL[:12] + b"\x08\x00" + WIRESHARK_MINIMAL[14:]
    assert lldp.parse_frame(ipv4) is None
    no_port = WIRESHARK_MINIMAL[:23] + b"\x06\x02\x00\x78\x00\x00"
    assert lldp.parse_frame(no_port) is None
    for cut in range(len(VIRTUALBOX_HMI)):
        lldp.parse_frame(VIRTUALBOX_HMI[:cut])  # never raises


def test_build_frame_round_trips() -> None:
    n = lldp.Neighbour(chassis_id="leaf-07", port_id="Ethernet1/12", system_name="leaf-07.pod3", ttl=120)
    assert lldp.parse_frame(build_frame(bytes(6), n)) == n


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 not installed")
    tag = uuid.uuid4().hex[:6]
    a, b = f"lldpa{tag}", f"lldpb{tag}"
    try:
        proc.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], timeout=30)
    except AgentError as exc:
        pytest.skip(f"cannot create a veth pair: {exc}")
    try:
        for name in (a, b):
            proc.run(["ip", "link", "set", name, "up"], timeout=30)
        yield a, b
    finally:
        proc.run(["ip", "link", "del", a], check=False, timeout=30)


def test_listen_hears_a_neighbour_on_a_veth_pair(veth: tuple[str, str]) -> None:
    sender, listener = veth
    announced = lldp.Neighbour(chassis_id="spine-1", port_id="swp7", system_name="spine-1", ttl=120)
    stop = threading.Event()

    def announce() -> None:
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind((sender, 0))
            mac = bytes.fromhex(Path(f"/sys/class/net/{sender}/address").read_text().strip().replace(":", ""))
            frame = build_frame(mac, announced)
            while not stop.wait(0.2):
                s.send(frame)

    thread = threading.Thread(target=announce, daemon=True)
    thread.start()
    try:
        found = lldp.listen([listener, "no-such-nic0"], seconds=20)
    finally:
        stop.set()
        thread.join(5)
    assert found == {listener: announced}


def test_listen_gives_up_at_its_deadline(veth: tuple[str, str]) -> None:
    started = time.monotonic()
    assert lldp.listen([veth[1]], seconds=0.5) == {}
    assert time.monotonic() - started < 15  # bounded, generously
    cancel = threading.Event()
    cancel.set()
    assert lldp.listen([veth[1]], seconds=30, cancel=cancel) == {}
