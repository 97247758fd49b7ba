"""Pieces of the ramdisk's /init (initramfs/init.sh), run by the host's sh."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

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


def run_functions(names: list[str], body: str, env: dict[str, str],
                  cwd: Path) -> subprocess.CompletedProcess[str]:
    script = "\n".join(shell_function(n) for n in names) + "\n" + body
    return subprocess.run(["sh", "-c", script], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env},
                          cwd=cwd, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(("text", "ok"), [
    ("10.0.2.50", True), ("0.0.0.0", True), ("255.255.255.255", True), ("1.2.3", False),
    ("1.2.3.4.5", False), ("256.1.1.1", False), ("01.2.3.4", False), ("1..3.4", False),
    (".1.2.3", False), ("1.2.3.", False), ("a.b.c.d", False), ("", False), ("1.2.3.4 5", False),
    ("*.*.*.*", False), ("99999999999999999999.1.1.1", False),
])
def test_ipv4_accepts_dotted_quads_only(text: str, ok: bool, tmp_path: Path) -> None:
    (tmp_path / "1.2.3.4").touch()  # a pattern must not expand to it
    done = run_functions(["ipv4"], 'ipv4 "$ADDR"', {"ADDR": text}, tmp_path)
    assert (done.returncode == 0) is ok, done.stderr


NETWORK = {"mac": "52:54:00:5e:00:11", "address": "10.0.2.50", "prefix": "24", "gateway": "10.0.2.2",
           "dns": "10.0.2.2"}


@pytest.mark.parametrize(("change", "message"), [
    ({"address": "10.0.2.500"}, "address '10.0.2.500' is not an IPv4 address"),
    ({"prefix": "33"}, "prefix must be 1-32"),
    ({"prefix": "x"}, "prefix must be 1-32"),
    ({"mac": "52:54:00:5E:00:11x"}, "is not a MAC address"),
    ({"gateway": "10.0.2"}, "gateway '10.0.2' is not an IPv4 address"),
    ({"dns": "10.0.2.2 8.8.8"}, "dns '8.8.8' is not an IPv4 address"),
    ({"vlan": "5"}, "unknown key 'vlan'"),
    ({"mac": "02:00:00:00:00:99"}, "no NIC has MAC 02:00:00:00:00:99"),
    ({"size": "x" * 5000}, "network is larger than 4096 bytes"),
    ({"absent": ""}, "no network file"),
])
def test_bad_network_file_is_said_on_the_console_and_in_the_kernel_log(
        change: dict[str, str], message: str, tmp_path: Path) -> None:
    """Every bad content is refused before anything is configured (no ip command runs: the
    machine's own NICs are never touched), said on stdout (the console) and in the kernel
    log's place, and the caller falls back to DHCP (status 1)."""
    fields = {**NETWORK, **change}
    path = tmp_path / "network"
    if "absent" not in change:
        if "size" in change:
            path.write_text("# " + change["size"] + "\n")
        else:
            path.write_text("".join(f"{k}={v}\n" for k, v in fields.items()))
    done = run_functions(["say", "media_error", "ipv4", "small", "static_network"],
                         f'net_source="config medium" KMSG="{tmp_path}/kmsg"\n'
                         f'static_network "{path}"', {}, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert message in done.stdout and "falling back to DHCP" in done.stdout
    assert message in (tmp_path / "kmsg").read_text()
