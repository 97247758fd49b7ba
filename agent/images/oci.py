"""Disk images in an OCI registry (the distribution API) or an OCI image layout on disk.

    ref = oci.parse("oci://registry.example:5000/os/ubuntu:24.04")     # or @sha256:<64 hex>
    reg = oci.Registry(ref, opts, credentials=None, policy=oci.Policy())
    art = reg.resolve(ref, arch=oci.node_arch())    # manifest (an index: the node's entry)
    art.manifest_digest                              # what the tag resolved to, once
    art.disk                                         # the disk image layer: digest, size, format
    art.chunk_manifest                               # the chunk manifest layer, or None
    data = reg.blob_bytes(art.chunk_manifest)        # a small blob, bounded, checked by digest
    with reg.open_blob(art.disk, offset=0) as body:  # a big one: http.Download (Range resume)
        ...                                          # the caller hashes it (the layer's digest)
    reg.push(ref, image_path, chunk_manifest_path, arch="amd64")   # publishing: agent image push

References: ``oci://HOST[:PORT]/REPOSITORY[:TAG|@sha256:HEX]`` (HTTPS, the registry's
certificate checked against the system's CAs and the caller's); ``oci+http://`` for a registry
reached over plain HTTP (loopback, or a site route on the provisioning network). No tag and no
digest means ``latest``. The repository follows distribution's grammar (lower case components
of ``[a-z0-9]`` joined by ``.``, ``_``, ``__`` or dashes, separated by ``/``).

What an artifact is (docs/oci.md): an OCI image manifest whose layers hold one disk image,
by media type (``application/vnd.bettercompute.disk.v1.raw`` and its ``+gzip``, ``+xz``,
``+bzip2``, ``+zstd`` forms, ``application/vnd.bettercompute.disk.v1.qcow2``), and at most one
chunk manifest (``application/vnd.bettercompute.chunk-manifest.v1+protobuf``: the
ImageManifest that ``agent manifest`` writes). A layer of another type whose
``org.opencontainers.image.title`` names a disk file (``.raw``, ``.img``, ``.gz``, ``.xz``,
``.bz2``, ``.zst``, ``.qcow2``: what ``oras push FILE`` makes) is taken as the disk when no
layer has one of our types; its format then comes from its magic bytes. An image index picks
its entry by ``platform.architecture`` (the node's, ``amd64`` or ``arm64``) and the annotation
``disktype`` (``whole``: a whole-disk image, the only kind deploy.image writes; an entry
without it is taken as whole, one with another value is skipped).

Authentication: anonymous; basic (``Credentials``); and the token flow: a 401 with
``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` is answered by asking the realm
for a token (with the credentials, if any, as basic) and retrying once with it; a second 401
raises AuthFailed. The realm must be the registry's own host or one the policy allows. A
download (``download_options``, a deploy's blob) carries the token through ``Authorizer``: a
401 at a resume after the token expired has the challenge answered once more, then goes on.

Bounds (``Policy``): a manifest or index larger than ``max_manifest`` bytes is refused
(RegistryError, reason too_large) without reading more; a small blob (chunk manifest, config)
larger than ``max_small_blob``; a redirect (blob storage) or a token realm on another host
than the registry's is refused unless the host is in ``other_hosts``; every connection,
redirects included, dials only hosts the policy allows (``HttpOptions.resolve``).

Everything fetched is checked against its digest: a manifest against the reference's digest
(a tag: against the registry's Docker-Content-Digest, and reported), a small blob at once, a
disk blob by the caller as it streams (deploy.image: the published file's digest).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import limits
from agent.errors import AgentError, AuthFailed, ChecksumMismatch, InvalidParameters, Reason, SourceFailed
from agent.net import http
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

Fmt = agent_pb2.ImageFormat

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))

CONFIG_TYPE = "application/vnd.bettercompute.disk.config.v1+json"
CHUNK_MANIFEST_TYPE = "application/vnd.bettercompute.chunk-manifest.v1+protobuf"
DISK_PREFIX = "application/vnd.bettercompute.disk.v1."
DISK_TYPES: dict[str, int] = {
    DISK_PREFIX + "raw": Fmt.RAW,
    DISK_PREFIX + "raw+gzip": Fmt.GZIP,
    DISK_PREFIX + "raw+xz": Fmt.XZ,
    DISK_PREFIX + "raw+bzip2": Fmt.BZIP2,
    DISK_PREFIX + "raw+zstd": Fmt.ZSTD,
    DISK_PREFIX + "qcow2": Fmt.QCOW2,
}
MEDIA_TYPE_OF = {fmt: media for media, fmt in DISK_TYPES.items()}
DISK_SUFFIXES = (".raw", ".img", ".gz", ".xz", ".bz2", ".zst", ".qcow2")
TITLE = "org.opencontainers.image.title"
REF_NAME = "org.opencontainers.image.ref.name"
DISKTYPE = "disktype"             # the index entry's annotation: "whole" (deployable) or other
WHOLE = "whole"
TOKEN_ANSWER = 1 << 20            # bytes of a token service's answer
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
HOST = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")


class RegistryError(SourceFailed):
    """The registry answered something we refuse: a status, a bound passed, a bad document."""

    def __init__(self, message: str, *, reason: Reason = Reason.SOURCE_FAILED, **details: Any) -> None:
        super().__init__(message, reason=reason, **details)


# ------------------------------------------------------------------------------ references


@dataclass(frozen=True)
class Reference:
    scheme: str          # "https" (oci://) or "http" (oci+http://)
    host: str            # host[:port], as written
    repository: str
    tag: str = ""        # one of tag and digest
    digest: str = ""     # "sha256:<hex>"

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}/v2/{self.repository}"

    @property
    def what(self) -> str:
        """The manifest's name in the API: the digest when pinned, else the tag."""
        return self.digest or self.tag

    def __str__(self) -> str:
        prefix = "oci" if self.scheme == "https" else "oci+http"
        return f"{prefix}://{self.host}/{self.repository}" + (f"@{self.digest}" if self.digest
                                                              else f":{self.tag}")


