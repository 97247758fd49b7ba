"""The CLI from a source tree: kinds, version, help, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent import catalog
from agent.version import __version__

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["kind", "lane", "roles", "retry_safe", "self_terminating", "attested", "destructive",
        "timeout_seconds", "payload", "result"]


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_kinds_json_has_the_documented_keys() -> None:
    out = agent("kinds", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == len(catalog.KINDS)
    for row in rows:
        assert list(row) == KEYS
        assert row == catalog.KINDS[row["kind"]].as_dict()


def test_kinds_table_lists_every_kind() -> None:
    out = agent("kinds")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["KIND", "LANE", "ROLES"]
    assert {line.split()[0] for line in lines[1:]} == set(catalog.KINDS)


def test_kinds_by_role() -> None:
    rows = json.loads(agent("kinds", "--json", "--role", "ramdisk").stdout)
    served = {name for name, kind in catalog.KINDS.items() if kind.serves(catalog.Role.RAMDISK)}
    assert {r["kind"] for r in rows} == served


def test_version_and_usage_exit_codes() -> None:
    assert agent("--version").stdout.strip() == f"agent {__version__}"
    assert agent("version").stdout.strip() == __version__
    assert agent().returncode == 2
    assert agent("no-such-command").returncode == 2
    assert agent("kinds", "--help").returncode == 0


def test_a_subcommand_imports_only_its_own_module_and_help_lists_them_all() -> None:
    """`agent run` (the ramdisk's start) must not pay for `agent install`'s imports."""
    probe = ("import sys; from agent import cli; cli._load_subcommands({argv}); "
             "print(sorted(m for m in ('agent.cli.app', 'agent.cli.install') if m in sys.modules))")
    both = ["agent.cli.app", "agent.cli.install"]
    for argv, loaded in ((["--debug", "run"], both[:1]), (["install", "--help"], both[1:]),
                         ([], both), (["--help"], both)):
        out = subprocess.run([sys.executable, "-c", probe.format(argv=argv)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(loaded), argv
    helptext = agent("--help").stdout
    for name in ("run", "exec", "gateway", "install", "kinds", "version"):
        assert name in helptext


# A source tree without the venv: the third-party packages cannot be imported.
WITHOUT_DEPENDENCIES = """
import runpy, sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("google", "cryptography", "pynvml"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["agent", *sys.argv[1:]]
runpy.run_module("agent", run_name="__main__", alter_sys=True)
"""


def without_dependencies(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_DEPENDENCIES, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_without_dependencies_kinds_works_and_the_others_name_what_is_missing() -> None:
    out = without_dependencies("kinds")
    assert out.returncode == 0, out.stderr
    assert {line.split()[0] for line in out.stdout.splitlines()[1:]} == set(catalog.KINDS)
    assert without_dependencies("version").stdout.strip() == __version__
    for argv in (["run", "--gateway", "gw:7443"], ["exec", "inventory.refresh"], ["gateway", "--help"]):
        out = without_dependencies(*argv)
        assert out.returncode == 69, (argv, out.stderr)
        (line,) = out.stderr.splitlines()  # one line, no traceback
        assert line.startswith(f"agent {argv[0]}: missing Python dependency 'google.protobuf'"), line
        assert "pip install protobuf" in line
    helptext = without_dependencies("--help")
    assert helptext.returncode == 0
    assert "unavailable here: missing Python dependency 'google.protobuf'" in helptext.stdout
