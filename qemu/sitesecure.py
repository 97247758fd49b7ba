"""A site lab whose node boots under UEFI Secure Boot with the fleet's own keys (issue 52): the
rig tests/e2e/test_secure_boot.py runs its boots in, and ``./dev demo --secure-boot`` (``run``).

    with secure_rig(lab, "sb-node", user, password, ref) as rig:   # in a SiteLab (qemu/sitelab.py)
        rig.life.query(); rig.life.prepare_ramdisk(); ...; rig.life.pxe_join()   # attested
        cause, detail, console = boot_refused(rig, unsigned_uki_entry(rig, "x.efi", None))

What the rig holds:

- The fleet's keys, made now (qemu/secureboot.py: PK, KEK, db, and another db key never
  enrolled), enrolled by virt-fw-vars into a copy of OVMF_VARS_4M.fd with Secure Boot on; dbx
  holds the Authenticode digest of one UKI the fleet signed and then revoked (``rig.revoked``).
- The site's boot files as the build makes them: Debian's iPXE signed with the fleet's db key
  and pinned in boot-files.json (initramfs/signing.py); the site's UKI signed with the same key.
- The node: OVMF_CODE_4M.secboot.fd on pflash with SMM, a TPM 2.0 (swtpm), no NIC ROM (the
  firmware's own PXE starts the site's ipxe.efi), its BMC an ipmi_sim whose SOL the site keeps.
  Its installed system's image (what deploy.image writes) has an ESP whose removable-media
  loader is a UKI of the image's kernel and initramfs, signed by the fleet's db key
  (qemu/nodeimage.py), and its "disk" boot is the firmware's boot of that disk (no -kernel).
- The gateway's attestation: the UKI build's values, the signed iPXE as the loader, and a
  ``secure_boot`` section that requires Secure Boot with the fleet's db certificate as each
  image's authority (PCR 7 judged event by event: agent/gateway/verifier/pcr7.py).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.images.filesource import file_digest
from agent.proc import run
from agent.site.boot.pxe import BootFile
from initramfs import signing, uki
from qemu import nodeimage, secureboot
from qemu import tpm as qemu_tpm
from qemu.ipmisim import IpmiSim, start_ipmi_sim
from qemu.siteattest import SiteAttestation
from qemu.sitebreak import cause_of
from qemu.sitelab import SiteLab, missing_network_prerequisites
from qemu.sitelife import Bmc, Lifecycle, SiteNode, make_node

CAUSE_TIMEOUT = 240.0
REVOKED_NOTE = "/etc/bettercompute/build-note"   # what sets the revoked build apart from the site's
# ``--break`` ways of ``./dev demo --secure-boot``: what the node is served instead of the signed UKI.
BREAKS = ("unsigned", "other-key", "revoked")


@dataclass
class SecureRig:
    lab: SiteLab
    keys: secureboot.FleetKeys
    boot_files: Path       # the signed, pinned boot files the site serves
    attest: SiteAttestation
    node: SiteNode
    life: Lifecycle
    ipmi: IpmiSim
    revoked: Path          # a UKI signed by the fleet's db key, its digest in the node's dbx


def missing() -> str | None:
    """Why a Secure Boot site node cannot run here, or None."""
    reason = missing_network_prerequisites() or qemu_tpm.missing() or secureboot.missing()
    for tool in ("ipmi_sim", "ipmitool"):
        if reason is None and shutil.which(tool) is None:
            reason = f"{tool} is not installed (apt-get install openipmi ipmitool)"
    return reason


@contextlib.contextmanager
def secure_rig(lab: SiteLab, node_id: str, username: str, password: str, ref: str,
               on_step: Callable[[Any], None] | None = None) -> Iterator[SecureRig]:
    """The rig in ``lab`` (whose site daemon it starts); the BMC's credentials already in the
    lab's secret store under ``ref``."""
    keys = secureboot.FleetKeys.generate(lab.workdir / "fleet-keys")
    boot_files = lab.site_boot_files(keys.db_key(), grub=False)
    # A build the fleet signed, then revoked: its Authenticode digest appended to dbx.
    revoked_esp, _ = lab.uki(f"{node_id}-uki-revoked", settings=SiteAttestation.uki_settings(),
                             files={REVOKED_NOTE: b"revoked"},
                             sign=lambda image: signing.sign(image, keys.db_key()))
    revoked = revoked_esp / "EFI" / "BOOT" / "BOOTX64.EFI"
    lab.start_site(boot_files=boot_files)
    attest = SiteAttestation(lab, node_id, keys.db_key(), secure_boot={
        "required": True, "authorities": [keys.cert_sha256("fleet-db")]})
    variables = keys.enrolled_vars(lab.workdir / f"{node_id}-enrolled-vars.fd",
                                   dbx=[uki.authenticode_sha256(revoked.read_bytes())])
    node = make_node(lab, node_id, uefi=True, tpm_state=attest.tpm_state, firmware_pxe=True,
                     secure_boot_vars=variables, image_sign=lambda image: signing.sign(image, keys.db_key()))
    sim = lab.in_lan(start_ipmi_sim, lab.workdir / "ipmi", node.power, username, password,
                     sol=lab.sol(node.power))
    attest.start()    # the lab's gateway attests the node's joins
    try:
        yield SecureRig(lab, keys, boot_files, attest, node,
                        Lifecycle(lab, node, Bmc("ipmi", sim.address, ref), on_step, attest=attest),
                        sim, revoked)
    finally:
        attest.stop()
        sim.stop()


