"""The ramdisk's licence notices and its SBOM.

The builder prunes /usr/share/doc, and with it the copyright file each Debian package must
ship with its binaries. They are kept instead, with the kernel's, in one xz-compressed tar,
``usr/share/licenses/debian-copyright.tar.xz`` (``PACKAGE/copyright`` inside), ~60 KB where
the files unpacked would take ~1 MB of the ramdisk's RAM. Beside it, in the image,
``usr/share/licenses/sbom.cdx.json``: a CycloneDX 1.5 document of every Debian package in the
root (version, architecture, source package and version, licences named in its copyright
file, sha256 of the .deb), the kernel package, and the agent zipapp with the wheels it
carries. The builder also writes it beside the image (OUT/initramfs.img.cdx.json).

Deterministic like the rest: sorted tar members with fixed owner, mode and mtime; no
timestamp in the SBOM; its serial number is derived from its contents.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import re
import subprocess
import tarfile
import uuid
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.proc import run

LICENSES = "usr/share/licenses"
COPYRIGHTS = f"{LICENSES}/debian-copyright.tar.xz"
SBOM = f"{LICENSES}/sbom.cdx.json"
AGENT = "usr/lib/bettercompute/agent.pyz"

# Licences of the packages whose copyright file is free-form rather than machine-readable
# (DEP-5), by source package, as each file states its overall terms (the file has the rest).
FREE_FORM = {
    "busybox": ("GPL-2",),
    "kexec-tools": ("GPL-2",),
    "glibc": ("LGPL-2.1+",),
    "libxcrypt": ("LGPL-2.1+",),
    "libgcrypt20": ("LGPL-2.1+", "GPL-2+"),  # the library; the manual and tools
    "libselinux": ("public-domain",),
    "python3.11": ("PSF-2.0",),
    "gcc-12": ("GPL-3+ with GCC-Runtime-Library-Exception-3.1",),
}


@dataclass(frozen=True)
class Package:
    """A Debian binary package in the ramdisk."""

    name: str
    version: str
    architecture: str
    source: str
    source_version: str
    sha256: str  # of the .deb; of the file this component stands for where there is none
    built_using: str = ""  # sources built in (the signed kernel's: the linux source package)

    @property
    def purl(self) -> str:
        return f"pkg:deb/debian/{self.name}@{_q(self.version)}?arch={self.architecture}&distro=debian-12"


def _q(version: str) -> str:
    return version.replace(":", "%3A").replace("+", "%2B").replace("~", "%7E")


def source_of(name: str, version: str, source_field: str) -> tuple[str, str]:
    """(source package, its version) from a control file's Source field: empty when the
    source has the binary's name, ``name (version)`` after a binary-only rebuild."""
    m = re.fullmatch(r"\s*(\S+)(?:\s+\((\S+)\))?\s*", source_field)
    if not m:
        return name, version
    return m.group(1), m.group(2) or version


def deb_package(deb: Path) -> Package:
    fields = dict.fromkeys(("Package", "Version", "Architecture", "Source", "Built-Using"), "")
    out = run(["dpkg-deb", "-f", str(deb), *fields], timeout=60).stdout.decode()
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            fields[key] = value.strip()
    source, source_version = source_of(fields["Package"], fields["Version"], fields["Source"])
    return Package(fields["Package"], fields["Version"], fields["Architecture"], source, source_version,
                   hashlib.sha256(deb.read_bytes()).hexdigest(), fields["Built-Using"])


def kernel_package(image: Path) -> Package | None:
    """The installed Debian package that ships the kernel image, or None (a kernel of no
    package, given with --kernel)."""
    owner = subprocess.run(["dpkg-query", "-S", str(image)], capture_output=True, text=True, check=False)
    if owner.returncode != 0:
        return None
    name = owner.stdout.split(":", 1)[0].strip()
    fmt = "${Version}\t${Architecture}\t${source:Package}\t${source:Version}\t${Built-Using}"
    out = run(["dpkg-query", "-W", f"-f={fmt}", name], timeout=60).stdout.decode()
    version, arch, source, source_version, built_using = out.split("\t")
    return Package(name, version, arch, source, source_version,
                   hashlib.sha256(image.read_bytes()).hexdigest(), built_using.strip())


def kernel_copyright(image: Path) -> tuple[str, Path] | None:
    """(the kernel's package, its copyright file on this machine), or None."""
    pkg = kernel_package(image)
    if pkg is None:
        return None
    path = Path("/usr/share/doc") / pkg.name / "copyright"
    return (pkg.name, path) if path.is_file() else None


# ---------------------------------------------------------------------------------------------
# Copyright files


def copyright_files(root: Path, packages: Iterable[str], fetch: Callable[[str], Path]) -> dict[str, bytes]:
    """Each package's copyright file, read from the unpacked (not yet pruned) ``root``. Where
    a package's doc directory links to another package's that is not unpacked (libgcc-s1 ->
    gcc-12-base), that package's .deb is fetched for its copyright file alone."""
    found: dict[str, bytes] = {}
    for name in packages:
        doc = root / "usr/share/doc" / name
        path = doc / "copyright"
        if path.is_file():
            found[name] = path.read_bytes()
        elif doc.is_symlink():
            other = Path(str(doc.readlink())).name
            found[name] = deb_file(fetch(other), f"./usr/share/doc/{other}/copyright")
        else:
            raise FileNotFoundError(f"initramfs: {name} has no usr/share/doc/{name}/copyright")
    return found


