"""``agent install``: the node role (or with ``--role site``, the site daemon) as a systemd service.

    agent install --gateway gw.example:7443 --ca /etc/bettercompute/ca.pem \\
        --cert /etc/bettercompute/node.pem --key /etc/bettercompute/node.key \\
        --trusted-key /etc/bettercompute/control-plane.pub [--root DIR] [--no-enable]

Copies the running zipapp to ``/usr/lib/bettercompute/agent.pyz`` and the launcher beside it,
writes ``/etc/bettercompute/agent.json`` (role "node", the journal in
``/var/lib/bettercompute-agent``, plus the settings given as flags) and the unit
``/etc/systemd/system/bettercompute-agent.service``, and enables it. With ``--root DIR``
everything goes under DIR and the unit is enabled by its symlink (what ``systemctl enable``
does), for building a node image offline; without it, systemd is asked to reload, enable and
(re)start the service. Running it again updates the files in place (each write is atomic).

``--role site`` installs the site daemon the same way: its config also names the secret store
of BMC credentials (``secrets_dir``, default /var/lib/bettercompute-agent/secrets), created
root-only (0700); docs/site.md says how entries are put there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pkgutil
import shutil
from pathlib import Path
from typing import Any

from agent import atomicfile, proc, version
from agent.cli import EXIT_OK, command, settings
from agent.errors import InvalidParameters

log = logging.getLogger(__name__)

UNIT_NAME = "bettercompute-agent.service"
LIBDIR = Path("/usr/lib/bettercompute")
CONFIG = Path("/etc/bettercompute/agent.json")
UNIT_DIR = Path("/etc/systemd/system")
STATE_DIR = Path("/var/lib/bettercompute-agent")
SECRETS_DIR = STATE_DIR / "secrets"
ROLES = ("node", "site")


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", type=Path, default=Path("/"),
                   help="install under this directory (an image being built); default /")
    p.add_argument("--archive", type=Path,
                   help="the zipapp to install (default: the one running this command)")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter the service runs with")
    p.add_argument("--no-enable", action="store_true", help="write the files, do not enable the unit")
    p.add_argument("--no-start", action="store_true", help="enable, but do not (re)start it now")
    settings.add_arguments(p)


def unit_text(python: str, libdir: Path = LIBDIR, config: Path = CONFIG, role: str = "node") -> str:
    data = pkgutil.get_data("agent", "data/" + UNIT_NAME)
    if data is None:
        raise InvalidParameters(f"{UNIT_NAME} is missing from this build")
    text = data.decode()
    text = text.replace("(node role)", f"({role} role)")
    for key, value in (("@PYTHON@", python), ("@LIBDIR@", str(libdir)), ("@CONFIG@", str(config))):
        text = text.replace(key, value)
    return text


def config_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags, over the role's defaults, validated like `agent run`."""
    values: dict[str, Any] = {"role": "node", "state_dir": str(STATE_DIR)}
    if getattr(args, "config", None) is not None:
        values.update(settings.read_config_file(args.config))
    for s in settings.SETTINGS:
        value = getattr(args, f"setting_{s.key}", None)
        if value is not None:
            values[s.key] = [str(v) for v in value] if s.multiple else str(value)
    if values["role"] == "site":
        values.setdefault("secrets_dir", str(SECRETS_DIR))
    loaded = settings.load(values, None, "")
    if str(loaded.config.role) not in ROLES:
        raise InvalidParameters("agent install sets up the node role (--role node) or the site "
                                "daemon (--role site); the ramdisk role is never installed")
    return values


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to("/")


def install(args: argparse.Namespace) -> list[Path]:
    root: Path = args.root
    archive = args.archive or (Path(version.ARCHIVE) if version.ARCHIVE else None)
    if archive is None or not archive.is_file():
        raise InvalidParameters("not running from a zipapp: give the one to install with --archive")
    values = config_values(args)
    libdir, unit_dir = _under(root, LIBDIR), _under(root, UNIT_DIR)
    config = _under(root, CONFIG)
    for d in (libdir, unit_dir, config.parent):
        d.mkdir(parents=True, exist_ok=True)
    state = _under(root, Path(values["state_dir"]))
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    if values["role"] == "site":
        secrets = _under(root, Path(values["secrets_dir"]))
        secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(secrets, 0o700)
        if shutil.which("ipmitool") is None:
            log.warning("ipmitool is not installed: bmc.* over IPMI will fail until it is "
                        "(apt-get install ipmitool)")
    written = []
    target = libdir / "agent.pyz"
    if not target.exists() or os.path.realpath(target) != os.path.realpath(archive):
        atomicfile.write_atomic(str(target), archive.read_bytes(), 0o755)
    written.append(target)
    source = pkgutil.get_data("agent", "launcher.py")
    assert source is not None
    atomicfile.write_atomic(str(libdir / "launcher.py"), source, 0o644)
    written.append(libdir / "launcher.py")
    atomicfile.write_atomic(str(config), json.dumps(values, indent=2, sort_keys=True).encode() + b"\n", 0o600)
    written.append(config)
    unit = unit_dir / UNIT_NAME
    atomicfile.write_atomic(str(unit), unit_text(args.python, role=values["role"]).encode(), 0o644)
    written.append(unit)
    if args.no_enable:
        return written
    if root == Path("/") and Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        proc.run(["systemctl", "daemon-reload"], timeout=60)
        proc.run(["systemctl", "enable", UNIT_NAME], timeout=60)
        if not args.no_start:
            proc.run(["systemctl", "restart", UNIT_NAME], timeout=120)
    else:
        wants = unit_dir / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        link = wants / UNIT_NAME
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(UNIT_DIR / UNIT_NAME)
        written.append(link)
    return written


@command("install", "install this agent as a systemd service (node role, or --role site)", _args)
def cmd_install(args: argparse.Namespace) -> int:
    for path in install(args):
        print(path)
    return EXIT_OK