def is_reference(text: str) -> bool:
    return text.startswith(("oci://", "oci+http://"))


def parse(text: str) -> Reference:
    """An ``oci://`` (or ``oci+http://``) reference; InvalidParameters naming what is wrong."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text) or not text.isascii():
        raise InvalidParameters("an OCI reference is ASCII without spaces or control characters")
    if text.startswith("oci://"):
        scheme, rest = "https", text[len("oci://"):]
    elif text.startswith("oci+http://"):
        scheme, rest = "http", text[len("oci+http://"):]
    else:
        raise InvalidParameters(f"an OCI reference starts with oci:// or oci+http://, not {text[:16]!r}")
    host, _, path = rest.partition("/")
    if not HOST.fullmatch(host) or "@" in host:
        raise InvalidParameters(f"bad registry host {host!r} in the OCI reference")
    digest = tag = ""
    if "@" in path:
        path, _, digest = path.partition("@")
        if not DIGEST.fullmatch(digest):
            raise InvalidParameters(f"the reference's digest must be sha256:<64 lower-case hex>,"
                                    f" not {digest!r}")
    else:
        name, colon, maybe_tag = path.rpartition(":")
        if colon and "/" not in maybe_tag:
            path, tag = name, maybe_tag
            if not TAG.fullmatch(tag):
                raise InvalidParameters(f"bad tag {tag!r} in the OCI reference")
        else:
            tag = "latest"
    if not path or len(path) > 255 or not REPOSITORY.fullmatch(path):
        raise InvalidParameters(f"bad repository {path!r} in the OCI reference (lower case, [a-z0-9._-/])")
    return Reference(scheme, host, path, tag, digest)


def node_arch(machine: str | None = None) -> str:
    """The OCI architecture of this machine (amd64, arm64)."""
    machine = machine or os.uname().machine
    try:
        return ARCHES[machine]
    except KeyError:
        raise AgentError(f"no OCI architecture known for machine {machine!r}",
                         reason=Reason.UNSUPPORTED) from None


# ------------------------------------------------------------------------------ documents


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    platform: Mapping[str, str] = field(default_factory=dict)

    @property
    def hex(self) -> str:
        return self.digest.partition(":")[2]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.platform:
            out["platform"] = dict(self.platform)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


def _descriptor(obj: object, where: str) -> Descriptor:
    if not isinstance(obj, dict):
        raise RegistryError(f"{where}: a descriptor is not an object")
    media, digest, size = obj.get("mediaType"), obj.get("digest"), obj.get("size")
    if not isinstance(media, str) or not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise RegistryError(f"{where}: a descriptor without a media type or a sha256 digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise RegistryError(f"{where}: descriptor {digest} has no valid size")

    def strings(value: object) -> dict[str, str]:
        if not isinstance(value, dict):
            return {}
        return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}

    return Descriptor(media, digest, size, strings(obj.get("annotations")), strings(obj.get("platform")))


@dataclass(frozen=True)
class Artifact:
    """What a reference resolved to: the manifest (and index) digests, the disk layer, its
    format by media type (AUTO: by its magic bytes), and the chunk manifest layer if any."""

    manifest_digest: str
    disk: Descriptor
    format: int
    chunk_manifest: Descriptor | None = None
    index_digest: str = ""


MANIFEST_DEPTH = 16   # objects and arrays inside each other in a manifest or index (ours: 4)


def document(data: bytes, where: str) -> dict[str, Any]:
    """A manifest or index (a registry's, an image layout's), read by the bounded JSON reader:
    not JSON, or nested deeper than MANIFEST_DEPTH, is a RegistryError (source_failed)."""
    doc = limits.loads_json(data, what=where, max_bytes=max(len(data), 1), max_depth=MANIFEST_DEPTH,
                            error=RegistryError)
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise RegistryError(f"{where}: not a schema 2 manifest or index")
    return doc


def pick_entry(index: Mapping[str, Any], arch: str, where: str) -> Descriptor:
    """The index entry for ``arch`` whose ``disktype`` is whole (or unsaid; whole first)."""
    entries = index.get("manifests")
    if not isinstance(entries, list):
        raise RegistryError(f"{where}: an index without manifests")
    found: list[Descriptor] = []
    seen: list[str] = []
    for i, raw in enumerate(entries):
        d = _descriptor(raw, f"{where} entry {i}")
        seen.append(f"{d.platform.get('architecture', '?')}/{d.annotations.get(DISKTYPE, '-')}")
        if d.media_type not in MANIFEST_TYPES or d.platform.get("architecture") != arch:
            continue
        if d.annotations.get(DISKTYPE, WHOLE) == WHOLE:
            found.append(d)
    if not found:
        raise RegistryError(f"{where}: the index has no whole-disk entry for architecture {arch}"
                            f" (it has: {', '.join(seen) or 'none'})", reason=Reason.NOT_FOUND, arch=arch)
    found.sort(key=lambda d: DISKTYPE not in d.annotations)
    return found[0]


def pick_layers(manifest: Mapping[str, Any], where: str) -> tuple[Descriptor, int, Descriptor | None]:
    """The disk layer, its format by media type, and the chunk manifest layer (or None)."""
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise RegistryError(f"{where}: a manifest without layers")
    descs = [_descriptor(raw, f"{where} layer {i}") for i, raw in enumerate(layers)]
    disks = [d for d in descs if d.media_type in DISK_TYPES]
    chunk = [d for d in descs if d.media_type == CHUNK_MANIFEST_TYPE]
    if len(chunk) > 1:
        raise RegistryError(f"{where}: more than one chunk manifest layer")
    if not disks:
        disks = [d for d in descs if d.annotations.get(TITLE, "").lower().endswith(DISK_SUFFIXES)
                 and d.media_type != CHUNK_MANIFEST_TYPE]
        if len(disks) == 1:
            return disks[0], Fmt.IMAGE_FORMAT_AUTO, chunk[0] if chunk else None
    if len(disks) != 1:
        types = ", ".join(sorted({d.media_type for d in descs}))
        raise RegistryError(f"{where}: {'no' if not disks else 'more than one'} disk image layer"
                            f" (layers: {types})", reason=Reason.NOT_FOUND)
    return disks[0], DISK_TYPES[disks[0].media_type], chunk[0] if chunk else None


# ------------------------------------------------------------------------------ the client


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


@dataclass(frozen=True)
class Policy:
    max_manifest: int = 4 << 20           # bytes of a manifest or index (distribution's own bound)
    max_small_blob: int = 64 << 20        # a chunk manifest (manifest.MAX_MANIFEST), a config
    other_hosts: frozenset[str] = frozenset()   # hosts a redirect or a token realm may lead to
    plain_http_redirect: bool = False     # a blob redirect from an https registry to http:// followed


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="...",scope="..."`` -> ("bearer", {realm:..., ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'([A-Za-z]+)="([^"]*)"', rest)}
    return scheme.lower(), params


class Authorizer:
    """A registry's authorization for the downloads of a job (http.Authorization): the header
    that works now (a token, basic), and a new token from the registry's challenge when it
    answers 401 (the token expired during a long deploy, or for a route at the site). One lock
    for the renewals of the many downloads that may share it (a site's route)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.lock = threading.RLock()

    def headers(self) -> dict[str, str]:
        with self.lock:
            return self.registry.headers

    def renew(self, challenge: str) -> bool:
        with self.lock:
            try:
                self.registry.authenticate(challenge, push=False)
            except AgentError as exc:
                log.warning("registry %s: authorization not renewed: %s", self.registry.ref.host, exc.message)
                return False
            log.info("registry %s: authorization renewed", self.registry.ref.host)
            return True


class Registry:
    """One registry's distribution API, for one job: its token kept for the job's requests."""

    def __init__(self, ref: Reference, opts: http.HttpOptions | None = None, *,
                 credentials: Credentials | None = None, policy: Policy | None = None) -> None:
        self.ref = ref
        self.policy = policy or Policy()
        self.credentials = credentials
        self.home = urllib.parse.urlsplit(f"{ref.scheme}://{ref.host}/").hostname or ""
        base = opts or http.HttpOptions()
        self.opts = dataclasses.replace(base, resolve=self._resolve(base.resolve))
        self._auth = ""                      # the Authorization header value that works
        self.authorizer = Authorizer(self)   # that header for downloads, renewed on their 401

    # -- the host policy -----------------------------------------------------------------

    def allowed(self, host: str) -> bool:
        host = host.lower().strip("[]")
        return host == self.home.lower() or host in {h.lower() for h in self.policy.other_hosts}

    def _resolve(self, inner: Callable[[str, int], Iterable[str]] | None
                 ) -> Callable[[str, int], Iterable[str]]:
        def resolve(host: str, port: int) -> Iterable[str]:
            if not self.allowed(host):
                raise RegistryError(f"{self.ref.host}: refused to connect to {host}: another host than"
                                    " the registry's, not allowed by the policy", host=host)
            if inner is not None:
                return inner(host, port)
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise RegistryError(f"{host}: cannot resolve: {exc}") from exc
            return [str(info[4][0]) for info in infos]
        return resolve

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization that works (a token, basic) now; sent to the registry's origin only."""
        return {"Authorization": self._auth} if self._auth else {}

    def download_options(self) -> http.HttpOptions:
        """Options for a download from the registry (a blob): its authorization made at each
        request and renewed once on a 401 (``authorizer``), to the registry's origin only."""
        return dataclasses.replace(self.opts, auth=self.authorizer,
                                   plain_http_redirect=self.policy.plain_http_redirect)

    # -- requests ------------------------------------------------------------------------

    def _scope(self, push: bool) -> str:
        return f"repository:{self.ref.repository}:{'pull,push' if push else 'pull'}"

    def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                body: bytes | None = None, max_body: int = http.MAX_BODY, push: bool = False
                ) -> http.Response:
        """One request, authenticated as the registry asks (once); 401 after that: AuthFailed."""
        for attempt in range(2):
            hdrs = dict(headers or {})
            if self._auth:
                hdrs["Authorization"] = self._auth
            resp = http.request(method, url, self.opts, headers=hdrs, body=body, max_body=max_body)
            if resp.status != 401:
                return resp
            challenge = resp.headers.get("www-authenticate", "")
            if attempt == 1 or not challenge:
                raise AuthFailed(f"{method} {http.redact(url)}: the registry refused the"
                                 f" {'credentials' if self._auth else 'anonymous request'} (HTTP 401)")
            self.authenticate(challenge, push)
        raise AssertionError("unreachable")

    def authenticate(self, challenge: str, push: bool) -> None:
        scheme, params = _challenge(challenge)
        if scheme == "basic":
            if self.credentials is None:
                raise AuthFailed(f"{self.ref.host}: the registry asks for credentials and none were given")
            self._auth = self.credentials.basic()
            return
        if scheme != "bearer" or "realm" not in params:
            raise AuthFailed(f"{self.ref.host}: an authentication scheme we do not speak: {scheme!r}")
        realm = params["realm"]
        parts = http.check_url(realm)
        if not self.allowed(parts.hostname or ""):
            raise RegistryError(f"{self.ref.host}: the token realm {http.redact(realm)} is on another"
                                " host, not allowed by the policy", host=parts.hostname or "")
        if parts.scheme != "https" and self.ref.scheme == "https":
            raise RegistryError(f"{self.ref.host}: the token realm is not https")
        query = {"scope": params.get("scope") or self._scope(push)}
        if "service" in params:
            query["service"] = params["service"]
        sep = "&" if parts.query else "?"
        url = realm + sep + urllib.parse.urlencode(query)
        # The realm gets what the token protocol gives it and nothing else: the registry's
        # credentials (the realm is the registry's host or one the operator listed), never the
        # caller's own headers (a deploy's http_headers: for the registry's origin only).
        hdrs = {"Authorization": self.credentials.basic()} if self.credentials is not None else {}
        realm_opts = dataclasses.replace(self.opts, headers={}, auth=None)
        resp = http.request("GET", url, realm_opts, headers=hdrs, max_body=TOKEN_ANSWER)
        if resp.status == 401 or resp.status == 403:
            who = "credentials" if self.credentials else "anonymous request"
            raise AuthFailed(f"{self.ref.host}: the token service refused the {who} (HTTP {resp.status})")
        if resp.status != 200:
            raise RegistryError(f"{self.ref.host}: the token service answered HTTP {resp.status}")
        doc = limits.loads_json(resp.body, what=f"{self.ref.host}: the token service's answer",
                                max_bytes=TOKEN_ANSWER, max_depth=MANIFEST_DEPTH, error=RegistryError)
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
            raise RegistryError(f"{self.ref.host}: the token service gave no token")
        self._auth = f"Bearer {token}"

    def _fail(self, what: str, resp: http.Response) -> RegistryError:
        first = resp.body[:300].decode("utf-8", "replace").strip().splitlines()[:1]
        reason = Reason.NOT_FOUND if resp.status == 404 else Reason.SOURCE_FAILED
        asked = http.retry_after(resp.headers.get("retry-after")) if resp.status in (429, 503) else None
        later = "" if asked is None else (f" (its Retry-After asks for {asked:.0f} s:"
                                          " past the deadline, or after the retries the deploy takes)")
        return RegistryError(f"{what}: HTTP {resp.status}" + (f": {first[0]}" if first else "") + later,
                             reason=reason, status=resp.status)

    # -- reading -------------------------------------------------------------------------

    def manifest(self, what: str) -> tuple[str, str, bytes]:
        """The manifest or index ``what`` (a tag or a digest): its digest, media type, bytes;
        checked against the digest asked for, or the one the registry says it has."""
        url = f"{self.ref.base}/manifests/{what}"
        where = f"{self.ref.host}/{self.ref.repository} {what}"
        try:
            resp = self.request("GET", url, headers={"Accept": ACCEPT}, max_body=self.policy.max_manifest)
        except http.BodyTooLarge as exc:
            raise RegistryError(f"{where}: the manifest is larger than the {self.policy.max_manifest}"
                                " bytes taken", reason=Reason.TOO_LARGE) from exc
        if resp.status != 200:
            raise self._fail(f"manifest {where}", resp)
        got = "sha256:" + hashlib.sha256(resp.body).hexdigest()
        said = resp.headers.get("docker-content-digest", "")
        if DIGEST.fullmatch(what) and got != what:
            raise ChecksumMismatch(f"manifest {where}: its bytes are {got}", expected=what, got=got)
        if said and said != got:
            raise ChecksumMismatch(f"manifest {where}: its bytes are {got}, the registry says {said}",
                                   expected=said, got=got)
        media = resp.headers.get("content-type", "").split(";")[0].strip()
        return got, media, resp.body

    def resolve(self, what: str = "", *, arch: str | None = None) -> Artifact:
        """The reference (or ``what``: a tag or digest) down to its disk layer: an index's entry
        for ``arch`` (the node's by default), then that manifest's layers."""
        arch = arch or node_arch()
        digest, media, data = self.manifest(what or self.ref.what)
        where = f"{self.ref.host}/{self.ref.repository}@{digest}"
        doc = document(data, where)
        media = doc.get("mediaType") or media
        index_digest = ""
        if media in INDEX_TYPES or "manifests" in doc:
            index_digest = digest
            entry = pick_entry(doc, arch, where)
            digest, media, data = self.manifest(entry.digest)
            where = f"{self.ref.host}/{self.ref.repository}@{digest}"
            doc = document(data, where)
        disk, fmt, chunk = pick_layers(doc, where)
        log.info("%s resolved to %s%s", self.ref, digest, f" (index {index_digest})" if index_digest else "")
        return Artifact(digest, disk, fmt, chunk, index_digest)

    def blob_url(self, desc: Descriptor) -> str:
        return f"{self.ref.base}/blobs/{desc.digest}"

    def blob_bytes(self, desc: Descriptor) -> bytes:
        """A small blob (a chunk manifest), whole, checked against its digest and size."""
        if desc.size > self.policy.max_small_blob:
            raise RegistryError(f"blob {desc.digest} is {desc.size} bytes, more than the"
                                f" {self.policy.max_small_blob} taken", reason=Reason.TOO_LARGE)
        self.request("HEAD", self.blob_url(desc))  # authenticates; the GET follows redirects
        with http.get(self.blob_url(desc), self.download_options()) as body:
            if body.total is not None and body.total != desc.size:
                raise ChecksumMismatch(f"blob {desc.digest} is {body.total} bytes, its descriptor"
                                       f" says {desc.size}")
            data = bytearray()
            while chunk := body.read(1 << 20):
                data += chunk
                if len(data) > desc.size:
                    raise ChecksumMismatch(f"blob {desc.digest} is longer than its descriptor's"
                                           f" {desc.size} bytes")
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != desc.digest:
            raise ChecksumMismatch(f"blob {desc.digest}: its bytes are {got}", expected=desc.digest, got=got)
        return bytes(data)

    def open_blob(self, desc: Descriptor, offset: int = 0, *, pool: http.ConnectionPool | None = None
                  ) -> http.Download:
        """A disk blob's bytes from ``offset``, with Range resume; the caller checks the digest."""
        self.request("HEAD", self.blob_url(desc))
        return http.get(self.blob_url(desc), self.download_options(), offset=offset, pool=pool)

    # -- writing (agent image push) --------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        resp = self.request("HEAD", f"{self.ref.base}/blobs/{digest}", push=True)
        return resp.status == 200

    def put_blob(self, digest: str, size: int, source: bytes | Path) -> bool:
        """Uploads a blob unless the registry has it (True: uploaded): a POST for the upload's
        URL, then one PUT of the whole body, streamed from the file."""
        if self.has_blob(digest):
            return False
        resp = self.request("POST", f"{self.ref.base}/blobs/uploads/", push=True,
                            headers={"Content-Length": "0"})
        if resp.status != 202 or not resp.headers.get("location"):
            raise self._fail(f"upload of {digest} to {self.ref.host}/{self.ref.repository}", resp)
        location = urllib.parse.urljoin(f"{self.ref.base}/blobs/uploads/", resp.headers["location"])
        parts = http.check_url(location)
        if not self.allowed(parts.hostname or ""):
            raise RegistryError(f"the upload location is on another host: {parts.hostname}")
        sep = "&" if parts.query else "?"
        url = f"{location}{sep}digest={urllib.parse.quote(digest)}"
        opts = self.download_options()
        if isinstance(source, bytes):
            http.put(url, source, opts)
        else:
            with source.open("rb") as f:
                http.put(url, f, opts, length=size)
        return True

    def put_manifest(self, what: str, data: bytes, media_type: str) -> str:
        resp = self.request("PUT", f"{self.ref.base}/manifests/{what}", body=data, push=True,
                            headers={"Content-Type": media_type})
        if resp.status not in (200, 201):
            raise self._fail(f"manifest {what} to {self.ref.host}/{self.ref.repository}", resp)
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def index_at(self, tag: str) -> dict[str, Any] | None:
        """The index the tag holds now, or None (no tag, or a plain manifest)."""
        try:
            _digest, media, data = self.manifest(tag)
        except RegistryError as exc:
            if exc.details.get("status") == "404":
                return None
            raise
        doc = document(data, f"{self.ref} {tag}")
        return doc if (doc.get("mediaType") or media) in INDEX_TYPES else None


