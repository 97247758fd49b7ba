"""A scripted PXE/iPXE DHCP client: sends one DHCPDISCOVER and prints every offer as JSON.

Run inside a network namespace on an interface without an address:

    python tests/site/boot/dhcp_client.py --iface cli0 --mac 52:54:00:00:00:01 [--arch 0|7] [--ipxe]
        [--ciaddr ADDR]       # and then ask the proxy's boot server (port 4011) for the file
    python tests/site/boot/dhcp_client.py --tftp SERVER FILE   # read a file by TFTP: size, sha256

It is what a PXE ROM sends (option 60 "PXEClient:Arch:...", 93 client architecture, 94 the
UNDI version, 97 a machine UUID) and, with --ipxe, what iPXE adds (77 user class "iPXE", 175).
Each offer: server (the source address), yiaddr, siaddr, file, and the options by number (hex).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import socket
import struct
import sys
import time

MAGIC = b"\x63\x82\x53\x63"


def discover(mac: bytes, xid: int, arch: int, ipxe: bool) -> bytes:
    head = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, 0, xid, 0, 0x8000,
                       b"\0" * 4, b"\0" * 4, b"\0" * 4, b"\0" * 4, mac.ljust(16, b"\0"),
                       b"", b"")
    opts = bytearray(MAGIC)

    def opt(code: int, value: bytes) -> None:
        opts.extend([code, len(value)])
        opts.extend(value)

    opt(53, b"\x01")
    opt(60, f"PXEClient:Arch:{arch:05d}:UNDI:002001".encode())
    opt(93, struct.pack("!H", arch))
    opt(94, b"\x01\x02\x01")
    opt(97, b"\x00" + bytes(range(16)))
    opt(55, bytes([1, 3, 6, 43, 60, 66, 67, 128, 129, 175]))
    if ipxe:
        opt(77, b"iPXE")
        opt(175, b"\x13\x01\x01")  # an encapsulated iPXE option (HTTP support)
    opts.append(255)
    return head + bytes(opts)


def boot_request(mac: bytes, xid: int, arch: int, ciaddr: str) -> bytes:
    """The PXE client's second step: ask the proxy's boot server (port 4011) for boot item 0x8000."""
    head = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, 0, xid, 0, 0,
                       socket.inet_aton(ciaddr), b"\0" * 4, b"\0" * 4, b"\0" * 4,
                       mac.ljust(16, b"\0"), b"", b"")
    opts = bytearray(MAGIC)
    for code, value in ((53, b"\x03"), (60, f"PXEClient:Arch:{arch:05d}:UNDI:002001".encode()),
                        (93, struct.pack("!H", arch)), (94, b"\x01\x02\x01"),
                        (97, b"\x00" + bytes(range(16))), (43, b"\x47\x04\x80\x00\x00\x00\xff")):
        opts.extend([code, len(value)])
        opts.extend(value)
    opts.append(255)
    return head + bytes(opts)


def parse(packet: bytes) -> dict[str, object]:
    op, _, _, _, xid = struct.unpack("!BBBBI", packet[:8])
    yiaddr = socket.inet_ntoa(packet[16:20])
    siaddr = socket.inet_ntoa(packet[20:24])
    file = packet[108:236].split(b"\0", 1)[0].decode("latin-1")
    options: dict[str, str] = {}
    i = 240
    while i < len(packet) and packet[i] != 255:
        if packet[i] == 0:
            i += 1
            continue
        code, length = packet[i], packet[i + 1]
        options[str(code)] = packet[i + 2:i + 2 + length].hex()
        i += 2 + length
    return {"op": op, "xid": xid, "yiaddr": yiaddr, "siaddr": siaddr, "file": file,
            "options": options}


def tftp_get(server: str, name: str, timeout: float = 3.0) -> dict[str, object]:
    """Read ``name`` from ``server`` by TFTP (RFC 1350, 512-byte blocks); its size and sha256,
    or the server's error."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    s.sendto(b"\0\1" + name.encode() + b"\0octet\0", (server, 69))
    data = bytearray()
    expected = 1
    while True:
        try:
            packet, peer = s.recvfrom(4 + 65536)
        except TimeoutError:
            return {"error": "timeout"}
        op = struct.unpack("!H", packet[:2])[0]
        if op == 5:
            return {"error": packet[4:].split(b"\0", 1)[0].decode("latin-1")}
        block = struct.unpack("!H", packet[2:4])[0]
        if op != 3:
            return {"error": f"opcode {op}"}
        if block == expected:
            data += packet[4:]
            expected = (expected + 1) & 0xFFFF
        s.sendto(struct.pack("!HH", 4, block), peer)
        if block == (expected - 1) & 0xFFFF and len(packet) - 4 < 512:
            return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def client_socket(iface: str) -> socket.socket:
    """A DHCP client's socket on ``iface``: port 68, broadcast (several may share the port)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    s.bind(("0.0.0.0", 68))
    return s


def gather(s: socket.socket, packet: bytes, xid: int, wait: float, *,
           first_from: str = "") -> list[dict[str, object]]:
    """Broadcast ``packet`` every second, as firmware does, for ``wait`` seconds; every distinct
    reply to ``xid`` (with its "server"). With ``first_from``: return at the first reply from
    that address, alone ([] if none came)."""
    offers: list[dict[str, object]] = []
    deadline = time.monotonic() + wait
    next_send = 0.0
    while (now := time.monotonic()) < deadline:
        if now >= next_send:
            s.sendto(packet, ("255.255.255.255", 67))
            next_send = now + 1.0
        ready, _, _ = select.select([s], [], [], 0.2)
        if not ready:
            continue
        data, (addr, _) = s.recvfrom(4096)
        if len(data) < 240 or data[236:240] != MAGIC:
            continue
        reply = parse(data)
        if reply["op"] != 2 or reply["xid"] != xid:
            continue
        reply["server"] = addr
        if first_from and addr == first_from:
            return [reply]
        if not first_from and reply not in offers:
            offers.append(reply)
    return offers


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iface", default="")
    p.add_argument("--mac", default="")
    p.add_argument("--tftp", nargs=2, metavar=("SERVER", "FILE"), help="read FILE by TFTP instead")
    p.add_argument("--arch", type=int, default=0)
    p.add_argument("--ipxe", action="store_true")
    p.add_argument("--wait", type=float, default=3.0)
    p.add_argument("--ciaddr", default="", help="this address: also ask the boot server (4011)")
    a = p.parse_args()
    if a.tftp:
        json.dump(tftp_get(*a.tftp), sys.stdout)
        return 0
    mac = bytes.fromhex(a.mac.replace(":", ""))
    xid = int.from_bytes(os.urandom(4), "big")
    s = client_socket(a.iface)
    offers = gather(s, discover(mac, xid, a.arch, a.ipxe), xid, a.wait)
    proxy = [o for o in offers if o["yiaddr"] == "0.0.0.0" and "43" in o["options"]]  # type: ignore[operator]
    if a.ciaddr and proxy:
        server = str(proxy[0]["server"])
        request = boot_request(mac, xid, a.arch, a.ciaddr)
        deadline = time.monotonic() + a.wait
        while time.monotonic() < deadline:
            s.sendto(request, (server, 4011))
            ready, _, _ = select.select([s], [], [], 1.0)
            if ready:
                data, (addr, _) = s.recvfrom(4096)
                if len(data) >= 240 and data[236:240] == MAGIC:
                    reply = parse(data)
                    reply["server"] = addr
                    reply["boot_server"] = True
                    offers.append(reply)
                    break
    json.dump(offers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
