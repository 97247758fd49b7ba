"""The Redfish client against the BMCs a GPU fleet really has: recorded trees of real servers
served by the project's emulator with each vendor's documented write behaviour
(tests/site/bmc/redfish_emulator). Each test fails without the handling it names
(agent/site/bmc/redfish/vendors.py holds the rows it relies on)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from agent.config import Config
from agent.errors import BmcRefused, InvalidParameters, Unsupported
from agent.site.bmc.client import (
    BootDevice,
    BootMode,
    BootSetting,
    PowerAction,
    PowerState,
    Target,
    Unconfirmed,
)
from agent.site.bmc.redfish.client import RedfishClient
from agent.site.bmc.redfish.session import SESSION_CONTEXT
from agent.site.bmc.redfish.vendors import VENDORS
from tests.site.bmc.redfish_emulator import Quirk, RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import parse_kind, run_kind
from tests.site.bmc.redfish_emulator.server import Session
from tests.site.bmc.sushy import fast_call


def new_client(bmc: RedfishEmulator, *, seconds: float = 30.0, vendor: str = "") -> RedfishClient:
    t = bmc.target()
    target = Target(t.address, t.credentials, verify_tls=False, vendor=vendor)
    return RedfishClient(target, fast_call(seconds))


@contextmanager
def client_of(bmc: RedfishEmulator, *, seconds: float = 30.0, vendor: str = "") -> Iterator[RedfishClient]:
    """A client of ``bmc`` (``vendor`` as the operator names it, "" to detect), closed on leaving."""
    c = new_client(bmc, seconds=seconds, vendor=vendor)
    try:
        yield c
    finally:
        c.close()


def boot_patches(bmc: RedfishEmulator) -> list[dict[str, object]]:
    return [body["Boot"] for _, _, body in bmc.writes("PATCH") if "Boot" in body]


@pytest.mark.parametrize(("tree", "vendor"), [
    ("dell_r750", "dell"), ("hpe_dl385", "hpe"), ("lenovo_sr670", "lenovo"),
    ("supermicro_sys821", "supermicro"), ("nvidia_dgxh100", "ami"), ("nvidia_gh200", "bmcweb"),
    ("nvidia_gb200", "bmcweb"), ("nvidia_bluefield3", "bmcweb"), ("dmtf_public_rackmount1", "generic"),
])
def test_the_vendor_profile_is_detected_from_the_root_and_manager(trees: Path, tree: str,
                                                                  vendor: str) -> None:
    with RedfishEmulator.of(tree, trees) as bmc:
        with client_of(bmc) as c:
            assert c.vendor().name == vendor
        with client_of(bmc, vendor="supermicro") as named:
            assert named.vendor() is VENDORS["supermicro"]     # the operator's word wins


def test_a_reset_answered_500_after_acting_is_sent_once(trees: Path) -> None:
    """bmcweb answers the Reset 500 after powering on: sent again it would act twice."""
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        bmc.state.docs["/redfish/v1/Systems/System_0"]["PowerState"] = "Off"
        with client_of(bmc) as c:
            c.set_power(PowerAction.ON, graceful_timeout=1)
            assert c.power_state() is PowerState.ON
        assert [b for _, _, b in bmc.writes("POST", "ComputerSystem.Reset")] == [{"ResetType": "On"}]
        assert c.readback == ["Reset On: HTTP 500; read back: applied (LastResetTime moved)"]


DELL_SYSTEM = "/redfish/v1/Systems/System.Embedded.1"
DELL_RESET = f"{DELL_SYSTEM}/Actions/ComputerSystem.Reset"


def resets(bmc: RedfishEmulator) -> list[object]:
    return [b.get("ResetType") for _, _, b in bmc.writes("POST", "ComputerSystem.Reset")]


def test_a_reset_whose_answer_is_cut_after_acting_is_read_back_applied_and_sent_once(trees: Path) -> None:
    """The BMC restarts the node and the connection drops before its answer: a restart leaves
    PowerState On, so only the System's LastResetTime tells that it took."""
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        bmc.state.cut.add(DELL_RESET)
        with client_of(bmc) as c:
            c.set_power(PowerAction.RESET, graceful_timeout=1)
        assert resets(bmc) == ["ForceRestart"] and bmc.state.resets == ["ForceRestart"]
        assert c.readback == ["Reset ForceRestart: no answer; read back: applied (LastResetTime moved)"]


