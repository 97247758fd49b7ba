"""An OCI image layout directory on disk (the OCI image spec's ``oci-layout``, ``index.json``,
``blobs/sha256/HEX``) as a source of disk images, and as where ``agent image push --layout``
publishes: the same artifact as in a registry (agent/images/oci.py), for a machine without one
(a USB stick, a recovery, a mirror made with ``skopeo copy``).

    art, disk_path, chunk_manifest = ocilayout.resolve(Path("/media/os"), arch="amd64", tag="24.04")
    ocilayout.write(Path("/media/os"), image, chunk_manifest_path, arch="amd64", tag="24.04")

``resolve`` reads index.json (bounded), takes the entry of ``tag`` (its
``org.opencontainers.image.ref.name``; any tag when none is given) for the platform as a
registry's index is read (``disktype`` annotation), reads and checks that manifest and the
chunk manifest blob against their digests, and gives the disk blob's path: the caller checks
its bytes against the layer's digest as it reads them (deploy.image's digest).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from agent.atomicfile import replacing, write_atomic
from agent.errors import ChecksumMismatch, InvalidParameters, NotFound, Reason
from agent.images import oci

LAYOUT_FILE = "oci-layout"
LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


def is_layout(path: Path) -> bool:
    return path.is_dir() and (path / LAYOUT_FILE).is_file()


def blob_path(root: Path, digest: str) -> Path:
    if not oci.DIGEST.fullmatch(digest):
        raise InvalidParameters(f"not a sha256 digest: {digest!r}")
    return root / "blobs" / "sha256" / digest.partition(":")[2]


def _read(path: Path, bound: int, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(bound + 1)
    except FileNotFoundError as exc:
        raise NotFound(f"{what}: {path} does not exist", path=str(path)) from exc
    if len(data) > bound:
        raise oci.RegistryError(f"{what} {path} is larger than the {bound} bytes taken",
                                reason=Reason.TOO_LARGE)
    return data


def _blob(root: Path, desc: oci.Descriptor, bound: int) -> bytes:
    data = _read(blob_path(root, desc.digest), bound, "blob")
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != desc.digest:
        raise ChecksumMismatch(f"{root}: blob {desc.digest}: its bytes are {got}",
                               expected=desc.digest, got=got)
    return data


def resolve(root: Path, *, arch: str, tag: str = "", policy: oci.Policy | None = None
            ) -> tuple[oci.Artifact, Path, bytes | None]:
    """The artifact for ``arch`` (and ``tag``) in the layout at ``root``: the artifact, the disk
    blob's path, and the chunk manifest's bytes (checked) or None."""
    policy = policy or oci.Policy()
    if not is_layout(root):
        raise InvalidParameters(f"{root} is not an OCI image layout (no {LAYOUT_FILE} file)")
    where = f"{root}/index.json"
    index = oci.document(_read(root / "index.json", policy.max_manifest, "index"), where)
    if tag:
        entries = index.get("manifests")
        entries = entries if isinstance(entries, list) else []
        index = {**index, "manifests": [e for e in entries if isinstance(e, dict)
                                        and (e.get("annotations") or {}).get(oci.REF_NAME) == tag]}
    else:
        tags = {(e.get("annotations") or {}).get(oci.REF_NAME, "") for e in index.get("manifests") or []
                if isinstance(e, dict) and (e.get("platform") or {}).get("architecture") == arch}
        if len(tags) > 1:
            raise InvalidParameters(f"{where}: several tags for {arch} ({', '.join(sorted(tags))}): name one")
    entry = oci.pick_entry(index, arch, where + (f" (tag {tag})" if tag else ""))
    data = _blob(root, entry, policy.max_manifest)
    doc = oci.document(data, f"{root} {entry.digest}")
    disk, fmt, chunk = oci.pick_layers(doc, f"{root} {entry.digest}")
    disk_path = blob_path(root, disk.digest)
    if not disk_path.is_file():
        raise NotFound(f"{root}: the disk blob {disk.digest} is missing", path=str(disk_path))
    if disk_path.stat().st_size != disk.size:
        raise ChecksumMismatch(f"{root}: the disk blob is {disk_path.stat().st_size} bytes, its descriptor"
                               f" says {disk.size}")
    chunk_bytes = _blob(root, chunk, policy.max_small_blob) if chunk is not None else None
    return oci.Artifact(entry.digest, disk, fmt, chunk), disk_path, chunk_bytes


def _put_blob(root: Path, digest: str, source: bytes | Path) -> bool:
    """A blob into the layout, whole or not at all (agent/atomicfile.py); False when it is
    there already."""
    dest = blob_path(root, digest)
    if dest.is_file():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        write_atomic(dest, source)
        return True
    with source.open("rb") as src, replacing(dest) as out:
        shutil.copyfileobj(src, out, 8 << 20)
    return True


def write(root: Path, image_path: Path, chunk_manifest: Path | None = None, *, arch: str,
          tag: str = "latest", disktype: str = oci.WHOLE) -> oci.Pushed:
    """Publish into the layout at ``root`` (made if need be): the blobs, the manifest, and
    index.json's entry for the tag and platform (other entries kept), index.json last."""
    if not oci.TAG.fullmatch(tag):
        raise InvalidParameters(f"bad tag {tag!r}")
    parts = oci.prepare(image_path, chunk_manifest, arch)
    root.mkdir(parents=True, exist_ok=True)
    if (root / LAYOUT_FILE).exists() and not is_layout(root):
        raise InvalidParameters(f"{root}/{LAYOUT_FILE} is not a file")
    copied = 0
    for digest, size, source in parts.blobs(image_path, chunk_manifest):
        if _put_blob(root, digest, source):
            copied += size
    _put_blob(root, parts.manifest_digest, parts.manifest)
    old = None
    if (root / "index.json").is_file():
        data = _read(root / "index.json", oci.Policy().max_manifest, "index")
        old = oci.document(data, f"{root}/index.json")
    index = oci.build_index(old, parts.entry(arch, disktype, tag))
    if not is_layout(root):
        write_atomic(root / LAYOUT_FILE, LAYOUT)
    write_atomic(root / "index.json", index)
    return oci.Pushed(parts.manifest_digest, "sha256:" + hashlib.sha256(index).hexdigest(), parts.disk,
                      parts.chunk_manifest, copied)
