"""A firmware update as fleets do it, on recorded trees served by the project's emulator: the
way in picked from what each recorded UpdateService offers (SimpleUpdate for a URL its
TransferProtocol values take, a multipart push, else HttpPushUri, for a file; the operator's
method where named), the update's task followed to its end, the BMC's own reboot after it
waited out (3 good answers in a row), and the new version read back from the FirmwareInventory."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from agent.errors import CommandTimeout, InvalidParameters, Unsupported
from agent.site.bmc.client import CallContext, Pacing
from agent.site.bmc.redfish import firmware
from agent.site.bmc.redfish.client import RedfishClient
from agent.site.bmc.redfish.session import link
from tests.site.bmc.redfish_emulator import RedfishEmulator


def quick(seconds: float) -> CallContext:
    return CallContext(threading.Event(), time.monotonic() + seconds, Pacing(0.1, 0.3, 1.5))


def first_component(bmc: RedfishEmulator) -> tuple[str, str]:
    members = bmc.doc("/redfish/v1/UpdateService/FirmwareInventory")["Members"]
    path = str(members[0]["@odata.id"]).rstrip("/")
    return path, str(bmc.doc(path).get("Version"))


def test_simple_update_waits_out_the_bmcs_reboot_and_reads_the_new_version(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        path, old = first_component(bmc)
        bmc.state.update_to, bmc.state.reboot_seconds = (path, "9.9.9"), 1.5
        client = RedfishClient(bmc.target(), quick(60))
        start = time.monotonic()
        try:
            task = client.firmware_update(image_uri="https://127.0.0.1:9/fw.exe")
        finally:
            client.close()
        assert task.state == "Completed"
        assert f"updated {path.rsplit('/', 1)[-1]}: {old} -> 9.9.9" in task.messages
        assert time.monotonic() - start >= 1.5             # not before the BMC was back


def test_a_multipart_push_where_that_is_what_the_bmc_offers(trees: Path, tmp_path: Path) -> None:
    image = tmp_path / "fw.tar"
    image.write_bytes(b"firmware" * 1000)
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        path, _ = first_component(bmc)
        bmc.state.update_to, bmc.state.reboot_seconds = (path, "GH200-99"), 0.5
        client = RedfishClient(bmc.target(), quick(60))
        try:
            task = client.firmware_update(file=image, sha256=hashlib.sha256(image.read_bytes()).hexdigest())
        finally:
            client.close()
        assert task.state == "Completed" and any(m.endswith("-> GH200-99") for m in task.messages)
        assert len(bmc.writes("POST", "/update-multipart")) == 1      # pushed once


def test_a_bmc_that_does_not_come_back_times_out_at_the_deadline(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        path, _ = first_component(bmc)
        bmc.state.update_to, bmc.state.reboot_seconds = (path, "9.9.9"), 600
        client = RedfishClient(bmc.target(), quick(6))
        try:
            with pytest.raises(CommandTimeout, match="not answering steadily"):
                client.firmware_update(image_uri="https://127.0.0.1:9/fw.exe")
        finally:
            client.close()


# -- the way in, picked from what each recorded UpdateService offers ------------------------

URL = "https://127.0.0.1:9/fw.bin"
# tree -> (an https URL: (method, TransferProtocol) or the refusal's words, a file: method)
OFFERS: dict[str, tuple[tuple[str, str] | str, str]] = {
    "dell_r750": (("simple_update", "HTTPS"), "multipart"),
    "hpe_dl385": (("simple_update", "HTTPS"), "http_push"),
    "lenovo_sr670": ("SimpleUpdate takes TransferProtocol TFTP, SFTP, not HTTPS", "multipart"),
    "supermicro_sys821": (("simple_update", "HTTPS"), "multipart"),       # its ActionInfo's values
    "nvidia_dgxh100": (("simple_update", "HTTPS"), "multipart"),          # required by its ActionInfo
    "nvidia_gh200": ("no SimpleUpdate", "multipart"),
    "nvidia_gb200": ("no SimpleUpdate", "multipart"),
    "nvidia_bluefield3": ("SimpleUpdate takes TransferProtocol SCP, not HTTPS", "multipart"),
    "dmtf_public_rackmount1": (("simple_update", "HTTPS"), "http_push"),
}


def offered(bmc: RedfishEmulator) -> tuple[RedfishClient, firmware.Offer]:
    client = RedfishClient(bmc.target(), quick(30))
    return client, firmware.offer(client, client.get(link(client.root(), "UpdateService")))


@pytest.mark.parametrize("tree", sorted(OFFERS))
def test_the_way_in_is_picked_from_each_recorded_update_service(trees: Path, tree: str,
                                                                tmp_path: Path) -> None:
    by_url, by_file = OFFERS[tree]
    with RedfishEmulator.of(tree, trees) as bmc:
        client, offer = offered(bmc)
        client.close()
    if isinstance(by_url, tuple):
        assert firmware.choose(offer, image_uri=URL) == (firmware.Method(by_url[0]), by_url[1])
    else:
        with pytest.raises(Unsupported, match=by_url):
            firmware.choose(offer, image_uri=URL)
    assert firmware.choose(offer, file=tmp_path / "fw.bin") == (firmware.Method(by_file), "")


def test_the_operators_method_overrides_the_pick_and_must_be_offered(trees: Path, tmp_path: Path) -> None:
    image = tmp_path / "fw.bin"
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        client, dell = offered(bmc)
        client.close()
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        client, hpe = offered(bmc)
        client.close()
    with RedfishEmulator.of("lenovo_sr670", trees) as bmc:
        client, lenovo = offered(bmc)
        client.close()
    assert firmware.choose(dell, file=image, method="http_push") == (firmware.Method.HTTP_PUSH, "")
    with pytest.raises(Unsupported, match=r"offers no MultipartHttpPushUri .*SimpleUpdate"):
        firmware.choose(hpe, file=image, method="multipart")
    tftp = firmware.choose(lenovo, image_uri="tftp://10.0.0.1/fw.bin")
    assert tftp == (firmware.Method.SIMPLE_UPDATE, "TFTP")
    with pytest.raises(Unsupported, match="not SCP"):
        firmware.choose(dell, image_uri=URL, transfer_protocol="SCP")


def test_dgx_h100s_simple_update_gets_the_transfer_protocol_its_action_info_requires(trees: Path) -> None:
    """The emulator refuses its SimpleUpdate without TransferProtocol (Required in the ActionInfo)."""
    with RedfishEmulator.of("nvidia_dgxh100", trees) as bmc:
        client = RedfishClient(bmc.target(), quick(60))
        try:
            task = client.firmware_update(image_uri=URL)
        finally:
            client.close()
        assert task.state == "Completed" and task.messages[0] == "method simple_update"
        assert [b for _, _, b in bmc.writes("POST", "/SimpleUpdate")] == [
            {"ImageURI": URL, "TransferProtocol": "HTTPS"}]


def test_an_http_push_where_no_multipart_push_is_offered(trees: Path, tmp_path: Path) -> None:
    """DMTF's mockup offers HttpPushUri (/FWUpdate) and no multipart push: the image is the body."""
    image = tmp_path / "fw.bin"
    image.write_bytes(b"firmware" * 512)
    with RedfishEmulator.of("dmtf_public_rackmount1", trees) as bmc:
        client = RedfishClient(bmc.target(), quick(60))
        try:
            task = client.firmware_update(file=image, sha256=hashlib.sha256(image.read_bytes()).hexdigest())
        finally:
            client.close()
        assert task.state == "Completed" and task.messages[0] == "method http_push"
        assert [b for _, _, b in bmc.writes("POST", "/FWUpdate")] == [{"octets": len(image.read_bytes())}]


