"""Which upstreams a proxy route may reach (the site setting ``site_upstreams``), and what
else a command makes the site fetch (a route's manifest, a boot entry's kernel and initrd, a
media set's ISO: SiteServices.upstream_addresses, as HttpOptions.resolve).

site.httpProxy is not a signed kind, so a route must not become a way into what the site
server itself can reach and the nodes cannot: its own services, a cloud's metadata address,
another route. The rules, checked when a route is made (a clear InvalidParameters) and again
at every connection to the upstream, on the addresses the host name resolves to then (the
connection goes to the checked address, so a name that resolves elsewhere later gains
nothing):

- Refused by default: loopback (127.0.0.0/8, ::1), link-local (169.254.0.0/16, fe80::/10,
  which holds 169.254.169.254), unspecified, multicast and broadcast addresses, and the site
  server's own addresses (``site_address`` and every address of its interfaces). An address
  there is allowed only by an entry that lies inside that range: ``127.0.0.1`` or
  ``127.0.0.0/8`` allows loopback, ``169.254.169.254`` the metadata address, the site's own
  address only by that address itself; ``0.0.0.0/0`` or ``10.0.0.0/8`` allows none of them.
- The site's own HTTP service (its port on its own or a loopback address) is never reached:
  no route leads to another route.
- ``site_upstreams`` empty (the default): any other address. Not empty: only upstreams
  whose host is a listed name, or whose every address is in a listed address or network.

    policy = UpstreamPolicy.parse(["mirror.example", "10.20.0.0/16"], own={"10.0.0.2"},
                                  own_port=8088)
    policy.check("http://mirror.example/img")     # InvalidParameters, saying why, or nothing
    addresses = policy.addresses("mirror.example", 80)   # the checked addresses to dial
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.errors import InvalidParameters
from agent.net import http as agent_http

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_REFUSED: tuple[tuple[str, Network], ...] = tuple(
    (why, ipaddress.ip_network(net)) for why, net in (
        ("loopback", "127.0.0.0/8"), ("loopback", "::1/128"),
        ("link-local", "169.254.0.0/16"), ("link-local", "fe80::/10"),
        ("unspecified", "0.0.0.0/8"), ("unspecified", "::/128"),
        ("multicast", "224.0.0.0/4"), ("multicast", "ff00::/8"),
        ("broadcast", "255.255.255.255/32"),
    ))


def parse_entry(text: str) -> str:
    """One ``site_upstreams`` entry: a host name, an address or a network (CIDR)."""
    entry = text.strip().lower()
    try:
        ipaddress.ip_network(entry, strict=False)
        return entry
    except ValueError:
        pass
    labels = entry.rstrip(".").split(".")
    if not entry or len(entry) > 253 or not all(
            label and len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
            and not label.startswith("-") for label in labels):
        raise ValueError(f"{text[:60]!r} is not a host name, an address or a network")
    return entry.rstrip(".")


def local_addresses() -> frozenset[Address]:
    """Every address of this host's interfaces (Linux: /proc/net/fib_trie, /proc/net/if_inet6)."""
    found: set[Address] = set()
    try:
        last = ""
        for line in Path("/proc/net/fib_trie").read_text().splitlines():
            text = line.strip()
            if text.startswith("|-- "):
                last = text[4:]
            elif text == "/32 host LOCAL" and last:
                found.add(ipaddress.ip_address(last))
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(ipaddress.ip_address(":".join(raw[i:i + 4] for i in range(0, 32, 4))))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)


def _plain(address: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class UpstreamPolicy:
    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    own: frozenset[Address] = frozenset()
    own_port: int = 0

    @classmethod
    def parse(cls, entries: Iterable[str], own: Iterable[str | Address] = (),
              own_port: int = 0) -> UpstreamPolicy:
        names: set[str] = set()
        networks: list[Network] = []
        for text in entries:
            try:
                entry = parse_entry(text)
            except ValueError as exc:
                raise InvalidParameters(f"site_upstreams: {exc}") from None
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry)
        return cls(frozenset(names), tuple(networks),
                   frozenset(_plain(ipaddress.ip_address(a)) for a in own), own_port)

    @property
    def listed(self) -> bool:
        return bool(self.names or self.networks)

    def refusal(self, host: str, address: Address, port: int) -> str:
        """Why ``address`` (of ``host``) may not be reached on ``port``; "" when it may."""
        address = _plain(address)
        own = address in self.own and not address.is_loopback  # loopback: its own rule
        if port == self.own_port and (own or address.is_loopback):
            return "it is the site's own HTTP service"
        ranges = [(why, net) for why, net in _REFUSED
                  if net.version == address.version and address in net]
        if own:
            ranges.append(("the site server's own", ipaddress.ip_network(address)))
        for why, net in ranges:
            if not any(n.version == net.version and address in n and n.subnet_of(net)  # type: ignore[arg-type]  # same version checked
                       for n in self.networks):
                return (f"{address} is a {why} address; list it in site_upstreams to allow "
                        "it (docs/site.md)")
        if self.listed and host.lower().rstrip(".") not in self.names and not any(
                address in n for n in self.networks if n.version == address.version):
            return f"{host} ({address}) is not in site_upstreams"
        return ""

    def addresses(self, host: str, port: int) -> list[str]:
        """The addresses of ``host`` an upstream connection may dial, in resolver order;
        InvalidParameters when it resolves to none, or to one that is refused."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise InvalidParameters(f"upstream host {host[:80]!r} does not resolve: {exc}") from None
        out: list[str] = []
        for *_rest, sockaddr in infos:
            text = str(sockaddr[0]).split("%", 1)[0]
            why = self.refusal(host, ipaddress.ip_address(text), port)
            if why:  # one refused address refuses the host: no choosing the allowed one
                raise InvalidParameters(f"upstream {host[:80]}:{port} refused: {why}")
            if str(sockaddr[0]) not in out:
                out.append(str(sockaddr[0]))
        if not out:
            raise InvalidParameters(f"upstream host {host[:80]!r} has no address")
        return out

    def check(self, url: str) -> None:
        """A route's upstream URL may be reached now; InvalidParameters saying why not."""
        parts = agent_http.check_url(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.addresses(parts.hostname or "", port)
