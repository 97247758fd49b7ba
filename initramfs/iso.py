"""The ramdisk as a bootable ISO 9660 image, for a BMC's virtual media (docs/site.md).

    python -m initramfs.build --iso [--arch amd64|arm64]   # -> OUT/ramdisk.iso (+ .cdx.json)

The same kernel and initramfs as the PXE boot, on a CD that boots them with GRUB:

- amd64: BIOS El Torito (GRUB's ``i386-pc-eltorito`` core, Debian's grub-pc-bin) and UEFI
  (an El Torito EFI boot image, a small FAT holding ``EFI/BOOT/BOOTX64.EFI``, GRUB's
  ``x86_64-efi`` core from grub-efi-amd64-bin): one ISO boots either firmware;
- arm64: UEFI only (``EFI/BOOT/BOOTAA64.EFI``, grub-efi-arm64-bin).

Each GRUB core is made by the host's ``grub-mkimage`` from the modules of the Debian package
(downloaded and unpacked, as the ramdisk's packages are, so the arm64 one is built on any
host) with its script embedded: find the ISO by its volume label, load the kernel and the
initramfs, boot. No GRUB modules, fonts or menus are on the ISO: its size is the kernel's and
the initramfs's plus ~0.9 MB (amd64: 0.47 MB of GRUB, the rest licences, SBOM, the ISO's own
structures and xorriso's 300 KiB of padding). ``xorriso`` writes the ISO (``-as mkisofs``), with
SOURCE_DATE_EPOCH fixed so that the same inputs give the same bytes.

Why GRUB and not systemd-boot or isolinux: one tool does BIOS and UEFI and arm64 from the
same embedded script; systemd-boot is UEFI only (BIOS would need isolinux beside it, a second
boot loader and configuration for one ISO).

With ``uki`` (``build_iso(..., uki=PATH)``, the ramdisk as a UKI: initramfs/uki.py), the UEFI
cores start the UKI instead: their script finds the ISO and ``chainloader /boot/ramdisk.efi``
with no arguments, so GRUB hands the UKI no LoadOptions and systemd-stub boots the UKI's own
command line, PCR 12 empty (docs/attestation.md). The firmware measures GRUB's core and the
UKI into PCR 4: the cores' Authenticode digests are written beside the ISO
(``TARGET.loaders.json``) for the attestation policy's ``loaders``. The UKI's command line is
the ISO's (``default_cmdline``, bc.media=cdrom): the node's settings come from its config
medium as before, never from the UKI. BIOS (El Torito) still boots the kernel and initramfs.
The same code serves arm64's core (BOOTAA64.EFI), which is UEFI only: its ISO holds the UKI
and no separate kernel and initramfs. The amd64 ISO holds them twice (for BIOS, and inside the
UKI): about twice the size, over the 32 MB target (build_iso warns).

Secure Boot (``db_key``, the fleet's db key: initramfs/signing.py; the build's ``--db-key`` with
``--iso-uki``): the El Torito EFI image holds the UKI itself as ``EFI/BOOT/BOOTX64.EFI`` (or
BOOTAA64.EFI), no GRUB: the firmware verifies the UKI (signed by the caller with that key)
against db and dbx and starts it, with no LoadOptions (PCR 12 empty), and PCR 4 holds the UKI
alone (``TARGET.loaders.json`` lists no loader). Why not a signed GRUB chainloading it: under
Secure Boot, Debian's GRUB 2.06 locks itself down, and its lockdown verifier defers the check of
every image ``chainloader`` opens to another verifier; without shim there is none (a core made
``--disable-shim-lock`` only drops shim's), so GRUB refuses the UKI before the firmware sees it
("verification requested but nobody cares: /boot/ramdisk.efi", seen on OVMF's console with the
fleet's keys enrolled: tests/e2e/test_attest_media.py). The UKI is on the ISO once, inside the
EFI image; BIOS still boots the kernel and initramfs (Secure Boot does not apply to it). Without
a UKI there is no signed ISO: nothing would verify a kernel and initramfs (``IsoError``).

The ISO carries its licence notices and SBOM as the initramfs does: ``licenses/`` holds the
GRUB packages' Debian copyright files (``debian-copyright.tar.xz``) and ``sbom.cdx.json`` (the
initramfs's SBOM with the GRUB packages added; the initramfs keeps its own inside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run
from initramfs import debs, licences, signing
from initramfs.signing import DbKey
from initramfs.uki import authenticode_sha256, boot_cmdline

LABEL = "BC_RAMDISK"          # the ISO's volume id; GRUB finds its files by it
MAX_ISO_BYTES = 32_000_000    # issue #29: at most 32 MB per architecture
EPOCH = "315619200"           # SOURCE_DATE_EPOCH, 1980-01-02 (FAT has no earlier date): reproducible
ISO_LICENSES = "licenses"


@dataclass(frozen=True)
class Loader:
    """One GRUB core on the ISO."""
    package: str          # Debian's binary package with the modules
    platform: str         # GRUB's target (grub-mkimage -O)
    modules: tuple[str, ...]
    efi_name: str = ""    # the removable-media path's file name under EFI/BOOT; "" for BIOS


COMMON = ("iso9660", "search", "search_label", "linux", "echo")
UKI_NAME = "ramdisk.efi"       # the UKI on the ISO, under /boot
# GRUB's tpm module is never in a core: it would measure GRUB's commands into PCR 8 and the
# files it reads into PCR 9, which the policy's builds do not predict.
UKI_MODULES = ("iso9660", "search", "search_label", "chain", "echo")
LOADERS = {
    "amd64": (Loader("grub-pc-bin", "i386-pc-eltorito", ("biosdisk", *COMMON)),
              Loader("grub-efi-amd64-bin", "x86_64-efi", COMMON, "BOOTX64.EFI")),
    "arm64": (Loader("grub-efi-arm64-bin", "arm64-efi", (*COMMON, "gzio"), "BOOTAA64.EFI"),),
}


class IsoError(RuntimeError):
    """The ISO could not be made; the message says why."""


def default_cmdline(arch: str) -> str:
    """The kernel command line on the shared ISO: the console and the boot-time settings of
    the PXE boot; everything per node comes from the node's config medium."""
    return f"{boot_cmdline(arch)} bc.media=cdrom"


