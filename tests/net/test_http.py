"""agent.net.http against a real loopback server: resume, faults, redirects, TLS, PUT."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import Cancelled, InvalidParameters, SourceFailed
from agent.net import http
from tests.loopback_http import Fault, LoopbackServer, ScriptedServer, Seen, self_signed_cert

DATA = os.urandom(3 * 1024 * 1024 + 123)
FAST = http.HttpOptions(timeout=5.0, max_retries=3, backoff=0.01)


def fetch(url: str, opts: http.HttpOptions = FAST, offset: int = 0) -> tuple[bytes, http.Download]:
    with http.get(url, opts, offset=offset) as body:
        data = b"".join(body.iter_chunks(256 * 1024))
    return data, body


def test_plain_get() -> None:
    with LoopbackServer() as srv:
        data, body = fetch(srv.add("/a", DATA))
    assert data == DATA
    assert body.total == len(DATA) and body.resumes == 0


def test_offset_uses_range() -> None:
    with LoopbackServer() as srv:
        data, _ = fetch(srv.add("/a", DATA), offset=1000)
        assert srv.requests[-1][2]["Range"] == "bytes=1000-"
    assert data == DATA[1000:]


@pytest.mark.parametrize(
    "fault",
    [
        Fault(reset_after=1_000_000, times=2),
        Fault(truncate_after=500_000, times=1),
        Fault(stall_after=200_000, stall=3.0, times=1),
    ],
    ids=["reset", "truncated", "stalled"],
)
def test_resume_after_drop(fault: Fault) -> None:
    opts = http.HttpOptions(timeout=1.0, max_retries=3, backoff=0.01)
    with LoopbackServer() as srv:
        data, body = fetch(srv.add("/a", DATA, fault), opts)
        ranges = [r[2].get("Range") for r in srv.requests]
        assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:])
        assert all(r[2].get("If-Range") == '"v1"' for r in srv.requests[1:])
    assert hashlib.sha256(data).digest() == hashlib.sha256(DATA).digest()
    assert body.resumes >= 1


def test_server_ignoring_range_is_skipped_forward() -> None:
    with LoopbackServer() as srv:
        data, body = fetch(srv.add("/a", DATA, Fault(reset_after=700_000, ignore_range=True, times=1)))
    assert data == DATA and body.resumes == 1


def test_always_truncated_fails_never_short_success() -> None:
    with LoopbackServer() as srv:
        url = srv.add("/a", DATA, Fault(truncate_after=100_000))
        with pytest.raises(SourceFailed, match="download failed at byte"):
            fetch(url)


def test_404_fails_at_once() -> None:
    with LoopbackServer() as srv:
        with pytest.raises(http.HttpError, match="HTTP 404") as err:
            fetch(srv.url("/missing"))
        assert err.value.status == 404
        assert len(srv.requests) == 1


def test_500_retried_then_served() -> None:
    with LoopbackServer() as srv:
        data, _ = fetch(srv.add("/a", DATA, Fault(status=500, times=2)))
        assert len(srv.requests) == 3
    assert data == DATA


def test_500_forever_gives_up() -> None:
    with (
        LoopbackServer() as srv,
        pytest.raises(http.HttpError, match=r"giving up after 4 attempts.*HTTP 500") as err,
    ):
        fetch(srv.add("/a", DATA, Fault(status=500)))
    assert err.value.status == 500


def test_slow_server_still_completes() -> None:
    small = DATA[: 512 * 1024]
    with LoopbackServer() as srv:
        data, _ = fetch(srv.add("/a", small, Fault(delay=0.05)))
    assert data == small


def test_redirect_followed() -> None:
    with LoopbackServer() as srv:
        srv.add("/real", DATA)
        srv.redirect("/old", "/real")
        data, _ = fetch(srv.url("/old"))
    assert data == DATA


def test_redirect_to_nowhere_is_a_failure() -> None:
    with LoopbackServer() as srv:
        srv.redirect("/nowhere", "")
        with pytest.raises(SourceFailed, match="redirect without Location"):
            fetch(srv.url("/nowhere"))


def test_callers_headers_go_to_the_urls_origin_only() -> None:
    """A token for the image server is not handed to wherever it redirects: a redirect on the
    same origin keeps the caller's headers, one to another origin (another port here) drops
    them, as curl does."""
    opts = http.HttpOptions(timeout=5.0, headers={"Authorization": "Bearer s3cret", "X-Tag": "t"})
    with LoopbackServer() as home, LoopbackServer() as elsewhere:
        elsewhere.add("/real", DATA)
        home.add("/here", DATA)
        home.redirect("/moved", "/here")
        home.redirect("/old", elsewhere.url("/real"))
        assert fetch(home.url("/moved"), opts)[0] == DATA
        assert fetch(home.url("/old"), opts)[0] == DATA
        seen = {path: headers for _m, path, headers in home.requests + elsewhere.requests}
    assert seen["/moved"]["Authorization"] == seen["/here"]["Authorization"] == "Bearer s3cret"
    assert seen["/old"]["X-Tag"] == "t"
    assert "Authorization" not in seen["/real"] and "X-Tag" not in seen["/real"]


def test_cancel_interrupts() -> None:
    cancel = threading.Event()
    cancel.set()
    with LoopbackServer() as srv, pytest.raises(Cancelled):
        fetch(srv.add("/a", DATA), http.HttpOptions(cancel=cancel))


def test_connection_refused_is_source_failed() -> None:
    with LoopbackServer() as srv:
        url = srv.url("/a")
    with pytest.raises(SourceFailed, match="giving up"):
        fetch(url)


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "http:///nohost", "http://127.0.0.1:99999/x"]
)
def test_bad_urls_refused(url: str) -> None:
    with pytest.raises(InvalidParameters):
        http.get(url)


def test_header_injection_refused() -> None:
    with LoopbackServer() as srv, pytest.raises(InvalidParameters, match="line break"):
        fetch(srv.add("/a", DATA), http.HttpOptions(headers={"X-A": "b\r\nEvil: 1"}))


def test_redact_hides_credentials() -> None:
    assert http.redact("https://user:pw@host:8443/p/img?token=abc") == "https://host:8443/p/img"


def test_tls_with_extra_ca(tmp_path: Path) -> None:
    cert, key = self_signed_cert(str(tmp_path))
    with LoopbackServer(tls=(cert, key)) as srv:
        url = srv.add("/a", DATA)
        with pytest.raises(SourceFailed, match="CERTIFICATE_VERIFY_FAILED"):
            fetch(url, http.HttpOptions(max_retries=0))
        data, _ = fetch(url, http.HttpOptions(ca_pem=Path(cert).read_text()))
        data2, _ = fetch(url, http.HttpOptions(ca_file=Path(cert)))
    assert data == DATA == data2


def test_bad_ca_pem_is_invalid_parameters() -> None:
    with pytest.raises(InvalidParameters, match="CA bundle"):
        http.ssl_context(ca_pem="-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")


def test_put_bytes_file_and_chunked(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(DATA)
    with LoopbackServer() as srv:
        resp = http.put(srv.url("/b"), DATA[:1000], FAST, content_type="text/plain")
        assert resp.status == 201 and srv.uploads["/b"] == DATA[:1000]
        with src.open("rb") as f:
            http.put(srv.url("/f"), f, FAST)
        assert srv.uploads["/f"] == DATA
        http.put(srv.url("/c"), iter([b"ab", b"cd"]), FAST)
        assert srv.uploads["/c"] == b"abcd"
        headers = srv.requests[-1][2]
        assert headers["Transfer-Encoding"] == "chunked"


def test_put_error_status() -> None:
    with LoopbackServer() as srv:
        srv.add("/b", b"", Fault(status=403))
        with pytest.raises(http.HttpError, match="HTTP 403") as err:
            http.put(srv.url("/b"), b"x", FAST)
    assert err.value.status == 403


def ranged(url: str, pool: http.ConnectionPool | None, pieces: int = 6,
           opts: http.HttpOptions = FAST) -> bytes:
    """The resource in ``pieces`` bounded Range requests, in order, as a deploy fetches runs."""
    step = -(-len(DATA) // pieces)
    out = b""
    for start in range(0, len(DATA), step):
        with http.get(url, opts, offset=start, length=min(step, len(DATA) - start), pool=pool) as body:
            out += b"".join(body.iter_chunks(256 * 1024))
    return out


def test_ranges_share_one_kept_alive_connection() -> None:
    with LoopbackServer() as srv:
        url = srv.add("/a", DATA)
        with http.ConnectionPool() as pool:
            assert ranged(url, pool) == DATA
        assert srv.connections == 1 and pool.opened == 1
        assert len(srv.requests) == 6
        assert ranged(url, None) == DATA  # without a pool: a connection per request, as before
        assert srv.connections == 1 + 6


def test_kept_alive_connection_closed_by_the_server_is_replaced() -> None:
    """A server that closes each connection after its response (without saying so, as an idle
    timeout does): every request gets a new one, and none of it counts as a failure."""
    opts = http.HttpOptions(timeout=5.0, max_retries=0)
    with LoopbackServer() as srv:
        url = srv.add("/a", DATA, Fault(close_after=True))
        with http.ConnectionPool() as pool:
            assert ranged(url, pool, opts=opts) == DATA
        assert srv.connections == 6 and len(srv.requests) == 6


def test_redirect_followed_once_per_pool() -> None:
    """Behind a redirect every Range request goes straight to where the first one was sent,
    on the same connection; a failure there forgets it and follows the URL itself again."""
    with LoopbackServer() as srv:
        srv.add("/real", DATA)
        srv.redirect("/old", "/real")
        with http.ConnectionPool() as pool:
            assert ranged(srv.url("/old"), pool) == DATA
        paths = [path for _m, path, _h in srv.requests]
        assert paths == ["/old"] + ["/real"] * 6 and srv.connections == 1
        pool = http.ConnectionPool()
        pool.remember(srv.url("/old"), srv.url("/gone"))
        with http.get(srv.url("/old"), FAST, pool=pool) as body:     # /gone: 404, then /old again
            assert b"".join(body.iter_chunks()) == DATA
        assert [path for _m, path, _h in srv.requests][-3:] == ["/gone", "/old", "/real"]
        assert pool.resolved(srv.url("/old")) == srv.url("/real")
        pool.close()


def test_tls_ranges_pay_one_handshake(tmp_path: Path) -> None:
    cert, key = self_signed_cert(str(tmp_path))
    opts = http.HttpOptions(timeout=5.0, ca_file=Path(cert))
    with LoopbackServer(tls=(cert, key)) as srv:
        url = srv.add("/a", DATA)
        with http.ConnectionPool() as pool:
            assert ranged(url, pool, opts=opts) == DATA
        assert srv.connections == 1


class Tokens:
    """An http.Authorization: a Bearer token, renewed (or not, ``grant``) on a 401."""

    def __init__(self, grant: bool = True) -> None:
        self.token, self.grant = "old", grant
        self.challenges: list[str] = []

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def renew(self, challenge: str) -> bool:
        self.challenges.append(challenge)
        if self.grant:
            self.token = "new"
        return self.grant


CHALLENGE = 'Bearer realm="https://auth.example/token",scope="repository:os:pull"'


def wants(token: str) -> Callable[[Seen], tuple[int, dict[str, str], bytes]]:
    def answer(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        if seen.headers.get("Authorization") == f"Bearer {token}":
            return 200, {}, DATA[:1000]
        return 401, {"WWW-Authenticate": CHALLENGE}, b'{"errors": []}'
    return answer


@pytest.mark.parametrize("accepted", ["new", "never"])
def test_a_401_has_the_authorization_renewed_once(accepted: str) -> None:
    tokens = Tokens()
    opts = http.HttpOptions(timeout=5.0, max_retries=3, backoff=0.01, auth=tokens)
    with ScriptedServer() as srv:
        srv.route("GET", "/blob", wants(accepted))
        if accepted == "new":
            assert fetch(srv.url("/blob"), opts)[0] == DATA[:1000]
        else:
            with pytest.raises(http.HttpError, match="401") as info:
                fetch(srv.url("/blob"), opts)
            assert info.value.status == 401
        sent = [seen.headers.get("Authorization") for seen in srv.seen]
    assert tokens.challenges == [CHALLENGE]            # once, never a loop
    assert sent == ["Bearer old", "Bearer new"]


def test_an_authorization_not_renewed_fails_clearly() -> None:
    tokens = Tokens(grant=False)
    opts = http.HttpOptions(timeout=5.0, max_retries=3, backoff=0.01, auth=tokens)
    with ScriptedServer() as srv:
        srv.route("GET", "/blob", wants("new"))
        with pytest.raises(http.HttpError, match="could not be renewed") as info:
            fetch(srv.url("/blob"), opts)
        assert len(srv.seen) == 1
    assert info.value.status == 401 and tokens.challenges == [CHALLENGE]


def test_a_401_from_another_origin_is_not_answered_with_the_authorization() -> None:
    """The authorization goes to the URL's origin only: blob storage elsewhere that answers
    401 neither gets it nor has it renewed."""
    tokens = Tokens()
    opts = http.HttpOptions(timeout=5.0, max_retries=3, backoff=0.01, auth=tokens)
    with ScriptedServer() as home, ScriptedServer() as storage:
        storage.route("GET", "/data", wants("old"))
        home.route("GET", "/blob", lambda seen: (307, {"Location": storage.url("/data")}, b""))
        with pytest.raises(http.HttpError, match="401"):
            fetch(home.url("/blob"), opts)
        assert home.seen[0].headers.get("Authorization") == "Bearer old"
        assert all("Authorization" not in seen.headers for seen in storage.seen)
    assert tokens.challenges == []