def test_a_reset_provably_not_taken_is_sent_once_more(trees: Path) -> None:
    """A 500 before the BMC did anything: its LastResetTime and PowerState stay as they were
    through the reads, so the reset is sent again, once, and takes."""
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        bmc.state.fail_next[DELL_RESET] = 500
        with client_of(bmc) as c:
            c.set_power(PowerAction.RESET, graceful_timeout=1)
        assert resets(bmc) == ["ForceRestart", "ForceRestart"] and bmc.state.resets == ["ForceRestart"]
        assert c.readback == ["Reset ForceRestart: HTTP 500; read back: not applied"
                              " (LastResetTime and PowerState unchanged in 3 reads)"]


def test_a_reset_that_cannot_be_read_back_is_unknown_and_not_resent(trees: Path) -> None:
    """iLO's System has no LastResetTime: a restart answered 500 may or may not have taken, and
    nothing tells; the command fails saying so, the reset sent once."""
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        bmc.state.fail_next["/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"] = 500
        with client_of(bmc) as c, pytest.raises(Unconfirmed, match=r"read back: unknown .*no LastResetTime"
                                                                 r".*not sent again"):
            c.set_power(PowerAction.RESET, graceful_timeout=1)
        assert resets(bmc) == ["ForceRestart"]


def test_a_power_on_cut_after_acting_is_read_back_by_its_power_state(trees: Path) -> None:
    """Without LastResetTime (iLO) an On is still told by the PowerState it leaves."""
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        bmc.state.docs["/redfish/v1/Systems/1"]["PowerState"] = "Off"
        bmc.state.cut.add("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset")
        with client_of(bmc) as c:
            c.set_power(PowerAction.ON, graceful_timeout=1)
        assert resets(bmc) == ["On"]
        assert c.readback == ["Reset On: no answer; read back: applied (PowerState On)"]