def test_an_image_url_nothing_offered_takes_is_refused_before_anything_is_sent(trees: Path) -> None:
    with RedfishEmulator.of("lenovo_sr670", trees) as bmc:
        client = RedfishClient(bmc.target(), quick(30))
        try:
            with pytest.raises(Unsupported, match=r"TFTP, SFTP, not HTTPS .*MultipartHttpPushUri"):
                client.firmware_update(image_uri=URL)
        finally:
            client.close()
        assert not [w for w in bmc.writes("POST") if "Session" not in w[1]]


@pytest.mark.parametrize(("parameters", "words"), [
    ({}, "give image_uri .* or file and sha256"),
    ({"image_uri": URL, "file": "/tmp/fw.bin", "sha256": "0" * 64}, "one of them"),
    ({"file": "/tmp/fw.bin"}, "file needs its sha256"),
    ({"file": "/tmp/fw.bin", "sha256": "0" * 64, "method": "simple_update"}, "pushes no file"),
    ({"image_uri": URL, "method": "multipart"}, "give file and sha256"),
    ({"image_uri": URL, "method": "carrier-pigeon"}, "one of simple_update, multipart, http_push"),
])
def test_bmc_firmware_update_is_checked_in_parse(parameters: dict[str, str], words: str) -> None:
    from agent.commands.bmc_params import parse_request
    from agent.proto import site_pb2

    payload = site_pb2.BmcOperationRequest(bmc_address="127.0.0.1:443", protocol="redfish",
                                           operation="update", credentials_ref="rack1-n01",
                                           parameters=parameters)
    with pytest.raises(InvalidParameters, match=words):
        parse_request("bmc.firmware", payload)
