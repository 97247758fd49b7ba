"""LLDP (IEEE 802.1AB): listen for the switch's announcement on each NIC, parse its TLVs.

``listen`` opens one AF_PACKET socket per interface for ethertype 0x88cc, joins the LLDP
multicast group (01:80:c2:00:00:0e, which NICs filter out otherwise), and waits at most
``seconds`` (switches send every 30 s by default) or until every interface has heard one.
``parse_frame`` reads a raw Ethernet frame (with or without an 802.1Q tag).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

ETH_P_LLDP = 0x88CC
ETH_P_8021Q = 0x8100
LLDP_MULTICAST = bytes.fromhex("0180c200000e")
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_MULTICAST = 0

# TLV types
END, CHASSIS_ID, PORT_ID, TTL, PORT_DESCRIPTION, SYSTEM_NAME, SYSTEM_DESCRIPTION = 0, 1, 2, 3, 4, 5, 6
MANAGEMENT_ADDRESS = 8


@dataclass(frozen=True)
class Neighbour:
    chassis_id: str = ""
    port_id: str = ""
    port_description: str = ""
    system_name: str = ""
    system_description: str = ""
    management_address: str = ""
    ttl: int = 0


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _address(raw: bytes) -> str:
    """An IANA address-family-prefixed network address (1 IPv4, 2 IPv6)."""
    if not raw:
        return ""
    family, value = raw[0], raw[1:]
    with contextlib.suppress(ValueError):
        if family == 1 and len(value) == 4:
            return str(ipaddress.IPv4Address(value))
        if family == 2 and len(value) == 16:
            return str(ipaddress.IPv6Address(value))
    return value.hex()


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip("\x00").strip()


def _id(raw: bytes, mac_subtype: int, address_subtype: int) -> str:
    """A chassis or port id: MAC and network-address subtypes decoded, others as text."""
    if not raw:
        return ""
    subtype, value = raw[0], raw[1:]
    if subtype == mac_subtype and len(value) == 6:
        return _mac(value)
    if subtype == address_subtype:
        return _address(value)
    text = _text(value)
    return text if text.isprintable() else value.hex()


def parse_frame(frame: bytes) -> Neighbour | None:
    """The neighbour an LLDP frame announces; None when it is not a well-formed LLDPDU."""
    if len(frame) < 14:
        return None
    offset = 12
    ethertype = struct.unpack_from("!H", frame, offset)[0]
    if ethertype == ETH_P_8021Q and len(frame) >= 18:
        offset += 4
        ethertype = struct.unpack_from("!H", frame, offset)[0]
    if ethertype != ETH_P_LLDP:
        return None
    offset += 2
    fields: dict[str, str | int] = {}
    while offset + 2 <= len(frame):
        header = struct.unpack_from("!H", frame, offset)[0]
        kind, length = header >> 9, header & 0x1FF
        offset += 2
        value = frame[offset : offset + length]
        if len(value) < length:
            return None  # truncated TLV
        offset += length
        if kind == END:
            break
        if kind == CHASSIS_ID:
            fields["chassis_id"] = _id(value, mac_subtype=4, address_subtype=5)
        elif kind == PORT_ID:
            fields["port_id"] = _id(value, mac_subtype=3, address_subtype=4)
        elif kind == TTL and length >= 2:
            fields["ttl"] = struct.unpack_from("!H", value)[0]
        elif kind == PORT_DESCRIPTION:
            fields["port_description"] = _text(value)
        elif kind == SYSTEM_NAME:
            fields["system_name"] = _text(value)
        elif kind == SYSTEM_DESCRIPTION:
            fields["system_description"] = _text(value)
        elif kind == MANAGEMENT_ADDRESS and length >= 2 and "management_address" not in fields:
            size = value[0]
            fields["management_address"] = _address(value[1 : 1 + size])
    if "chassis_id" not in fields or "port_id" not in fields:
        return None  # both are mandatory
    return Neighbour(**fields)  # type: ignore[arg-type]  # the fields parsed above, by name


def _open(interface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_LLDP))
    try:
        sock.bind((interface, ETH_P_LLDP))
        ifindex = socket.if_nametoindex(interface)
        mreq = struct.pack("iHH8s", ifindex, PACKET_MR_MULTICAST, 6, LLDP_MULTICAST)
        with contextlib.suppress(OSError):
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def listen(
    interfaces: Sequence[str], seconds: float, cancel: threading.Event | None = None
) -> dict[str, Neighbour]:
    """The first LLDP neighbour heard on each interface within ``seconds``."""
    sockets: dict[socket.socket, str] = {}
    found: dict[str, Neighbour] = {}
    try:
        for name in interfaces:
            try:
                sockets[_open(name)] = name
            except OSError as exc:
                log.info("LLDP: cannot listen on %s: %s", name, exc)
        deadline = time.monotonic() + seconds
        while sockets and (left := deadline - time.monotonic()) > 0:
            if cancel is not None and cancel.is_set():
                break
            ready, _, _ = select.select(list(sockets), [], [], min(left, 0.2))
            for sock in ready:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    frame = sock.recv(9216)
                    neighbour = parse_frame(frame)
                    if neighbour is not None:
                        found[sockets.pop(sock)] = neighbour
                        sock.close()
    finally:
        for sock in sockets:
            sock.close()
    return found