def deb_file(deb: Path, member: str) -> bytes:
    data = run(["dpkg-deb", "--fsys-tarfile", str(deb)], timeout=300).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        f = tar.extractfile(member)
        if f is None:
            raise FileNotFoundError(f"initramfs: {deb.name} has no {member}")
        return f.read()


def copyright_archive(files: dict[str, bytes]) -> bytes:
    """``PACKAGE/copyright`` for each package, a deterministic tar, xz -9e."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(f"{name}/copyright")
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME)


def read_copyright_archive(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data))) as tar:
        out = {}
        for info in tar.getmembers():
            f = tar.extractfile(info)
            if f is not None:
                out[info.name.removesuffix("/copyright")] = f.read()
        return out


def install_copyrights(root: Path, packages: Iterable[str], fetch: Callable[[str], Path],
                       kernel_copyright: tuple[str, Path] | None) -> None:
    """Write the copyright archive into ``root`` (before the pruning of usr/share/doc)."""
    files = copyright_files(root, packages, fetch)
    if kernel_copyright is not None:
        name, path = kernel_copyright
        files[name] = path.read_bytes()
    target = root / COPYRIGHTS
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(copyright_archive(files))
    target.chmod(0o644)


def licences(text: str, source: str) -> list[str]:
    """The licences a copyright file names: every License of a machine-readable (DEP-5)
    file's header and Files paragraphs, in order; for a free-form one, FREE_FORM's entry
    for its source package, else the /usr/share/common-licenses files it refers to."""
    if text.startswith("Format:"):
        names: list[str] = []
        for paragraph in re.split(r"\n\s*\n", text):
            fields = re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", paragraph, re.M)
            keys = {k.lower() for k, _ in fields}
            if "files" not in keys and "format" not in keys:
                continue  # a stand-alone License paragraph: the text of a name used above
            for key, value in fields:
                if key.lower() == "license" and value.strip() and value.strip() not in names:
                    names.append(value.strip())
        return names or ["NOASSERTION"]
    if source in FREE_FORM:
        return list(FREE_FORM[source])
    refs = re.findall(r"/usr/share/common-licenses/([A-Za-z0-9.+-]*[A-Za-z0-9+])", text)
    return list(dict.fromkeys(refs)) or ["NOASSERTION"]


# ---------------------------------------------------------------------------------------------
# The SBOM


def component(pkg: Package, copyrights: dict[str, bytes], location: str) -> dict[str, object]:
    text = copyrights.get(pkg.name, b"").decode("utf-8", "replace")
    return {
        "type": "library", "bom-ref": pkg.purl, "name": pkg.name, "version": pkg.version,
        "purl": pkg.purl, "hashes": [{"alg": "SHA-256", "content": pkg.sha256}],
        "licenses": [{"license": {"name": n}} for n in licences(text, pkg.source)],
        "properties": [
            {"name": "bettercompute:copyright", "value": f"{COPYRIGHTS}:{pkg.name}/copyright"},
            {"name": "bettercompute:location", "value": location},
            {"name": "debian:architecture", "value": pkg.architecture},
            {"name": "debian:source", "value": pkg.source},
            {"name": "debian:source-version", "value": pkg.source_version},
            *([{"name": "debian:built-using", "value": pkg.built_using}] if pkg.built_using else []),
        ],
    }


def agent_component(agent: bytes) -> dict[str, object]:
    """The agent zipapp as it is in the image, with the wheels its own SBOM lists."""
    with zipfile.ZipFile(io.BytesIO(agent)) as z:
        own = json.loads(z.read("_legal/sbom.cdx.json"))
    component = dict(own["metadata"]["component"])
    component["hashes"] = [{"alg": "SHA-256", "content": hashlib.sha256(agent).hexdigest()}]
    component["properties"] = [*component.get("properties", []),
                               {"name": "bettercompute:location", "value": AGENT},
                               {"name": "bettercompute:licence-files", "value": f"{AGENT}:_legal/"}]
    component["components"] = own["components"]
    return component


def sbom(packages: list[Package], kernel: Package | None, agent: bytes, copyrights: dict[str, bytes],
         base_key: str) -> bytes:
    components = [component(p, copyrights, "root") for p in packages]
    if kernel is not None:
        components.append(component(kernel, copyrights, "vmlinuz beside the image; lib/modules"))
    components.sort(key=lambda c: str(c["bom-ref"]))
    doc: dict[str, object] = {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        "metadata": {"component": {
            "type": "operating-system", "bom-ref": "bettercompute-ramdisk", "name": "bettercompute-ramdisk",
            "version": base_key,
            "properties": [{"name": "bettercompute:base-key", "value": base_key}],
        }},
        "components": [*components, agent_component(agent)],
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    doc["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'bettercompute-ramdisk/' + digest)}"
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def image_sbom(debs: list[Path], kernel_image: Path, agent: Path, root: Path, base_key: str) -> bytes:
    """The SBOM of the image: the .deb files unpacked into ``root``, the kernel, the agent."""
    copyrights = read_copyright_archive((root / COPYRIGHTS).read_bytes())
    return sbom([deb_package(d) for d in debs], kernel_package(kernel_image), agent.read_bytes(),
                copyrights, base_key)
