"""http.request against a server that drips its answer a byte at a time: each attempt is cut
at its total_timeout (and retried), at the caller's deadline, and at once on cancel."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agent.errors import Cancelled
from agent.net import http


class Dripper:
    """Reads a request, then sends an answer one byte every ``interval`` seconds."""

    def __init__(self, interval: float = 0.5) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.interval = interval
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/redfish/v1/"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        answer = b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}'
        with conn:
            conn.recv(65536)
            for i in range(len(answer)):
                if self.stop.wait(self.interval):
                    return
                try:
                    conn.sendall(answer[i:i + 1])
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def dripper() -> Iterator[Dripper]:
    d = Dripper()
    yield d
    d.close()


def test_each_attempt_is_cut_at_its_total_timeout_and_retried(dripper: Dripper) -> None:
    opts = http.HttpOptions(timeout=5.0, total_timeout=1.0, max_retries=1, backoff=0.1)
    started = time.monotonic()
    with pytest.raises(http.HttpError) as info:
        http.request("GET", dripper.url, opts)
    took = time.monotonic() - started
    assert "no complete answer within 1 s" in info.value.message
    assert dripper.connections == 2 and took < 4.0, (dripper.connections, took)


def test_the_deadline_cuts_an_answer_that_is_still_coming(dripper: Dripper) -> None:
    opts = http.HttpOptions(timeout=5.0, max_retries=3)
    started = time.monotonic()
    with pytest.raises(http.HttpError) as info:
        http.request("GET", dripper.url, opts, deadline=started + 1.5)
    took = time.monotonic() - started
    assert "before the deadline" in info.value.message
    assert 1.4 < took < 2.5, took


def test_cancel_cuts_an_answer_that_is_still_coming(dripper: Dripper) -> None:
    cancel = threading.Event()
    opts = http.HttpOptions(timeout=5.0, cancel=cancel)
    threading.Timer(0.7, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        http.request("GET", dripper.url, opts, deadline=started + 30)
    took = time.monotonic() - started
    assert took < 0.7 + http.CANCEL_POLL + 0.5, took
