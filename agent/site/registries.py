"""The site's side of OCI registries (docs/oci.md): a route to a registry is resolved here, with
the credentials of the site's secret store, and its requests to the registry carry the
registry's authorization, added here: the ramdisk behind the route holds none.

    regs = Registries(secrets_dir, http_options)     # SiteServices makes one
    reg, art, chunks = regs.resolve(ref, "registry1", arch="amd64", other_hosts=frozenset())
    route.auth = regs.auth_for(route)                # after a restart: made again from the route

``RegistryAuth`` (routes.UpstreamAuth) keeps the header that works (a Bearer token, basic) and,
when the registry answers 401 (a token expired), runs its challenge again once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import AgentError, InvalidParameters
from agent.images import oci
from agent.net import http
from agent.site.bmc.secrets import SecretStore

if TYPE_CHECKING:
    from agent.site.serve.routes import Route

log = logging.getLogger(__name__)


class RegistryAuth:
    """One route's authorization at its registry (routes.UpstreamAuth): the registry's own
    ``oci.Authorizer`` (the header that works, renewed once on a 401), which the blob store's
    downloads carry too."""

    def __init__(self, registry: oci.Registry) -> None:
        self.registry = registry

    def headers(self) -> dict[str, str]:
        return self.registry.authorizer.headers()

    def blob_options(self, url: str) -> http.HttpOptions:
        """A HEAD of ``url`` first (a 401 answered: the token renewed), then the options of a
        download with the authorization (renewed again if it expires during the download),
        dialling only the registry's and allowed hosts."""
        with self.registry.authorizer.lock:
            resp = self.registry.request("HEAD", url)
            if resp.status != 200 and resp.status not in http.REDIRECTS:
                raise oci.RegistryError(f"{http.redact(url)}: HTTP {resp.status} to a HEAD",
                                        status=resp.status)
            return self.registry.download_options()

    def renew(self, challenge: str) -> bool:
        """Answer the registry's 401 challenge (a new token); False when that fails."""
        return self.registry.authorizer.renew(challenge)


class Registries:
    def __init__(self, secrets_dir: Path | None, options: http.HttpOptions) -> None:
        self.secrets = SecretStore(secrets_dir) if secrets_dir is not None else None
        self.options = options

    def _registry(self, ref: oci.Reference, credentials_ref: str, other_hosts: frozenset[str]
                  ) -> oci.Registry:
        creds = None
        if credentials_ref:
            if self.secrets is None:
                raise InvalidParameters("credentials_ref: this site has no secret store")
            entry = self.secrets.get(credentials_ref)
            creds = oci.Credentials(entry.username, entry.password)
        return oci.Registry(ref, self.options, credentials=creds, policy=oci.Policy(other_hosts=other_hosts))

    def resolve(self, ref: oci.Reference, credentials_ref: str, *, arch: str,
                other_hosts: frozenset[str] = frozenset()
                ) -> tuple[oci.Registry, oci.Artifact, bytes | None]:
        """The reference down to ``arch``'s disk layer, and its chunk manifest (checked)."""
        reg = self._registry(ref, credentials_ref, other_hosts)
        art = reg.resolve(arch=arch)
        chunks = reg.blob_bytes(art.chunk_manifest) if art.chunk_manifest is not None else None
        return reg, art, chunks

    def auth_for(self, route: Route) -> RegistryAuth | None:
        """A route's authorization, made again from what the route keeps (after a restart)."""
        if not route.registry:
            return None
        try:
            reg = self._registry(oci.parse(route.registry), route.credentials_ref,
                                 frozenset(route.registry_hosts))
        except AgentError as exc:
            log.warning("route %s: its registry's authorization cannot be made: %s", route.id, exc.message)
            return None
        return RegistryAuth(reg)