def test_the_read_back_reaches_the_result_through_the_handler(trees: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        bmc.state.docs["/redfish/v1/Systems/System_0"]["PowerState"] = "Off"
        result = run_kind("bmc.power", emulator_config, bmc, "on")
        assert result.power_state == "on" and resets(bmc) == ["On"]
        assert result.values["readback"] == "Reset On: HTTP 500; read back: applied (LastResetTime moved)"


def test_a_patch_answered_500_and_not_applied_is_read_back_not_resent(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        bmc.state.fail_next["/redfish/v1/Systems/System.Embedded.1"] = 500
        with client_of(bmc) as c, pytest.raises(Unconfirmed, match="may have acted"):
            c.set_boot_device(BootSetting(BootDevice.PXE))
        assert len(boot_patches(bmc)) == 1


def test_a_write_whose_answer_is_lost_is_read_back_not_resent(trees: Path) -> None:
    """The connection drops after the BMC took the PATCH: it reads back as asked, so the
    command succeeds, and the PATCH was sent once."""
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        bmc.state.cut.add("/redfish/v1/Systems/System.Embedded.1")
        with client_of(bmc) as c:
            assert c.set_boot_device(BootSetting(BootDevice.PXE)).device is BootDevice.PXE
        assert len(boot_patches(bmc)) == 1


def test_bmcweb_gets_no_boot_mode_it_does_not_offer(trees: Path) -> None:
    """GH200's Boot has no BootSourceOverrideMode; naming it answers 500 after the target."""
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:
        with client_of(bmc) as c:
            got = c.set_boot_device(BootSetting(BootDevice.DISK, persistent=True, mode=BootMode.UEFI))
        assert got.device is BootDevice.DISK and got.persistent
        assert boot_patches(bmc) == [{"BootSourceOverrideTarget": "Hdd",
                                      "BootSourceOverrideEnabled": "Continuous"}]


def test_dell_gets_the_boot_mode_only_when_it_changes(trees: Path) -> None:
    """iDRAC queues a BIOS job (an extra reboot) for a mode named, even unchanged."""
    with RedfishEmulator.of("dell_r750", trees) as bmc, client_of(bmc) as c:
        c.set_boot_device(BootSetting(BootDevice.PXE, mode=BootMode.UEFI))    # UEFI already
        assert bmc.state.bios_jobs == 0
        assert "BootSourceOverrideMode" not in boot_patches(bmc)[-1]
        c.set_boot_device(BootSetting(BootDevice.PXE, mode=BootMode.LEGACY))
        assert boot_patches(bmc)[-1]["BootSourceOverrideMode"] == "Legacy"
        assert bmc.state.bios_jobs == 1


def test_supermicro_gets_the_mode_in_every_boot_patch(trees: Path) -> None:
    """Without it Supermicro resets the mode to Legacy: the node would boot Legacy."""
    with RedfishEmulator.of("supermicro_sys821", trees) as bmc:
        with client_of(bmc) as c:
            got = c.set_boot_device(BootSetting(BootDevice.PXE))
        assert boot_patches(bmc)[0]["BootSourceOverrideMode"] == "UEFI"
        assert got.mode is BootMode.UEFI


def test_an_override_reverted_after_a_moment_is_caught(trees: Path) -> None:
    reverted = frozenset({Quirk.OVERRIDE_REVERTED})
    with RedfishEmulator.of("supermicro_sys821", trees, quirks=reverted, apply_delay=0.5) as bmc, \
            client_of(bmc) as c, pytest.raises(BmcRefused, match="reads back none"):
        c.set_boot_device(BootSetting(BootDevice.PXE, mode=BootMode.UEFI))


def test_ami_boot_goes_to_the_settings_object_with_its_etag(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_dgxh100", trees) as bmc, client_of(bmc) as c:
        got = c.set_boot_device(BootSetting(BootDevice.PXE))
        assert got.device is BootDevice.PXE
        assert [p for _, p, _ in bmc.writes("PATCH")] == ["/redfish/v1/Systems/DGX/SD"]
        # Applied at the next reset: the System itself reads Pxe after it.
        assert bmc.doc("/redfish/v1/Systems/DGX")["Boot"]["BootSourceOverrideTarget"] == "None"
        c.set_power(PowerAction.RESET, graceful_timeout=1)
        assert bmc.doc("/redfish/v1/Systems/DGX")["Boot"]["BootSourceOverrideTarget"] == "Pxe"


def test_bluefield_boot_goes_to_the_settings_object_the_system_names(trees: Path) -> None:
    """BlueField-3 answers a Boot PATCH at its System and applies nothing; NVIDIA's BlueField BMC
    documentation ("Boot Configuration") and libredfish PATCH /Systems/Bluefield/Settings, which
    the System names in @Redfish.Settings: applied at the next reset."""
    with RedfishEmulator.of("nvidia_bluefield3", trees) as bmc, client_of(bmc) as c:
        assert c.vendor().name == "bmcweb"          # no row of its own: the rule is every vendor's
        got = c.set_boot_device(BootSetting(BootDevice.PXE, mode=BootMode.UEFI))
        assert got.device is BootDevice.PXE
        assert [p for _, p, _ in bmc.writes("PATCH")] == ["/redfish/v1/Systems/Bluefield/Settings"]
        assert bmc.doc("/redfish/v1/Systems/Bluefield")["Boot"]["BootSourceOverrideTarget"] == "None"
        c.set_power(PowerAction.RESET, graceful_timeout=1)
        assert bmc.doc("/redfish/v1/Systems/Bluefield")["Boot"]["BootSourceOverrideTarget"] == "Pxe"


def test_a_settings_object_without_the_override_leaves_the_boot_at_the_system(trees: Path) -> None:
    """Lenovo's System names a Pending object whose Boot holds only BootOrder; XCC documents the
    boot override PATCHed at /Systems/1 (pubs.lenovo.com xcc-restapi, "PATCH - Update
    next-one-time boot configurations")."""
    with RedfishEmulator.of("lenovo_sr670", trees) as bmc, client_of(bmc) as c:
        assert c.set_boot_device(BootSetting(BootDevice.PXE)).device is BootDevice.PXE
        assert [p for _, p, _ in bmc.writes("PATCH")] == ["/redfish/v1/Systems/1"]


def test_an_etag_form_answered_412_is_sent_once_in_its_other_form(trees: Path) -> None:
    """iLO firmware that matches only the weak form it gave: the row's strong form answers 412
    (not applied), the weak one is sent once and taken."""
    as_given = frozenset({Quirk.WEAK_ETAG_AS_GIVEN})
    with RedfishEmulator.of("hpe_dl385", trees, quirks=as_given) as bmc:
        bmc.state.profile = replace(bmc.state.profile, quirks=bmc.state.profile.quirks - {Quirk.WEAK_ETAG})
        with client_of(bmc) as c:
            assert c.set_boot_device(BootSetting(BootDevice.PXE)).device is BootDevice.PXE
        matches = [h for h in bmc.state.if_match if h]
        assert len(boot_patches(bmc)) == 2 and not matches[0].startswith("W/") and matches[1].startswith("W/")


def test_a_412_to_both_etag_forms_is_refused_after_two_patches(trees: Path) -> None:
    """The resource changed between the read and the write (412 to either form): refused, named,
    and never a third PATCH."""
    with RedfishEmulator.of("hpe_dl385", trees) as bmc, client_of(bmc) as c:
        bmc.state.contended.add("/redfish/v1/Systems/1")
        with pytest.raises(BmcRefused, match="412"):
            c.set_boot_device(BootSetting(BootDevice.PXE))
        assert len(boot_patches(bmc)) == 2


def test_ilo_weak_etags_are_sent_strong(trees: Path) -> None:
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        with client_of(bmc) as c:
            assert c.set_boot_device(BootSetting(BootDevice.PXE)).device is BootDevice.PXE
        assert len(boot_patches(bmc)) == 1
        # No row: the weak one, then after its 412 the strong (the row's gzip apart: without it,
        # this iLO 5 v2.72 answers the generic client's GETs 406, a test of its own below).
        bmc.state.profile = replace(bmc.state.profile, quirks=bmc.state.profile.quirks - {Quirk.GZIP_OR_406})
        with client_of(bmc, vendor="generic") as generic:
            assert generic.set_boot_device(BootSetting(BootDevice.DISK)).device is BootDevice.DISK
        assert len(boot_patches(bmc)) == 3


def test_ilo_gets_enabled_and_target_alone_and_the_mode_apart(trees: Path) -> None:
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        with client_of(bmc) as c, pytest.raises(BmcRefused, match="BootSourceOverrideMode"):
            c.set_boot_device(BootSetting(BootDevice.PXE, mode=BootMode.LEGACY))
        first = {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}
        assert boot_patches(bmc)[0] == first
        assert bmc.doc("/redfish/v1/Systems/1")["Boot"]["BootSourceOverrideTarget"] == "Pxe"


def test_ilo_insert_media_takes_the_image_alone(trees: Path) -> None:
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        with client_of(bmc) as c:
            got = c.insert_media("http://127.0.0.1:9/ramdisk.iso")
        assert got.inserted and got.image == "http://127.0.0.1:9/ramdisk.iso"
        assert [b for _, _, b in bmc.writes("POST", "InsertMedia")] == [{"Image": "http://127.0.0.1:9/ramdisk.iso"}]


def test_lenovo_mounts_network_images_in_its_ext_slots(trees: Path) -> None:
    with RedfishEmulator.of("lenovo_sr670", trees) as bmc:
        with client_of(bmc) as c:
            got = c.insert_media("http://127.0.0.1:9/ramdisk.iso")
        assert got.id == "EXT1" and got.inserted
        assert [p for _, p, _ in bmc.writes("PATCH")] == ["/redfish/v1/Managers/1/VirtualMedia/EXT1"]


def test_bmcweb_media_over_http_is_refused_before_any_write(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_gb200", trees) as bmc, client_of(bmc) as c:
        with pytest.raises(Unsupported, match="https, smb images only"):
            c.insert_media("http://127.0.0.1:9/ramdisk.iso")
        assert not bmc.writes("POST", "InsertMedia")
        assert c.insert_media("https://127.0.0.1:9/ramdisk.iso").inserted


def test_supermicro_is_ejected_once(trees: Path) -> None:
    """Its slot keeps the Image after EjectMedia; a second eject would be refused."""
    with RedfishEmulator.of("supermicro_sys821", trees) as bmc:
        with client_of(bmc) as c:
            c.insert_media("http://127.0.0.1:9/ramdisk.iso")
            c.eject_media()
            c.eject_media()
        ejects = [b for _, _, b in bmc.writes("PATCH") if b.get("Inserted") is False]
        assert len(ejects) == 1


def test_lenovo_events_are_not_doubled(trees: Path) -> None:
    """XCC's Manager links the System's own LogServices collection."""
    with RedfishEmulator.of("lenovo_sr670", trees) as bmc:
        with client_of(bmc) as c:
            entries = c.event_log(0)
        keys = [(e.log, e.id) for e in entries]
        assert len(keys) == len(set(keys)) == 468


def test_a_log_service_that_answers_404_leaves_the_others_read_and_is_named(trees: Path) -> None:
    with RedfishEmulator.of("nvidia_bluefield3", trees) as bmc:
        with client_of(bmc) as c:
            entries = c.event_log(0)
        # Its recording lists the Manager's Journal and the System's EventLog without their entries.
        assert entries and c.partial == ["events: Journal: HTTP 404", "events: EventLog: HTTP 404"]


def test_every_session_is_deleted(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        for _ in range(10):             # more than iDRAC's 8
            with client_of(bmc) as c:
                c.power_state()
        assert not bmc.state.sessions


def test_sessions_a_crash_left_are_closed_at_first_contact(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        for n in range(7):
            bmc.state.sessions[f"old{n}"] = Session(f"old{n}", f"t{n}", bmc.user, SESSION_CONTEXT)
        bmc.state.sessions["op"] = Session("op", "t-op", bmc.user, "an operator's browser")
        with client_of(bmc) as c:                # 8 open: the iDRAC's limit, RAC0218
            assert c.power_state() in (PowerState.ON, PowerState.OFF)
        assert list(bmc.state.sessions) == ["op"]


def test_busy_answers_are_retried_with_a_bound(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        bmc.state.docs["/redfish/v1/Systems/System.Embedded.1"]["PowerState"] = "Off"
        bmc.state.busy_left = 2                  # SYS518: the job queue busy twice
        with client_of(bmc) as c:
            c.set_power(PowerAction.ON, graceful_timeout=1)
            assert len(bmc.writes("POST", "ComputerSystem.Reset")) == 3
            bmc.state.busy_left = 100
            with pytest.raises(BmcRefused, match="503"):
                c.set_power(PowerAction.OFF, graceful_timeout=0)
            assert 3 < len(bmc.writes("POST", "ComputerSystem.Reset")) <= 3 + 5


def test_nothing_is_kept_from_an_answer_cut_at_the_deadline(trees: Path) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        bmc.state.drip["/redfish/v1/Systems"] = 0.05          # a BMC that drips its answer
        first = new_client(bmc, seconds=2)
        with pytest.raises(Exception, match=r"deadline|cancel|answer"):
            first.power_state()
        known = first.leave()
        assert known.root is None and not known.paths
        bmc.state.drip.clear()
        before = len(bmc.writes("GET", "/redfish/v1"))
        second = RedfishClient(bmc.target(), fast_call(30), known)
        try:
            assert second.power_state() in (PowerState.ON, PowerState.OFF)
        finally:
            second.close()
        assert len(bmc.writes("GET", "/redfish/v1")) == before + 1     # it asked again


def test_an_unknown_vendor_name_is_refused_in_parse() -> None:
    with pytest.raises(InvalidParameters, match="vendor"):
        parse_kind("bmc.power", "status", vendor="acme")
    assert parse_kind("bmc.power", "status", vendor="dell").args.vendor == "dell"


def test_the_operators_vendor_reaches_the_client_through_the_handler(trees: Path,
                                                                    emulator_config: Config) -> None:
    """Named "generic" for the Supermicro, its Boot PATCH leaves the mode out and the BMC resets it
    to Legacy (said in not_kept); detected, the row names the mode in every PATCH and it is kept."""
    with RedfishEmulator.of("supermicro_sys821", trees) as bmc:
        generic = run_kind("bmc.boot", emulator_config, bmc, "set_boot_device", device="pxe", mode="uefi",
                           vendor="generic")
        assert generic.boot.device == "pxe" and "mode" in generic.not_kept
        bmc.state.docs["/redfish/v1/Systems/1"]["Boot"]["BootSourceOverrideMode"] = "UEFI"
        detected = run_kind("bmc.boot", emulator_config, bmc, "set_boot_device", device="pxe", mode="uefi")
        assert detected.boot.device == "pxe" and "mode" not in detected.not_kept
        assert ["BootSourceOverrideMode" in p for p in boot_patches(bmc)] == [False, True]


def test_storage_list_without_virtual_media_keeps_the_controllers(trees: Path,
                                                                 emulator_config: Config) -> None:
    """BlueField-3 has Storage and no VirtualMedia: the controllers are returned, the missing
    media named partial."""
    with RedfishEmulator.of("nvidia_bluefield3", trees) as bmc:
        result = run_kind("bmc.storage", emulator_config, bmc, "list")
    assert result.storage and not result.virtual_media
    partial = result.values["partial"]
    assert partial.startswith("virtual_media: ") and "has no VirtualMedia" in partial


def test_ilo_is_asked_for_gzip_and_its_compressed_answers_are_read(trees: Path) -> None:
    """iLO 5 answers 406 to a GET of a compressed subtree from a client that does not take gzip
    (DMTF/Redfish-Mockup-Creator#56): named generic, the client sends http.client's identity
    and its query is refused; detected (the HPE row), it asks for gzip and decodes."""
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        with client_of(bmc, vendor="generic") as c, pytest.raises(BmcRefused, match="406"):
            c.query()
        with client_of(bmc) as c:
            info = c.query()
        system = bmc.doc("/redfish/v1/Systems/1")
        assert info.system.serial == system["SerialNumber"] and info.system.model == system["Model"]
        assert info.system.bmc_firmware_version == "iLO 5 v2.72"
