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
