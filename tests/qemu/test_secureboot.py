"""qemu/secureboot.py's variable store (virt-fw-vars run for real, no QEMU) and the demo's
Secure Boot flags (the demo itself boots QEMU: ./dev demo --secure-boot)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from agent.hw import uefi_auth
from qemu import demo, secureboot, sitesecure


def test_revoked_digests_are_appended_to_dbx_as_sha256_entries(tmp_path: Path) -> None:
    reason = secureboot.missing()
    if reason:
        pytest.skip(reason)
    keys = secureboot.FleetKeys.generate(tmp_path / "keys")
    revoked = [hashlib.sha256(b"build 1").digest(), hashlib.sha256(b"build 2").digest()]
    store = keys.enrolled_vars(tmp_path / "vars.fd", dbx=revoked)
    subprocess.run([str(secureboot.virt_fw_vars()), "--input", str(store), "--output-json",
                    str(tmp_path / "vars.json")], check=True, capture_output=True, timeout=120)
    listed = json.loads((tmp_path / "vars.json").read_text())["variables"]
    found = {v["name"]: bytes.fromhex(v["data"]) for v in listed}
    # EFI_SIGNATURE_LISTs of EFI_CERT_SHA256 entries (owner GUID, then the digest), the fleet's owner.
    entries = [(sl.type, e.owner, e.data)
               for sl in uefi_auth.signature_lists(found["dbx"]) for e in sl.entries]
    for digest in revoked:
        assert (uefi_auth.EFI_CERT_SHA256, secureboot.OWNER, digest) in entries
    assert {"PK", "KEK", "db", "dbx"} <= found.keys()
    # virt-firmware's lists of one certificate are ours byte for byte (the digests a gate names).
    for name, cert in (("PK", "fleet-pk"), ("KEK", "fleet-kek"), ("db", "fleet-db")):
        der = subprocess.run(["openssl", "x509", "-in", str(keys.cert(cert)), "-outform", "DER"],
                             check=True, capture_output=True, timeout=60).stdout
        assert found[name] == uefi_auth.x509_list(der, secureboot.OWNER), name
    with pytest.raises(ValueError, match="SHA-256"):
        keys.enrolled_vars(tmp_path / "bad.fd", dbx=[b"\x00" * 20])
    assert not (tmp_path / "bad.fd").exists()


def test_an_arm64_store_holds_the_fleets_keys_alone_on_aavmfs_formatted_store(tmp_path: Path) -> None:
    """AAVMF_VARS.fd is blank, so the arm64 store is AAVMF_VARS.ms.fd emptied, then the fleet's
    keys: Microsoft's certificates gone, nothing of that store's boot entries left."""
    reason = secureboot.missing("arm64")
    if reason:
        pytest.skip(reason)
    keys = secureboot.FleetKeys.generate(tmp_path / "keys")
    store = keys.enrolled_vars(tmp_path / "vars.fd", arch="arm64")
    assert store.stat().st_size == secureboot.AAVMF_VARS_FORMATTED.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys", "vars.fd"]   # the emptied copy removed
    subprocess.run([str(secureboot.virt_fw_vars()), "--input", str(store), "--output-json",
                    str(tmp_path / "vars.json")], check=True, capture_output=True, timeout=120)
    listed = json.loads((tmp_path / "vars.json").read_text())["variables"]
    found = {v["name"]: bytes.fromhex(v["data"]) for v in listed}
    assert {"PK", "KEK", "db", "SecureBootEnable"} <= found.keys()
    assert not any(name.startswith("Boot") for name in found), sorted(found)
    der = subprocess.run(["openssl", "x509", "-in", str(keys.cert("fleet-db")), "-outform", "DER"],
                         check=True, capture_output=True, timeout=60).stdout
    assert der in found["db"] and b"Microsoft" not in found["db"] + found["KEK"]


def test_the_demo_refuses_secure_boot_with_what_it_does_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--secure-boot", "--nodes", "2"], ["--secure-boot", "--arch", "arm64"],
                 ["--secure-boot", "--virtual-media"], ["--secure-boot", "--break", "bad-cmdline"],
                 ["--nodes", "2", "--break", "unsigned"]):
        with pytest.raises(SystemExit) as info:
            demo.main(argv)
        assert info.value.code == 2, argv
    assert "--secure-boot" in capsys.readouterr().err
    assert set(sitesecure.BREAKS) == {"unsigned", "other-key", "revoked"}
