"""logs.collect: archive with manifest, redaction, confinement, caps, upload with digest headers."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.bulk.logs import LogsCollect, read_confined
from agent.config import Config
from agent.errors import AgentError, InvalidParameters, Reason
from agent.proto import agent_pb2
from tests.loopback_http import LoopbackServer

TOKEN = "enroll-7f3a9c2b4d1e"
PEM_BODY = "MC4CAQAwBQYDK2VwBCIEIK0e9bB0vT0b6pQbC1wQk1wq5W3aV2pX0l9s8mVt2uQy"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\n"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Config, Path]:
    allowed = tmp_path / "allowed"
    state = tmp_path / "state"
    allowed.mkdir()
    state.mkdir()
    (state / "node.key").write_text(PEM)
    (state / "agent.log").write_text(
        "started\n"
        f"dialing gateway with token {TOKEN}\n"
        "request headers: Authorization: Bearer abc.def.ghi\n"
        "cmdline: console=ttyS0 bc.token=s3cr3t-from-cmdline bc.gateway=gw:443\n"
        f"oops, key leaked into a log:\n{PEM}"
        "done\n"
    )
    (state / "journal").write_bytes(b"BCJ1\x00\x00\x00\x02")
    config = Config(
        state_dir=state,
        cache_dir=tmp_path / "cache",
        enrollment_token=TOKEN,
        logs_allow=(allowed, state),
        bulk_bandwidth_bytes_per_second=64 << 20,
    )
    return config, allowed


def collect(config: Config, **fields: object) -> agent_pb2.LogsCollectResult:
    handler = LogsCollect()
    params = handler.parse(agent_pb2.LogsCollectRequest(**fields))  # type: ignore[arg-type]
    result = handler.run(Context.local("logs.collect", config), params)
    assert isinstance(result, agent_pb2.LogsCollectResult)
    return result


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        names = tar.getnames()
        assert names[-1] == "manifest.json"
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_archive_has_agent_logs_named_files_and_a_matching_manifest(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    (allowed / "app.log").write_text("line 1\nline 2\n")
    (allowed / "sub").mkdir()
    (allowed / "sub" / "b.txt").write_bytes(b"\x00binary\xff")
    result = collect(config, paths=[str(allowed / "app.log"), str(allowed / "sub")])
    files = members(result.inline_archive)
    assert result.archive_bytes == len(result.inline_archive)
    assert result.archive_digest.hex == hashlib.sha256(result.inline_archive).hexdigest()
    assert files[f"files{allowed}/app.log"] == b"line 1\nline 2\n"
    assert files[f"files{allowed}/sub/b.txt"] == b"\x00binary\xff"
    assert "agent/agent.log" in files and "agent/journal" in files
    assert not any("node.key" in name for name in files)
    manifest = json.loads(files["manifest.json"])
    by_name = {e["name"]: e for e in manifest["entries"]}
    assert set(by_name) == set(files) - {"manifest.json"}
    for entry in result.manifest:
        assert entry.sha256 == hashlib.sha256(files[entry.name]).hexdigest()
        assert entry.size_bytes == len(files[entry.name])
        assert by_name[entry.name]["sha256"] == entry.sha256
    assert by_name["agent/agent.log"]["redacted"] and not by_name[f"files{allowed}/app.log"]["redacted"]


def test_secrets_of_the_agent_config_are_redacted(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    (allowed / "copied.log").write_text(f"token again: {TOKEN}\nkey line {PEM_BODY}\n")
    result = collect(config, paths=[str(allowed / "copied.log")])
    files = members(result.inline_archive)
    everything = b"".join(files.values())
    for secret in (TOKEN, PEM_BODY, "abc.def.ghi", "s3cr3t-from-cmdline", "BEGIN PRIVATE KEY"):
        assert secret.encode() not in everything, secret
    log = files["agent/agent.log"].decode()
    assert "Authorization: [REDACTED]" in log
    assert "bc.token=[REDACTED] bc.gateway=gw:443" in log
    assert "[REDACTED PRIVATE KEY]" in log
    assert "started\n" in log and "done\n" in log
    assert all(e.redacted for e in result.manifest if e.name.endswith(("agent.log", "copied.log")))


def test_paths_outside_the_allow_list_are_refused(setup: tuple[Config, Path], tmp_path: Path) -> None:
    config, allowed = setup
    (allowed / "shadow").symlink_to("/etc/shadow")
    outside = tmp_path / "outside.log"
    outside.write_text("private")
    for bad in (
        "/etc/shadow",
        f"{allowed}/../outside.log",
        str(allowed / "shadow"),
        str(outside),
        "relative/path.log",
    ):
        with pytest.raises(InvalidParameters):
            collect(config, paths=[bad])
    with pytest.raises(InvalidParameters, match="key material"):
        collect(config, paths=[str(config.state_dir / "node.key")])
    with pytest.raises(InvalidParameters, match="does not exist"):
        collect(config, paths=[str(allowed / "missing.log")])


def test_key_material_under_a_named_directory_is_left_out(setup: tuple[Config, Path]) -> None:
    config, _ = setup
    (config.state_dir / "client.key").write_text("not a log")
    result = collect(config, paths=[str(config.state_dir)])
    names = members(result.inline_archive)
    assert f"files{config.state_dir}/agent.log" in names
    assert not any(n.endswith((".key", "node.key")) for n in names)
    assert sorted(s for s in result.skipped if "key material" in s) == [
        f"{config.state_dir}/client.key: key material, never collected",
        f"{config.state_dir}/node.key: key material, never collected",
    ]


def test_links_under_a_named_directory_do_not_escape(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    logs = allowed / "logs"
    logs.mkdir()
    (logs / "ok.log").write_text("fine\n")
    (logs / "shadow").symlink_to("/etc/shadow")
    (logs / "etc").symlink_to("/etc", target_is_directory=True)
    (logs / "inside").symlink_to(logs / "ok.log")
    result = collect(config, paths=[str(logs)])
    files = members(result.inline_archive)
    assert f"files{logs}/ok.log" in files
    assert f"files{logs}/inside" in files and files[f"files{logs}/inside"] == b"fine\n"
    assert not any("shadow" in n or "/etc/" in n for n in files)
    assert any("shadow" in s and "outside" in s for s in result.skipped)


def test_open_refuses_a_symlink_swapped_in(tmp_path: Path) -> None:
    target = tmp_path / "real.log"
    target.write_text("x")
    link = tmp_path / "link.log"
    link.symlink_to(target)
    with pytest.raises(OSError):
        read_confined(link, (tmp_path,), 1024)


def test_per_file_cap_keeps_the_tail(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    lines = [f"line {i:07d}\n".encode() for i in range(300_000)]  # 3.6 MB
    (allowed / "big.log").write_bytes(b"".join(lines))
    result = collect(config, paths=[str(allowed / "big.log")], max_file_bytes=1 << 20)
    data = members(result.inline_archive)[f"files{allowed}/big.log"]
    assert len(data) <= 1 << 20
    assert data.endswith(lines[-1])
    assert data.startswith(b"line ")  # the cut first line was dropped
    entry = next(e for e in result.manifest if e.name.endswith("big.log"))
    assert entry.truncated


def test_archive_cap_skips_what_does_not_fit(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    for i in range(4):
        (allowed / f"r{i}.bin").write_bytes(os.urandom(400_000))
    result = collect(config, paths=[str(allowed)], max_bytes=1 << 20)
    assert result.archive_bytes <= 1 << 20
    assert any("size cap" in s for s in result.skipped)
    assert len(members(result.inline_archive)) >= 2


def test_oversize_requests_are_refused(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    handler = LogsCollect()
    with pytest.raises(InvalidParameters, match="max_bytes"):
        handler.parse(agent_pb2.LogsCollectRequest(max_bytes=8 << 30))
    with pytest.raises(InvalidParameters, match="max_file_bytes"):
        handler.parse(agent_pb2.LogsCollectRequest(max_bytes=2 << 20, max_file_bytes=4 << 20))
    (allowed / "random.bin").write_bytes(os.urandom(6 << 20))
    with pytest.raises(AgentError) as info:
        collect(config, paths=[str(allowed / "random.bin")], max_file_bytes=6 << 20)
    assert info.value.reason is Reason.TOO_LARGE and "upload_url" in info.value.message


def test_upload_carries_the_digest(setup: tuple[Config, Path]) -> None:
    config, allowed = setup
    (allowed / "random.bin").write_bytes(os.urandom(6 << 20))
    with LoopbackServer() as srv:
        result = collect(
            config,
            paths=[str(allowed / "random.bin")],
            max_file_bytes=6 << 20,
            upload_url=srv.url("/logs/x.tar.gz?sig=abc"),
            http_headers={"X-Upload-Id": "42"},
        )
        body = srv.uploads["/logs/x.tar.gz"]
        _, _, headers = srv.requests[-1]
    digest = hashlib.sha256(body).digest()
    assert headers["Digest"] == "sha-256=" + base64.b64encode(digest).decode()
    assert headers["X-Content-SHA256"] == digest.hex()
    assert headers["X-Upload-Id"] == "42"
    assert int(headers["Content-Length"]) == len(body) == result.archive_bytes
    assert result.archive_digest.hex == digest.hex()
    assert result.uploaded_to.endswith("/logs/x.tar.gz") and "sig" not in result.uploaded_to
    assert not result.inline_archive
    assert len(members(body)[f"files{allowed}/random.bin"]) == 6 << 20


def test_kernel_log_is_collected_and_redacted(setup: tuple[Config, Path]) -> None:
    config, _ = setup
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write("agent-test: cmdline bc.token=kmsg-secret-99 seen\n")
    except OSError:
        pytest.skip("cannot write /dev/kmsg here")
    result = collect(config, include_kernel_log=True)
    text = members(result.inline_archive)["kernel/kmsg.txt"]
    assert b"agent-test: cmdline bc.token=[REDACTED] seen" in text
    assert b"kmsg-secret-99" not in text


def test_system_journal_is_included_or_explained(setup: tuple[Config, Path]) -> None:
    config, _ = setup
    result = collect(config, include_system_journal=True, since_seconds=3600)
    if shutil.which("journalctl") is None:
        assert any("journalctl" in s for s in result.skipped)
    else:
        assert "journal/system.txt" in members(result.inline_archive)


def test_what_a_request_can_reach_is_bounded(setup: tuple[Config, Path]) -> None:
    """A directory named many times over a small budget: the archive stays under max_bytes and
    the list of what was left out (in the manifest and in the result frame) stays short."""
    from agent.commands.bulk import logs

    config, allowed = setup
    big = allowed / "many"
    big.mkdir()
    for i in range(300):
        (big / f"{i:04d}-{'n' * 200}.log").write_bytes(os.urandom(8192))
    result = collect(config, paths=[str(big)] * logs.MAX_PATHS, max_bytes=1 << 20, max_file_bytes=8192)
    assert result.archive_bytes <= 1 << 20
    assert len(result.skipped) == logs.MAX_SKIPPED + 1 and result.skipped[-1].startswith("... and ")
    assert result.ByteSize() < (1 << 20) + 64 * 1024
    assert members(result.inline_archive)  # a valid archive with its manifest last
    with pytest.raises(InvalidParameters, match="at most"):
        collect(config, paths=[str(big)] * (logs.MAX_PATHS + 1))
    with pytest.raises(InvalidParameters, match="longer than"):
        collect(config, paths=["/var/log/" + "x/" * 3000])
