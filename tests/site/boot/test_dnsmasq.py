"""The dnsmasq supervisor without root: its configuration, its TFTP folder, and the
supervision itself (start, restart, reload, stop, a stray killed) with a stand-in dnsmasq,
a script that records the signals it gets. tests/site/boot/test_boot_network.py runs the real one."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.errors import ToolFailed, ToolMissing
from agent.site.boot.dnsmasq import (
    DnsmasqSettings,
    DnsmasqSupervisor,
    prepare,
    render_config,
    served_digest,
)
from agent.site.boot.pxe import BootFile
from tests.site.conftest import stray_children

FAKE = """#!{python}
import signal, sys, time
from pathlib import Path
log = Path({log!r})
signal.signal(signal.SIGHUP, lambda *a: log.open("a").write("HUP\\n"))
log.open("a").write("start " + " ".join(sys.argv[1:]) + "\\n")
while True:
    time.sleep(0.05)
"""


def settings(tmp_path: Path, **kw: object) -> DnsmasqSettings:
    ipxe = tmp_path / "ipxe"
    ipxe.mkdir(exist_ok=True)
    for name in ("undionly.kpxe", "ipxe.efi", "snponly.efi"):
        (ipxe / name).write_bytes(name.encode() * 10)
    fields: dict[str, object] = {"interface": "eth9", "address": "10.0.0.2",
                                 "http_base_url": "http://10.0.0.2:8088", "root": tmp_path / "boot",
                                 "ipxe_dir": ipxe}
    fields.update(kw)
    (tmp_path / "boot").mkdir(exist_ok=True)
    return DnsmasqSettings(**fields)  # type: ignore[arg-type]


def fake_dnsmasq(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "fake.log"
    script = tmp_path / "dnsmasq"
    script.write_text(FAKE.format(python=sys.executable, log=str(log)))
    script.chmod(0o755)
    return str(script), log


def starts(log: Path) -> list[str]:
    """The stand-in's start lines (the word also occurs in tmp_path, "test_..._restarted_...")."""
    return [line for line in log.read_text().splitlines() if line.startswith("start ")]


