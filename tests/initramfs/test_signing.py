"""Secure Boot signing at build time (initramfs/signing.py): real sbsign and sbverify, keys made
by openssl in the test (never committed), on the UKI the build assembles (Debian's stub around a
fake bzImage) and on Debian's ipxe.efi. The Authenticode digest, what firmware measures into
PCR 4, is the same before and after signing, and sbsign's own digest in the signature agrees."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from agent.errors import ToolFailed
from agent.site.boot.dnsmasq import BOOT_MANIFEST, DnsmasqSettings, pinned_digests, prepare
from initramfs import signing, uki
from tests.initramfs.test_uki import STUB, x86_kernel

IPXE = Path("/usr/lib/ipxe/ipxe.efi")
PASSPHRASE = "Db-Key-Pass-9qv3"   # grepped for in every argv the signing ran


def keypair(folder: Path, name: str, *, passphrase: str = "") -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-subj", f"/CN={name}", "-days", "2",
            "-keyout", str(key), "-out", str(cert)]
    if passphrase:   # a test's own key: the passphrase in a file, as the build takes it
        (folder / "pass").write_text(passphrase + "\n")
        argv += ["-passout", f"file:{folder / 'pass'}"]
    else:
        argv += ["-nodes"]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return key, cert


@pytest.fixture
def tools() -> None:
    for tool in ("sbsign", "sbverify", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install sbsigntool openssl)")


@pytest.fixture
def db(tmp_path: Path, tools: None) -> signing.DbKey:
    return signing.DbKey.load(*keypair(tmp_path, "fleet-db"))


@pytest.fixture
def ramdisk_uki(tmp_path: Path) -> Path:
    if not STUB.is_file() or shutil.which(uki.objcopy("amd64")) is None:
        pytest.skip(f"no {STUB} or objcopy (apt-get install systemd-boot-efi binutils)")
    (tmp_path / "vmlinuz").write_bytes(x86_kernel())
    (tmp_path / "initrd").write_bytes(b"070701 an initramfs" * 300)
    return tmp_path / "ramdisk.efi"


def test_a_signed_uki_keeps_its_authenticode_digest_and_reference_values(
        ramdisk_uki: Path, db: signing.DbKey, tmp_path: Path) -> None:
    plain = tmp_path / "plain.efi"
    unsigned = uki.write(STUB, tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyS0", plain, "b1")
    values = uki.write(STUB, tmp_path / "vmlinuz", tmp_path / "initrd", "console=ttyS0", ramdisk_uki, "b1",
                       sign=lambda image: signing.sign(image, db))
    data = ramdisk_uki.read_bytes()
    assert uki.parse_pe(data).cert_size and not uki.parse_pe(plain.read_bytes()).cert_size
    assert signing.verify(ramdisk_uki, db.cert) and not signing.verify(plain, db.cert)
    # What firmware measures is the same image digest, so PCR 4's reference value is unchanged;
    # the file's own sha256 (the site's pin) is the signed file's.
    assert values["pcr4"] == unsigned["pcr4"] == [uki.authenticode_sha256(plain.read_bytes()).hex()]
    assert values["pcr11"] == unsigned["pcr11"]
    assert values["sha256"] == hashlib.sha256(data).hexdigest() != unsigned["sha256"]
    # sbsign computed the same digest on its own (the one its signature holds).
    assert signing.signed_digest(data) == bytes.fromhex(values["pcr4"][0])
    assert signing.signed_digest(plain.read_bytes()) is None
    assert json.loads(ramdisk_uki.with_name("ramdisk.efi.json").read_text()) == values


def test_debians_ipxe_signed_keeps_its_digest(db: signing.DbKey, tmp_path: Path) -> None:
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed")
    out = tmp_path / "ipxe.efi"
    digest = signing.sign(IPXE, db, out)
    assert digest == uki.authenticode_sha256(IPXE.read_bytes()) == signing.signed_digest(out.read_bytes())
    assert signing.verify(out, db.cert)
    with pytest.raises(signing.SigningError, match="signed already"):
        signing.sign(out, db)


def test_another_keys_signature_does_not_verify_with_the_fleets_cert(
        db: signing.DbKey, tmp_path: Path) -> None:
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed")
    (tmp_path / "other").mkdir()
    other = signing.DbKey.load(*keypair(tmp_path / "other", "other-db"))
    out = tmp_path / "ipxe.efi"
    signing.sign(IPXE, other, out)
    assert signing.verify(out, other.cert) and not signing.verify(out, db.cert)


def test_an_encrypted_key_is_used_through_its_passphrase_file_never_argv(
        tmp_path: Path, tools: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed")
    key, cert = keypair(tmp_path, "enc-db", passphrase=PASSPHRASE)
    with pytest.raises(signing.SigningError, match="encrypted: name its passphrase file"):
        signing.DbKey.load(key, cert)
    (tmp_path / "wrong").write_text("nope\n")
    with pytest.raises(signing.SigningError, match="passphrase is wrong"):
        signing.DbKey.load(key, cert, tmp_path / "wrong")
    db = signing.DbKey.load(key, cert, tmp_path / "pass")
    argvs: list[list[str]] = []
    seen_plain: list[Path] = []
    real_run = signing.run

    def watching(argv: list[str], **kw: object) -> object:
        argvs.append(list(argv))
        if argv[0] == signing.SBSIGN:
            plain = Path(argv[argv.index("--key") + 1])
            seen_plain.append(plain)
            assert stat.S_IMODE(plain.stat().st_mode) == 0o600
            assert stat.S_IMODE(plain.parent.stat().st_mode) == 0o700
        return real_run(argv, **kw)  # type: ignore[arg-type]  # run's keywords

    monkeypatch.setattr(signing, "run", watching)
    signing.sign(IPXE, db, tmp_path / "ipxe.efi")
    assert signing.verify(tmp_path / "ipxe.efi", cert)
    assert argvs and not any(PASSPHRASE in word for argv in argvs for word in argv)
    assert seen_plain and not seen_plain[0].exists()   # the decrypted key is gone


def test_bad_keys_are_named(tmp_path: Path, tools: None) -> None:
    key, cert = keypair(tmp_path, "a")
    (tmp_path / "b").mkdir()
    _, other_cert = keypair(tmp_path / "b", "b")
    with pytest.raises(signing.SigningError, match="not the key of the certificate"):
        signing.DbKey.load(key, other_cert)
    with pytest.raises(signing.SigningError, match=r"not a PEM X\.509 certificate"):
        signing.DbKey.load(key, key)
    with pytest.raises(signing.SigningError, match="no PEM private key"):
        signing.DbKey.load(cert, cert)
    with pytest.raises(signing.SigningError, match="is not a file"):
        signing.DbKey.load(tmp_path / "none.key", cert)


def test_the_build_refuses_half_a_key_or_a_bad_one_before_building(tmp_path: Path, tools: None) -> None:
    from initramfs import build

    key, cert = keypair(tmp_path, "a")
    for argv in (["--db-key", str(key)], ["--db-cert", str(cert)],
                 ["--db-key", str(key), "--db-cert", str(key)],
                 # a signed ISO starts a signed UKI or nothing (initramfs/iso.py, "Secure Boot")
                 ["--db-key", str(key), "--db-cert", str(cert), "--iso"]):
        with pytest.raises(SystemExit) as info:
            build.main(argv)
        assert info.value.code == 2, argv


def test_the_sites_boot_files_signed_and_pinned_and_the_site_serves_only_those(
        db: signing.DbKey, tmp_path: Path) -> None:
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed")
    folder = tmp_path / "site-boot"
    pinned = signing.site_boot_files(folder, db)
    assert sorted(pinned) == ["ipxe.efi", "undionly.kpxe"]
    assert signing.verify(folder / "ipxe.efi", db.cert)
    assert pinned["ipxe.efi"]["authenticode"] == uki.authenticode_sha256(IPXE.read_bytes()).hex()
    assert pinned["ipxe.efi"]["signed"] == "yes" and "authenticode" not in pinned["undionly.kpxe"]
    assert pinned_digests(folder) == {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
                                      for name in pinned}
    s = DnsmasqSettings(interface="eth9", address="10.0.0.2", http_base_url="http://10.0.0.2:8088",
                        root=tmp_path / "boot", ipxe_dir=folder)
    prepare(s)
    assert (s.tftp_dir / "ipxe.efi").read_bytes() == (folder / "ipxe.efi").read_bytes()
    # A boot file changed after the build (here: Debian's unsigned one put back) is not served.
    shutil.copyfile(IPXE, folder / "ipxe.efi")
    with pytest.raises(ToolFailed, match=rf"ipxe.efi has sha256 .*its {BOOT_MANIFEST} pins"):
        prepare(s)
    (folder / BOOT_MANIFEST).write_text("{not json")
    with pytest.raises(ToolFailed, match="not a boot file manifest"):
        prepare(s)
    (folder / BOOT_MANIFEST).unlink()
    prepare(s)     # no manifest: the folder as it is (Debian's /usr/lib/ipxe)
    assert (s.tftp_dir / "ipxe.efi").read_bytes() == IPXE.read_bytes()


def test_a_secure_boot_sites_arm64_boot_file_is_its_signed_uki_pinned(
        db: signing.DbKey, tmp_path: Path) -> None:
    """Under Secure Boot the site's arm64 boot file is its UKI itself (bootaa64.efi; a PE is all
    this step reads, so Debian's iPXE stands for it): signed and pinned with the others; the
    GRUB beside it refused (one arm64 boot file per site)."""
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed")
    folder = tmp_path / "site-boot"
    pinned = signing.site_boot_files(folder, db, uki=IPXE)
    assert sorted(pinned) == ["bootaa64.efi", "ipxe.efi", "undionly.kpxe"]
    assert pinned["bootaa64.efi"]["signed"] == "yes" and signing.verify(folder / "bootaa64.efi", db.cert)
    served = (folder / "bootaa64.efi").read_bytes()
    assert pinned["bootaa64.efi"]["sha256"] == hashlib.sha256(served).hexdigest()
    with pytest.raises(signing.SigningError, match="one arm64 boot file per site"):
        signing.site_boot_files(tmp_path / "both", db, grub=IPXE, uki=IPXE)
    assert not (tmp_path / "both").exists()


@pytest.mark.slow  # downloads Debian's arm64 GRUB package once (apt-get download)
def test_the_sites_arm64_grub_signed_keeps_its_loader_digest(db: signing.DbKey, tmp_path: Path) -> None:
    import os

    from initramfs import build as ramdisk
    from initramfs import netgrub

    if shutil.which("grub-mkimage") is None or shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("needs grub-mkimage, apt-get and root (the GRUB package is downloaded)")
    if not IPXE.is_file():
        pytest.skip("Debian's ipxe is not installed")
    grub = tmp_path / netgrub.NAME
    loader = netgrub.build("http://10.0.0.2:8088", grub, ramdisk.out_dir(ramdisk.ARCHES["arm64"]))
    pinned = signing.site_boot_files(tmp_path / "site-boot", db, grub=grub)
    assert sorted(pinned) == ["grubaa64.efi", "ipxe.efi", "undionly.kpxe"]
    signed = tmp_path / "site-boot" / netgrub.NAME
    assert signing.verify(signed, db.cert) and not signing.verify(grub, db.cert)
    # The policy's loader (grubaa64.efi.json, written before signing) is still the GRUB's digest.
    in_signature = signing.signed_digest(signed.read_bytes())
    assert in_signature is not None and pinned["grubaa64.efi"]["authenticode"] == loader == in_signature.hex()