def power_off(rig: SecureRig) -> None:
    rig.life.bmc_op("bmc.power", "off", graceful_timeout_seconds="0")


def wait_cause(rig: SecureRig, timeout: float = CAUSE_TIMEOUT) -> tuple[str, str]:
    """The cause the site names for the node's boot (its inventory.refresh, as a control plane
    asks), polled until one is named."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cause, detail = cause_of(rig.life.site("inventory.refresh", {"skip_gpus": True}), rig.node.name)
        if cause:
            return cause, detail
        time.sleep(3)
    raise rig.life.fail(f"the site named no cause within {timeout:g}s")


def _entry_for(rig: SecureRig, image: Path) -> dict[str, Any]:
    entry = rig.attest.entry(rig.node.name)
    entry.update(uki_url=rig.lab.upstream_url(image.name), uki_digest={"hex": file_digest(image)})
    return entry


def unsigned_uki_entry(rig: SecureRig, name: str, sign: signing.DbKey | None) -> dict[str, Any]:
    """An entry whose UKI is the site's build as ``sign`` leaves it (None: unsigned), in the
    images' upstream as ``name``."""
    image = rig.lab.www / name
    unsigned = rig.lab.workdir / "site-uki-unsigned-esp" / "EFI" / "BOOT" / "BOOTX64.EFI"
    if not unsigned.is_file():
        rig.lab.uki("site-uki-unsigned", settings=SiteAttestation.uki_settings())
    shutil.copyfile(unsigned, image)
    if uki.parse_pe(image.read_bytes()).cert_size:
        raise AssertionError(f"{unsigned} is signed: the refusal needs the unsigned build")
    if sign is not None:
        signing.sign(image, sign)
    return _entry_for(rig, image)


def revoked_entry(rig: SecureRig) -> dict[str, Any]:
    """An entry whose UKI is the revoked build: signed by the fleet's db key (checked), so only
    its digest in dbx can refuse it."""
    image = rig.lab.www / "uki-revoked.efi"
    shutil.copyfile(rig.revoked, image)
    if not signing.verify(image, rig.keys.cert("fleet-db")):
        raise AssertionError(f"{rig.revoked} is not signed by the fleet's db key")
    if uki.authenticode_sha256(image.read_bytes()).hex() == rig.attest.values["pcr4"][0]:
        raise AssertionError("the revoked build is the site's own: its refusal would refuse both")
    return _entry_for(rig, image)


def broken_entry(rig: SecureRig, way: str) -> dict[str, Any]:
    """The entry for one of BREAKS."""
    if way == "revoked":
        return revoked_entry(rig)
    if way not in BREAKS:
        raise ValueError(f"no such Secure Boot break {way!r} (one of {', '.join(BREAKS)})")
    return unsigned_uki_entry(rig, f"uki-{way}.efi", rig.keys.other_key() if way == "other-key" else None)


def unsigned_disk(rig: SecureRig) -> None:
    """The node's first disk holds its installed image as deploy.image writes it, but with the
    ESP's UKI unsigned (its signature table removed by sbattach: the same image, the same
    Authenticode digest, checked), for the firmware to refuse."""
    image, disk = rig.node.image, rig.node.deploy_disk
    if not image.esp or not image.loader_authenticode:
        raise AssertionError("the node's image has no UKI on an ESP (make_node(image_sign=...))")
    with image.raw.open("rb") as src, disk.open("r+b") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    esp = [f"{disk}@@{nodeimage.START_SECTOR * nodeimage.SECTOR}"]   # mtools: the ESP's offset
    loader = rig.lab.workdir / f"{rig.node.name}-disk-uki-unsigned.efi"
    loader.unlink(missing_ok=True)
    run(["mcopy", "-i", *esp, "::/EFI/BOOT/BOOTX64.EFI", str(loader)], timeout=60)
    run(["sbattach", "--remove", str(loader)], timeout=60)
    data = loader.read_bytes()
    if uki.parse_pe(data).cert_size or uki.authenticode_sha256(data).hex() != image.loader_authenticode:
        raise AssertionError(f"{loader}: not the image's UKI with its signature removed")
    run(["mcopy", "-o", "-i", *esp, str(loader), "::/EFI/BOOT/BOOTX64.EFI"], timeout=60)


def boot_refused(rig: SecureRig, entry: dict[str, Any] | None,
                 timeout: float = CAUSE_TIMEOUT) -> tuple[str, str, str]:
    """The node booted by PXE with ``entry`` (None: from its first disk, by the firmware);
    (cause, detail, console) once the site names a cause; the node powered off after it."""
    if entry is not None:
        rig.life.site("boot.prepareRamdisk", {"node_id": rig.node.name, "mac_address": rig.node.mac,
                                              "boot_file": BootFile.UEFI.value, "ttl_seconds": 1800, **entry})
    rig.life.boot_device("pxe" if entry is not None else "disk")
    rig.life.power_on()
    try:
        cause, detail = wait_cause(rig, timeout)
    finally:
        power_off(rig)
    return cause, detail, rig.lab.console(rig.node.power)