def wait(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_config_answers_known_macs_only_and_never_leases(tmp_path: Path) -> None:
    text = render_config(settings(tmp_path))
    lines = text.splitlines()
    assert "port=0" in lines and "dhcp-range=10.0.0.2,proxy" in lines
    assert "dhcp-ignore=tag:!known" in lines and "leasefile-ro" in lines
    assert f"dhcp-hostsdir={tmp_path / 'boot' / 'hosts'}" in lines
    assert "dhcp-boot=tag:ipxe,http://10.0.0.2:8088/boot.ipxe" in lines
    assert not any("set:bc" in line for line in lines), "no tags on host lines (dnsmasq 2.90)"


def test_tftp_folder_holds_the_two_binaries_only(tmp_path: Path) -> None:
    s = settings(tmp_path)
    s.tftp_dir.mkdir(parents=True)
    (s.tftp_dir / "stray.bin").write_bytes(b"x")
    prepare(s)
    assert sorted(p.name for p in s.tftp_dir.iterdir()) == ["ipxe.efi", "undionly.kpxe"]
    assert (s.tftp_dir / "ipxe.efi").read_bytes() == (s.ipxe_dir / "ipxe.efi").read_bytes()
    assert s.conf_path.read_text() == render_config(s)


def test_arm64_uefi_gets_the_sites_grub_where_there_is_one(tmp_path: Path) -> None:
    """Client architecture 11 (arm64 UEFI) gets grubaa64.efi, the site's GRUB, only where the
    iPXE folder holds one; without it nothing is said to arm64 clients and nothing is missing."""
    s = settings(tmp_path)
    prepare(s)
    assert "efiarm64" not in s.conf_path.read_text()
    (s.ipxe_dir / "grubaa64.efi").write_bytes(b"MZ the site's GRUB")
    prepare(s)
    lines = s.conf_path.read_text().splitlines()
    assert "dhcp-match=set:efiarm64,option:client-arch,11" in lines
    assert "dhcp-boot=tag:!ipxe,tag:efiarm64,grubaa64.efi" in lines
    assert sorted(p.name for p in s.tftp_dir.iterdir()) == ["grubaa64.efi", "ipxe.efi", "undionly.kpxe"]
    assert (s.tftp_dir / "grubaa64.efi").read_bytes() == b"MZ the site's GRUB"
    (s.ipxe_dir / "grubaa64.efi").unlink()
    prepare(s)
    assert "grubaa64.efi" not in [p.name for p in s.tftp_dir.iterdir()]
    assert "efiarm64" not in s.conf_path.read_text()


def test_a_secure_boot_site_gives_arm64_uefi_its_signed_uki_and_never_both(tmp_path: Path) -> None:
    """bootaa64.efi in the iPXE folder (the site's signed arm64 UKI): architecture 11 gets it,
    the firmware its only loader; served_digest names what the TFTP holds. A folder with the
    GRUB beside it is refused by name (which one a node boots would be a guess)."""
    s = settings(tmp_path)
    prepare(s)
    assert served_digest(s, BootFile.UEFI_ARM64_UKI) is None
    (s.ipxe_dir / "bootaa64.efi").write_bytes(b"MZ the site's signed UKI")
    prepare(s)
    lines = s.conf_path.read_text().splitlines()
    assert "dhcp-match=set:efiarm64,option:client-arch,11" in lines
    assert "dhcp-boot=tag:!ipxe,tag:efiarm64,bootaa64.efi" in lines
    assert not any("grubaa64" in line for line in lines)
    assert sorted(p.name for p in s.tftp_dir.iterdir()) == ["bootaa64.efi", "ipxe.efi", "undionly.kpxe"]
    signed = hashlib.sha256(b"MZ the site's signed UKI").hexdigest()
    assert served_digest(s, BootFile.UEFI_ARM64_UKI) == signed
    (s.ipxe_dir / "grubaa64.efi").write_bytes(b"MZ the site's GRUB")
    with pytest.raises(ToolFailed, match=r"holds both grubaa64\.efi and bootaa64\.efi"):
        prepare(s)


def test_missing_binary_and_bad_interface(tmp_path: Path) -> None:
    s = settings(tmp_path)
    (s.ipxe_dir / "ipxe.efi").unlink()
    with pytest.raises(ToolMissing, match="apt-get install ipxe"):
        prepare(s)
    with pytest.raises(ToolFailed, match="interface"):
        prepare(settings(tmp_path, interface="eth0\ndhcp-range=0.0.0.0"))


def test_supervised_restarted_reloaded_stopped(tmp_path: Path) -> None:
    binary, log = fake_dnsmasq(tmp_path)
    sup = DnsmasqSupervisor(settings(tmp_path, binary=binary))
    sup.start()
    try:
        wait(lambda: log.exists() and "start" in log.read_text())
        first = sup.pid
        assert first is not None
        assert f"--conf-file={sup.settings.conf_path}" in log.read_text()
        assert int(sup.settings.pid_path.read_text()) == first
        sup.reload()
        wait(lambda: "HUP" in log.read_text())
        os.kill(first, signal.SIGKILL)
        wait(lambda: sup.pid not in (None, first))
        wait(lambda: len(starts(log)) == 2)  # the new child logs its start a moment later
        assert sup.restarts == 1 and len(starts(log)) == 2
        last = sup.pid
    finally:
        sup.stop()
    assert last is not None and stray_children(sup.settings, [first, last]) == []
    assert not sup.settings.pid_path.exists()


def test_stray_from_a_killed_daemon_is_killed_at_start(tmp_path: Path) -> None:
    binary, log = fake_dnsmasq(tmp_path)
    s = settings(tmp_path, binary=binary)
    old = DnsmasqSupervisor(s)
    old.start()
    wait(lambda: log.exists() and "start" in log.read_text())
    stray = old.pid
    assert stray is not None
    old._stopping.set()  # the daemon "dies": its watcher stops, the child lives on
    assert stray_children(s, [stray]) == [stray]
    new = DnsmasqSupervisor(s)
    new.start()
    try:
        assert stray_children(s, [stray]) == []
        assert new.pid not in (None, stray)
    finally:
        new.stop()
