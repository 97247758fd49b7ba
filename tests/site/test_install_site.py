"""`agent install --role site`: the site daemon's layout (its secret store root-only), and
that the unit's command line really serves a gateway in the site role with the bmc.* kinds."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from agent.gateway import Gateway
from agent.gateway.certs import DevPki
from tests.cli.test_install import (  # noqa: F401  (archive, gateway: fixtures)
    UNIT,
    archive,
    gateway,
    run_install,
    unit_running,
)


def test_site_install_writes_its_config_and_a_root_only_secret_store(tmp_path: Path, archive: Path) -> None:  # noqa: F811
    root = tmp_path / "root"
    out = run_install(archive, root, "--role", "site", "--gateway", "gw.example:7443")
    assert out.returncode == 0, out.stderr
    config = json.loads((root / "etc/bettercompute/agent.json").read_text())
    assert config == {"role": "site", "state_dir": "/var/lib/bettercompute-agent",
                      "secrets_dir": "/var/lib/bettercompute-agent/secrets", "gateway": "gw.example:7443"}
    secrets = root / "var/lib/bettercompute-agent/secrets"
    assert secrets.is_dir() and stat.S_IMODE(secrets.stat().st_mode) == 0o700
    unit = (root / UNIT).read_text()
    assert "Description=Better Compute machine agent (site role)" in unit
    # descriptors for 1,024 connections at two each, and the reserve (agent/site/serve/conns.py)
    assert "\nLimitNOFILE=16384\n" in unit
    assert (root / "etc/systemd/system/multi-user.target.wants/bettercompute-agent.service").is_symlink()
    # A secrets_dir given as a flag wins.
    out = run_install(archive, root, "--role", "site", "--secrets-dir", "/srv/bc-secrets")
    assert out.returncode == 0, out.stderr
    assert json.loads((root / "etc/bettercompute/agent.json").read_text())["secrets_dir"] == "/srv/bc-secrets"
    assert stat.S_IMODE((root / "srv/bc-secrets").stat().st_mode) == 0o700


def test_the_units_command_serves_the_gateway_in_the_site_role(
        tmp_path: Path, archive: Path, pki: DevPki, gateway: Gateway) -> None:  # noqa: F811
    root = tmp_path / "root"
    state = tmp_path / "state"
    out = run_install(
        archive, root, "--role", "site", "--python", sys.executable, "--gateway", gateway.address,
        "--node", "node-7", "--ca", str(pki.ca), "--cert", str(pki.client_cert("node-7")),
        "--key", str(pki.client_key("node-7")), "--trusted-key", str(pki.signing_pub),
        "--state-dir", str(state), "--secrets-dir", str(tmp_path / "secrets"),
    )
    assert out.returncode == 0, out.stderr
    with unit_running(root, tmp_path) as service:
        node = gateway.wait_node("node-7", 60)
        assert node.hello.role == "site"
        kinds = set(node.hello.kinds)
        assert {"bmc.power", "bmc.boot", "bmc.query", "bmc.rotate", "bmc.firmware", "bmc.storage"} <= kinds
        assert "deploy.image" not in kinds and "disk.wipe" not in kinds
    assert service.returncode == 0, (tmp_path / "service.log").read_text()