def grub_script(cmdline: str) -> str:
    if any(c in cmdline for c in "\"'$;{}|&<>\\\n#"):
        raise IsoError(f"kernel command line with characters GRUB's script would parse: {cmdline!r}")
    return (f"search --no-floppy --label --set=root {LABEL}\n"
            f"echo bc-iso: booting the ramdisk from the CD\n"
            f"linux /boot/vmlinuz {cmdline}\n"
            "initrd /boot/initrd.img\n"
            "boot\n")


def grub_uki_script() -> str:
    """A UEFI core's script that starts the UKI: ``chainloader`` with no arguments passes the
    image no LoadOptions (a command line would replace the UKI's own and land in PCR 12).
    No quote in it: GRUB's parser would take the lines after one as a single word."""
    return (f"search --no-floppy --label --set=root {LABEL}\n"
            "echo bc-iso: starting the ramdisk UKI from the CD\n"
            f"chainloader /boot/{UKI_NAME}\n"
            "boot\n")


def missing_tools() -> str | None:
    """Why the ISO cannot be made on this machine, or None."""
    for tool, package in (("grub-mkimage", "grub-common"), ("xorriso", "xorriso"),
                          ("mkfs.vfat", "dosfstools"), ("mcopy", "mtools"), ("mmd", "mtools")):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install {package})"
    return None


def grub_trees(arch_name: str, out: Path) -> list[tuple[Loader, Path, Path]]:
    """(loader, its .deb, the .deb unpacked) for each GRUB core of ``arch_name``."""
    arch = debs.ARCHES[arch_name]
    loaders = LOADERS[arch_name]
    fetched = debs.download([ld.package for ld in loaders], out / "debs", arch)
    found = []
    for loader, deb in zip(loaders, fetched, strict=True):
        # grub-efi-arm64-bin unpacked where qemu/harness.py's grub_netboot() has it.
        dest = out / ("grub" if loader.package == "grub-efi-arm64-bin" else f"grub-{loader.platform}")
        found.append((loader, deb, debs.unpacked(deb, dest)))
    return found


