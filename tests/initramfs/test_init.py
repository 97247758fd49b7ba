"""Pieces of the ramdisk's /init (initramfs/init.sh), run by the host's sh."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

INIT = Path(__file__).resolve().parents[2] / "initramfs" / "init.sh"


def shell_function(name: str) -> str:
    """The text of one function of /init, from ``name() {`` to its closing brace."""
    m = re.search(rf"^{name}\(\) {{.*?^}}$", INIT.read_text(), re.M | re.S)
    assert m, f"{name}() not found in {INIT}"
    return m.group(0)


def arg(cmdline: str, name: str, cwd: Path) -> str:
    script = shell_function("arg") + f'\narg {name}\nprintf "%s" "$v"\n'
    out = subprocess.run(["sh", "-c", script], env={"CMDLINE": cmdline, "PATH": "/usr/bin:/bin"},
                         cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout


def test_arg_reads_the_last_value_of_a_kernel_parameter(tmp_path: Path) -> None:
    cmdline = "console=ttyS0 bc.node=a bc.gateway=10.0.2.100:443 bc.node=b quiet"
    assert arg(cmdline, "bc.node", tmp_path) == "b"
    assert arg(cmdline, "bc.gateway", tmp_path) == "10.0.2.100:443"
    assert arg(cmdline, "bc.root", tmp_path) == ""
    assert arg(cmdline, "bc.no", tmp_path) == ""  # a prefix of a name is not the name


def test_arg_never_expands_a_pattern_into_file_names(tmp_path: Path) -> None:
    (tmp_path / "bc.token=ON-DISK").touch()
    assert arg("bc.token=* quiet", "bc.token", tmp_path) == "*"
    assert arg("bc.x=a? bc.token=?", "bc.token", tmp_path) == "?"
