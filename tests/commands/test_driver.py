"""driver.invoke: typed arguments only, missing tools, output and exit status, deadline kills the tree."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.errors import CommandTimeout, InvalidParameters, ToolMissing
from agent.proc import alive
from agent.proto import agent_pb2
from tests.runtime.harness import wait_until


def request(driver: str, operation: str, **arguments: str | int | bool) -> agent_pb2.DriverInvokeRequest:
    msg = agent_pb2.DriverInvokeRequest(driver=driver, operation=operation)
    for name, value in arguments.items():
        arg = msg.arguments[name]
        if isinstance(value, bool):
            arg.bool_value = value
        elif isinstance(value, int):
            arg.int_value = value
        else:
            arg.string_value = value
    return msg


def invoke(msg: agent_pb2.DriverInvokeRequest, timeout: float | None = None) -> agent_pb2.DriverInvokeResult:
    handler = DriverInvoke()
    params = handler.parse(msg)
    result = handler.run(Context.local("driver.invoke", timeout=timeout), params)
    assert isinstance(result, agent_pb2.DriverInvokeResult)
    return result


def fake_tool(bindir: Path, name: str, body: str) -> Path:
    """An executable shell script standing in for a vendor tool; it records its argv."""
    path = bindir / name
    path.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do printf "%s\\n" "$a"; done > "{bindir}/{name}.argv"\n' + body + "\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:/usr/bin:/bin")
    return d


def test_unknown_driver_operation_and_arguments_are_refused() -> None:
    handler = DriverInvoke()
    with pytest.raises(InvalidParameters, match="no driver 'rm'"):
        handler.parse(request("rm", "run"))
    with pytest.raises(InvalidParameters, match="no operation 'flash'"):
        handler.parse(request("ethtool", "flash", interface="eth0"))
    with pytest.raises(InvalidParameters, match="takes no argument 'command'"):
        handler.parse(request("ethtool", "show", interface="eth0", command="reboot"))
    with pytest.raises(InvalidParameters, match="needs argument 'interface'"):
        handler.parse(request("ethtool", "show"))
    with pytest.raises(InvalidParameters, match="must be an int"):
        handler.parse(request("ethtool", "set_ring", interface="eth0", rx="4096"))
    with pytest.raises(InvalidParameters, match="must be <= "):
        handler.parse(request("ethtool", "set_ring", interface="eth0", rx=1 << 30))
    with pytest.raises(InvalidParameters, match="needs rx, tx or both"):
        handler.parse(request("ethtool", "set_ring", interface="eth0"))
    with pytest.raises(InvalidParameters, match="must be one of"):
        handler.parse(request("ipmitool", "set_boot_device", device="floppy"))


@pytest.mark.parametrize(
    "value",
    ["-s", "--help", "eth0; reboot", "eth0 lo", "$(reboot)", "../../etc", "a" * 16, ""],
)
def test_strings_can_never_become_options_or_shell(value: str) -> None:
    with pytest.raises(InvalidParameters, match="does not match"):
        DriverInvoke().parse(request("ethtool", "show", interface=value))


def test_mlxconfig_value_cannot_inject_a_second_parameter() -> None:
    with pytest.raises(InvalidParameters):
        DriverInvoke().parse(
            request("mlxconfig", "set", device="0000:3b:00.0", parameter="SRIOV_EN", value="1 NUM_OF_VFS=64")
        )


def test_missing_tool_is_a_clear_error(bindir: Path) -> None:
    with pytest.raises(ToolMissing, match=r"needs 'mlxconfig', which is not installed.*MFT"):
        invoke(request("mlxconfig", "query", device="0000:3b:00.0"))


def test_argv_is_built_from_typed_values(bindir: Path) -> None:
    fake_tool(bindir, "mlxconfig", 'echo "Applying... Done!"; echo "warning" >&2; exit 0')
    result = invoke(request("mlxconfig", "set", device="3b:00.0", parameter="SRIOV_EN", value="True"))
    recorded = (bindir / "mlxconfig.argv").read_text().splitlines()
    assert recorded == ["-d", "3b:00.0", "-y", "set", "SRIOV_EN=True"]
    assert result.argv == [str(bindir / "mlxconfig"), *recorded]
    assert result.exit_code == 0
    assert result.stdout == b"Applying... Done!\n"
    assert result.stderr == b"warning\n"
    assert not result.truncated


def test_nvidia_smi_and_ipmitool_argv(bindir: Path) -> None:
    fake_tool(bindir, "nvidia-smi", "exit 0")
    invoke(request("nvidia-smi", "set_persistence_mode", gpu=3, enabled=True))
    assert (bindir / "nvidia-smi.argv").read_text().splitlines() == ["--id=3", "--persistence-mode=1"]
    invoke(request("nvidia-smi", "query_gpu", fields="index,uuid,power.limit"))
    assert (bindir / "nvidia-smi.argv").read_text().splitlines() == [
        "--query-gpu=index,uuid,power.limit",
        "--format=csv,noheader,nounits",
    ]
    with pytest.raises(InvalidParameters):
        DriverInvoke().parse(request("nvidia-smi", "query_gpu", fields="index,--help"))
    fake_tool(bindir, "ipmitool", "exit 0")
    invoke(request("ipmitool", "set_boot_device", device="pxe", efiboot=True))
    recorded = (bindir / "ipmitool.argv").read_text().splitlines()
    assert recorded == ["chassis", "bootdev", "pxe", "options=efiboot"]


def test_failing_tool_returns_its_exit_status_and_capped_output(bindir: Path) -> None:
    fake_tool(bindir, "ethtool", "head -c 3000000 /dev/zero; echo 'no such device' >&2; exit 75")
    result = invoke(request("ethtool", "show", interface="eth9"))
    assert result.exit_code == 75
    assert result.truncated
    assert len(result.stdout) == 1024 * 1024
    assert result.stderr == b"no such device\n"


def test_deadline_kills_the_whole_process_tree(bindir: Path) -> None:
    pidfile = bindir / "grandchild.pid"
    fake_tool(bindir, "ipmitool", f'sleep 300 & echo $! > "{pidfile}"; wait')
    with pytest.raises(CommandTimeout):
        invoke(request("ipmitool", "sel_list"), timeout=1.5)
    pid = int(pidfile.read_text())
    wait_until(lambda: not alive(pid), 30, f"grandchild {pid} to end with the deadline")


@pytest.mark.skipif(shutil.which("ethtool") is None, reason="ethtool not installed")
def test_real_ethtool_on_loopback() -> None:
    result = invoke(request("ethtool", "show", interface="lo"))
    assert result.exit_code == 0
    assert b"Link detected: yes" in result.stdout


@pytest.mark.skipif(shutil.which("nvme") is None, reason="nvme-cli not installed")
def test_real_nvme_cli() -> None:
    result = invoke(request("nvme", "version"))
    assert result.exit_code == 0
    assert b"nvme version" in result.stdout
    missing = "/dev/nvme" + str(max(900, len(os.listdir("/dev"))))
    result = invoke(request("nvme", "id_ctrl", device=missing))
    assert result.exit_code != 0


def test_a_chatty_tool_costs_no_more_memory_than_the_cap(bindir: Path) -> None:
    """The output is capped while it is read, not after: 200 MiB of it never sit in memory."""
    import resource

    fake_tool(bindir, "ethtool", "head -c 209715200 /dev/zero; head -c 5000000 /dev/zero >&2")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = invoke(request("ethtool", "show", interface="eth9"))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.exit_code == 0 and result.truncated
    assert len(result.stdout) == len(result.stderr) == 1024 * 1024
    assert grown_mib < 64, f"peak memory grew by {grown_mib:.0f} MiB"