def build_iso(kernel: Path, initrd: Path, target: Path, *, arch: str = "amd64",
              cmdline: str | None = None, sbom: bytes | None = None, out: Path | None = None,
              uki: Path | None = None, db_key: DbKey | None = None) -> Path:
    """``target``: a bootable ISO of ``kernel`` and ``initrd`` (see the module's docstring),
    its SBOM beside it (``target``.cdx.json) built on ``sbom``, the initramfs's. ``out``:
    where the GRUB packages are downloaded and unpacked (the arch's build directory).
    ``uki``: the UEFI cores start this UKI (built with ``default_cmdline``) instead, and
    ``target``.loaders.json lists their Authenticode digests. ``db_key`` (with ``uki``, which
    the caller signed with it): Secure Boot, the firmware starts the UKI itself (the module's
    docstring, "Secure Boot"); the UKI is checked to be signed by the key's certificate."""
    reason = missing_tools()
    if reason:
        raise IsoError(reason)
    if db_key is not None and uki is None:
        raise IsoError("a signed ISO needs a UKI: its GRUB core, signed, would start a kernel and "
                       "initramfs that nothing verifies (build with --iso-uki)")
    if db_key is not None and uki is not None and not signing.verify(uki, db_key.cert):
        raise IsoError(f"{uki} is not signed by the db key's certificate {db_key.cert}: the firmware "
                       "would refuse it under Secure Boot")
    out = out if out is not None else debs.out_dir(debs.ARCHES[arch])
    script_text = grub_script(cmdline if cmdline is not None else default_cmdline(arch))
    trees = grub_trees(arch, out)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".iso-", dir=target.parent) as tmp:
        work = Path(tmp)
        tree = work / "tree"
        (tree / "boot").mkdir(parents=True)
        (tree / ISO_LICENSES).mkdir()
        # With a UKI, the kernel and initramfs are on the ISO for a BIOS boot only: arm64's
        # (UEFI only) has them inside the UKI alone.
        if uki is None or any(not loader.efi_name for loader, _d, _u in trees):
            shutil.copyfile(kernel, tree / "boot/vmlinuz")
            shutil.copyfile(initrd, tree / "boot/initrd.img")
        script = work / "grub.cfg"
        script.write_text(script_text)
        uki_script = work / "grub-uki.cfg"
        uki_script.write_text(grub_uki_script())
        if uki is not None and db_key is None:   # signed: in the EFI image alone
            shutil.copyfile(uki, tree / "boot" / UKI_NAME)
        loader_digests: list[str] = []
        argv = ["xorriso", "-as", "mkisofs", "-quiet", "-o", str(work / "out.iso"), "-V", LABEL,
                "-r", "-J", "-joliet-long"]
        efi_files: list[tuple[str, Path]] = []
        for loader, _deb, unpacked in trees:
            if loader.efi_name and uki is not None and db_key is not None:
                efi_files.append((loader.efi_name, uki))   # Secure Boot: the firmware starts it
                continue
            modules = unpacked / "usr/lib/grub" / loader.platform.removesuffix("-eltorito")
            core = work / (loader.efi_name or "eltorito.img")
            chain = uki is not None and bool(loader.efi_name)
            run(["grub-mkimage", "-O", loader.platform, "-d", str(modules), "-o", str(core),
                 "-p", "/boot/grub", "-c", str(uki_script if chain else script),
                 *(UKI_MODULES if chain else loader.modules)], timeout=120)
            if loader.efi_name:
                efi_files.append((loader.efi_name, core))
                loader_digests.append(authenticode_sha256(core.read_bytes()).hex())
            else:
                shutil.copyfile(core, tree / "boot/eltorito.img")
                argv += ["-b", "boot/eltorito.img", "-no-emul-boot", "-boot-load-size", "4",
                         "-boot-info-table"]
        if efi_files:
            esp = tree / "boot/efi.img"
            _fat_image(esp, efi_files)
            if len(trees) > 1:
                argv.append("-eltorito-alt-boot")
            argv += ["-e", "boot/efi.img", "-no-emul-boot"]
        copyrights = grub_copyrights(trees, arch, out)
        bom = iso_sbom([deb for _l, deb, _t in trees], sbom, arch, copyrights)
        (tree / ISO_LICENSES / "debian-copyright.tar.xz").write_bytes(licences.copyright_archive(copyrights))
        (tree / ISO_LICENSES / "sbom.cdx.json").write_bytes(bom)
        for path in [*sorted(tree.rglob("*"), reverse=True), tree]:
            os.utime(path, (int(EPOCH), int(EPOCH)), follow_symlinks=False)
        argv.append(str(tree))
        env = {**os.environ, "SOURCE_DATE_EPOCH": EPOCH}
        run(argv, timeout=300, env=env)
        size = (work / "out.iso").stat().st_size
        os.replace(work / "out.iso", target)
    target.with_name(target.name + ".cdx.json").write_bytes(bom)
    loaders = target.with_name(target.name + ".loaders.json")
    if uki is not None:
        loaders.write_text(json.dumps({"loaders": loader_digests}, indent=2) + "\n")
    else:
        loaders.unlink(missing_ok=True)
    if size > MAX_ISO_BYTES:
        print(f"initramfs: warning: {target} is {size} bytes, over the {MAX_ISO_BYTES} target",
              flush=True)
    return target


