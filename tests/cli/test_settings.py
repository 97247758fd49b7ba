"""Settings precedence: flags, then the JSON config file, then kernel bc.* parameters, then defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.catalog import Role
from agent.cli import settings
from agent.errors import InvalidParameters


def test_kernel_cmdline_parameters() -> None:
    params = settings.parse_cmdline(
        'BOOT_IMAGE=/vmlinuz quiet bc.gateway=gw:7443 bc.node=n1 "bc.token=a b" '
        "bc.rejoin=boot.kexec:c1:b1 x=1"
    )
    assert params == {"bc.gateway": "gw:7443", "bc.node": "n1", "bc.token": "a b",
                      "bc.rejoin": "boot.kexec:c1:b1"}


def test_precedence_flags_over_file_over_cmdline_over_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.json"
    cfg.write_text(json.dumps({"gateway": "file:1", "node_id": "file-node", "trusted_keys": ["/k1", "/k2"],
                               "reconnect_max_seconds": 9}))
    cmdline = ("bc.gateway=cmd:1 bc.node=cmd-node bc.role=node bc.token=t0k bc.ca=/ca.pem "
               "bc.trust=/a,/b bc.extra=1")
    loaded = settings.load({"gateway": "flag:1"}, cfg, cmdline)
    c = loaded.config
    assert c.gateway == "flag:1"                       # flag beats file and cmdline
    assert c.node_id == "file-node"                    # file beats cmdline
    assert c.role is Role.NODE and c.enrollment_token == "t0k" and c.ca_bundle == Path("/ca.pem")
    assert c.trusted_keys == (Path("/k1"), Path("/k2"))
    assert c.extra == {"extra": "1"}
    assert c.state_dir == Path("/run/bettercompute-agent")  # default
    assert loaded.session == {"reconnect_max_seconds": 9.0}
    assert loaded.sources["gateway"] == "flag" and loaded.sources["role"] == "cmdline"


def test_defaults_node_id_is_the_host_name() -> None:
    import socket

    assert settings.load({}, None, "").config.node_id == socket.gethostname()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"gatway": "x:1"}', "unknown keys"),
        ('{"role": "rack"}', "'ramdisk', 'node', 'site'"),
        ('{"heartbeat_seconds": -1}', "positive"),
        ('{"gateway": ["a"]}', "single value"),
    ],
)
def test_bad_config_files_are_refused_clearly(tmp_path: Path, content: str, message: str) -> None:
    cfg = tmp_path / "bad.json"
    cfg.write_text(content)
    with pytest.raises(InvalidParameters, match=message):
        settings.load({}, cfg, "")


def test_cert_without_key_is_refused() -> None:
    with pytest.raises(InvalidParameters, match="needs its key"):
        settings.load({"client_cert": "/c.pem"}, None, "")


def test_site_store_and_metrics_settings() -> None:
    c = settings.load({"site_store_bytes": "2G"}, None,
                      "bc.site_store_dir=/srv/store bc.site_metrics=10.0.0.2:9108").config
    assert c.site_store_bytes == 2 << 30 and c.site_store_dir == Path("/srv/store")
    assert c.site_metrics_address == "10.0.0.2:9108"
    defaults = settings.load({}, None, "").config
    assert defaults.site_store_dir is None and defaults.site_store_bytes == 64 << 30
    assert defaults.site_metrics_address == "127.0.0.1:9108"
    for bad in ("0", "12X", "G", "-1"):
        with pytest.raises(InvalidParameters, match="site_store_bytes"):
            settings.load({"site_store_bytes": bad}, None, "")


# -- every setting in the table -------------------------------------------------------------

SAMPLES = {  # a value each kind of row reads, none of them a default
    str: "sample", Path: "/sample/path", settings._role: "site", settings._positive: "7",
    settings._count: "7", settings._port: "7", settings._bytes: "3M",
    settings._path_list: "/a:/b", settings._upstream: "10.9.0.0/16", settings._tpm: "none",
    settings._posture: "ipmi=off,http=off",
    settings._cause_wait: "no_kernel=7",
}


def _config_reads() -> set[str]:
    """The Config fields the package reads (``config.X``, ``ctx.config.X``, ``self.config.X``)."""
    import ast
    import dataclasses

    from agent.config import Config

    fields = {f.name for f in dataclasses.fields(Config)}
    found: set[str] = set()
    for path in (Path(__file__).resolve().parents[2] / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in fields:
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if name == "config":
                    found.add(node.attr)
    return found


def test_every_config_field_read_has_a_row() -> None:
    import dataclasses

    from agent.config import Config

    reads = _config_reads()
    assert {"logs_allow", "bulk_bandwidth_bytes_per_second", "state_dir"} <= reads  # the scan sees them
    missing = sorted(reads - set(settings.BY_KEY) - {"extra"})
    assert not missing, f"Config fields read by the agent that no setting sets: {missing}"
    unset = sorted({f.name for f in dataclasses.fields(Config)} - set(settings.BY_KEY) - {"extra"})
    assert not unset, f"Config fields no setting sets: {unset}"


@pytest.mark.parametrize("row", settings.SETTINGS, ids=lambda s: s.key)
def test_every_row_reaches_config_from_each_source(row: settings.Setting, tmp_path: Path) -> None:
    sample = SAMPLES[row.parse]
    want = settings._convert(row, [sample] if row.multiple else sample, "test")
    assert want != row.default
    cfg = tmp_path / "agent.json"
    cfg.write_text(json.dumps({row.key: [sample] if row.multiple else sample}))
    flag = [sample] if row.multiple else sample
    pair = {"client_cert": "client_key", "client_key": "client_cert"}.get(row.key)
    other = {pair: "/the/other.pem"} if pair else {}   # a certificate needs its key
    for loaded in (settings.load({row.key: flag, **other}, None, ""),
                   settings.load(other, cfg, ""),
                   settings.load(other, None, f"{row.param}={sample}")):
        got = loaded.session[row.key] if row.session else getattr(loaded.config, row.key)
        assert got == want
    if not row.session:
        assert "_" not in row.flag and row.flag.startswith("--") and row.param.startswith("bc.")


def test_the_help_shows_each_default_once_from_config() -> None:
    import argparse

    p = argparse.ArgumentParser()
    settings.add_arguments(p)
    text = "".join(p.format_help().split())   # argparse wraps lines, at hyphens too
    for row in settings.SETTINGS:
        assert "".join(f"(default: {row.default_text()}) [{row.param}=]".split()) in text, row.key
        assert "default" not in row.help, f"{row.key}: the default is the field's, not the help's"
    rows = settings.BY_KEY
    assert rows["bulk_bandwidth_bytes_per_second"].default_text() == "200M"
    assert rows["logs_allow"].default_text() == "/var/log:/run/bettercompute-agent"
    assert rows["site_http_port"].default_text() == "8088"
    assert rows["logs_allow"].flag == "--logs-allow" and rows["logs_allow"].param == "bc.logs_allow"


def test_logs_allow_and_the_bulk_bandwidth_are_settings() -> None:
    c = settings.load({"bulk_bandwidth_bytes_per_second": "50M"}, None,
                      "bc.logs_allow=/var/log:/srv/logs").config
    assert c.bulk_bandwidth_bytes_per_second == 50 << 20
    assert c.logs_allow == (Path("/var/log"), Path("/srv/logs"))


def test_the_tpm_is_a_row_refused_by_name_when_malformed() -> None:
    """bc.tpm and bc.tpm_event_log are settings rows like the others (shown by --help), and a
    value the TPM opener cannot take is refused when the settings load, not at the first quote."""
    loaded = settings.load({}, None, "bc.tpm=tcp:127.0.0.1:2321 bc.tpm_event_log=/run/log")
    assert loaded.config.tpm == "tcp:127.0.0.1:2321"
    assert loaded.config.tpm_event_log == Path("/run/log")
    assert loaded.config.extra == {}
    for bad in ("tcp:10.0.0.1:2321", "tcp:127.0.0.1:port", "/dev/tpm0"):
        with pytest.raises(InvalidParameters, match=r"cmdline: .*(TPM|bc\.tpm)"):
            settings.load({}, None, f"bc.tpm={bad}")


def test_no_module_reads_config_extra_by_name() -> None:
    """Config.extra holds what no row names; a read of it by key would be a setting outside the
    table (no --help line, no config-file key)."""
    import ast

    def is_extra(node: ast.expr) -> bool:
        owner = node.value if isinstance(node, ast.Attribute) and node.attr == "extra" else None
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        return name == "config"

    reads = []
    for path in (Path(__file__).resolve().parents[2] / "agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            by_key = isinstance(node, ast.Subscript) and is_extra(node.value)
            by_get = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and is_extra(node.func.value)
            if by_key or by_get:
                reads.append(f"{path.name}:{node.lineno}")
    assert not reads, f"Config.extra read by name: {reads}"
