"""driver.invoke: typed arguments only, missing tools, output and exit status, deadline kills the tree."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from agent.commands.base import Context
from agent.commands.driver import DriverInvoke
from agent.errors import CommandTimeout, InvalidParameters, ToolMissing, Unsupported
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


QUERY = """
Device #1:
----------

Device type:    ConnectX6DX
Name:           MCX623106AN-CDA_Ax
Device:         0000:3b:00.0

Configurations:                                      Default         Current         Next Boot
         NUM_OF_VFS                                  0               0               0
*        SRIOV_EN                                    False(0)        False(0)        True(1)
         LINK_TYPE_P1                                ETH(2)          ETH(2)          ETH(2)
         PF_NUM_PF_MSIX[1]                           0               0               0
The '*' shows parameters with next value different from default/current value.
"""


def test_mlxconfig_query_table_is_parsed() -> None:
    from agent.drivers import mlxconfig

    table = mlxconfig.parse_query(QUERY)
    assert table["SRIOV_EN"] == mlxconfig.Setting("False(0)", "False(0)", "True(1)")
    assert table["LINK_TYPE_P1"].current == "ETH(2)" and table["PF_NUM_PF_MSIX[1]"].default == "0"
    assert set(table) == {"NUM_OF_VFS", "SRIOV_EN", "LINK_TYPE_P1", "PF_NUM_PF_MSIX[1]"}
    assert mlxconfig.parse_query("Device type: ConnectX6\n") == {}


def test_efivars_is_done_in_the_agent_on_the_tree_it_is_given(tmp_path: Path) -> None:
    import json
    import struct

    from agent.hw import efivars

    directory = tmp_path / "sys/firmware/efi/efivars"
    directory.mkdir(parents=True)
    for name, value in (("Boot0001", efivars.load_option("debian")), ("Boot0004", efivars.load_option("x")),
                        ("BootOrder", struct.pack("<2H", 4, 1))):
        (directory / f"{name}-{efivars.GLOBAL}").write_bytes(struct.pack("<I", 7) + value)
    handler = DriverInvoke()
    handler.root = tmp_path

    def run(msg: agent_pb2.DriverInvokeRequest) -> agent_pb2.DriverInvokeResult:
        result = handler.run(Context.local("driver.invoke"), handler.parse(msg))
        assert isinstance(result, agent_pb2.DriverInvokeResult) and result.exit_code == 0
        return result

    listed = json.loads(run(request("efivars", "list")).stdout)
    assert [e["number"] for e in listed["boot_entries"]] == ["0001", "0004"]
    assert listed["boot_order"] == ["0004", "0001"] and listed["pk_sha256"] == "absent"
    done = run(request("efivars", "delete_boot_entry", entry="0004"))
    assert done.argv == ["(efivars)", "delete_boot_entry", "0004"] and done.stdout == b"deleted Boot0004\n"
    assert efivars.Efivars(directory).boot_order() == [1]
    run(request("efivars", "set_boot_order", order="0001"))
    with pytest.raises(InvalidParameters):
        handler.parse(request("efivars", "set_boot_order", order="1; reboot"))
    handler.root = tmp_path / "elsewhere"
    with pytest.raises(Unsupported, match="no UEFI variables"):
        run(request("efivars", "list"))