def _fat_image(path: Path, files: list[tuple[str, Path]]) -> None:
    """A FAT image holding ``EFI/BOOT/NAME`` for each file: the El Torito EFI boot image."""
    need = sum(p.stat().st_size for _n, p in files)
    kib = max(256, (need * 11 // 10 + 64 * 1024) // 1024)
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1", "SOURCE_DATE_EPOCH": EPOCH}
    run(["mkfs.vfat", "-C", "--invariant", "-i", "0b0c0d0e", "-n", "BC_ESP", str(path), str(kib)],
        timeout=60, env=env)
    # The tree copied whole with its times (-s -m), so that the directories' entries carry
    # the fixed time too (mmd would stamp them with the clock's).
    with tempfile.TemporaryDirectory(prefix=".esp-", dir=path.parent) as tmp:
        boot = Path(tmp) / "EFI" / "BOOT"
        boot.mkdir(parents=True)
        for name, src in files:
            shutil.copyfile(src, boot / name)
        for p in [*boot.iterdir(), boot, boot.parent]:
            os.utime(p, (int(EPOCH), int(EPOCH)))
        run(["mcopy", "-s", "-m", "-i", str(path), str(boot.parent), "::/"], timeout=60, env=env)


def grub_copyrights(trees: list[tuple[Loader, Path, Path]], arch: str, out: Path) -> dict[str, bytes]:
    """Each GRUB package's Debian copyright file (grub-common's, where its doc directory
    links there: that .deb is fetched for it alone)."""
    def fetch(name: str) -> Path:
        return debs.download([name], out / "debs", debs.ARCHES[arch])[0]

    found: dict[str, bytes] = {}
    for loader, _deb, unpacked in trees:
        found.update(licences.copyright_files(unpacked, [loader.package], fetch))
    return found


def iso_sbom(grub_debs: list[Path], initramfs_sbom: bytes | None, arch: str,
             copyrights: dict[str, bytes]) -> bytes:
    """The initramfs's SBOM (its components) with the GRUB packages on the ISO added."""
    doc: dict[str, object] = json.loads(initramfs_sbom) if initramfs_sbom else {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1, "components": []}
    components = list(doc.get("components", []))  # type: ignore[call-overload]  # JSON list
    for deb in grub_debs:
        pkg = licences.deb_package(deb)
        component = licences.component(pkg, copyrights, "the ISO's boot loader (GRUB core)")
        component["properties"] = [
            {"name": "bettercompute:copyright", "value": f"{ISO_LICENSES}/debian-copyright.tar.xz:"
                                                         f"{pkg.name}/copyright"}
            if p["name"] == "bettercompute:copyright" else p
            for p in component["properties"]]  # type: ignore[attr-defined]  # a list of dicts
        components.append(component)
    doc["components"] = components
    doc["metadata"] = {"component": {"type": "operating-system", "bom-ref": "bettercompute-ramdisk-iso",
                                     "name": "bettercompute-ramdisk-iso", "version": arch}}
    doc.pop("serialNumber", None)
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    doc["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'bettercompute-ramdisk-iso/' + digest)}"
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"