# ------------------------------------------------------------------------------ publishing


@dataclass(frozen=True)
class Pushed:
    manifest_digest: str
    index_digest: str
    disk: Descriptor
    chunk_manifest: Descriptor | None
    uploaded: int          # bytes uploaded (blobs the registry had already are not)


def _file_descriptor(path: Path, media_type: str) -> Descriptor:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while data := f.read(8 << 20):
            h.update(data)
    return Descriptor(media_type, "sha256:" + h.hexdigest(), path.stat().st_size, {TITLE: path.name})


def disk_media_type(path: Path) -> str:
    from agent.images import image

    with path.open("rb") as f:
        return MEDIA_TYPE_OF[image.detect(f.read(image.MAGIC_LEN))]


def build_manifest(disk: Descriptor, chunk: Descriptor | None, config: bytes) -> bytes:
    """The artifact's image manifest: our config, the disk layer, the chunk manifest layer."""
    layers = [disk.to_json()] + ([chunk.to_json()] if chunk is not None else [])
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": CONFIG_TYPE, "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                   "size": len(config)},
        "layers": layers,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def build_index(old: Mapping[str, Any] | None, entry: Descriptor) -> bytes:
    """An index with ``entry``, keeping the old index's entries of other platforms, disk types
    or (an image layout's index.json) tags."""
    keep: list[dict[str, Any]] = []
    for raw in (old or {}).get("manifests", []):
        try:
            d = _descriptor(raw, "the index")
        except RegistryError:
            continue
        same = (d.platform.get("architecture") == entry.platform.get("architecture")
                and d.annotations.get(DISKTYPE, WHOLE) == entry.annotations.get(DISKTYPE, WHOLE)
                and d.annotations.get(REF_NAME) == entry.annotations.get(REF_NAME))
        if not same:
            keep.append(d.to_json())
    doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*keep, entry.to_json()]}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def config_bytes(arch: str, disk: Descriptor) -> bytes:
    return json.dumps({"architecture": arch, "os": "linux", "disk": {"mediaType": disk.media_type,
                      "digest": disk.digest}}, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class Parts:
    """An artifact ready to publish: its blobs (disk, chunk manifest, config) and its manifest."""

    disk: Descriptor
    chunk_manifest: Descriptor | None
    config: bytes
    manifest: bytes

    @property
    def manifest_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    def blobs(self, image_path: Path, chunk_manifest: Path | None) -> list[tuple[str, int, bytes | Path]]:
        out: list[tuple[str, int, bytes | Path]] = [(self.disk.digest, self.disk.size, image_path)]
        if self.chunk_manifest is not None and chunk_manifest is not None:
            out.append((self.chunk_manifest.digest, self.chunk_manifest.size, chunk_manifest))
        out.append(("sha256:" + hashlib.sha256(self.config).hexdigest(), len(self.config), self.config))
        return out

    def entry(self, arch: str, disktype: str, tag: str = "") -> Descriptor:
        annotations = {DISKTYPE: disktype, **({REF_NAME: tag} if tag else {})}
        return Descriptor(OCI_MANIFEST, self.manifest_digest, len(self.manifest), annotations,
                          {"architecture": arch, "os": "linux"})


def prepare(image_path: Path, chunk_manifest: Path | None, arch: str) -> Parts:
    """The artifact of a disk image (its media type from its magic bytes) and its chunk
    manifest (checked to be of this image when it says which file it was made from)."""
    if arch not in ARCHES.values():
        raise InvalidParameters(f"architecture must be one of {sorted(set(ARCHES.values()))}, not {arch!r}")
    disk = _file_descriptor(image_path, disk_media_type(image_path))
    chunk = None
    if chunk_manifest is not None:
        from agent.images import manifest as chunks

        chunk = _file_descriptor(chunk_manifest, CHUNK_MANIFEST_TYPE)
        plan = chunks.parse(chunk_manifest.read_bytes())
        if (plan.published is not None and plan.published_format == DISK_TYPES[disk.media_type]
                and plan.published.hex != disk.hex):
            raise InvalidParameters(f"the chunk manifest {chunk_manifest} is of another file"
                                    f" than {image_path}")
    config = config_bytes(arch, disk)
    return Parts(disk, chunk, config, build_manifest(disk, chunk, config))


def push(reg: Registry, image_path: Path, chunk_manifest: Path | None = None, *, arch: str,
         disktype: str = WHOLE, index: bool = True) -> Pushed:
    """The disk image and its chunk manifest as one artifact at the reference's tag: blobs the
    registry has are not sent again; with ``index`` (default) the tag holds an image index
    whose entry for ``arch`` is this manifest (other architectures' entries are kept)."""
    ref = reg.ref
    if not ref.tag or ref.digest:
        raise InvalidParameters("push needs a tag (oci://host/repo:tag), not a digest")
    parts = prepare(image_path, chunk_manifest, arch)
    uploaded = 0
    for digest, size, source in parts.blobs(image_path, chunk_manifest):
        if reg.put_blob(digest, size, source):
            uploaded += size
    if not index:
        digest = reg.put_manifest(ref.tag, parts.manifest, OCI_MANIFEST)
        return Pushed(digest, "", parts.disk, parts.chunk_manifest, uploaded)
    digest = reg.put_manifest(parts.manifest_digest, parts.manifest, OCI_MANIFEST)
    index_body = build_index(reg.index_at(ref.tag), parts.entry(arch, disktype))
    index_digest = reg.put_manifest(ref.tag, index_body, OCI_INDEX)
    return Pushed(digest, index_digest, parts.disk, parts.chunk_manifest, uploaded)
