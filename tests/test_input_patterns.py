"""Every parser in agent/ that validates input with a regular expression or a digit check: a
trailing newline (``$`` matches before one), a newline inside, and digits that are not ASCII
("²", "①": ``str.isdigit`` says yes, ``int`` raises ValueError) are refused with a clear
InvalidParameters, never accepted and never an internal error. One test per parser."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent import limits
from agent.commands.bmc_params import parse_request
from agent.commands.bulk.logs import SECRET_FILE
from agent.commands.dcgm import DiagDcgm
from agent.commands.gpu import parse_gpu_ref
from agent.commands.upgrade import UpgradeHandler
from agent.drivers.base import Arg, ArgType
from agent.errors import InvalidParameters
from agent.hw import dcgm
from agent.images import manifest
from agent.link.session import parse_address
from agent.net import http
from agent.proto import agent_pb2, site_pb2
from agent.site.bmc.ipmi import split_address
from agent.site.bmc.secrets import check_ref
from agent.site.boot.fields import parse_mac, parse_node_id, script_safe_url
from agent.site.boot.pxe import EntryRequest


def refused(fn: Callable[[], Any], match: str | None = None) -> None:
    with pytest.raises(InvalidParameters, match=match):
        fn()


def test_is_digits() -> None:
    assert limits.is_digits("0") and limits.is_digits("65535")
    for text in ("", "²", "①", "٣", "1\n", " 1", "-1", "1.0"):
        assert not limits.is_digits(text), text


def test_pxe_node_id() -> None:
    """The issue's case: "n1\\n" was accepted, and the iPXE script and the log gained a line."""
    assert parse_node_id("rack1-n01") == "rack1-n01"
    for bad in ("n1\n", "n1\nset x y", "\nn1"):
        refused(lambda bad=bad: parse_node_id(bad), "node_id")
    entry = site_pb2.ProxyDhcpEntry(node_id="n1\n", mac_address="52:54:00:00:00:01",
                                    boot_file="ipxe.efi", kernel_url="http://10.0.0.1/k", ttl_seconds=60)
    refused(lambda: EntryRequest.from_proto(entry), "node_id")


def test_pxe_mac_url_and_cmdline() -> None:
    assert parse_mac("52:54:00:00:00:01\n") == "52:54:00:00:00:01"   # surrounding space is trimmed
    refused(lambda: parse_mac("52:54:00:00:00:01\nx"), "MAC")
    refused(lambda: script_safe_url("http://10.0.0.1/k\n", "kernel_url"))
    refused(lambda: script_safe_url("http://10.0.0.1/k\nchain http://evil/", "kernel_url"))
    entry = site_pb2.ProxyDhcpEntry(node_id="n1", mac_address="52:54:00:00:00:01", boot_file="ipxe.efi",
                                    kernel_url="http://10.0.0.1/k", kernel_cmdline="quiet\nshell",
                                    ttl_seconds=60)
    entry.kernel_digest.hex = "0" * 64
    refused(lambda: EntryRequest.from_proto(entry), "kernel_cmdline")


def test_dcgm_parameters() -> None:
    assert dcgm.check_parameters({"memtest.test_duration": "60"}) == {"memtest.test_duration": "60"}
    refused(lambda: dcgm.check_parameters({"memtest.test_duration\n": "60"}), "DCGM parameter")
    refused(lambda: dcgm.check_parameters({"memtest.test_duration": "60\n"}), "DCGM parameter")


def test_dcgm_gpu_indices() -> None:
    for ref in ("①", "²"):
        refused(lambda ref=ref: DiagDcgm().parse(agent_pb2.DiagDcgmRequest(gpus=[ref])), "GPU indices")


def test_gpu_ref() -> None:
    assert parse_gpu_ref("3") == "3" and parse_gpu_ref("GPU-0123abcd") == "GPU-0123abcd"
    for ref in ("①", "²", "GPU-0123abcd\nx"):
        refused(lambda ref=ref: parse_gpu_ref(ref), "neither an index nor a UUID")


def test_secret_store_ref() -> None:
    assert check_ref("rack1-n01") == "rack1-n01"
    refused(lambda: check_ref("rack1-n01\n"), "credentials_ref")


def test_bmc_address_port() -> None:
    assert split_address("10.0.0.1:623") == ("10.0.0.1", 623)
    for address in ("10.0.0.1:①", "10.0.0.1:6²3", "[::1]:①", "10.0.0.1\n", "10.0.0.1:623\n"):
        refused(lambda address=address: split_address(address), "bmc_address")


