"""Forward one guest connection to a port on the host's loopback.

QEMU's ``guestfwd=tcp:IP:PORT-cmd:CMD`` runs CMD once per connection the guest opens to
IP:PORT, with the connection as its stdin and stdout. This is that CMD:

    python3 -I -S qemu/forward.py PORT

Standard library only, started with -I -S to keep it quick. Nothing but 127.0.0.1 is dialled.
"""

import contextlib
import os
import socket
import sys
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def main() -> int:
    port = int(sys.argv[1])
    guest = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # all three are the guest's connection: keep errors out of it
        os.dup2(devnull, fd)
    try:
        host = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        guest.close()
        return 1
    host.settimeout(None)
    back = threading.Thread(target=pump, args=(host, guest), daemon=True)
    back.start()
    pump(guest, host)
    back.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
