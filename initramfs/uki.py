"""The ramdisk as a unified kernel image (UKI), and the values a TPM will hold after booting it.

A UKI is the systemd-boot stub (Debian's systemd-boot-efi: linuxx64.efi.stub, linuxaa64.efi.stub)
with the kernel, the initramfs, the kernel command line and an os-release added as PE sections
(.linux, .initrd, .cmdline, .osrel), assembled here with binutils' objcopy. UEFI firmware that
starts it measures its Authenticode digest into PCR 4; the stub measures each of those sections
into PCR 11 (the section's name with its NUL, then its contents, in the UKI specification's
order), and into PCR 12 only what a boot loader passes it (a command line, credentials): none
for a UKI started as it is. ``reference_values`` writes those expectations beside the image,
for the gateway's policy (docs/attestation.md):

    .venv/bin/python -m initramfs.uki --kernel initramfs/out/vmlinuz \\
        --initrd initramfs/out/initramfs.img --cmdline "console=ttyS0 ..." --out ramdisk.efi
    # -> ramdisk.efi and ramdisk.efi.json: {"build_id", "pcr4": [UKI], "pcr9", "pcr11", "pcr12", ...}
    #    (arm64's: "pcr4": [UKI, kernel], no "pcr9": its stub starts the kernel with LoadImage)
    .venv/bin/python -m initramfs.uki --arch arm64 --kernel initramfs/out/arm64/vmlinuz \\
        --initrd initramfs/out/arm64/initramfs.img --cmdline "console=ttyAMA0 ..." --out ramdisk.efi

On x86 the stub hands over to the kernel (``handover_kernel``: the firmware measures the kernel
once, inside the UKI, and the kernel's stub measures no initramfs into PCR 9).

On an x86 host the arm64 UKI takes the stub out of Debian's arm64 systemd-boot-efi .deb
(``find_stub``) and is assembled by binutils-aarch64-linux-gnu's objcopy; its .linux section is
the arm64 kernel's Image, unpacked (the stub starts it through the firmware's LoadImage, which
takes a PE image, not a gzipped one).

What is measured is the same on every node that boots one build, so the command line holds
nothing per node (never a node id or a token). A site's build names the site
(``bc.site=http://<site>:<port>``: its nodes fetch their settings from it, docs/site.md); the
virtual-media ISO's names the config medium (``bc.media=cdrom``, initramfs/iso.py).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.proc import run
from initramfs import debs

STUBS = {"amd64": Path("/usr/lib/systemd/boot/efi/linuxx64.efi.stub"),
         "arm64": Path("/usr/lib/systemd/boot/efi/linuxaa64.efi.stub")}
STUB_PACKAGE = "systemd-boot-efi"
# The PE/COFF machine of each architecture's images (the COFF header's Machine field).
PE_MACHINES = {0x8664: "amd64", 0xAA64: "arm64"}
# The x86 boot protocol's xloadflags bit: the kernel has a 64-bit EFI handover entry.
XLF_EFI_HANDOVER_64 = 1 << 3
# The UKI specification's section order, the order systemd-stub measures them into PCR 11
# (.pcrsig is never measured; the rest of it this build does not add).
MEASURED_SECTIONS = (".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrpkey")
OS_RELEASE = 'NAME="bettercompute ramdisk"\nID=bettercompute-ramdisk\n'
CONSOLE = {"amd64": "ttyS0", "arm64": "ttyAMA0"}
# What initramfs/init.sh takes as a site's address: http://host:port, nothing else.
SITE_URL = re.compile(r"http://[A-Za-z0-9.-]+:[0-9]{1,5}")


def boot_cmdline(arch: str) -> str:
    """The console and boot-time words every ramdisk boot has (the PXE boot's, the ISO's)."""
    return f"console={CONSOLE[arch]},115200 panic=-1 quiet loglevel=4 cryptomgr.notests"


def site_cmdline(arch: str, site_url: str) -> str:
    """A site's UKI's command line: the boot words and the site its nodes fetch their
    settings from (``bc.site``, docs/site.md); nothing per node."""
    if not SITE_URL.fullmatch(site_url):
        raise ValueError(f"the site's URL is http://host:port (the ramdisk takes nothing else), "
                         f"not {site_url!r}")
    return f"{boot_cmdline(arch)} bc.site={site_url}"


class PeError(ValueError):
    """Not a PE image this module can read."""


@dataclass(frozen=True)
class Section:
    name: str
    virtual_size: int
    virtual_address: int
    raw_size: int
    raw_offset: int


@dataclass(frozen=True)
class Pe:
    data: bytes
    image_base: int
    section_alignment: int
    size_of_image: int
    size_of_headers: int
    image_version_at: int  # offset of the optional header's MajorImageVersion
    checksum_at: int      # offset of the optional header's CheckSum
    cert_dir_at: int      # offset of the Certificate Table's data directory entry
    cert_size: int
    sections: list[Section]

    def section(self, name: str) -> bytes:
        s = next((s for s in self.sections if s.name == name), None)
        if s is None:
            raise PeError(f"no {name} section")
        return self.data[s.raw_offset:s.raw_offset + min(s.virtual_size, s.raw_size)]


def parse_pe(data: bytes) -> Pe:
    if data[:2] != b"MZ" or len(data) < 0x40:
        raise PeError("no MZ header")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe:pe + 4] != b"PE\0\0":
        raise PeError("no PE signature")
    nsections = struct.unpack_from("<H", data, pe + 6)[0]
    opt_size = struct.unpack_from("<H", data, pe + 20)[0]
    opt = pe + 24
    magic = struct.unpack_from("<H", data, opt)[0]
    if magic == 0x20B:      # PE32+
        image_base = struct.unpack_from("<Q", data, opt + 24)[0]
        dirs = opt + 112
    elif magic == 0x10B:    # PE32
        image_base = struct.unpack_from("<I", data, opt + 28)[0]
        dirs = opt + 96
    else:
        raise PeError(f"optional header magic {magic:#x}")
    section_alignment = struct.unpack_from("<I", data, opt + 32)[0]
    size_of_image, size_of_headers = struct.unpack_from("<II", data, opt + 56)
    cert_dir_at = dirs + 4 * 8
    cert_size = struct.unpack_from("<I", data, cert_dir_at + 4)[0] if cert_dir_at + 8 <= opt + opt_size else 0
    sections = []
    for i in range(nsections):
        at = opt + opt_size + 40 * i
        name = data[at:at + 8].rstrip(b"\0").decode("ascii", "replace")
        vsize, vaddr, rsize, roff = struct.unpack_from("<IIII", data, at + 8)
        sections.append(Section(name, vsize, vaddr, rsize, roff))
    return Pe(data, image_base, section_alignment, size_of_image, size_of_headers, opt + 44, opt + 64,
              cert_dir_at, cert_size, sections)


def pe_arch(data: bytes) -> str:
    """The Debian architecture a PE image is for (its COFF header's Machine)."""
    parse_pe(data)
    machine = struct.unpack_from("<H", data, struct.unpack_from("<I", data, 0x3C)[0] + 4)[0]
    if machine not in PE_MACHINES:
        raise PeError(f"PE machine {machine:#x} is neither x86-64 nor AArch64")
    return PE_MACHINES[machine]


def objcopy(arch: str) -> str:
    """binutils' objcopy for ``arch``'s PE images by its target triplet: an x86 host's own
    objcopy knows pei-x86-64 only, binutils-aarch64-linux-gnu's knows pei-aarch64-little."""
    return f"{debs.ARCHES[arch].triplet}-objcopy"


def find_stub(arch: str) -> Path:
    """Debian's systemd-boot stub for ``arch``: the host's where its systemd-boot-efi has it
    (amd64 on an x86 host), else taken out of that architecture's systemd-boot-efi .deb,
    downloaded (``apt-get download``) and unpacked once, as the arm64 ramdisk's packages are
    (initramfs/debs.py), under initramfs/out/ARCH/."""
    if STUBS[arch].is_file():
        return STUBS[arch]
    target = debs.ARCHES[arch]
    out = debs.out_dir(target)
    (deb,) = debs.download([STUB_PACKAGE], out / "debs", target)
    stub = debs.unpacked(deb, out / STUB_PACKAGE) / STUBS[arch].relative_to("/")
    if not stub.is_file():
        raise FileNotFoundError(f"{deb.name} holds no {STUBS[arch]}")
    return stub


def pe_kernel(kernel: Path, tmp: Path) -> Path:
    """``kernel`` as a PE image the stub can start: a gzipped arm64 Image (initramfs/out/arm64/
    vmlinuz; Debian's arm64 kernel is no EFI zboot image) unpacked into ``tmp``."""
    with kernel.open("rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return kernel
    image = tmp / "linux"
    image.write_bytes(gzip.decompress(kernel.read_bytes()))
    return image


def handover_kernel(kernel: Path, tmp: Path) -> Path:
    """An x86 ``kernel`` that systemd-stub starts through the EFI handover protocol, written into
    ``tmp``: its PE header's MajorImageVersion (the kernel's EFI stub version, 1 since Linux 5.8)
    set to 0, which is what systemd-stub 252 reads to choose the handover protocol over the
    firmware's LoadImage (src/boot/efi/pe.c, pe_kernel_info). The kernel is the same code; what
    changes is what is hashed at boot: LoadImage would measure the kernel into PCR 4 a second
    time, and the kernel's own stub, taking the initramfs through the stub's LoadFile2 device,
    would measure the initramfs into PCR 9 a third time; the stub has already measured both
    into PCR 11 (and the firmware the whole UKI into PCR 4). Under TCG those two passes are
    30 MB of SHA-256 in emulated firmware, about 1.4 s per boot (docs/performance.md). With
    nothing measured into PCR 9, the build can say PCR 9 stays zero: an initramfs a loader
    offers through that device in place of the UKI's would show there (by its source, Linux's
    x86 stub prefers such an initramfs to the boot parameters' on the handover path too; not
    tested here). The build leaves the kernel's in-memory size free after it (``build``)."""
    data = bytearray(kernel.read_bytes())
    if len(data) < 0x268 or data[0x202:0x206] != b"HdrS":
        raise PeError(f"{kernel}: no x86 boot protocol header")
    version, xloadflags = struct.unpack_from("<H", data, 0x206)[0], struct.unpack_from("<H", data, 0x236)[0]
    handover = struct.unpack_from("<I", data, 0x264)[0]
    if version < 0x20B or not xloadflags & XLF_EFI_HANDOVER_64 or not handover:
        raise PeError(f"{kernel}: the kernel has no 64-bit EFI handover entry "
                      f"(boot protocol {version:#x})")
    struct.pack_into("<H", data, parse_pe(bytes(data)).image_version_at, 0)
    out = tmp / "linux-handover"
    out.write_bytes(bytes(data))
    return out


def authenticode_sha256(data: bytes) -> bytes:
    """The PE image's Authenticode digest (Microsoft PE/COFF specification, "Calculating the PE
    Image Hash"): what UEFI firmware extends into PCR 4 when it starts the image."""
    pe = parse_pe(data)
    h = hashlib.sha256()
    h.update(data[:pe.checksum_at])
    h.update(data[pe.checksum_at + 4:pe.cert_dir_at])
    h.update(data[pe.cert_dir_at + 8:pe.size_of_headers])
    hashed = pe.size_of_headers
    for s in sorted((s for s in pe.sections if s.raw_size), key=lambda s: s.raw_offset):
        h.update(data[s.raw_offset:s.raw_offset + s.raw_size])
        hashed += s.raw_size
    if len(data) > hashed:
        h.update(data[hashed:len(data) - pe.cert_size])
    return h.digest()


def extend(pcr: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(pcr + digest).digest()


def predicted_pcr11(data: bytes) -> bytes:
    """PCR 11 after systemd-stub measured this UKI: each UKI section present, in the
    specification's order, its name (with the NUL) and then its contents."""
    pe = parse_pe(data)
    names = {s.name for s in pe.sections}
    pcr = bytes(32)
    for name in MEASURED_SECTIONS:
        if name in names:
            pcr = extend(pcr, hashlib.sha256(name.encode() + b"\0").digest())
            pcr = extend(pcr, hashlib.sha256(pe.section(name)).digest())
    return pcr


def build(stub: Path, kernel: Path, initrd: Path, cmdline: str, out: Path, *,
          os_release: str = OS_RELEASE) -> None:
    """Assemble the UKI with objcopy (the stub's architecture's): each added section placed
    after the stub's own; a gzipped kernel is added unpacked (pe_kernel)."""
    data = stub.read_bytes()
    pe = parse_pe(data)
    align = max(pe.section_alignment, 0x1000)
    end = max(s.virtual_address + max(s.virtual_size, s.raw_size) for s in pe.sections)
    with tempfile.TemporaryDirectory() as tmp:
        osrel, cmd = Path(tmp) / "osrel", Path(tmp) / "cmdline"
        osrel.write_text(os_release)
        cmd.write_text(cmdline)
        kernel = pe_kernel(kernel, Path(tmp))
        if pe_arch(data) == "amd64":
            kernel = handover_kernel(kernel, Path(tmp))
        argv = [objcopy(pe_arch(data))]
        for name, path in ((".osrel", osrel), (".cmdline", cmd), (".linux", kernel), (".initrd", initrd)):
            at = (end + align - 1) // align * align
            argv += ["--add-section", f"{name}={path}",
                     "--change-section-vma", f"{name}={pe.image_base + at:#x}"]
            end = at + path.stat().st_size
            if name == ".linux":
                # The kernel's own in-memory size (its BSS) is kept free after it: started
                # where it lies (the handover protocol), it clears and uses that memory.
                end = at + max(path.stat().st_size, parse_pe(path.read_bytes()).size_of_image)
        tmp_out = out.with_name(f".{out.name}.tmp")
        run([*argv, str(stub), str(tmp_out)], timeout=120)
        with tmp_out.open("ab") as f:  # 8-byte aligned: signing it later leaves its digest as it is
            f.write(bytes(-f.tell() % 8))
        tmp_out.replace(out)


def reference_values(uki: Path, build_id: str = "") -> dict[str, Any]:
    """What a TPM holds after firmware started this UKI as it is (the gateway policy's build)."""
    data = uki.read_bytes()
    values: dict[str, Any] = {
        "build_id": build_id or hashlib.sha256(data).hexdigest()[:16],
        # The firmware measures the UKI.
        "pcr4": [authenticode_sha256(data).hex()],
        "pcr11": predicted_pcr11(data).hex(),
        "pcr12": bytes(32).hex(),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if pe_arch(data) == "amd64":
        # The stub hands over to the kernel (handover_kernel): nothing more in PCR 4, none in 9.
        values["pcr9"] = bytes(32).hex()
    else:
        # The stub starts the kernel through the firmware's LoadImage, which measures it too;
        # under Secure Boot the stub's own security override lets the kernel in unverified and
        # unmeasured (its bytes are in the UKI's digest): PCR 4 then holds the UKI alone.
        values["pcr4_secure_boot"] = list(values["pcr4"])
        values["pcr4"].append(authenticode_sha256(parse_pe(data).section(".linux")).hex())
    return values


def write(stub: Path, kernel: Path, initrd: Path, cmdline: str, out: Path,
          build_id: str = "", sign: Callable[[Path], object] | None = None) -> dict[str, Any]:
    """The UKI and, beside it, OUT.json with its reference values; ``sign``: signs the UKI in
    place before its values are taken (initramfs/signing.py: Secure Boot, the same PCR 4)."""
    build(stub, kernel, initrd, cmdline, out)
    if sign is not None:
        sign(out)
    values = reference_values(out, build_id)
    out.with_name(out.name + ".json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    return values


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(STUBS), default="amd64")
    p.add_argument("--stub", type=Path, help="the systemd-boot stub (default: Debian's for --arch)")
    p.add_argument("--kernel", type=Path, required=True)
    p.add_argument("--initrd", type=Path, required=True)
    p.add_argument("--cmdline", default="")
    p.add_argument("--build-id", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    stub = args.stub or find_stub(args.arch)
    values = write(stub, args.kernel, args.initrd, args.cmdline, args.out, args.build_id)
    print(json.dumps(values, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