def test_bmc_parameters() -> None:
    def parse(kind: str, operation: str, **parameters: str) -> None:
        parse_request(kind, site_pb2.BmcOperationRequest(
            bmc_address="10.0.0.1", protocol="redfish", operation=operation, credentials_ref="r1",
            parameters=parameters))

    refused(lambda: parse("bmc.firmware", "push", file="/x", sha256="a" * 64 + "\n"), "sha256")
    refused(lambda: parse("bmc.firmware", "status", task_uri="/redfish/v1/TaskService/Tasks/1\n"), "task_uri")
    refused(lambda: parse("bmc.storage", "create_volume", controller_id="1", name="v", raid_type="RAID1",
                          drives="a", capacity_bytes="①"), "capacity_bytes")


def test_gateway_address() -> None:
    assert parse_address("gw:7443") == ("gw", 7443)
    for address in ("gw:①", "gw:7443\n"):
        refused(lambda address=address: parse_address(address), "gateway address")


def test_upgrade_version() -> None:
    payload = agent_pb2.DaemonSection(version="1.2.3\n", url="https://gw/agent.pyz")
    refused(lambda: UpgradeHandler().parse(payload), "version")


def test_driver_string_argument() -> None:
    arg = Arg("interface", ArgType.STRING, "network interface", pattern=r"[A-Za-z0-9_.:@-]{1,15}")
    assert arg.check("eth0") == "eth0"
    refused(lambda: arg.check("eth0\n"), "does not match")


def _bmap(image_size: str) -> bytes:
    body = (f'<?xml version="1.0" ?>\n<bmap version="2.0">\n<ImageSize> {image_size} </ImageSize>\n'
            "<BlockSize> 4096 </BlockSize>\n<BlocksCount> 1 </BlocksCount>\n<MappedBlocksCount> 1 "
            "</MappedBlocksCount>\n<ChecksumType> sha256 </ChecksumType>\n<BmapFileChecksum> "
            + "0" * 64 + " </BmapFileChecksum>\n<BlockMap>\n<Range chksum=\"" + "ab" * 32
            + "\"> 0 </Range>\n</BlockMap>\n</bmap>\n")
    data = body.encode()
    return data.replace(b"0" * 64, hashlib.sha256(data).hexdigest().encode(), 1)


def test_bmap_numbers() -> None:
    assert manifest.parse_bmap(_bmap("4096")).image_size == 4096
    for size in ("①", "4²"):
        refused(lambda size=size: manifest.parse_bmap(_bmap(size)), "not a number")


def test_secret_file_names_in_logs_collect(tmp_path: Path) -> None:
    """A deny list: a key file's name with trailing whitespace (a newline) is still a key file."""
    for name in ("server.key", "server.key\n", "server.key \n", "id.p12", "node.key", "node.key\n"):
        assert SECRET_FILE.fullmatch(name), name
    for name in ("server.keys", "agent.log", "key", "node.keyring"):
        assert not SECRET_FILE.fullmatch(name), name


def test_an_upstreams_content_length_in_other_digits() -> None:
    """``Content-Length: ²`` from a server: not a length (the body is read to the close), never
    a ValueError out of the download."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            head = "HTTP/1.1 200 OK\r\nContent-Length: ²\r\nConnection: close\r\n\r\n"
            conn.sendall(head.encode("latin-1") + b"body")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
        with http.get(url, http.HttpOptions(timeout=5.0, max_retries=0)) as body:
            assert b"".join(body.iter_chunks(65536)) == b"body"
    finally:
        thread.join(5)
        listener.close()


def test_oci_reference_and_registry_hosts() -> None:
    from agent.commands.deploy.oci import hosts
    from agent.images import oci

    ref = oci.parse("oci://reg.example:5000/os/node:1")
    wide = "\uff15\uff10"     # fullwidth "50": digits to str.isdigit, not to the parser
    for bad in ("oci://reg.example:5000/os/node:1\n", "oci://reg.example:5000/os/node:1\nx",
                f"oci://reg.example:{wide}/os/node:1", "oci://reg.example/os/node@sha256:" + "a" * 63 + "\n",
                "oci://reg.example/os/n\u00f6de:1", "oci://reg.example/os/node:v\u00b2"):
        refused(lambda bad=bad: oci.parse(bad))  # type: ignore[misc]
    for bad in ("cdn.example\n", "cdn.example\nx", "cdn.exa²mple"):
        refused(lambda bad=bad: hosts([bad], ref))  # type: ignore[misc]
