"""A node's serial line between QEMU and its emulated BMC, as the wire on a real board is: always
there, whoever is listening.

QEMU dials ``node_port`` at start (``-chardev socket,server=off``: qemu/harness.py
``serial_port``), so not a byte of the firmware is written before the line exists; ipmi_sim
dials ``bmc_port`` when a SOL session is activated (qemu/ipmisim.py ``sol``), maybe seconds
later, maybe again after a drop. What the node writes while no BMC side is connected is held,
the newest ``HOLD`` bytes, and given to the next BMC connection, as a BMC's SOL buffer would.

    relay = SerialRelay().start()
    NodeSpec(..., serial_port=relay.node_port);  start_ipmi_sim(..., sol=relay.sol)
    relay.stop()
"""

from __future__ import annotations

import contextlib
import socket
import threading

HOLD = 1 << 20


class SerialRelay:
    def __init__(self) -> None:
        self._node_server = self._listen()
        self._bmc_server = self._listen()
        self.node_port = int(self._node_server.getsockname()[1])
        self.bmc_port = int(self._bmc_server.getsockname()[1])
        self._lock = threading.Lock()
        self._node: socket.socket | None = None
        self._bmc: socket.socket | None = None
        self._held = bytearray()
        self._stopped = False

    @property
    def sol(self) -> str:
        """ipmi_sim's ``sol`` device for this line."""
        return f"tcp:127.0.0.1:{self.bmc_port}"

    @staticmethod
    def _listen() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        return s

    def start(self) -> SerialRelay:
        for server, side in ((self._node_server, "node"), (self._bmc_server, "bmc")):
            threading.Thread(target=self._accept, args=(server, side), name=f"serial-{side}",
                             daemon=True).start()
        return self

    def _accept(self, server: socket.socket, side: str) -> None:
        while not self._stopped:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with self._lock:
                old = self._node if side == "node" else self._bmc
                if side == "node":
                    self._node = conn
                else:
                    self._bmc = conn
                    held, self._held = bytes(self._held), bytearray()
            if old is not None:
                with contextlib.suppress(OSError):
                    old.close()
            if side == "bmc" and held:
                with contextlib.suppress(OSError):
                    conn.sendall(held)
            threading.Thread(target=self._pump, args=(conn, side), daemon=True).start()

    def _pump(self, conn: socket.socket, side: str) -> None:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    if side == "node" and self._node is conn:
                        self._node = None
                    elif side == "bmc" and self._bmc is conn:
                        self._bmc = None
                return
            with self._lock:
                other = self._bmc if side == "node" else self._node
                if other is None and side == "node":
                    self._held += data
                    del self._held[:-HOLD]
                    continue
            if other is not None:
                try:
                    other.sendall(data)
                except OSError:
                    if side == "node":
                        with self._lock:
                            self._held += data
                            del self._held[:-HOLD]

    def stop(self) -> None:
        self._stopped = True
        for s in (self._node_server, self._bmc_server, self._node, self._bmc):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()
